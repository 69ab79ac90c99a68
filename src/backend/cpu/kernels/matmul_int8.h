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
// Kernels (Int8Kernel): AMX-INT8 tiles (TDPBSSD, int8 x int8 -> int32) when the CPU and
// the OS allow them; else AVX512-VNNI (VPDPBUSD, u8 x s8 -> int32: B is offset by +128
// and 128 times each row sum of A subtracted again, exact in int32; Zen 4, Ice Lake,
// Cooper Lake; matmul_int8_vnni.cpp); else the same quantized values multiplied exactly
// in float64 (dgemm). int32 sums are exact, so every kernel gives bitwise the same C,
// bitwise identical for any thread count. TESSERA_CPU_INT8_GEMM (auto | reference | amx
// | avx512vnni) forces one.
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

enum class Int8Kernel { Reference, Amx, Avx512Vnni };
const char* int8_kernel_name(Int8Kernel kernel);  // "reference", "amx", "avx512vnni": the flag's values

// Whether `kernel` can run here (CPU, OS, build); `why_not` says why not.
bool int8_kernel_usable(Int8Kernel kernel, const char** why_not = nullptr);

// The kernel quantized_matmul takes, decided once: auto takes AMX, else AVX512-VNNI, else
// the reference; a forced kernel this machine cannot run falls back to the reference (the
// description says why).
struct Int8GemmPath {
  Int8Kernel kernel = Int8Kernel::Reference;
  bool native = false;      // kernel != Reference: int8 products on the CPU's int8 units
  std::string description;  // for `tessera info` and the quant report
};
const Int8GemmPath& int8_gemm_path();

// C [m, n] (contiguous, overwritten) for one problem (shape.batch must be 1); A, B and C
// share `dtype`, float32 or bfloat16. With `epilogue` (matmul.h: bias, activation,
// pre-activation output, all of `dtype`), it runs on each row as it is dequantized, with
// bitwise the unfused ops' results.
void quantized_matmul(DType dtype, const MatmulShape& shape, const void* a, const void* b, void* c,
                      const Int8Rounding& round_a, const Int8Rounding& round_b, const GemmEpilogue* epilogue = nullptr);

// On `kernel` whatever the path (the tests compare the kernels bitwise, the benchmarks
// time them). ValueError if it cannot run here.
void quantized_matmul(Int8Kernel kernel, DType dtype, const MatmulShape& shape, const void* a, const void* b, void* c,
                      const Int8Rounding& round_a, const Int8Rounding& round_b, const GemmEpilogue* epilogue = nullptr);

// The float64 path whatever the machine.
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
