// Attention backward, FlashAttention-2 style, deterministic (no atomics). With
// P = exp(scale Q K^T - lse) recomputed tile by tile from the forward's lse:
//   delta_t = sum_d dO[t, d] O[t, d]                        (delta_kernel)
//   dP = dO V^T,  dS = P * (dP - delta)                      (per tile)
//   dV = P^T dO,  dK = scale dS^T Q                          (dkdv kernels: own a key tile)
//   dQ = scale dS K                                          (dq kernels: own a query tile)
// The dK/dV kernel loops over the query tiles of the G query heads that share its kv
// head (grouped-query attention) in a fixed order, so every sum has one order; the dQ
// kernel recomputes S and dP instead of receiving dS through atomics (7 tile GEMMs per
// visible tile pair instead of 5). Causal: the dK/dV kernel starts at the query tile
// holding its first key, the dQ kernel stops at the key tile holding its last query.
//
// Kernels (choice as in the forward, see flash_attention.h), one file per path:
//  * flash_attention_backward_tensor_core.cu: bwd_dkdv_tc_kernel<T, D, kBM>,
//    bwd_dq_tc_kernel<T, D>: bf16/f16 tensor cores, D =
//    64/128, 4 warps; each warp owns 16 rows (keys, resp. queries) of the CTA's 64.
//    Operands that enter an MMA as B with pairs along the row dimension are kept
//    transposed in shared memory (Q^T, dO^T, K^T), so every fragment is one 32-bit load.
//  * flash_attention_backward_generic.cu: bwd_dkdv_generic_kernel,
//    bwd_dq_generic_kernel: fp32 CUDA cores, any D <= 256, masks.
// This file: the delta kernel and the entry point that picks the path.
#include <algorithm>

#include "backend/cuda/kernels/flash_attention.h"
#include "backend/cuda/kernels/flash_attention_backward_kernels.h"
#include "backend/cuda/kernels/flash_attention_common.cuh"
#include "backend/cuda/kernels/flash_attention_v2.cuh"

namespace tessera::cuda {
namespace flash {
namespace {

// ---------------------------------------------------------------------------------
// delta[r] = sum_d dout[r, d] * out[r, d] (float32), one warp per row r = (b H + h) T + t
// (delta contiguous; out and dout rows at b os.batch + h os.head + t os.row).

constexpr int kDeltaWarps = 8;

template <typename T>
__global__ void __launch_bounds__(256) delta_kernel(const Params p) {
  const int warp = thread_index() / 32, lane = thread_index() % 32;
  const int64_t rows = p.B * p.H * p.T, row = block_index() * kDeltaWarps + warp;
  if (row >= rows) return;  // whole warps; no CTA-wide synchronization below
  const int64_t bh = row / p.T, t = row - bh * p.T, b = bh / p.H, h = bh - b * p.H;
  const int64_t at = b * p.os.batch + h * p.os.head + t * p.os.row;
  const T* o = static_cast<const T*>(p.out) + at;
  const T* dout = static_cast<const T*>(p.dout) + at;
  float sum = 0.0f;
  for (int d = lane; d < p.D; d += 32) sum = fmaf(to_float(dout[d]), to_float(o[d]), sum);
  sum = warp_sum(sum);
  if (lane == 0) p.delta[row] = sum;
}

// ---------------------------------------------------------------------------------
// Launchers.

template <typename T>
void launch_delta(const Params& p, cudaStream_t stream) {
  launch(delta_kernel<T>, ceil_div(p.B * p.H * p.T, kDeltaWarps), 32 * kDeltaWarps, 0, stream, p);
}

}  // namespace
}  // namespace flash

size_t flash_attention_backward_scratch_bytes(const FlashAttentionShape& shape) {
  return sizeof(float) * static_cast<size_t>(std::max<int64_t>(shape.batch * shape.heads * shape.q_len, 0));
}

void flash_attention_backward(DType dtype, const FlashAttentionShape& shape, const void* q, const void* k,
                              const void* v, const void* out, const float* lse, const void* dout, void* dq, void* dk,
                              void* dv, void* scratch, cudaStream_t stream, FlashAttentionPath path) {
  using namespace flash;
  validate("flash_attention_backward", dtype, shape);
  const int64_t q_elems = shape.batch * shape.heads * shape.q_len * shape.head_dim;
  const int64_t kv_elems = shape.batch * shape.kv_heads * shape.kv_len * shape.head_dim;
  if (q_elems == 0 && kv_elems == 0) return;  // nothing to write
  const int64_t rows = shape.batch * shape.heads * shape.q_len;
  if ((q_elems > 0 && (q == nullptr || out == nullptr || dout == nullptr || dq == nullptr)) ||
      (rows > 0 && (lse == nullptr || scratch == nullptr)) ||
      (kv_elems > 0 && (k == nullptr || v == nullptr || dk == nullptr || dv == nullptr)))
    throw_value_error("flash_attention_backward: null data pointer for a non-empty tensor");
  if (reinterpret_cast<uintptr_t>(scratch) % alignof(float) != 0)
    throw_value_error("flash_attention_backward: scratch must be 4-byte aligned");
  Params p = make_params(shape);
  p.q = q;
  p.k = k;
  p.v = v;
  p.out = out;
  p.dout = dout;
  p.lse = const_cast<float*>(lse);  // read only in the backward kernels
  p.delta = static_cast<float*>(scratch);
  p.dq = dq;
  p.dk = dk;
  p.dv = dv;
  const bool tc = path == FlashAttentionPath::Auto && tensor_core_shape(dtype, shape) && aligned16(q) && aligned16(k) &&
                  aligned16(v) && aligned16(dout) && aligned16(dq) && aligned16(dk) && aligned16(dv);
  switch (dtype) {
    case DType::BFloat16:
      launch_delta<__nv_bfloat16>(p, stream);
      break;
    case DType::Float16:
      launch_delta<__half>(p, stream);
      break;
    default:
      launch_delta<float>(p, stream);
      break;
  }
  const bool v2 = tc && flash_attention_kernel() == FlashAttentionKernel::V2 && launch_backward_v2(dtype, p, stream);
  if (v2) return;
  if (tc && tensor_core_v1_shape(dtype, shape)) {
    launch_backward_tensor_core(dtype, p, stream);
  } else {
    launch_backward_generic(dtype, p, stream);
  }
}

bool flash_attention_backward_strided(DType dtype, const FlashAttentionShape& shape, const FlashAttentionLayout& layout,
                                      const void* q, const void* k, const void* v, const void* out, const float* lse,
                                      const void* dout, void* dq, void* dk, void* dv, void* scratch,
                                      cudaStream_t stream) {
  using namespace flash;
  validate("flash_attention_backward_strided", dtype, shape);
  if (!strided_v2_shape(dtype, shape, layout)) return false;
  const int64_t q_rows = shape.batch * shape.heads * shape.q_len, kv_rows = shape.batch * shape.kv_heads * shape.kv_len;
  if (q_rows == 0 && kv_rows == 0) return true;  // nothing to write (head_dim is 64 or 128)
  if ((q_rows > 0 &&
       (q == nullptr || out == nullptr || dout == nullptr || dq == nullptr || lse == nullptr || scratch == nullptr)) ||
      (kv_rows > 0 && (k == nullptr || v == nullptr || dk == nullptr || dv == nullptr)))
    throw_value_error("flash_attention_backward_strided: null data pointer for a non-empty tensor");
  if (reinterpret_cast<uintptr_t>(scratch) % alignof(float) != 0)
    throw_value_error("flash_attention_backward_strided: scratch must be 4-byte aligned");
  if (!(aligned16(q) && aligned16(k) && aligned16(v) && aligned16(dout) && aligned16(dq) && aligned16(dk) &&
        aligned16(dv)))
    return false;
  Params p = make_params(shape);
  p.qs = layout.q;
  p.kvs = layout.kv;
  p.os = layout.o;
  p.q = q;
  p.k = k;
  p.v = v;
  p.out = out;
  p.dout = dout;
  p.lse = const_cast<float*>(lse);  // read only in the backward kernels
  p.delta = static_cast<float*>(scratch);
  p.dq = dq;
  p.dk = dk;
  p.dv = dv;
  if (!backward_v2_applies(dtype, p)) return false;  // before the delta kernel: nothing launched
  if (dtype == DType::BFloat16)
    launch_delta<__nv_bfloat16>(p, stream);
  else
    launch_delta<__half>(p, stream);
  launch_backward_v2(dtype, p, stream);
  return true;
}

}  // namespace tessera::cuda
