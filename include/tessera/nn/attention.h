// Causal self-attention, multi-head or grouped-query (kv_heads < heads), with an
// optional RoPE and an optional KV cache for incremental decoding.
//
// One fused projection: x @ wqkv (+ bqkv), wqkv [dim, (heads + 2 kv_heads) head_dim],
// columns grouped by kv head (Megatron's layout): [kv_heads, G + 2, head_dim] with
// G = heads / kv_heads, i.e. per kv head its G query heads, then its k, then its v.
// Splitting the columns over devices (tensor parallelism on the "heads" axis) gives
// every device whole groups, so attention runs locally on its heads. q, k, v are
// slices of the [B, T, kv_heads, G + 2, head_dim] view; then
// scaled_dot_product_attention (GQA natively) and x @ wo (+ bo).
#pragma once

#include <cstdint>
#include <optional>

#include "tessera/core/tree.h"
#include "tessera/nn/param.h"
#include "tessera/nn/projection.h"
#include "tessera/nn/rotary.h"

namespace tessera::nn {

// Keys and values of earlier positions, [B, kv_heads, S, head_dim] each (S may be 0).
struct KVState {
  Array k, v;
};

// Documents packed in one row of T tokens (data::Batch): integer [B, T] each.
// segments: the document of each token; attention never crosses documents.
// positions: each token's position inside its document (restarting at 0), in [0, T):
// the RoPE angles (and GPT-2's position-embedding rows, models/model.h).
struct Packing {
  Array segments, positions;
};

struct Attention {
  int64_t dim = 0, heads = 0;
  int64_t kv_heads = 0;  // 0: = heads
  bool bias = true;
  bool rope = false;
  double rope_theta = 10000.0;
  std::optional<Llama3RopeScaling> rope_llama3 = std::nullopt;  // Llama 3.1 RoPE scaling (rotary.h)
  double init_std = 0.02;
  double out_std = 0.02;             // wo (GPT-2: init_std / sqrt(2 * layers))
  ProjectionMatmul projection = {};  // the wqkv (site 0) and wo (site 1) products; empty: matmul

  int64_t resolved_kv_heads() const { return kv_heads == 0 ? heads : kv_heads; }
  int64_t head_dim() const { return dim / heads; }
  // Checks dim % heads, heads % kv_heads and an even head_dim with RoPE (ValueError).
  void validate() const;

  // {"wqkv", "wo"} and, with bias, {"bqkv", "bo"}.
  Tree init(ParamScope scope) const;
  // x [B, T, dim] -> [B, T, dim]. With `cache`, x follows the cache's S positions:
  // positions (RoPE) start at S, queries see all cached keys plus the causal part of
  // the new ones, and the new keys and values are appended to the cache.
  Array operator()(const Tree& p, const Array& x, KVState* cache = nullptr) const;
  // x [B, T, dim] -> [B, T, dim] for packed documents: each token attends causally
  // within its own document, RoPE at packing.positions. Equal, row by row, to running
  // each document alone. No cache (training and scoring).
  Array operator()(const Tree& p, const Array& x, const Packing& packing) const;

 private:
  Array forward(const Tree& p, const Array& x, KVState* cache, const Packing* packing) const;
};

}  // namespace tessera::nn
