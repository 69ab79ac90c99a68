// int8 GEMMs with dynamic symmetric quantization on the device (AQT, quantized_matmul):
// the CPU's algorithm (backend/cpu/kernels/matmul_int8.h) step for step, so a GPU run
// quantizes to the same bytes and gives bitwise the CPU's C:
//
//   per row of op(A) and per column of op(B) over the contraction K:
//     amax = max |x|; scale = amax / 127, inv = 127 / amax (0 and 0 when amax is 0; a
//     non-finite value makes the scale NaN and the inverse 0)
//     nearest: q = rint(x * inv); stochastic: q = floor(x * inv + u), u in [0, 1) from
//     the CPU's hash of (seed, p, the bits of x); clamped to [-127, 127]
//   int32 sums of the int8 products (exact), then c = (float(acc) * scale_a) * scale_b,
//   rounded once to C's dtype.
//
// Steps, all queued on the stream (nothing waits for the host, so a step with it can be
// captured in a CUDA graph): the scales of the lines (rows of op(A), columns of op(B)),
// the lines quantized into [lines, k_pad] int8 rows (a 32x32 shared-memory transpose for
// an operand stored with the lines as columns), the product by cuBLASLt (int8 x int8 ->
// int32, CUBLAS_COMPUTE_32I, the "TN" form its int8 kernels need: both quantized
// operands have K contiguous) or, where cuBLASLt has no algorithm, a dp4a kernel (the
// same exact sums), then one dequantizing pass with the bias of a fused epilogue.
//
// The stochastic-rounding seed comes from the op's key, read on the device: seed =
// splitmix64(key, salt, operand), QuantizedMatmul::rounding_seed's formula.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/kernels/gemm.h"
#include "tessera/base/dtype.h"

namespace tessera::cuda {

struct QuantizedGemmShape {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false;  // A stored [k, m], else [m, k]
  bool trans_b = false;  // B stored [n, k], else [k, n]
};

// How one operand rounds: to nearest, or stochastically with the seed derived on the
// device from key (2 uint32 words, device memory), salt and operand (0: A, 1: B).
struct DeviceRounding {
  bool stochastic = false;
  const uint32_t* key = nullptr;
  uint32_t salt = 0;
  int operand = 0;
};

// The fused epilogue's first part: c = s + bias (bias_first: bias + s), rounded to C's
// dtype; with pre_activation set, the sum goes there instead of to c (the caller then
// runs the activation from it into c).
struct QuantizedEpilogue {
  const void* bias = nullptr;  // n elements of C's dtype
  bool bias_first = false;
  void* pre_activation = nullptr;
};

// The device scratch quantized_gemm needs for `shape` (its cuBLASLt workspace included).
size_t quantized_gemm_scratch_bytes(const QuantizedGemmShape& shape);

// c [m, n] (float32 or bfloat16, as a and b) = the product above; `scratch` holds
// quantized_gemm_scratch_bytes(shape) bytes, 256-byte aligned. gemm_options().reference_only
// (tests) takes the dp4a kernel instead of cuBLASLt.
void quantized_gemm(DType dtype, const QuantizedGemmShape& shape, const void* a, const void* b, void* c,
                    const DeviceRounding& round_a, const DeviceRounding& round_b, const QuantizedEpilogue& epilogue,
                    const GemmContext& context, void* scratch);

// ---- the kernels' launchers (quantized_gemm.cu) ----

// Lines of an operand: element (line l, contraction index p) at base[l * line_stride +
// p * elem_stride], with (line_stride, elem_stride) = (k, 1) or (1, lines).
struct QuantLines {
  const void* base = nullptr;
  int64_t lines = 0, k = 0;
  bool contiguous = true;  // (k, 1); else (1, lines)
};
// scale[l], inv[l] of each line.
void launch_line_scales(DType dtype, const QuantLines& x, float* scale, float* inv, cudaStream_t stream);
// q [lines, k_pad] int8 (zeros for p >= k).
void launch_quantize_lines(DType dtype, const QuantLines& x, const float* inv, const DeviceRounding& rounding,
                           int8_t* q, int64_t k_pad, cudaStream_t stream);
// acc [m, ldc] int32 = qa [m, k_pad] qb [n, k_pad]^T, exact (dp4a).
void launch_int8_gemm_reference(const int8_t* qa, const int8_t* qb, int64_t m, int64_t n, int64_t k_pad, int32_t* acc,
                                int64_t ldc, cudaStream_t stream);
// c [m, n] = (float(acc) * sa[i]) * sb[j], rounded, then the epilogue's bias.
void launch_dequantize(DType dtype, const int32_t* acc, int64_t ldc, const float* sa, const float* sb, int64_t m,
                       int64_t n, const QuantizedEpilogue& epilogue, void* c, cudaStream_t stream);

}  // namespace tessera::cuda
