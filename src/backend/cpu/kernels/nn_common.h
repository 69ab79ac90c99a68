// Private helpers shared by the row-wise NN kernels (softmax.cpp, norm.cpp,
// cross_entropy.cpp) and optim.cpp: float dtype dispatch, half <-> float row
// conversion, 8-lane reductions with a fixed lane order, and row-chunk sizing.
//
// Low-precision rows (bfloat16, float16) are widened into a per-chunk float32
// scratch row, processed by the float32 kernel, and rounded back once, so every
// dtype shares the float32 arithmetic (and its vectorization).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "backend/cpu/kernels/scratch.h"
#include "tessera/base/dtype.h"
#include "tessera/base/error.h"
#include "tessera/base/thread_pool.h"

#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace tessera::cpu::nn_detail {

template <typename T>
inline constexpr bool kIsHalf = std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>;

// The type a dtype's arithmetic happens in (accumulation_dtype as a C++ type).
template <typename T>
using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <typename T>
inline float to_float(T v) {
  if constexpr (std::is_same_v<T, bfloat16>) {
    return bf16_to_float(v);
  } else if constexpr (std::is_same_v<T, float16>) {
    return f16_to_float(v);
  } else {
    return static_cast<float>(v);
  }
}

template <typename T>
inline T from_float(float v) {
  if constexpr (std::is_same_v<T, bfloat16>) {
    return float_to_bf16(v);
  } else if constexpr (std::is_same_v<T, float16>) {
    return float_to_f16(v);
  } else {
    return static_cast<T>(v);
  }
}

// Rounds a value of the accumulation type into T.
template <typename T, typename A>
inline T from_acc(A v) {
  if constexpr (kIsHalf<T>) {
    return from_float<T>(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}

template <typename T>
inline void widen(const T* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = to_float(src[i]);
}

template <typename T>
inline void narrow(const float* src, T* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = from_float<T>(src[i]);
}

// parallel_for(n, grain, ...) whose chunks each get `floats` float32 scratch values of
// their own for widened 16-bit rows: body(begin, end, scratch). The buffers come from a
// ChunkScratch taken here, so nothing is allocated once warm, whichever thread runs
// which chunk. float32 / float64 bodies work in place and get nullptr.
template <typename T, typename Body>
void parallel_for_widened(int64_t n, int64_t grain, int64_t floats, Scratch slot, Body&& body) {
  if constexpr (kIsHalf<T>) {
    const ChunkScratch scratch(sizeof(float) * static_cast<size_t>(floats), slot);
    parallel_for(n, grain, [&](int64_t begin, int64_t end) {
      ChunkScratch::Lease lease(scratch);
      body(begin, end, lease.as<float>());
    });
  } else {
    parallel_for(n, grain, [&](int64_t begin, int64_t end) { body(begin, end, static_cast<float*>(nullptr)); });
  }
}

// Rows per parallel chunk: about 32k elements of work per chunk. Depends only on the
// problem size, so partitions (and any per-chunk partial sums) are thread-count free.
inline int64_t row_grain(int64_t cols) { return std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, cols)); }

// Calls fn(T{}) for the four float dtypes; anything else is a DTypeError.
template <typename Fn>
inline void dispatch_float(DType dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case DType::Float64:
      fn(double{});
      break;
    case DType::Float32:
      fn(float{});
      break;
    case DType::BFloat16:
      fn(bfloat16{});
      break;
    case DType::Float16:
      fn(float16{});
      break;
    default:
      fail<DTypeError>("{}: unsupported dtype (got {}; expected float64, float32, bfloat16 or float16)", op,
                       name(dtype));
  }
}

inline void check_rows(const char* op, int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0) fail<ValueError>("{}: negative size (got rows={}, cols={}; expected >= 0)", op, rows, cols);
}

#ifdef __AVX2__
// Horizontal reductions in a fixed lane order (deterministic).
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline float hmax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
// exp(x) for x <= 0 where only a sum of the results is needed: arguments below -87.3
// give ~1.2e-38 instead of 0, which no sum of terms that includes exp(0) = 1 can see,
// so the flush-to-zero compare and blend of exp_nonpos are skipped.
inline __m256 exp_nonpos_for_sum(__m256 x) {
  const __m256 xc = _mm256_max_ps(_mm256_set1_ps(-87.33654475f), x);  // NaN passes through
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// exp(x) for the softmax domain x <= 0 (x - max, x - lse); valid up to x ~ 88. Cheaper
// than vmath::exp: one 2^n scaling, results below FLT_MIN (x < -87.34) flush to 0
// (-inf -> 0), NaN propagates. Same Cephes polynomial: ~2 ulp.
inline __m256 exp_nonpos(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.33654475f);
  return _mm256_andnot_ps(_mm256_cmp_ps(x, lo, _CMP_LT_OQ), exp_nonpos_for_sum(x));
}

// Mask selecting the first `r` (0..8) lanes, for row tails.
inline __m256i tail_mask(int64_t r) {
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(r)), lanes);
}
inline float row_max(const float* x, int64_t n) {
  const __m256 ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 m0 = ninf, m1 = ninf, m2 = ninf, m3 = ninf;
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
    m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + j));
    m1 = _mm256_max_ps(m1, _mm256_loadu_ps(x + j + 8));
    m2 = _mm256_max_ps(m2, _mm256_loadu_ps(x + j + 16));
    m3 = _mm256_max_ps(m3, _mm256_loadu_ps(x + j + 24));
  }
  for (; j + 8 <= n; j += 8) m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + j));
  if (j < n) {
    __m256i mask = tail_mask(n - j);
    __m256 v = _mm256_blendv_ps(ninf, _mm256_maskload_ps(x + j, mask), _mm256_castsi256_ps(mask));
    m1 = _mm256_max_ps(m1, v);
  }
  return hmax(_mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)));
}

// Touches the two cache lines of `next` at float offset j (of a row of n floats) so the
// next row streams in from memory while this row's exps keep the core busy. Rows that
// fit in L1 with room to spare go to L1, longer ones to L2.
inline void prefetch_pair(const float* next, int64_t j, int64_t n) {
  if (n <= 4096) {
    _mm_prefetch(reinterpret_cast<const char*>(next + j), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(next + j + 16), _MM_HINT_T0);
  } else {
    _mm_prefetch(reinterpret_cast<const char*>(next + j), _MM_HINT_T1);
    _mm_prefetch(reinterpret_cast<const char*>(next + j + 16), _MM_HINT_T1);
  }
}

template <bool kStore>
inline float sum_exp_impl(const float* x, float m, float* y, int64_t n, const float* next) {
  const __m256 vm = _mm256_set1_ps(m);
  auto ex = [](__m256 v) { return kStore ? exp_nonpos(v) : exp_nonpos_for_sum(v); };
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
    if (next) prefetch_pair(next, j, n);
    __m256 e0 = ex(_mm256_sub_ps(_mm256_loadu_ps(x + j), vm));
    __m256 e1 = ex(_mm256_sub_ps(_mm256_loadu_ps(x + j + 8), vm));
    __m256 e2 = ex(_mm256_sub_ps(_mm256_loadu_ps(x + j + 16), vm));
    __m256 e3 = ex(_mm256_sub_ps(_mm256_loadu_ps(x + j + 24), vm));
    if constexpr (kStore) {
      _mm256_storeu_ps(y + j, e0);
      _mm256_storeu_ps(y + j + 8, e1);
      _mm256_storeu_ps(y + j + 16, e2);
      _mm256_storeu_ps(y + j + 24, e3);
    }
    s0 = _mm256_add_ps(s0, e0);
    s1 = _mm256_add_ps(s1, e1);
    s2 = _mm256_add_ps(s2, e2);
    s3 = _mm256_add_ps(s3, e3);
  }
  for (; j + 8 <= n; j += 8) {
    __m256 e = ex(_mm256_sub_ps(_mm256_loadu_ps(x + j), vm));
    if constexpr (kStore) _mm256_storeu_ps(y + j, e);
    s0 = _mm256_add_ps(s0, e);
  }
  if (j < n) {
    __m256i mask = tail_mask(n - j);
    __m256 e = ex(_mm256_sub_ps(_mm256_maskload_ps(x + j, mask), vm));
    e = _mm256_and_ps(e, _mm256_castsi256_ps(mask));
    if constexpr (kStore) _mm256_maskstore_ps(y + j, mask, e);
    s1 = _mm256_add_ps(s1, e);
  }
  return hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
}

// sum_j exp(x_j - m); also stores the exps into y when y is non-null. `next` (nullable)
// is the row to prefetch meanwhile (same length n).
inline float sum_exp(const float* x, float m, float* y, int64_t n, const float* next = nullptr) {
  return y ? sum_exp_impl<true>(x, m, y, n, next) : sum_exp_impl<false>(x, m, y, n, next);
}

#endif

}  // namespace tessera::cpu::nn_detail
