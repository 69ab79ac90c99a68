// int8 GEMMs with dynamic symmetric quantization, as AQT trains (Google's Accurate
// Quantized Training): C = dequant(q(op(A)) q(op(B))) where each row of op(A) and each
// column of op(B) gets its own scale over the contraction axis K (per-token activations,
// per-channel weights), the int8 products accumulate exactly in int32 and the epilogue
// multiplies by both scales.
//
// Quantization of a row x (K values, read as float32):
//   amax = max |x_p|;  scale = amax / 127;  inv = 127 / amax  (both 0 when amax is 0)
//   nearest:     q_p = round_half_even(x_p * inv)
//   stochastic:  q_p = floor(x_p * inv + u_p),  u_p in [0, 1) from a hash of (seed, p,
//                the bits of x_p): unbiased, E[q_p] = x_p * inv, as AQT rounds gradients.
//   q_p is clamped to [-127, 127].
// The noise depends on the contraction index and the value, not on the row, so a row
// quantizes to the same bytes wherever it sits (a shard of the token axis included).
// Result: c_ij = (float(acc_ij) * scale_a_i) * scale_b_j, rounded once to C's dtype.
//
// Paths: AMX-INT8 tiles (TDPBSSD, int8 x int8 -> int32) when the CPU and the OS allow
// them; otherwise the same quantized values multiplied exactly in float64 (dgemm), so
// both paths give bitwise the same C. Either way the result is bitwise identical for
// any thread count. TESSERA_CPU_INT8_GEMM=reference forces the float64 path.
#pragma once

#include <cstdint>
#include <string>

#include "backend/cpu/kernels/matmul.h"
#include "tessera/base/dtype.h"

namespace tessera::cpu {

struct Int8Rounding {
  bool stochastic = false;
  uint64_t seed = 0;  // of the stochastic rounding noise
};

struct Int8GemmPath {
  bool native = false;      // AMX-INT8 tiles
  std::string description;  // for `tessera info` and the quant report
};
const Int8GemmPath& int8_gemm_path();

// C [m, n] (contiguous, overwritten) for one problem (shape.batch must be 1); A, B and C
// share `dtype`, float32 or bfloat16. With `epilogue` (matmul.h: bias, activation,
// pre-activation output, all of `dtype`), it runs on each row as it is dequantized, with
// bitwise the unfused ops' results.
void quantized_matmul(DType dtype, const MatmulShape& shape, const void* a, const void* b, void* c,
                      const Int8Rounding& round_a, const Int8Rounding& round_b, const GemmEpilogue* epilogue = nullptr);

// The float64 path whatever the machine (the tests compare the two paths bitwise).
void quantized_matmul_reference(DType dtype, const MatmulShape& shape, const void* a, const void* b, void* c,
                                const Int8Rounding& round_a, const Int8Rounding& round_b,
                                const GemmEpilogue* epilogue = nullptr);

// The stochastic-rounding noise u in [0, 1) of the element with contraction index p and
// float32 bits `bits` (exposed for the tests' reference).
inline float int8_rounding_noise(uint64_t seed, uint32_t p, uint32_t bits) {
  auto fmix = [](uint32_t h) {
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    return h;
  };
  // One murmur3 finalizer over the value, the index and both seed words.
  const uint32_t h = fmix((bits ^ static_cast<uint32_t>(seed) ^ (p * 0x9e3779b1u)) + static_cast<uint32_t>(seed >> 32));
  return static_cast<float>(h >> 8) * (1.0f / 16777216.0f);
}

}  // namespace tessera::cpu
