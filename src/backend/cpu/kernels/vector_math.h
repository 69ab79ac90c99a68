// Private helpers of the elementwise kernels: float32 transcendental functions on
// 8-wide AVX2 vectors (Cephes-style range reduction + minimax polynomials) and the
// scalar formulas every path shares.
//
// Accuracy against a double reference (tested in tests/backend/test_elementwise.cpp):
// exp, log: |rel err| <= ~2 ulp on normal results; tanh, erf: |abs err| <= 1e-6.
// All functions saturate cleanly for large |x| and propagate NaN / +-Inf.
#pragma once

#include <cmath>
#include <cstdint>

#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace tessera::cpu::vmath {

// Double so the float64 kernels get full precision; float code converts them.
inline constexpr double kSqrt2OverPi = 0.7978845608028654;  // sqrt(2/pi), GELU-tanh
inline constexpr double kGeluCubic = 0.044715;
inline constexpr double kInvSqrt2 = 0.7071067811865476;
inline constexpr double kInvSqrt2Pi = 0.3989422804014327;  // 1/sqrt(2 pi)

#ifdef __AVX2__

inline __m256 set1(double v) { return _mm256_set1_ps(static_cast<float>(v)); }
inline __m256 is_nan(__m256 x) { return _mm256_cmp_ps(x, x, _CMP_UNORD_Q); }

// exp(x) = 2^n * p(r), n = round(x / ln2), r = x - n ln2 (two-part ln2 for exactness),
// p a degree-7 polynomial (Cephes expf).
inline __m256 exp_poly(__m256 x, __m256& n) {
  n = _mm256_round_ps(_mm256_mul_ps(x, set1(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, set1(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, set1(-2.12194440e-4f), r);
  __m256 p = set1(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, set1(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, set1(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, set1(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, set1(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, set1(5.0000001201e-1f));
  __m256 r2 = _mm256_mul_ps(r, r);
  return _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, set1(1.0f)));
}

// When every lane lies in [-87, 88], n is in [-126, 127] and 2^n is one normal float;
// that path skips the clamps, the split scaling and the special-value blends. Both
// paths round once (in the final product by a power of two), so they agree bitwise.
// Otherwise 2^n is applied as two factors so results down to the subnormal range
// (x >= -103.97) are exact scalings, and +-Inf / NaN are patched in.
inline __m256 exp(__m256 x) {
  const __m256 in_range =
      _mm256_and_ps(_mm256_cmp_ps(x, set1(-87.0f), _CMP_GE_OQ), _mm256_cmp_ps(x, set1(88.0f), _CMP_LE_OQ));
  const __m256i bias = _mm256_set1_epi32(127);
  __m256 n;
  if (_mm256_movemask_ps(in_range) == 0xff) {
    __m256 p = exp_poly(x, n);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), bias), 23)));
  }
  const __m256 hi = set1(88.72283935546875f), lo = set1(-103.972084045410f);
  __m256 p = exp_poly(_mm256_min_ps(_mm256_max_ps(x, lo), hi), n);
  __m256i ni = _mm256_cvtps_epi32(n);
  __m256i n1 = _mm256_srai_epi32(ni, 1);
  __m256i n2 = _mm256_sub_epi32(ni, n1);
  __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
  y = _mm256_blendv_ps(y, set1(INFINITY), _mm256_cmp_ps(x, hi, _CMP_GT_OQ));
  y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, lo, _CMP_LT_OQ));
  return _mm256_blendv_ps(y, x, is_nan(x));
}

// log(x) = e ln2 + log(1 + m), x = 2^e (1 + m) with 1 + m in [sqrt(1/2), sqrt(2)),
// log(1 + m) = m - m^2/2 + m^3 P(m) (Cephes logf). Subnormals are pre-scaled by 2^23.
inline __m256 log(__m256 x) {
  const __m256 min_normal = set1(1.17549435e-38f);
  __m256 sub = _mm256_cmp_ps(x, min_normal, _CMP_LT_OQ);
  __m256 xs = _mm256_blendv_ps(x, _mm256_mul_ps(x, set1(8388608.0f)), sub);
  __m256 e_adj = _mm256_and_ps(sub, set1(-23.0f));
  __m256i xi = _mm256_castps_si256(xs);
  __m256 e = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(xi, 23), _mm256_set1_epi32(126)));
  e = _mm256_add_ps(e, e_adj);
  // mantissa in [0.5, 1)
  __m256 m = _mm256_castsi256_ps(
      _mm256_or_si256(_mm256_and_si256(xi, _mm256_set1_epi32(0x007fffff)), _mm256_set1_epi32(0x3f000000)));
  __m256 small = _mm256_cmp_ps(m, set1(0.707106781186547524f), _CMP_LT_OQ);
  e = _mm256_sub_ps(e, _mm256_and_ps(small, set1(1.0f)));
  m = _mm256_add_ps(m, _mm256_and_ps(small, m));
  m = _mm256_sub_ps(m, set1(1.0f));
  __m256 z = _mm256_mul_ps(m, m);
  __m256 p = set1(7.0376836292e-2f);
  p = _mm256_fmadd_ps(p, m, set1(-1.1514610310e-1f));
  p = _mm256_fmadd_ps(p, m, set1(1.1676998740e-1f));
  p = _mm256_fmadd_ps(p, m, set1(-1.2420140846e-1f));
  p = _mm256_fmadd_ps(p, m, set1(1.4249322787e-1f));
  p = _mm256_fmadd_ps(p, m, set1(-1.6668057665e-1f));
  p = _mm256_fmadd_ps(p, m, set1(2.0000714765e-1f));
  p = _mm256_fmadd_ps(p, m, set1(-2.4999993993e-1f));
  p = _mm256_fmadd_ps(p, m, set1(3.3333331174e-1f));
  __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, m), z);
  y = _mm256_fmadd_ps(e, set1(-2.12194440e-4f), y);
  y = _mm256_fnmadd_ps(z, set1(0.5f), y);
  __m256 r = _mm256_add_ps(m, y);
  r = _mm256_fmadd_ps(e, set1(0.693359375f), r);
  // Special values: x < 0 or NaN -> NaN, 0 -> -inf, +inf -> +inf.
  r = _mm256_blendv_ps(r, set1(-INFINITY), _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_EQ_OQ));
  r = _mm256_blendv_ps(r, x, _mm256_cmp_ps(x, set1(INFINITY), _CMP_EQ_OQ));
  __m256 bad = _mm256_or_ps(_mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ), is_nan(x));
  return _mm256_blendv_ps(r, set1(NAN), bad);
}

// tanh: odd polynomial for |x| < 0.625 (Cephes tanhf), else 1 - 2 / (exp(2|x|) + 1).
inline __m256 tanh(__m256 x) {
  const __m256 sign_mask = set1(-0.0f);
  __m256 ax = _mm256_andnot_ps(sign_mask, x);
  __m256 z = _mm256_mul_ps(x, x);
  __m256 p = set1(-5.70498872745e-3f);
  p = _mm256_fmadd_ps(p, z, set1(2.06390887954e-2f));
  p = _mm256_fmadd_ps(p, z, set1(-5.37397155531e-2f));
  p = _mm256_fmadd_ps(p, z, set1(1.33314422036e-1f));
  p = _mm256_fmadd_ps(p, z, set1(-3.33332819422e-1f));
  __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(p, z), x, x);
  __m256 e = exp(_mm256_add_ps(ax, ax));
  __m256 big = _mm256_sub_ps(set1(1.0f), _mm256_div_ps(set1(2.0f), _mm256_add_ps(e, set1(1.0f))));
  big = _mm256_or_ps(big, _mm256_and_ps(sign_mask, x));
  __m256 r = _mm256_blendv_ps(big, small, _mm256_cmp_ps(ax, set1(0.625f), _CMP_LT_OQ));
  return _mm256_blendv_ps(r, x, is_nan(x));
}

inline __m256 sigmoid(__m256 x) {
  __m256 e = exp(_mm256_sub_ps(_mm256_setzero_ps(), x));
  return _mm256_div_ps(set1(1.0f), _mm256_add_ps(set1(1.0f), e));
}

// erf: Taylor series x * sum_k (-1)^k x^2k / (k! (2k+1)) * 2/sqrt(pi) for |x| < 0.5;
// Abramowitz & Stegun 7.1.26 (abs err 1.5e-7) 1 - t P(t) exp(-x^2), t = 1/(1 + 0.3275911|x|)
// beyond; erf(x) rounds to +-1 past |x| = 4.
inline __m256 erf(__m256 x) {
  const __m256 sign_mask = set1(-0.0f);
  __m256 ax = _mm256_min_ps(_mm256_andnot_ps(sign_mask, x), set1(4.0f));
  __m256 z = _mm256_mul_ps(x, x);
  __m256 s = set1(-1.0f / 75600.0f);
  s = _mm256_fmadd_ps(s, z, set1(1.0f / 9360.0f));
  s = _mm256_fmadd_ps(s, z, set1(-1.0f / 1320.0f));
  s = _mm256_fmadd_ps(s, z, set1(1.0f / 216.0f));
  s = _mm256_fmadd_ps(s, z, set1(-1.0f / 42.0f));
  s = _mm256_fmadd_ps(s, z, set1(1.0f / 10.0f));
  s = _mm256_fmadd_ps(s, z, set1(-1.0f / 3.0f));
  s = _mm256_fmadd_ps(s, z, set1(1.0f));
  __m256 small = _mm256_mul_ps(_mm256_mul_ps(s, x), set1(1.1283791670955126f));
  __m256 t = _mm256_div_ps(set1(1.0f), _mm256_fmadd_ps(ax, set1(0.3275911f), set1(1.0f)));
  __m256 p = set1(1.061405429f);
  p = _mm256_fmadd_ps(p, t, set1(-1.453152027f));
  p = _mm256_fmadd_ps(p, t, set1(1.421413741f));
  p = _mm256_fmadd_ps(p, t, set1(-0.284496736f));
  p = _mm256_fmadd_ps(p, t, set1(0.254829592f));
  p = _mm256_mul_ps(p, t);
  __m256 e = exp(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(ax, ax)));
  __m256 big = _mm256_fnmadd_ps(p, e, set1(1.0f));
  big = _mm256_or_ps(big, _mm256_and_ps(sign_mask, x));
  __m256 r = _mm256_blendv_ps(big, small, _mm256_cmp_ps(_mm256_andnot_ps(sign_mask, x), set1(0.5f), _CMP_LT_OQ));
  return _mm256_blendv_ps(r, x, is_nan(x));
}

// 0.5 x (1 + tanh(u)) = x sigmoid(2u): one exp and one division.
inline __m256 gelu_tanh(__m256 x) {
  __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
  __m256 u2 = _mm256_mul_ps(set1(-2.0 * kSqrt2OverPi), _mm256_fmadd_ps(set1(kGeluCubic), x3, x));
  return _mm256_div_ps(x, _mm256_add_ps(set1(1.0f), exp(u2)));
}

inline __m256 gelu_erf(__m256 x) {
  __m256 hx = _mm256_mul_ps(set1(0.5f), x);
  return _mm256_fmadd_ps(hx, erf(_mm256_mul_ps(x, set1(kInvSqrt2))), hx);
}

inline __m256 silu(__m256 x) { return _mm256_mul_ps(x, sigmoid(x)); }

// With s = sigmoid(2u) = 0.5 (1 + tanh u): d/dx = s + 2 x s (1 - s) k (1 + 3 c x^2).
inline __m256 gelu_tanh_grad(__m256 x) {
  __m256 x2 = _mm256_mul_ps(x, x);
  __m256 one = set1(1.0f);
  __m256 u2 = _mm256_mul_ps(set1(-2.0 * kSqrt2OverPi), _mm256_fmadd_ps(_mm256_mul_ps(set1(kGeluCubic), x2), x, x));
  __m256 s = _mm256_div_ps(one, _mm256_add_ps(one, exp(u2)));
  __m256 du = _mm256_mul_ps(set1(2.0 * kSqrt2OverPi), _mm256_fmadd_ps(set1(3.0 * kGeluCubic), x2, one));
  __m256 ss = _mm256_mul_ps(s, _mm256_sub_ps(one, s));
  return _mm256_fmadd_ps(_mm256_mul_ps(x, ss), du, s);
}

inline __m256 gelu_erf_grad(__m256 x) {
  __m256 cdf = _mm256_mul_ps(set1(0.5f), _mm256_add_ps(set1(1.0f), erf(_mm256_mul_ps(x, set1(kInvSqrt2)))));
  __m256 pdf = _mm256_mul_ps(set1(kInvSqrt2Pi), exp(_mm256_mul_ps(set1(-0.5f), _mm256_mul_ps(x, x))));
  return _mm256_fmadd_ps(x, pdf, cdf);
}

inline __m256 silu_grad(__m256 x) {
  __m256 s = sigmoid(x);
  __m256 one = set1(1.0f);
  return _mm256_mul_ps(s, _mm256_fmadd_ps(x, _mm256_sub_ps(one, s), one));
}

#endif  // __AVX2__

}  // namespace tessera::cpu::vmath
