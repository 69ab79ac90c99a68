// Sharding rules for gathers and their transposes (embedding lookup and its
// gradient). The gathered axis of the table is whole on every device; the other
// table dims and the index dims keep their splits. The scatter-add transpose sums
// updates from every split index position: its output is a partial sum over the
// axes that split the indices.
#include <fmt/format.h>

#include "spmd/rules.h"
#include "tessera/core/ops.h"
#include "tessera/ir/primitives/expert_dispatch.h"
#include "tessera/ir/primitives/indexing.h"
#include "tessera/spmd/collectives.h"
#include "tessera/spmd/ragged_all_to_all.h"

namespace tessera::spmd::rules {

namespace {

bool overlaps(const std::vector<int>& a, const std::vector<int>& b) {
  for (int x : a)
    if (std::find(b.begin(), b.end(), x) != b.end()) return true;
  return false;
}

Decision take_rule(const Context& c) {
  // The indices are activations (a batch split): their splits win; a table split on
  // the same mesh axis (an FSDP-sharded embedding) is gathered. A table split along the
  // gathered axis (vocabulary-parallel embedding) stays split: each device looks up
  // the ids in its range (zeros elsewhere) and the output is a partial sum.
  int axis = static_cast<const Take&>(c.primitive).axis();
  Sharding idx = c.in[1].without_partial();
  std::vector<int> idx_axes;
  for (int d = 0; d < idx.rank(); ++d) idx_axes.insert(idx_axes.end(), idx.dim_axes(d).begin(), idx.dim_axes(d).end());
  Sharding table = c.in[0].without_partial();
  for (int d = 0; d < table.rank(); ++d)
    if (overlaps(table.dim_axes(d), idx_axes)) table = table.with_dim_axes(d, {});
  std::vector<int> vocab_axes = table.dim_axes(axis);
  Sharding out = Sharding::replicated(c.mesh, static_cast<int>(c.out_types[0].shape.size()));
  int o = 0;
  for (int d = 0; d < axis; ++d) out = out.with_dim_axes(o++, table.dim_axes(d));
  for (int d = 0; d < idx.rank(); ++d) out = out.with_dim_axes(o++, idx.dim_axes(d));
  for (int d = axis + 1; d < table.rank(); ++d) out = out.with_dim_axes(o++, table.dim_axes(d));
  Decision dec;
  dec.inputs = {table, idx};
  dec.outputs = {out.with_partial(vocab_axes)};
  if (!vocab_axes.empty()) {
    const Mesh mesh = c.mesh;
    const int64_t vocab = c.in_types[0].shape[static_cast<size_t>(axis)];
    dec.expand = [mesh, vocab_axes, vocab, axis](const std::vector<Array>& in) -> std::vector<Array> {
      const int64_t local = in[0].shape(axis);
      // The first id this device holds: element 0 of its slice of arange(V).
      Array first = reshape(slice(shard_slice(arange(vocab, DType::Int64), mesh, vocab_axes, 0), {0}, {1}), Shape{});
      Array ids = astype(in[1], DType::Int64) - first;
      Array mine = logical_and(greater_equal(ids, zeros({}, DType::Int64)),
                               less(ids, full({}, static_cast<double>(local), DType::Int64)));
      Array rows = take(in[0], where(mine, ids, zeros({}, DType::Int64)), axis);
      // Broadcast the mask over the table's trailing dims.
      Array mask = astype(mine, rows.dtype());
      for (int d = axis + 1; d < in[0].ndim(); ++d) mask = expand_dims(mask, -1);
      return {rows * mask};
    };
  }
  return dec;
}

Decision scatter_add_rule(const Context& c) {
  // Inputs (indices, updates); updates = shape[:axis] + indices.shape + shape[axis+1:].
  int axis = static_cast<const TakeScatterAdd&>(c.primitive).axis();
  const Shape& out_shape = c.out_types[0].shape;
  int idx_rank = static_cast<int>(c.in_types[0].shape.size());
  Sharding upd = c.in[1].without_partial();
  Sharding idx = c.in[0].without_partial();
  // Axes the updates' table dims (before and after the index dims) already use.
  std::vector<int> table_axes;
  for (int d = 0; d < upd.rank(); ++d)
    if (d < axis || d >= axis + idx_rank)
      table_axes.insert(table_axes.end(), upd.dim_axes(d).begin(), upd.dim_axes(d).end());
  // Index dims: split like the updates' (merged, updates first), minus axes a table
  // dim uses (those index dims are gathered).
  for (int d = 0; d < idx_rank; ++d) {
    std::vector<int> axes = upd.dim_axes(axis + d);
    if (axes.empty()) axes = idx.dim_axes(d);
    if (overlaps(axes, table_axes)) axes.clear();
    table_axes.insert(table_axes.end(), axes.begin(), axes.end());
    idx = idx.with_dim_axes(d, axes);
    upd = upd.with_dim_axes(axis + d, axes);
  }
  Sharding out = Sharding::replicated(c.mesh, static_cast<int>(out_shape.size()));
  std::vector<int> partial;
  for (int d = 0; d < axis; ++d) out = out.with_dim_axes(d, upd.dim_axes(d));
  for (int d = 0; d < idx_rank; ++d) partial.insert(partial.end(), idx.dim_axes(d).begin(), idx.dim_axes(d).end());
  for (int d = axis + 1; d < static_cast<int>(out_shape.size()); ++d)
    out = out.with_dim_axes(d, upd.dim_axes(d - 1 + idx_rank));
  out = out.with_partial(partial);
  Decision dec;
  dec.inputs = {idx, upd};
  dec.outputs = {out};
  dec.local = std::make_shared<TakeScatterAdd>(out.local_shape(out_shape), axis);
  return dec;
}

// take_along_axis (a, indices) and its transpose (indices, updates): both operands
// shaped like the output except along `axis`, which is whole on every device; the
// other dims are merged like an elementwise op's.
Decision along_axis_rule(const Context& c, int axis, bool scatter) {
  Context whole = c;
  for (Sharding& s : whole.in) s = s.without_partial().with_dim_axes(axis, {});
  for (auto& t : whole.in_types) t.shape[static_cast<size_t>(axis)] = c.out_types[0].shape[static_cast<size_t>(axis)];
  Sharding target = elementwise_target(whole, {0, 1}, false);
  Decision dec;
  dec.inputs = {target, target};
  dec.outputs = {target};
  if (scatter) dec.local = std::make_shared<TakeAlongScatterAdd>(target.local_shape(c.out_types[0].shape), axis);
  return dec;
}

// expert_dispatch (x [G, N, D], sizes [G, E] -> [S, G, N, D]) and expert_combine
// (y [S, G, N, D], sizes -> [G, N, D]), ir/primitives/expert_dispatch.h. With the op's
// expert axes X on the mesh: the groups split over their other axes B then X (X minor),
// the shards over X and their groups over B, and the local computation is a ragged
// all-to-all over X after an all-gather of the groups' sizes (spmd/ragged_all_to_all.h).
// Without them: each device runs the op on its own groups.
Decision expert_dispatch_rule(const Context& c) {
  const auto& p = static_cast<const ExpertDispatch&>(c.primitive);
  const bool combine = p.combine();
  std::vector<int> x_axes;
  int64_t shards = 1;
  for (const std::string& name : p.axes())
    if (c.mesh.has_axis(name) && c.mesh.axis_size(name) > 1) {
      x_axes.push_back(c.mesh.axis_index(name));
      shards *= c.mesh.axis_size(name);
    }
  if (!x_axes.empty() && shards != p.shards())
    fail_rule(c, fmt::format("its {} expert shards do not match mesh axes {} ({} devices)", p.shards(),
                             axis_list_text(p.axes()), shards));
  // The groups' arriving split, less the expert axes, then the expert axes.
  // (An axis that would leave the groups indivisible is left out.)
  const int64_t group_count = c.in_types[0].shape[combine ? 1 : 0];
  if (group_count % shards != 0)
    fail_rule(c, fmt::format("its {} routing groups do not split over the {} devices of the expert axes {}",
                             group_count, shards, axis_list_text(p.axes())));
  std::vector<int> b;
  int64_t split = shards;
  for (int a : c.in[0].dim_axes(combine ? 1 : 0))
    if (std::find(x_axes.begin(), x_axes.end(), a) == x_axes.end() &&
        group_count % (split * c.mesh.axis_size(a)) == 0) {
      b.push_back(a);
      split *= c.mesh.axis_size(a);
    }
  std::vector<int> g_axes = b;
  g_axes.insert(g_axes.end(), x_axes.begin(), x_axes.end());
  // Both ops are linear in the rows: a partial sum on other axes (tensor-parallel expert
  // GEMMs) passes through, reduced after the combine on 1/S of the padded buffer.
  std::vector<int> partial;
  for (int a : c.in[0].partial_axes())
    if (std::find(g_axes.begin(), g_axes.end(), a) == g_axes.end()) partial.push_back(a);
  const Sharding groups = Sharding::replicated(c.mesh, 3).with_dim_axes(0, g_axes).with_partial(partial);
  const Sharding sizes = Sharding::replicated(c.mesh, 2).with_dim_axes(0, g_axes);
  const Sharding shard_buffers =
      Sharding::replicated(c.mesh, 4).with_dim_axes(0, x_axes).with_dim_axes(1, b).with_partial(partial);
  Decision dec;
  dec.inputs = {combine ? shard_buffers : groups, sizes};
  dec.outputs = {combine ? groups : shard_buffers};
  if (!x_axes.empty()) {
    const Mesh mesh = c.mesh;
    dec.expand = [mesh, x_axes, combine](const std::vector<Array>& in) -> std::vector<Array> {
      const Array all_sizes = all_gather(in[1], mesh, x_axes, 0);
      return {combine ? ragged_combine(in[0], all_sizes, mesh, x_axes)
                      : ragged_dispatch(in[0], all_sizes, mesh, x_axes)};
    };
  }
  return dec;
}

}  // namespace

void register_indexing() {
  add("expert_dispatch", expert_dispatch_rule);
  add("expert_combine", expert_dispatch_rule);
  add("take", take_rule);
  add("scatter_add", scatter_add_rule);
  add("take_along_axis",
      [](const Context& c) { return along_axis_rule(c, static_cast<const TakeAlong&>(c.primitive).axis(), false); });
  add("scatter_add_along_axis", [](const Context& c) {
    return along_axis_rule(c, static_cast<const TakeAlongScatterAdd&>(c.primitive).axis(), true);
  });
}

}  // namespace tessera::spmd::rules
