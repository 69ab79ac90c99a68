#include "tessera/spmd/reshard.h"

#include <fmt/format.h>

#include <algorithm>

#include "tessera/base/error.h"
#include "tessera/core/ops.h"
#include "tessera/spmd/collectives.h"

namespace tessera::spmd {

namespace {

bool is_prefix(const std::vector<int>& prefix, const std::vector<int>& of) {
  return prefix.size() <= of.size() && std::equal(prefix.begin(), prefix.end(), of.begin());
}

void record(std::vector<ReshardStep>* steps, const char* what, const Array& before, const Array& after,
            const Mesh& mesh, const std::vector<int>& axes, const std::string& extra) {
  if (steps == nullptr) return;
  std::string names;
  for (size_t i = 0; i < axes.size(); ++i) names += (i ? "," : "") + mesh.axis_name(axes[i]);
  steps->push_back(
      {fmt::format("{} {{axes=[{}]{}}} {} -> {}", what, names, extra, type_string(before), type_string(after))});
}

}  // namespace

Array reshard_local(const Array& local, const Shape& global, const Sharding& from, const Sharding& to,
                    std::vector<ReshardStep>* steps) {
  const Mesh& mesh = from.mesh();
  if (from.rank() != to.rank())
    fail<ShardingError>("reshard: rank {} sharding {} cannot become rank {} sharding {}", from.rank(), from.to_string(),
                        to.rank(), to.to_string());
  Array x = local;
  Sharding cur = from;
  // 0. Replicate -> Partial: the first member of each group keeps the value, the others
  //    hold zeros, so the sum over the group is exactly the value (a linear op can then
  //    combine it with partial sums, and one reduction serves both).
  for (int a : to.partial_axes()) {
    if (std::find(from.partial_axes().begin(), from.partial_axes().end(), a) != from.partial_axes().end()) continue;
    if (from.sharded_dim(a) >= 0)
      fail<ShardingError>("reshard: {} splits a dimension over axis '{}', so it cannot become partial on it ({})",
                          from.to_string(), mesh.axis_name(a), to.to_string());
    std::vector<bool> first(static_cast<size_t>(mesh.axis_size(a)), false);
    first[0] = true;
    Array mine = reshape(shard_slice(Array::from_vector(first), mesh, {a}, 0), Shape{});
    Array y = where(mine, x, zeros({}, x.dtype()));
    record(steps, "partial_from_replicated", x, y, mesh, {a}, "");
    x = y;
    std::vector<int> partial = cur.partial_axes();
    partial.push_back(a);
    cur = cur.with_partial(partial);
  }

  // This device's block of dim d along axis a, the dim's next split (a local slice).
  auto slice_next = [&](int d, int a) {
    Array y = shard_slice(x, mesh, {a}, d);
    record(steps, "shard_slice", x, y, mesh, {a}, fmt::format(", dim={}", d));
    x = y;
    std::vector<int> next = cur.dim_axes(d);
    next.push_back(a);
    cur = cur.with_dim_axes(d, next);
  };

  // 0b. Splits the target adds on axes that hold neither a split nor a partial sum here:
  //     take the local slice first, so the reductions below move only this device's part
  //     (slicing commutes with the sum). Each dim takes its next wanted axes in order.
  if (cur.is_partial()) {
    std::vector<int> used = cur.partial_axes();
    for (int d = 0; d < cur.rank(); ++d) used.insert(used.end(), cur.dim_axes(d).begin(), cur.dim_axes(d).end());
    for (int d = 0; d < cur.rank(); ++d) {
      while (is_prefix(cur.dim_axes(d), to.dim_axes(d)) && cur.dim_axes(d).size() < to.dim_axes(d).size()) {
        const int a = to.dim_axes(d)[cur.dim_axes(d).size()];
        if (std::find(used.begin(), used.end(), a) != used.end() || x.shape(d) % mesh.axis_size(a) != 0) break;
        slice_next(d, a);
        used.push_back(a);
      }
    }
  }

  // 1. Partial axes the target does not keep: reduce-scatter onto the dim the target
  //    splits next on that axis, else all-reduce (all such axes in one call).
  std::vector<int> all_reduce_axes;
  for (int a : from.partial_axes()) {
    if (std::find(to.partial_axes().begin(), to.partial_axes().end(), a) != to.partial_axes().end()) continue;
    int d = to.sharded_dim(a);
    bool scatter = false;
    if (d >= 0) {
      std::vector<int> next = cur.dim_axes(d);
      next.push_back(a);
      scatter = is_prefix(next, to.dim_axes(d)) && x.shape(d) % mesh.axis_size(a) == 0;
    }
    std::vector<int> remaining = cur.partial_axes();
    remaining.erase(std::find(remaining.begin(), remaining.end(), a));
    if (scatter) {
      Array y = reduce_scatter(x, mesh, {a}, d);
      record(steps, "reduce_scatter", x, y, mesh, {a}, fmt::format(", dim={}", d));
      x = y;
      std::vector<int> axes = cur.dim_axes(d);
      axes.push_back(a);
      cur = cur.with_dim_axes(d, axes).with_partial(remaining);
    } else {
      all_reduce_axes.push_back(a);
    }
  }
  if (!all_reduce_axes.empty()) {
    Array y = all_reduce(x, mesh, all_reduce_axes);
    record(steps, "all_reduce", x, y, mesh, all_reduce_axes, "");
    x = y;
    std::vector<int> remaining;
    for (int a : cur.partial_axes())
      if (std::find(all_reduce_axes.begin(), all_reduce_axes.end(), a) == all_reduce_axes.end()) remaining.push_back(a);
    cur = cur.with_partial(remaining);
  }

  // 2. Splits: drop what the target does not start with (moving an axis to another
  //    dim with all-to-all when it is that dim's next axis), then add what is missing.
  for (int guard = 0; guard < 64; ++guard) {
    bool changed = false;
    for (int d = 0; d < cur.rank() && !changed; ++d) {
      if (is_prefix(cur.dim_axes(d), to.dim_axes(d))) continue;
      int a = cur.dim_axes(d).back();  // the minor axis goes first
      std::vector<int> rest = cur.dim_axes(d);
      rest.pop_back();
      int e = to.sharded_dim(a);
      bool move = false;
      if (e >= 0 && e != d) {
        std::vector<int> next = cur.dim_axes(e);
        next.push_back(a);
        move = is_prefix(next, to.dim_axes(e)) && x.shape(e) % mesh.axis_size(a) == 0;
      }
      if (move) {
        Array y = all_to_all(x, mesh, {a}, e, d);
        record(steps, "all_to_all", x, y, mesh, {a}, fmt::format(", split={}, concat={}", e, d));
        x = y;
        std::vector<int> next = cur.dim_axes(e);
        next.push_back(a);
        cur = cur.with_dim_axes(d, rest).with_dim_axes(e, next);
      } else {
        Array y = all_gather(x, mesh, {a}, d);
        record(steps, "all_gather", x, y, mesh, {a}, fmt::format(", dim={}", d));
        x = y;
        cur = cur.with_dim_axes(d, rest);
      }
      changed = true;
    }
    if (changed) continue;
    for (int d = 0; d < cur.rank() && !changed; ++d) {
      const std::vector<int>& want = to.dim_axes(d);
      if (cur.dim_axes(d).size() == want.size()) continue;
      slice_next(d, want[cur.dim_axes(d).size()]);
      changed = true;
    }
    if (!changed) break;
  }
  if (cur != to)
    fail<ShardingError>("reshard: internal error: reached {} instead of {} (from {}, global shape {})", cur.to_string(),
                        to.to_string(), from.to_string(), tessera::to_string(global));
  return x;
}

}  // namespace tessera::spmd
