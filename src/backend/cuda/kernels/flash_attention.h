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
// Layouts (dense, row-major; the strided entry points below take others for v2): q, out,
// dout, dq: [B, H, T, D]; k, v, dk, dv: [B, Hkv, S, D];
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
// V1 (the first kernels, kept to compare); "auto" (the default) and "cudnn" (the attention
// evals run cuDNN where it applies, cudnn_attention.h) mean V2 here. An Error for any
// other value.
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

// ---- strided operands (v2 kernels only) ----
// So that attention can read q, k, v straight out of a fused QKV projection and write
// out / dq / dk / dv in place in the packed layouts around it (no transpose, slice or
// concat copies), the v2 kernels take every row of head_dim contiguous elements at
// element strides. Row (b, h, t) of q and dq is at
//   b*q.batch + (h / G)*q.group + (h % G)*q.head + t*q.row    (G = heads / kv_heads),
// row (b, kvh, s) of k, v, dk, dv at b*kv.batch + kvh*kv.head + s*kv.row, row (b, h, t)
// of out and dout at b*o.batch + h*o.head + t*o.row (group unused for kv and o; the
// layouts below set it to head, so that they also describe those kinds to
// flash_attention_copy_rows with group_size 1), each from its own pointer. lse and delta
// stay contiguous [B, H, T] float32.
struct FlashAttentionStrides {
  int64_t batch = 0, group = 0, head = 0, row = 0;
};
struct FlashAttentionLayout {
  FlashAttentionStrides q, kv, o;
};

// The layouts of flash_attention_forward / flash_attention_backward: q, out [B, H, T, D],
// k, v [B, Hkv, S, D] (q.group = G q.head, so the q row is at (b H + h) T D + t D).
//   q: {H T D, G T D, T D, D}   kv: {Hkv S D, S D, S D, D}   o: {H T D, T D, T D, D}
FlashAttentionLayout contiguous_attention_layout(const FlashAttentionShape& shape);

// The fused projection's layout (T == S, else an Error): qkv [B, T, Hkv, G + 2, D] holds,
// per token and kv head, its G query heads, then its k, then its v (W = Hkv (G + 2) D
// elements per token); out and dout [B, T, H, D]. q, k, v then point at qkv, qkv + G D
// and qkv + (G + 1) D; dq, dk, dv likewise into a dqkv buffer of the same layout (the
// three sets of rows are disjoint, so the dK/dV and dQ kernels write one buffer).
//   q: {T W, (G + 2) D, D, W}   kv: {T W, (G + 2) D, (G + 2) D, W}   o: {T H D, D, D, H D}
FlashAttentionLayout packed_qkv_attention_layout(const FlashAttentionShape& shape);

// flash_attention_forward / flash_attention_backward on the v2 kernels with strided
// operands (k and v point at their own first row, e.g. qkv + G D and qkv + (G + 1) D;
// outputs must not overlap inputs). Return false, launching nothing, when v2 does not
// apply: dtype not bfloat16/float16, head_dim not 64/128, a mask, sm < 80,
// TESSERA_ATTENTION_KERNEL=v1, not enough shared memory per block (sm_86/89: the D = 128
// backward), T or S above 2^31 - 256, or a data pointer (q, k, v, out; backward: q, k, v,
// dout, dq, dk, dv) or a stride not 16-byte aligned (a multiple of 8 elements; a stride
// whose index is always 0, e.g. batch when B = 1, is not checked). The caller then copies
// to the contiguous layout (flash_attention_copy_rows) and calls flash_attention_forward
// / flash_attention_backward. Same results, bit for bit, as those on the contiguous
// copies when they take v2. Errors as theirs for invalid arguments (an empty problem
// returns true). scratch as flash_attention_backward's (delta, contiguous).
bool flash_attention_forward_strided(DType dtype, const FlashAttentionShape& shape, const FlashAttentionLayout& layout,
                                     const void* q, const void* k, const void* v, void* out, float* lse,
                                     cudaStream_t stream);
bool flash_attention_backward_strided(DType dtype, const FlashAttentionShape& shape, const FlashAttentionLayout& layout,
                                      const void* q, const void* k, const void* v, const void* out, const float* lse,
                                      const void* dout, void* dq, void* dk, void* dv, void* scratch,
                                      cudaStream_t stream);

// Copies rows of head_dim elements between two layouts of one tensor kind: for b < batch,
// h < heads, t < rows, i < head_dim,
//   dst[b d.batch + (h / group_size) d.group + (h % group_size) d.head + t d.row + i]
//     = src[the same with the strides of src]
// (k, v, out kinds: group_size 1 and group = head). The fallback of the strided entry
// points (e.g. packed -> contiguous before, dq/dk/dv contiguous -> packed after). Any
// dtype of 2 or 4 bytes; 16-byte chunks where both sides allow them. dst must not
// overlap src.
void flash_attention_copy_rows(DType dtype, int64_t batch, int64_t heads, int64_t group_size, int64_t rows,
                               int64_t head_dim, const void* src, const FlashAttentionStrides& src_strides, void* dst,
                               const FlashAttentionStrides& dst_strides, cudaStream_t stream);

}  // namespace tessera::cuda
