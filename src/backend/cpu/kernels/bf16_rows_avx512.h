// Rows of float32 GEMM sums stored as bf16 through a GEMM epilogue, on AVX-512: the
// store of the bf16 GEMM kernels (matmul_avx512bf16.cpp) and of the int8 kernels'
// dequantized rows (matmul_int8.cpp). Bitwise the unfused ops (matmul.cpp's
// bf16_epilogue_rows): the sum rounded to bf16, the bias added in float32 and rounded,
// the activation in float32 on that rounded pre-activation, rounded again, with the
// scalar cast's rounding (nearest even, NaNs made quiet, denormals kept). One pass over
// the row instead of five casts. Only for files that compile AVX-512 code behind a
// run-time check (TESSERA_HAS_AVX512_KERNELS).
#pragma once

#include <cstdint>

#include "backend/cpu/kernels/elementwise.h"
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

// Stores the lanes of `mask` of x (already bf16 values) as bf16.
TESSERA_TARGET_BF16_ROWS inline void store_bf16(bfloat16* out, __m512 x, __mmask16 mask) {
  _mm512_mask_cvtepi32_storeu_epi16(out, mask, _mm512_maskz_srli_epi32(0xffff, _mm512_castps_si512(x), 16));
}

// out[0, n) = the epilogue of sums[0, n); pre (or null) keeps the pre-activation when
// there is an activation.
TESSERA_TARGET_BF16_ROWS inline void store_row(const float* sums, int64_t n, const Epilogue& e, bfloat16* out,
                                               bfloat16* pre) {
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 mask = n - j >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - j)) - 1);
    __m512 x = round_to_bf16(_mm512_maskz_loadu_ps(mask, sums + j));
    if (e.bias) {
      const __m512 b = _mm512_maskz_loadu_ps(mask, e.bias + j);
      x = round_to_bf16(e.bias_first ? _mm512_add_ps(b, x) : _mm512_add_ps(x, b));
    }
    if (!e.has_activation) {
      store_bf16(out + j, x, mask);
    } else {
      store_bf16((pre ? pre : out) + j, x, mask);
      _mm512_mask_storeu_ps(e.row + j, mask, x);
    }
  }
  if (e.has_activation) {  // the float32 activation of the unfused op, then its rounding
    unary_span(e.activation, DType::Float32, e.row, e.row, n);
    cast_span(DType::Float32, e.row, DType::BFloat16, out, n);
  }
}

}  // namespace tessera::cpu::bf16_rows

#endif
