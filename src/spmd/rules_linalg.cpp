// The matmul sharding rule, einsum-style. Labels: A is [batch..., M, K] and B is
// [batch..., K, N] (after their transpose flags). Per mesh axis:
//   * a split batch dim stays split (both operands split it alike);
//   * M split on A -> the output's M; N split on B -> the output's N, unless that
//     axis already splits another output dim (then B's N is gathered);
//   * K split alike on both -> the output is a partial sum on those axes; K split on
//     one side only -> the other side's K is sliced locally (free) and the output is
//     partial, unless the axes already split an output dim (then K is gathered).
// A partial operand times a replicated one stays partial (the product is linear).
#include "spmd/rules.h"
#include "tessera/ir/primitives/grouped_matmul.h"
#include "tessera/ir/primitives/linalg.h"
#include "tessera/ir/primitives/quantized.h"

namespace tessera::spmd::rules {

namespace {

bool any_used(const std::vector<int>& axes, const std::vector<bool>& used) {
  for (int a : axes)
    if (used[static_cast<size_t>(a)]) return true;
  return false;
}
void mark(const std::vector<int>& axes, std::vector<bool>& used) {
  for (int a : axes) used[static_cast<size_t>(a)] = true;
}

Decision matmul_rule(const Context& c) {
  const auto& p = static_cast<const Matmul&>(c.primitive);
  int ra = static_cast<int>(c.in_types[0].shape.size());
  int rb = static_cast<int>(c.in_types[1].shape.size());
  int ro = static_cast<int>(c.out_types[0].shape.size());
  int m_a = p.trans_a() ? ra - 1 : ra - 2, k_a = p.trans_a() ? ra - 2 : ra - 1;
  int k_b = p.trans_b() ? rb - 1 : rb - 2, n_b = p.trans_b() ? rb - 2 : rb - 1;
  Sharding a = c.in[0].without_partial();
  Sharding b = c.in[1].without_partial();
  Sharding out = Sharding::replicated(c.mesh, ro);
  std::vector<bool> used(static_cast<size_t>(c.mesh.ndim()), false);

  // Batch dims (present on an operand only when its rank is the output's).
  for (int d = 0; d < ro - 2; ++d) {
    std::vector<int> axes_a = ra == ro ? a.dim_axes(d) : std::vector<int>{};
    std::vector<int> axes_b = rb == ro ? b.dim_axes(d) : std::vector<int>{};
    std::vector<int> axes = axes_a.size() >= axes_b.size() ? axes_a : axes_b;
    if (!axes_a.empty() && !axes_b.empty() && axes_a != axes_b) {
      const std::vector<int>& shorter = axes_a.size() < axes_b.size() ? axes_a : axes_b;
      if (!std::equal(shorter.begin(), shorter.end(), axes.begin()))
        fail_rule(c, fmt::format("the operands split batch dimension {} differently ({} vs {})", d, c.in[0].to_string(),
                                 c.in[1].to_string()));
    }
    if (any_used(axes, used)) axes.clear();
    out = out.with_dim_axes(d, axes);
    if (ra == ro) a = a.with_dim_axes(d, axes);
    if (rb == ro) b = b.with_dim_axes(d, axes);
    mark(axes, used);
  }
  // M and N.
  if (any_used(a.dim_axes(m_a), used)) a = a.with_dim_axes(m_a, {});
  out = out.with_dim_axes(ro - 2, a.dim_axes(m_a));
  mark(a.dim_axes(m_a), used);
  if (any_used(b.dim_axes(n_b), used)) b = b.with_dim_axes(n_b, {});
  out = out.with_dim_axes(ro - 1, b.dim_axes(n_b));
  mark(b.dim_axes(n_b), used);
  // K.
  std::vector<int> ka = a.dim_axes(k_a), kb = b.dim_axes(k_b), partial;
  if (!ka.empty() && !any_used(ka, used) && (kb.empty() || kb == ka)) {
    b = b.with_dim_axes(k_b, ka);
    partial = ka;
  } else if (!kb.empty() && !any_used(kb, used) && ka.empty()) {
    a = a.with_dim_axes(k_a, kb);
    partial = kb;
  } else {
    a = a.with_dim_axes(k_a, {});
    b = b.with_dim_axes(k_b, {});
  }
  mark(partial, used);
  // One partial operand (the other not split or partial on those axes) stays partial.
  const Sharding& pa = c.in[0];
  const Sharding& pb = c.in[1];
  if (pa.is_partial() != pb.is_partial()) {
    const std::vector<int>& axes = pa.is_partial() ? pa.partial_axes() : pb.partial_axes();
    if (!any_used(axes, used)) {
      if (pa.is_partial()) a = a.with_partial(axes);
      if (pb.is_partial()) b = b.with_partial(axes);
      partial.insert(partial.end(), axes.begin(), axes.end());
    }
  }
  Decision dec;
  dec.inputs = {a, b};
  dec.outputs = {out.with_partial(partial)};
  return dec;
}

// quantized_matmul: each row of op(A) and column of op(B) is quantized with a scale over
// all of K, so K is never split (a split K is gathered: per-shard scales would change the
// result). M follows A, N follows B unless those axes already split M; the key is
// replicated. Partial operands are reduced first (quantization is not linear).
Decision quantized_matmul_rule(const Context& c) {
  const auto& p = static_cast<const QuantizedMatmul&>(c.primitive);
  const bool ta = p.config().trans_a, tb = p.config().trans_b;
  const int ra = static_cast<int>(c.in_types[0].shape.size());
  // A's row dims: all but K ([..., m, k]), or dim 1 of a transposed [k, m].
  const int k_a = ta ? 0 : ra - 1, k_b = tb ? 1 : 0, n_b = tb ? 0 : 1;
  Sharding a = c.in[0].without_partial().with_dim_axes(k_a, {});
  Sharding b = c.in[1].without_partial().with_dim_axes(k_b, {});
  std::vector<bool> used(static_cast<size_t>(c.mesh.ndim()), false);
  Sharding out = Sharding::replicated(c.mesh, ta ? 2 : ra);
  for (int d = 0; d < ra; ++d) {
    if (d == k_a) continue;
    if (any_used(a.dim_axes(d), used)) a = a.with_dim_axes(d, {});
    out = out.with_dim_axes(ta ? 0 : d, a.dim_axes(d));
    mark(a.dim_axes(d), used);
  }
  if (any_used(b.dim_axes(n_b), used)) b = b.with_dim_axes(n_b, {});
  out = out.with_dim_axes(ta ? 1 : ra - 1, b.dim_axes(n_b));
  Decision dec;
  dec.inputs = {a, b};
  if (c.in.size() > 2) dec.inputs.push_back(Sharding::replicated(c.mesh, 1));
  dec.outputs = {out};
  return dec;
}

// The shard dim S of a rank-4 grouped matmul (ir/primitives/grouped_matmul.h): shard s
// reads only its own matrices, so S split alike on every operand needs no communication.
// Its axes: the first operand's, else the second's. Marks them used; none at rank 3.
std::vector<int> grouped_shard_axes(const Context& c, std::vector<bool>& used) {
  if (c.in_types[0].shape.size() != 4) return {};
  std::vector<int> axes = c.in[0].dim_axes(0);
  if (axes.empty()) axes = c.in[1].dim_axes(0);
  mark(axes, used);
  return axes;
}

// grouped_matmul (a [G, N, K], w [E, K, M] or transposed, sizes [G, E]; or each with a
// leading shard dim S, split alike on all): the batch dim G keeps a's split (sizes
// follow it); a batch's rows N and w's matrices E are never split (the groups' rows lie
// anywhere in N); M follows w; K split alike on both (or on a only, w's K then sliced
// locally) gives a partial sum, else K is gathered.
Decision grouped_matmul_rule(const Context& c) {
  const auto& p = static_cast<const GroupedMatmul&>(c.primitive);
  const int o = static_cast<int>(c.in_types[0].shape.size()) - 3;  // 1 with a shard dim
  const int k_w = o + (p.trans_w() ? 2 : 1), m_w = o + (p.trans_w() ? 1 : 2);
  std::vector<bool> used(static_cast<size_t>(c.mesh.ndim()), false);
  const std::vector<int> shard = grouped_shard_axes(c, used);
  Sharding a = c.in[0].without_partial().with_dim_axes(o + 1, {});
  Sharding w = c.in[1].without_partial().with_dim_axes(o, {});
  if (o == 1) {
    a = a.with_dim_axes(0, shard);
    w = w.with_dim_axes(0, shard);
  }
  if (any_used(a.dim_axes(o), used)) a = a.with_dim_axes(o, {});
  Sharding out = Sharding::replicated(c.mesh, o + 3).with_dim_axes(o, a.dim_axes(o));
  Sharding sizes = Sharding::replicated(c.mesh, o + 2).with_dim_axes(o, a.dim_axes(o));
  if (o == 1) {
    out = out.with_dim_axes(0, shard);
    sizes = sizes.with_dim_axes(0, shard);
  }
  mark(a.dim_axes(o), used);
  if (any_used(w.dim_axes(m_w), used)) w = w.with_dim_axes(m_w, {});
  out = out.with_dim_axes(o + 2, w.dim_axes(m_w));
  mark(w.dim_axes(m_w), used);
  std::vector<int> ka = a.dim_axes(o + 2), kw = w.dim_axes(k_w), partial;
  if (!ka.empty() && !any_used(ka, used) && (kw.empty() || kw == ka)) {
    w = w.with_dim_axes(k_w, ka);
    partial = ka;
  } else {
    a = a.with_dim_axes(o + 2, {});
    w = w.with_dim_axes(k_w, {});
  }
  Decision dec;
  dec.inputs = {a, w, sizes};
  dec.outputs = {out.with_partial(partial)};
  // A device's shard dim is 1: its FLOPs are still a 1/S share of its buffers' rows.
  if (!shard.empty()) dec.local = std::make_shared<GroupedMatmul>(p.trans_w(), c.mesh.group_size(shard));
  return dec;
}

// grouped_matmul_weight_grad (x [G, N, K], y [G, N, M], sizes [G, E] -> [E, K, M] or
// [E, M, K]; or each with a leading shard dim S, split alike on all and on the output):
// the batches are summed, so a G split alike on x and y gives a partial sum over those
// axes; K follows x and M follows y where those axes are free; N and E are never split.
Decision grouped_matmul_weight_grad_rule(const Context& c) {
  const auto& p = static_cast<const GroupedMatmulWeightGrad&>(c.primitive);
  const int o = static_cast<int>(c.in_types[0].shape.size()) - 3;
  std::vector<bool> used(static_cast<size_t>(c.mesh.ndim()), false);
  const std::vector<int> shard = grouped_shard_axes(c, used);
  Sharding x = c.in[0].without_partial().with_dim_axes(o + 1, {});
  Sharding y = c.in[1].without_partial().with_dim_axes(o + 1, {});
  if (o == 1) {
    x = x.with_dim_axes(0, shard);
    y = y.with_dim_axes(0, shard);
  }
  std::vector<int> batch = x.dim_axes(o);
  if (any_used(batch, used)) batch.clear();
  x = x.with_dim_axes(o, batch);
  y = y.with_dim_axes(o, batch);
  mark(batch, used);
  if (any_used(x.dim_axes(o + 2), used)) x = x.with_dim_axes(o + 2, {});
  mark(x.dim_axes(o + 2), used);
  if (any_used(y.dim_axes(o + 2), used)) y = y.with_dim_axes(o + 2, {});
  Sharding out = Sharding::replicated(c.mesh, o + 3)
                     .with_dim_axes(o + (p.trans_out() ? 2 : 1), x.dim_axes(o + 2))
                     .with_dim_axes(o + (p.trans_out() ? 1 : 2), y.dim_axes(o + 2));
  Sharding sizes = Sharding::replicated(c.mesh, o + 2).with_dim_axes(o, batch);
  if (o == 1) {
    out = out.with_dim_axes(0, shard);
    sizes = sizes.with_dim_axes(0, shard);
  }
  Decision dec;
  dec.inputs = {x, y, sizes};
  dec.outputs = {out.with_partial(batch)};
  if (!shard.empty())
    dec.local = std::make_shared<GroupedMatmulWeightGrad>(p.groups(), p.trans_out(), c.mesh.group_size(shard));
  return dec;
}

}  // namespace

void register_linalg() {
  add("matmul", matmul_rule);
  add("quantized_matmul", quantized_matmul_rule);
  add("grouped_matmul", grouped_matmul_rule);
  add("grouped_matmul_weight_grad", grouped_matmul_weight_grad_rule);
}

}  // namespace tessera::spmd::rules
