// Causal / masked scaled-dot-product attention, tiled flash-style on the CPU:
// O(T) extra memory (no [T, S] score matrix), online softmax, fully masked causal
// blocks skipped. Grouped-query attention: query head h reads kv head h / (H / Hkv).
//
// Layouts: q, out: [B, H, T, D]; k, v: [B, Hkv, S, D]; lse: [B, H, T] of
// accumulation_dtype(dtype). mask (optional, Bool, true = attend) is read at
// mask[b*mask_b_stride + h*mask_h_stride + t*S + s] (strides 0 to broadcast).
// segments (optional, int32 [B, T], needs T == S): query t sees key s only when
// segments[b*T + s] == segments[b*T + t] (packed documents); (query block, key block)
// tiles whose id ranges do not overlap are skipped, so sorted ids cost less than causal.
// Causal (top-left aligned, like PyTorch's is_causal): query t sees keys s <= t.
// A row with no visible key outputs 0 and lse = -inf.
// dtypes: float64, float32, bfloat16, float16 (computed in float32, float64 for float64;
// bfloat16 on bf16 dot-product units where attention_bf16_native(): attention_avx512bf16.h).
#pragma once

#include <cstdint>

#include "tessera/base/dtype.h"

namespace tessera::cpu {

struct AttentionShape {
  int64_t batch = 1, heads = 1, kv_heads = 1, q_len = 0, kv_len = 0, head_dim = 0;
  bool causal = false;
  double scale = 1.0;
  const void* mask = nullptr;
  int64_t mask_b_stride = 0, mask_h_stride = 0;
  const int32_t* segments = nullptr;
};

void attention_forward(DType dtype, const AttentionShape& shape, const void* q, const void* k, const void* v, void* out,
                       void* lse);

// dq, dk, dv have the shapes of q, k, v and are overwritten. Recomputes the
// probabilities blockwise from lse (no stored score matrix).
void attention_backward(DType dtype, const AttentionShape& shape, const void* q, const void* k, const void* v,
                        const void* out, const void* lse, const void* dout, void* dq, void* dk, void* dv);

}  // namespace tessera::cpu
