// The mixture-of-experts block (see moe.h).
#include "tessera/nn/moe.h"

#include <cmath>
#include <memory>

#include "tessera/base/error.h"
#include "tessera/core/ops.h"
#include "tessera/ir/primitives/expert_dispatch.h"
#include "tessera/ir/primitives/indexing.h"
#include "tessera/nn/logical_sharding.h"

namespace tessera::nn {

namespace {

// 1 where row > column: the strictly lower triangle of an n x n matrix, float32.
Array strictly_lower(int64_t n) {
  const Array r = arange(n);
  return astype(greater(expand_dims(r, 1), expand_dims(r, 0)), DType::Float32);
}

// Exclusive prefix sums down axis 1 of `a` [g, n, e] (small non-negative integers in
// float32, so every sum is exact), each of the g groups on its own: blocks of s ~
// sqrt(n) rows, a triangular matmul inside each block and one across the blocks' totals.
// O(g n^1.5 e) work.
Array exclusive_prefix(const Array& a) {
  const int64_t g = a.shape(0), n = a.shape(1), e = a.shape(2);
  const auto s = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(n)))));
  const int64_t blocks = (n + s - 1) / s;
  Array padded = blocks * s == n ? a : concatenate({a, zeros({g, blocks * s - n, e}, a.dtype())}, 1);
  padded = reshape(padded, {g, blocks, s, e});
  const Array within = matmul(strictly_lower(s), padded);                 // [g, blocks, s, e]
  const Array before = matmul(strictly_lower(blocks), sum(padded, {2}));  // [g, blocks, e]
  const Array prefix = reshape(within + expand_dims(before, 2), {g, blocks * s, e});
  return slice_axis(prefix, 1, 0, n);
}

// zeros([g, size]) with values[i, j] added at [i, index[i, j]] (take_along_axis's transpose).
Array scatter_add_rows(int64_t size, const Array& index, const Array& values) {
  const Shape shape{index.shape(0), size};
  return Array::make(shape, values.dtype(), std::make_shared<TakeAlongScatterAdd>(shape, 1), {index, values});
}

// rows[i, index[i, j], :] for each group i: [g, m, d] from [g, n, d] and [g, m].
Array gather_rows(const Array& rows, const Array& index) {
  const Array wide = broadcast_to(expand_dims(index, 2), {index.shape(0), index.shape(1), rows.shape(2)});
  return take_along_axis(rows, wide, 1);
}

}  // namespace

int64_t MoE::capacity(int64_t tokens) const {
  if (capacity_factor <= 0) return tokens;  // dropless: an expert can get every token once
  const auto c = static_cast<int64_t>(
      std::ceil(capacity_factor * static_cast<double>(tokens * top_k) / static_cast<double>(experts)));
  return std::clamp<int64_t>(c, 1, tokens);
}

Tree MoE::init(ParamScope scope) const {
  if (dim <= 0 || hidden <= 0 || experts <= 0)
    fail<ValueError>("MoE '{}': dim {}, hidden {} and experts {} must be positive", scope.path(), dim, hidden, experts);
  if (top_k < 1 || top_k > experts)
    fail<ValueError>("MoE '{}': top_k = {} must be between 1 and the {} experts", scope.path(), top_k, experts);
  auto weight = [&](const std::string& name, Shape shape, AxisNames axes, double std) {
    Tree t;
    t["w"] = scope.child(name).param(
        "w", {.shape = std::move(shape), .axes = std::move(axes), .init = Initializer::normal(std)});
    return t;
  };
  Tree p;
  p["router"] = weight("router", {dim, experts}, {"embed", "experts"}, init_std);
  p["gate"] = weight("gate", {experts, dim, hidden}, {"experts", "embed", "mlp"}, init_std);
  p["up"] = weight("up", {experts, dim, hidden}, {"experts", "embed", "mlp"}, init_std);
  p["down"] = weight("down", {experts, hidden, dim}, {"experts", "mlp", "embed"}, out_std);
  return p;
}

int64_t MoE::resolved_groups(int64_t tokens) const {
  if (groups > 0) {
    if (tokens % groups != 0)
      fail<ShapeError>("MoE: {} tokens do not split into moe_groups = {} equal groups", tokens, groups);
    return groups;
  }
  const int64_t devices = logical_axis_size("batch");
  return tokens % devices == 0 ? devices : 1;
}

MoE::Output MoE::operator()(const Tree& p, const Array& x) const {
  if (x.ndim() < 1 || x.shape(-1) != dim)
    fail<ShapeError>("MoE: input {} must end in the model width {}", tessera::to_string(x.shape()), dim);
  const Shape shape = x.shape();
  const int64_t t = x.size() / dim, k = top_k, e = experts;
  const int64_t g = resolved_groups(t), tg = t / g, ng = tg * k, c = capacity(tg);
  const Array flat = reshape(x, {t, dim});

  // Routing in float32 (float64 for float64 inputs): the top k by repeated argmax (the
  // first index on ties).
  const DType router_dtype = x.dtype() == DType::Float64 ? DType::Float64 : DType::Float32;
  const Array probs =
      softmax(matmul(astype(flat, router_dtype), astype(p.at("router").at("w").leaf(), router_dtype)), -1);
  Array remaining = stop_gradient(probs);
  std::vector<Array> choices;
  for (int64_t j = 0; j < k; ++j) {
    const Array choice = argmax(remaining, 1);  // [t]
    choices.push_back(choice);
    remaining = where(greater(one_hot(choice, e), zeros({}, DType::Float32)), full({}, -1.0, router_dtype), remaining);
  }
  const Array chosen = stack(choices, 1);  // [t, k]
  const Array picked = take_along_axis(probs, chosen, 1);
  // Mixtral renormalizes the top k. (Pinned to the batch layout: with fewer routing groups
  // than batch devices the combine's cotangent would arrive split like the groups.)
  const Array gates = with_logical_constraint(picked / sum(picked, {1}, true), {"batch", ""});

  // Per group of tg consecutive tokens: assignment i = the group's token i / k's
  // (i % k)-th choice; its rank among its expert's assignments in that order.
  const Array expert = reshape(chosen, {g, ng});
  const Array choice_one_hot = stop_gradient(one_hot(expert, e));  // [g, ng, e]
  const Array rank = reshape(take_along_axis(exclusive_prefix(choice_one_hot), expand_dims(expert, 2), 2), {g, ng});
  const Array token = broadcast_to(reshape(broadcast_to(expand_dims(arange(tg), 1), {tg, k}), {1, ng}), {g, ng});
  const Array groups_x = reshape(flat, {g, tg, dim});
  const DType dtype = flat.dtype();
  auto w = [&](const char* name) { return astype(p.at(name).at("w").leaf(), dtype); };
  Output o;
  o.choice_share = mean(reshape(choice_one_hot, {t, k, e}), {0});
  o.router_prob = mean(probs, {0});
  o.tokens_per_expert = sum(reshape(choice_one_hot, {g * ng, e}), {0});

  const int64_t shards = logical_axis_size("experts");
  if (capacity_factor <= 0 && grouped_gemm && e % shards == 0 && g % shards == 0) {
    // Dropless on grouped GEMMs: assignment i goes to row start[expert_i] + rank_i of the
    // group's rows sorted by expert (start: exclusive prefix sums of the experts' counts,
    // a matmul by the strictly upper triangle on exact small integers).
    const Array counts = sum(choice_one_hot, {1});  // [g, e]
    const Array start = matmul(counts, transpose(strictly_lower(e), {1, 0}));
    const Array position = astype(reshape(take_along_axis(start, expert, 1), {g, ng}) + rank, DType::Int64);
    // Which token fills each sorted row: every row gets exactly one.
    const Array source =
        astype(scatter_add_rows(ng, position, astype(token, DType::Float32) + 1.0) - 1.0, DType::Int64);
    const Array sizes = astype(counts, DType::Int64);
    Array out;  // [g, ng, dim], sorted by expert
    if (shards == 1) {
      const Array sorted = with_logical_constraint(gather_rows(groups_x, source), {"moe_groups", "", ""});
      const Array h = silu(grouped_matmul(sorted, w("gate"), sizes)) * grouped_matmul(sorted, w("up"), sizes);
      out = grouped_matmul(h, w("down"), sizes);
    } else {
      // Expert parallelism: each group's rows for shard s's experts go to shard s's devices
      // (a ragged all-to-all of the routed rows only), run there as shard s's grouped GEMMs
      // ([S, g, ng, .] with w [S, E/S, ., .]), and come back the same way.
      const std::vector<std::string> axes = logical_axis_names("experts");
      const int64_t local_experts = e / shards;
      const Array sorted = with_logical_constraint(gather_rows(groups_x, source), {"batch", "", ""});
      const Array dispatched =
          with_logical_constraint(expert_dispatch(sorted, sizes, shards, axes), {"experts", "moe_groups", "", ""});
      const Array shard_sizes = transpose(reshape(sizes, {g, shards, local_experts}), {1, 0, 2});  // [S, g, E/S]
      auto shard_w = [&](const char* name) {
        const Array full = w(name);
        return reshape(full, {shards, local_experts, full.shape(1), full.shape(2)});
      };
      const Array h = silu(grouped_matmul(dispatched, shard_w("gate"), shard_sizes)) *
                      grouped_matmul(dispatched, shard_w("up"), shard_sizes);
      out = expert_combine(grouped_matmul(h, shard_w("down"), shard_sizes), sizes, axes);
    }
    const Array per_assignment = gather_rows(out, position);
    const Array weighted = per_assignment * astype(reshape(gates, {g, ng, 1}), dtype);
    o.y = reshape(sum(reshape(weighted, {t, k, dim}), {1}), shape);
    o.dropped = zeros({}, DType::Float32);
    return o;
  }

  // Capacity buffers: an assignment's slot is its expert's row `rank`; past the capacity
  // it goes to the spare slot e * c.
  const Array kept = less(rank, full({}, static_cast<double>(c)));
  const Array slot = astype(
      where(kept, astype(expert, DType::Float32) * static_cast<double>(c) + rank, full({}, static_cast<double>(e * c))),
      DType::Int64);
  // Which of the group's tokens fills each slot (+1; 0 for an empty slot), then a gather
  // with the empty slots reading an appended zero row.
  const Array filled = slice_axis(scatter_add_rows(e * c + 1, slot, astype(token, DType::Float32) + 1.0), 1, 0, e * c);
  const Array source = astype(filled - 1.0, DType::Int64);
  const Array source_or_zero_row =
      where(less(source, zeros({}, DType::Int64)), full({}, static_cast<double>(tg), DType::Int64), source);
  const Array padded_x = concatenate({groups_x, zeros({g, 1, dim}, flat.dtype())}, 1);
  // [g, e, c, dim], then (on a mesh with an expert axis) split over the experts instead
  // of the groups: the partitioner's all-to-all is expert parallelism's dispatch.
  Array dispatched = reshape(gather_rows(padded_x, source_or_zero_row), {g, e, c, dim});
  const AxisNames at_experts{"moe_groups", "experts", "", ""};
  dispatched = with_logical_constraint(dispatched, at_experts);

  // The experts: batched SwiGLU GEMMs [g, e, c, dim] x [e, dim, hidden], every product
  // pinned to the experts' devices.
  auto expert_matmul = [&](const Array& a, const char* name) {
    return with_logical_constraint(matmul(a, w(name)), at_experts);
  };
  const Array h =
      with_logical_constraint(silu(expert_matmul(dispatched, "gate")) * expert_matmul(dispatched, "up"), at_experts);
  // ... and back to the groups' devices (the combine's all-to-all).
  const Array out = with_logical_constraint(expert_matmul(h, "down"), {"batch", "", "", ""});

  // Combine: each assignment reads its slot (a dropped one the zero row), weighted by its gate.
  const Array padded_out = concatenate({reshape(out, {g, e * c, dim}), zeros({g, 1, dim}, dtype)}, 1);
  const Array per_assignment = gather_rows(padded_out, slot);  // [g, ng, dim]
  const Array weighted = per_assignment * astype(reshape(gates, {g, ng, 1}), dtype);
  o.y = reshape(sum(reshape(weighted, {t, k, dim}), {1}), shape);
  o.dropped = sum(astype(logical_not(kept), DType::Float32));
  return o;
}

Array load_balancing_loss(const std::vector<MoE::Output>& layers, int64_t experts) {
  if (layers.empty()) fail<ValueError>("load_balancing_loss: no MoE layers");
  Array f = layers.front().choice_share, prob = layers.front().router_prob;
  for (size_t l = 1; l < layers.size(); ++l) {
    f = f + layers[l].choice_share;
    prob = prob + layers[l].router_prob;
  }
  return load_balancing_loss(f, prob, static_cast<int64_t>(layers.size()), experts);
}

Array load_balancing_loss(const Array& choice_share_sum, const Array& router_prob_sum, int64_t count, int64_t experts) {
  if (count < 1) fail<ValueError>("load_balancing_loss: figures summed over {} layers (expected >= 1)", count);
  const double inv = 1.0 / static_cast<double>(count);
  return sum(choice_share_sum * inv * expand_dims(router_prob_sum * inv, 0)) * static_cast<double>(experts);
}

}  // namespace tessera::nn
