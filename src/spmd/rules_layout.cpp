// Sharding rules for layout primitives. Splits move with the dimensions they are
// on; partial sums pass through (every layout op is linear). A split that cannot
// survive the op (a sliced or concatenated dimension, a minor dimension merged by a
// reshape) is gathered first.
#include <fmt/format.h>

#include "spmd/rules.h"
#include "tessera/ir/primitives/layout.h"

namespace tessera::spmd::rules {

namespace {

Shape local_of(const Sharding& s, const Shape& global) { return s.local_shape(global); }

// Contiguous groups of input and output dims with equal products (row-major
// reshape maps each group onto the other).
struct DimGroup {
  std::vector<int> in, out;
};
std::vector<DimGroup> reshape_groups(const Shape& in, const Shape& out) {
  std::vector<DimGroup> groups;
  size_t i = 0, j = 0;
  while (i < in.size() || j < out.size()) {
    DimGroup g;
    int64_t pi = 1, po = 1;
    // Take at least one dim from a side that has any left, then grow the smaller product.
    if (i < in.size()) pi *= in[i], g.in.push_back(static_cast<int>(i++));
    if (j < out.size()) po *= out[j], g.out.push_back(static_cast<int>(j++));
    while (pi != po) {
      if (pi < po && i < in.size()) {
        pi *= in[i], g.in.push_back(static_cast<int>(i++));
      } else if (po < pi && j < out.size()) {
        po *= out[j], g.out.push_back(static_cast<int>(j++));
      } else {
        break;
      }
    }
    // Trailing size-1 dims join the group (they carry no data).
    while (i < in.size() && in[i] == 1 && (j >= out.size() || out[j] != 1)) g.in.push_back(static_cast<int>(i++));
    while (j < out.size() && out[j] == 1 && (i >= in.size() || in[i] != 1)) g.out.push_back(static_cast<int>(j++));
    groups.push_back(std::move(g));
  }
  return groups;
}

Decision reshape_rule(const Context& c) {
  const Shape& in = c.in_types.at(0).shape;
  const Shape& out = c.out_types.at(0).shape;
  const Sharding& s = c.in.at(0);
  Sharding want = s;
  Sharding result = Sharding::replicated(c.mesh, static_cast<int>(out.size())).with_partial(s.partial_axes());
  for (const DimGroup& g : reshape_groups(in, out)) {
    // The group's major dim with data (size > 1) may stay split when the output's
    // major dim with data divides by its shard count; every other split is gathered.
    int major_in = -1, major_out = -1;
    for (int d : g.in)
      if (in[static_cast<size_t>(d)] > 1) {
        major_in = d;
        break;
      }
    for (int d : g.out)
      if (out[static_cast<size_t>(d)] > 1) {
        major_out = d;
        break;
      }
    for (int d : g.in) {
      if (s.dim_axes(d).empty()) continue;
      bool keep = d == major_in && major_out >= 0 && out[static_cast<size_t>(major_out)] % s.num_shards(d) == 0;
      if (keep) {
        result = result.with_dim_axes(major_out, s.dim_axes(d));
      } else {
        want = want.with_dim_axes(d, {});
      }
    }
  }
  Decision dec;
  dec.inputs = {want};
  dec.outputs = {result};
  dec.local = std::make_shared<Reshape>(local_of(result, out));
  return dec;
}

Decision transpose_rule(const Context& c) {
  const auto& p = static_cast<const Transpose&>(c.primitive);
  const Sharding& s = c.in.at(0);
  Sharding out = Sharding::replicated(c.mesh, s.rank()).with_partial(s.partial_axes());
  for (int d = 0; d < s.rank(); ++d) out = out.with_dim_axes(d, s.dim_axes(p.perm()[static_cast<size_t>(d)]));
  return same_everywhere(c, out);
}

Decision broadcast_rule(const Context& c) {
  const Shape& in = c.in_types.at(0).shape;
  const Shape& out = c.out_types.at(0).shape;
  const Sharding& s = c.in.at(0);
  int offset = static_cast<int>(out.size() - in.size());
  Sharding result = Sharding::replicated(c.mesh, static_cast<int>(out.size())).with_partial(s.partial_axes());
  for (int d = 0; d < static_cast<int>(in.size()); ++d)
    if (in[static_cast<size_t>(d)] == out[static_cast<size_t>(d + offset)])
      result = result.with_dim_axes(d + offset, s.dim_axes(d));
  Decision dec = same_everywhere(c, result);
  dec.local = std::make_shared<BroadcastTo>(local_of(result, out));
  return dec;
}

Decision slice_rule(const Context& c) {
  const auto& p = static_cast<const Slice&>(c.primitive);
  const Shape& in = c.in_types.at(0).shape;
  Sharding want = c.in.at(0);
  std::vector<int64_t> start = p.start(), stop = p.stop(), step = p.step();
  Shape local_in = want.local_shape(in);
  for (int d = 0; d < want.rank(); ++d) {
    size_t u = static_cast<size_t>(d);
    bool whole = start[u] == 0 && stop[u] == in[u] && step[u] == 1;
    if (want.dim_axes(d).empty()) continue;
    if (whole) {
      stop[u] = local_in[u];
    } else {
      want = want.with_dim_axes(d, {});
    }
  }
  Decision dec;
  dec.inputs = {want};
  dec.outputs = {want};
  dec.local = std::make_shared<Slice>(start, stop, step);
  return dec;
}

Decision slice_pad_rule(const Context& c) {
  const auto& p = static_cast<const SlicePad&>(c.primitive);
  const Shape& in = c.in_types.at(0).shape;
  const Shape& out = c.out_types.at(0).shape;
  Sharding want = c.in.at(0);
  for (int d = 0; d < want.rank(); ++d) {
    size_t u = static_cast<size_t>(d);
    bool whole = p.start()[u] == 0 && p.step()[u] == 1 && in[u] == out[u];
    if (!whole) want = want.with_dim_axes(d, {});
  }
  Decision dec;
  dec.inputs = {want};
  dec.outputs = {want};
  dec.local = std::make_shared<SlicePad>(want.local_shape(out), p.start(), p.step());
  return dec;
}

Decision concatenate_rule(const Context& c) {
  const auto& p = static_cast<const Concatenate&>(c.primitive);
  std::vector<int> operands;
  for (size_t i = 0; i < c.in.size(); ++i) operands.push_back(static_cast<int>(i));
  // Merge the splits of the other dims; the concatenated one is gathered.
  Context merged = c;
  for (Sharding& s : merged.in) s = s.with_dim_axes(p.axis(), {});
  for (auto& t : merged.in_types)
    t.shape[static_cast<size_t>(p.axis())] = c.out_types[0].shape[static_cast<size_t>(p.axis())];
  Sharding target = elementwise_target(merged, operands, true);
  Decision dec;
  dec.inputs.assign(c.in.size(), target);
  dec.outputs = {target};
  return dec;
}

}  // namespace

void register_layout() {
  add("reshape", reshape_rule);
  add("transpose", transpose_rule);
  add("broadcast_to", broadcast_rule);
  add("slice", slice_rule);
  add("slice_pad", slice_pad_rule);
  add("concatenate", concatenate_rule);
}

}  // namespace tessera::spmd::rules
