// Rows of float32 GEMM sums stored as bf16 through a GEMM epilogue, on AVX-512: the
// store of the bf16 GEMM kernels (matmul_avx512bf16.cpp) and of the int8 kernels'
// dequantized rows (matmul_int8.cpp). Bitwise the unfused ops (matmul.cpp's
// bf16_epilogue_rows): the sum rounded to bf16, the bias added in float32 and rounded,
// the activation in float32 on that rounded pre-activation, rounded again, with the
// scalar cast's rounding (nearest even, NaNs made quiet, denormals kept). One pass over
// the row instead of five casts. Only for files that compile AVX-512 code behind a
// run-time check (TESSERA_HAS_AVX512_KERNELS).
#pragma once

#include <cmath>
#include <cstdint>

#include "backend/cpu/kernels/elementwise.h"
#include "backend/cpu/kernels/vector_math.h"
#include "tessera/base/dtype.h"

namespace tessera::cpu::bf16_rows {

// (Declared on every build: the kernels' interfaces take it.)
struct Epilogue {
  const float* bias = nullptr;  // the row's bias widened to float32, or null
  bool bias_first = false;      // bias + sum instead of sum + bias (NaN payloads)
  bool has_activation = false;
  UnaryOp activation = UnaryOp::Copy;
  float* row = nullptr;  // n floats of scratch for the activation (may be the sums themselves)
};

}  // namespace tessera::cpu::bf16_rows

#if defined(__x86_64__) && TESSERA_HAS_AVX512_KERNELS
#include <immintrin.h>

#define TESSERA_TARGET_BF16_ROWS __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

namespace tessera::cpu::bf16_rows {

// float_to_bf16 of each lane, widened back to float32. (The maskz shifts: the plain
// intrinsics start from _mm512_undefined_*, which GCC 12's -Wmaybe-uninitialized
// reports once inlined.)
TESSERA_TARGET_BF16_ROWS inline __m512 round_to_bf16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  const __m512i odd = _mm512_and_si512(_mm512_maskz_srli_epi32(0xffff, u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd));
  r = _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x00400000));
  return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
}

// vector_math.h's exp and gelu_tanh on 16 lanes: the same operations in the same order,
// so each lane's result is bitwise the AVX2 function's (the unfused op's).
namespace avx512_math {

TESSERA_TARGET_BF16_ROWS inline __m512 exp_poly(__m512 x, __m512& n) {
  n = _mm512_maskz_roundscale_ps(0xffff, _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 r2 = _mm512_mul_ps(r, r);
  return _mm512_fmadd_ps(p, r2, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
}

TESSERA_TARGET_BF16_ROWS inline __m512 exp(__m512 x) {
  const __mmask16 in_range = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ) &
                             _mm512_cmp_ps_mask(x, _mm512_set1_ps(88.0f), _CMP_LE_OQ);
  const __m512i bias = _mm512_set1_epi32(127);
  constexpr __mmask16 kAll = 0xffff;  // (the maskz forms: see store_bf16)
  __m512 n;
  if (in_range == kAll) {
    const __m512 p = exp_poly(x, n);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(_mm512_maskz_slli_epi32(
                                kAll, _mm512_add_epi32(_mm512_maskz_cvtps_epi32(kAll, n), bias), 23)));
  }
  const __m512 hi = _mm512_set1_ps(88.72283935546875f), lo = _mm512_set1_ps(-103.972084045410f);
  const __m512 p = exp_poly(_mm512_maskz_min_ps(kAll, _mm512_maskz_max_ps(kAll, x, lo), hi), n);
  const __m512i ni = _mm512_maskz_cvtps_epi32(kAll, n);
  const __m512i n1 = _mm512_maskz_srai_epi32(kAll, ni, 1);
  const __m512i n2 = _mm512_sub_epi32(ni, n1);
  const __m512 s1 = _mm512_castsi512_ps(_mm512_maskz_slli_epi32(kAll, _mm512_add_epi32(n1, bias), 23));
  const __m512 s2 = _mm512_castsi512_ps(_mm512_maskz_slli_epi32(kAll, _mm512_add_epi32(n2, bias), 23));
  __m512 y = _mm512_mul_ps(_mm512_mul_ps(p, s1), s2);
  y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, hi, _CMP_GT_OQ), _mm512_set1_ps(INFINITY));
  y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ), _mm512_setzero_ps());
  return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}

// 0.5 x (1 + tanh(u)) = x / (1 + e^(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3).
TESSERA_TARGET_BF16_ROWS inline __m512 gelu_tanh(__m512 x) {
  const __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
  const __m512 u2 = _mm512_mul_ps(_mm512_set1_ps(static_cast<float>(-2.0 * vmath::kSqrt2OverPi)),
                                  _mm512_fmadd_ps(_mm512_set1_ps(static_cast<float>(vmath::kGeluCubic)), x3, x));
  return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), exp(u2)));
}

}  // namespace avx512_math

// Stores the lanes of `mask` of x (already bf16 values) as bf16.
TESSERA_TARGET_BF16_ROWS inline void store_bf16(bfloat16* out, __m512 x, __mmask16 mask) {
  _mm512_mask_cvtepi32_storeu_epi16(out, mask, _mm512_maskz_srli_epi32(0xffff, _mm512_castps_si512(x), 16));
}

// The lanes of `mask` of columns [j, j + 16) of a row: `sum` (the GEMM's float32 sums)
// through the epilogue into out (and pre, or null, the pre-activation when there is an
// activation). Every chunk of a row first, then finish_row.
TESSERA_TARGET_BF16_ROWS inline void store_chunk(__m512 sum, int64_t j, __mmask16 mask, const Epilogue& e,
                                                 bfloat16* out, bfloat16* pre) {
  __m512 x = round_to_bf16(sum);
  if (e.bias) {
    const __m512 b = _mm512_maskz_loadu_ps(mask, e.bias + j);
    x = round_to_bf16(e.bias_first ? _mm512_add_ps(b, x) : _mm512_add_ps(x, b));
  }
  if (!e.has_activation) {
    store_bf16(out + j, x, mask);
  } else if (e.activation == UnaryOp::GeluTanh) {  // GELU-tanh (the MLP's) in the same pass
    if (pre) store_bf16(pre + j, x, mask);
    store_bf16(out + j, round_to_bf16(avx512_math::gelu_tanh(x)), mask);
  } else {  // other activations through the float32 span in finish_row
    store_bf16((pre ? pre : out) + j, x, mask);
    _mm512_mask_storeu_ps(e.row + j, mask, x);
  }
}

// After the n columns' chunks: an activation other than GELU-tanh runs as the unfused
// op's float32 span on the rounded pre-activations, then its rounding.
inline void finish_row(int64_t n, const Epilogue& e, bfloat16* out) {
  if (!e.has_activation || e.activation == UnaryOp::GeluTanh) return;
  unary_span(e.activation, DType::Float32, e.row, e.row, n);
  cast_span(DType::Float32, e.row, DType::BFloat16, out, n);
}

TESSERA_TARGET_BF16_ROWS inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
}

// out[0, n) = the epilogue of sums[0, n); pre (or null) keeps the pre-activation when
// there is an activation.
TESSERA_TARGET_BF16_ROWS inline void store_row(const float* sums, int64_t n, const Epilogue& e, bfloat16* out,
                                               bfloat16* pre) {
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 mask = tail_mask(n - j);
    store_chunk(_mm512_maskz_loadu_ps(mask, sums + j), j, mask, e, out, pre);
  }
  finish_row(n, e, out);
}

}  // namespace tessera::cpu::bf16_rows

#endif
