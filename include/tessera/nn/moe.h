// Mixture of experts (Mixtral's sparse MoE block): a router picks top_k of `experts`
// SwiGLU experts per token; the token's output is their outputs weighted by the
// router's renormalized probabilities.
//
//   probs = softmax(x @ router)                       [T, E] (float32)
//   top-k experts per token, gates = their probs / the sum of those k
//   y_t = sum_j gate_tj * expert_{e_tj}(x_t),  expert_e(x) = down_e(silu(gate_e x) * up_e x)
//
// Dispatch is by gathers, not dense masks: within each group of tokens (below) the
// (token, expert) assignments get a slot in their expert's buffer of `capacity` rows
// (rank among the expert's assignments in token order: an exclusive prefix count of the
// one-hot choices, done as blocked triangular matmuls on exact small integers), the
// tokens are gathered into [groups, experts, capacity, dim], the experts run as batched
// GEMMs, and the outputs are gathered back by slot. Gradients flow through the gathers (scatter-adds), the GEMMs
// and the gates; the routing itself (which expert, which slot) carries none.
//
// capacity_factor 0: dropless. The group's assignments are sorted by expert (position =
// the expert's offset, a prefix sum of the counts, + the assignment's rank) and run as
// grouped GEMMs over the sorted rows: the active FLOPs. With expert parallelism (an
// `experts` axis of S devices) each group's rows for shard s's E/S experts move to shard
// s's devices by a ragged all-to-all of those rows only (ir/primitives/expert_dispatch.h)
// and run there as that shard's grouped GEMMs; the active bytes, and the active FLOPs.
// > 0: capacity = ceil(factor * T * k / E) (GShard / Switch); assignments past
// it are dropped (their gate's share is lost, as in those models) and counted.
//
// Load balancing (Switch Transformer, as transformers' Mixtral computes it): with
// f[j, e] the share of tokens whose j-th choice is e and P[e] the mean router
// probability, aux = E * sum_je f[j, e] P[e]; the model adds aux_loss_coef * aux to the
// loss, the per-layer f and P averaged over layers first.
#pragma once

#include <cstdint>

#include "tessera/core/tree.h"
#include "tessera/nn/param.h"

namespace tessera::nn {

struct MoE {
  int64_t dim = 0, hidden = 0, experts = 0, top_k = 2, groups = 0;
  double capacity_factor = 0;  // 0: dropless
  // Tokens are routed in `groups` groups of consecutive tokens, each with its own
  // expert slots (GShard): on a mesh one group per batch device, so a group's dispatch
  // is local and the move to the experts' devices is an all-to-all. 0: the batch's
  // devices in the active logical scope (nn/logical_sharding.h; 1 without one, or when
  // they do not divide the tokens). Dropless routing gives the same result for any
  // number of groups; with a capacity each group has its own.
  double init_std = 0.02, out_std = 0.02;
  // Dropless routing (capacity_factor 0): the group's assignments sorted by expert run as
  // grouped GEMMs (core/ops.h grouped_matmul), which cost the active FLOPs, on the
  // experts' own devices under expert parallelism. false, or experts that an `experts`
  // axis does not divide: the capacity buffers above with capacity = T (experts / top_k
  // times the active FLOPs; with expert parallelism, bytes too). So do routing groups
  // that the experts' devices do not divide.
  bool grouped_gemm = true;

  struct Output {
    Array y;                  // x's shape
    Array choice_share;       // f: [top_k, experts], the share of tokens per (choice, expert)
    Array router_prob;        // P: [experts], the mean router probability
    Array tokens_per_expert;  // [experts] float32: assignments routed to each expert (kept or not)
    Array dropped;            // scalar float32: assignments past the capacity
  };

  // {"router": {"w" [dim, experts]}, "gate"/"up": {"w" [experts, dim, hidden]},
  //  "down": {"w" [experts, hidden, dim]}}; logical axes "embed", "experts", "mlp".
  Tree init(ParamScope scope) const;
  // x [..., dim] in the compute dtype (the router runs in float32).
  Output operator()(const Tree& p, const Array& x) const;
  // Expert slots per expert for a group of `tokens` tokens.
  int64_t capacity(int64_t tokens) const;
  // The groups `tokens` tokens are routed in (ShapeError if `groups` does not divide them).
  int64_t resolved_groups(int64_t tokens) const;
};

// E * sum(f * P) from the layers' f and P averaged over layers (see above).
Array load_balancing_loss(const std::vector<MoE::Output>& layers, int64_t experts);
// The same from f [top_k, experts] and P [experts] already summed over `count` layers
// (or layer x equal batch parts): what pipeline stages hand on.
Array load_balancing_loss(const Array& choice_share_sum, const Array& router_prob_sum, int64_t count, int64_t experts);

}  // namespace tessera::nn
