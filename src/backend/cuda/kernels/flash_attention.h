// Causal / masked scaled-dot-product attention on CUDA, FlashAttention-2 style: tiled
// over queries and keys with an online softmax in fp32, O(T) extra memory (no [T, S]
// score matrix), key tiles above the causal diagonal never visited; the backward
// recomputes the probabilities from the forward's lse. Same contract as the CPU kernels
// (backend/cpu/kernels/attention.h), so the CPU backend is the reference:
//
//   scores[t, s] = scale * q[b, h, t, :] . k[b, h / (H / Hkv), s, :]   (grouped-query)
//   visible(t, s) = (!causal || s <= t) && (!mask || mask[b, h, t, s])  (causal is
//                   top-left aligned, like PyTorch's is_causal)
//                   && (!segments || segments[b, s] == segments[b, t])  (T == S)
//   lse[b, h, t]  = log sum_{visible s} exp(scores[t, s])               (natural log)
//   out[b, h, t]  = sum_{visible s} exp(scores[t, s] - lse[t]) v[b, kvh, s, :]
// A row with no visible key gets out = 0 and lse = -inf (and zero gradients).
//
// Layouts (dense, row-major): q, out, dout, dq: [B, H, T, D]; k, v, dk, dv: [B, Hkv, S, D];
// lse: [B, H, T] float32 (the accumulation dtype of every supported dtype). mask
// (optional, Bool bytes, nonzero = attend) is read at
// mask[b * mask_b_stride + h * mask_h_stride + t * S + s] (strides 0 broadcast).
// segments (optional, int32 [B, T], T == S): packed documents' ids, read at
// segments[b * T + t]; tested per pair (no tile skipping yet) by the v2 tensor-core
// kernels and the fp32 kernels (the v1 tensor-core kernels take none: fp32 instead).
// dtypes: float32, bfloat16, float16 (stored in their type, computed in float32; float64
// is not supported on the GPU). head_dim D <= 256.
//
// Kernels:
//  * bfloat16 / float16 with D = 64 or 128, no mask, 16-byte aligned tensors, sm_80+:
//    tensor cores (mma.sync m16n8k16, fp32 accumulators), 64 x 64 tiles (v1); v2
//    (TESSERA_ATTENTION_KERNEL, below) adds cp.async double buffering, ldmatrix operands
//    and 128-row CTAs (flash_attention_forward_v2.cu, flash_attention_backward_v2.cu).
//  * everything else (float32, other D, masks, segment ids under v1): fp32 CUDA-core kernels (float32 math
//    throughout, so float32 matches the CPU to ~1e-6).
// The backward is deterministic (no atomics): delta = rowsum(dout * out) first, then one
// kernel owns dK/dV of a key tile (summing the G query heads of a kv head in a fixed
// order) and a second owns dQ of a query tile (recomputing P and dP: 7 tile GEMMs
// instead of 5, the price of no float atomics).
//
// Launchers only queue work on `stream`: no host synchronization, no allocation (the
// backward's scratch comes from the caller), so they can be captured in a CUDA graph.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "tessera/base/dtype.h"

namespace tessera::cuda {

struct FlashAttentionShape {
  int64_t batch = 1, heads = 1, kv_heads = 1, q_len = 0, kv_len = 0, head_dim = 0;
  bool causal = false;
  double scale = 1.0;
  const void* mask = nullptr;  // device pointer or null
  int64_t mask_b_stride = 0, mask_h_stride = 0;
  const int32_t* segments = nullptr;  // device pointer or null
};

// Which kernels run: Auto picks the tensor-core kernels where they apply (see above);
// Generic forces the fp32 CUDA-core kernels (tests compare both against the CPU).
enum class FlashAttentionPath { Auto, Generic };

// Which tensor-core kernels Auto runs, from TESSERA_ATTENTION_KERNEL (read on every call,
// so a test can switch it in-process): V2 (the default: the kernels of
// flash_attention_forward_v2.cu and flash_attention_backward_v2.cu where they apply) or
// V1 (the first kernels, kept to compare). An Error for any other value.
enum class FlashAttentionKernel { V1, V2 };
FlashAttentionKernel flash_attention_kernel();

// True when Auto would use the tensor-core kernels for this dtype and shape on the
// current device (given 16-byte aligned tensors).
bool flash_attention_uses_tensor_cores(DType dtype, const FlashAttentionShape& shape);

// out [B, H, T, D] (dtype) and lse [B, H, T] (float32) are overwritten.
void flash_attention_forward(DType dtype, const FlashAttentionShape& shape, const void* q, const void* k, const void* v,
                             void* out, float* lse, cudaStream_t stream,
                             FlashAttentionPath path = FlashAttentionPath::Auto);

// Device scratch the backward needs (delta: B * H * T floats), in bytes.
size_t flash_attention_backward_scratch_bytes(const FlashAttentionShape& shape);

// dq, dk, dv (the shapes and dtype of q, k, v) are overwritten. out and lse are the
// forward's outputs for the same inputs; scratch holds at least
// flash_attention_backward_scratch_bytes(shape) bytes, 4-byte aligned.
void flash_attention_backward(DType dtype, const FlashAttentionShape& shape, const void* q, const void* k,
                              const void* v, const void* out, const float* lse, const void* dout, void* dq, void* dk,
                              void* dv, void* scratch, cudaStream_t stream,
                              FlashAttentionPath path = FlashAttentionPath::Auto);

}  // namespace tessera::cuda
