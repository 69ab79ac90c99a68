// Internal building blocks of the tiled attention kernels (attention_forward.cpp,
// attention_backward.cpp): a register-blocked small GEMM for the 64x64 tile products,
// a vectorized exp for the softmax rows, tile loads that convert bf16/f16 to float,
// and the score mask. Tiles are row-major with a padded width (a multiple of kPad)
// so every GEMM's N is a whole number of SIMD vectors.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define TESSERA_ATTENTION_AVX2 1
#endif

#include "backend/cpu/kernels/attention.h"
#include "tessera/base/dtype.h"
#include "tessera/base/error.h"
#include "tessera/base/thread_pool.h"

namespace tessera::cpu::attention_detail {

// Query rows and key rows per tile. 64x64 float tiles (16 KiB) keep Q, K^T, V and the
// score tile of one step within L1/L2; the causal skip works at this granularity.
inline constexpr int64_t kBlockQ = 64;
inline constexpr int64_t kBlockK = 64;
inline constexpr int64_t kPad = 8;  // tile widths are multiples of this

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

template <typename T>
inline constexpr T kNegInf = -std::numeric_limits<T>::infinity();

// Computation type of an element type: double for double, float otherwise.
template <typename In>
using Acc = std::conditional_t<std::is_same_v<In, double>, double, float>;

inline float to_acc(float x) { return x; }
inline double to_acc(double x) { return x; }
inline float to_acc(bfloat16 x) { return bf16_to_float(x); }
inline float to_acc(float16 x) { return f16_to_float(x); }

template <typename Out, typename T>
inline Out from_acc(T x) {
  if constexpr (std::is_same_v<Out, bfloat16>) {
    return float_to_bf16(static_cast<float>(x));
  } else if constexpr (std::is_same_v<Out, float16>) {
    return float_to_f16(static_cast<float>(x));
  } else {
    return static_cast<Out>(x);
  }
}

// SIMD vector of T: kW lanes. The generic version is scalar (builds without AVX2).
template <typename T>
struct Simd {
  using V = T;
  static constexpr int kW = 1;
  static constexpr int kMaxNV = 8;
  static V load(const T* p) { return *p; }
  static void store(T* p, V v) { *p = v; }
  static V set1(T x) { return x; }
  static V zero() { return T(0); }
  static V fma(V a, V b, V c) { return a * b + c; }
};

#ifdef TESSERA_ATTENTION_AVX2
template <>
struct Simd<float> {
  using V = __m256;
  static constexpr int kW = 8;
  static constexpr int kMaxNV = 2;  // 6x16 register block: 12 accumulators
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V zero() { return _mm256_setzero_ps(); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
};
template <>
struct Simd<double> {
  using V = __m256d;
  static constexpr int kW = 4;
  static constexpr int kMaxNV = 2;  // 6x8 register block
  static V load(const double* p) { return _mm256_loadu_pd(p); }
  static void store(double* p, V v) { _mm256_storeu_pd(p, v); }
  static V set1(double x) { return _mm256_set1_pd(x); }
  static V zero() { return _mm256_setzero_pd(); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_pd(a, b, c); }
};
#endif

inline constexpr int kMR = 6;  // rows of C per register block

// C[MR, NV*kW] (+)= A[MR, K] B[K, NV*kW], A[i, k] = a[i*ars + k*acs]. The accumulators
// stay in registers for the whole K loop; each step is one B row load and MR broadcasts.
template <typename T, int MR, int NV>
inline void gemm_block(int64_t K, const T* a, int64_t ars, int64_t acs, const T* b, int64_t ldb, T* c, int64_t ldc,
                       bool accumulate) {
  using S = Simd<T>;
  typename S::V acc[MR][NV];
  for (int i = 0; i < MR; ++i)
    for (int u = 0; u < NV; ++u) acc[i][u] = accumulate ? S::load(c + i * ldc + u * S::kW) : S::zero();
  for (int64_t kk = 0; kk < K; ++kk) {
    typename S::V bv[NV];
    for (int u = 0; u < NV; ++u) bv[u] = S::load(b + kk * ldb + u * S::kW);
    const T* ak = a + kk * acs;
    for (int i = 0; i < MR; ++i) {
      typename S::V av = S::set1(ak[i * ars]);
      for (int u = 0; u < NV; ++u) acc[i][u] = S::fma(av, bv[u], acc[i][u]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int u = 0; u < NV; ++u) S::store(c + i * ldc + u * S::kW, acc[i][u]);
}

template <typename T, int MR>
inline void gemm_rows(int nv, int64_t K, const T* a, int64_t ars, int64_t acs, const T* b, int64_t ldb, T* c,
                      int64_t ldc, bool accumulate) {
  constexpr int kW = Simd<T>::kW;
  if (nv == Simd<T>::kMaxNV) {
    gemm_block<T, MR, Simd<T>::kMaxNV>(K, a, ars, acs, b, ldb, c, ldc, accumulate);
  } else {
    for (int u = 0; u < nv; ++u) gemm_block<T, MR, 1>(K, a, ars, acs, b + u * kW, ldb, c + u * kW, ldc, accumulate);
  }
}

// C[M, N] (+)= A[M, K] B[K, N] for tile-sized operands (single-threaded; the caller
// parallelizes over tiles). A[i, k] = a[i*ars + k*acs] so a transposed A (P^T, dS^T)
// costs nothing; B and C are row-major; N must be a multiple of kPad. The summation
// order over k is fixed (ascending), so results do not depend on M, N blocking.
template <typename T>
void tile_gemm(int64_t M, int64_t N, int64_t K, const T* a, int64_t ars, int64_t acs, const T* b, int64_t ldb, T* c,
               int64_t ldc, bool accumulate) {
  constexpr int kW = Simd<T>::kW;
  constexpr int64_t kNR = int64_t{kW} * Simd<T>::kMaxNV;
  for (int64_t j = 0; j < N; j += kNR) {
    const int nv = static_cast<int>(std::min(kNR, N - j) / kW);
    for (int64_t i = 0; i < M; i += kMR) {
      const T* ai = a + i * ars;
      T* cij = c + i * ldc + j;
      switch (std::min<int64_t>(kMR, M - i)) {
        case 6:
          gemm_rows<T, 6>(nv, K, ai, ars, acs, b + j, ldb, cij, ldc, accumulate);
          break;
        case 5:
          gemm_rows<T, 5>(nv, K, ai, ars, acs, b + j, ldb, cij, ldc, accumulate);
          break;
        case 4:
          gemm_rows<T, 4>(nv, K, ai, ars, acs, b + j, ldb, cij, ldc, accumulate);
          break;
        case 3:
          gemm_rows<T, 3>(nv, K, ai, ars, acs, b + j, ldb, cij, ldc, accumulate);
          break;
        case 2:
          gemm_rows<T, 2>(nv, K, ai, ars, acs, b + j, ldb, cij, ldc, accumulate);
          break;
        default:
          gemm_rows<T, 1>(nv, K, ai, ars, acs, b + j, ldb, cij, ldc, accumulate);
          break;
      }
    }
  }
}

#ifdef TESSERA_ATTENTION_AVX2
// e^x for 8 floats: Cephes expf (range reduction by ln 2, degree-6 polynomial, about
// 1 ulp). Inputs below -87.3 (and -inf) give exactly 0, so masked scores vanish.
inline __m256 exp256(__m256 x) {
  const __m256 underflow = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ);
  x = _mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f));
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
  __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
  fx = _mm256_floor_ps(fx);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  const __m256 z = _mm256_mul_ps(x, x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, z, x);
  y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
  __m256i e = _mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127));
  const __m256 pow2 = _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(y, pow2));
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

// max over x[0, n).
template <typename T>
T row_max(const T* x, int64_t n) {
  T m = kNegInf<T>;
  int64_t j = 0;
#ifdef TESSERA_ATTENTION_AVX2
  if constexpr (std::is_same_v<T, float>) {
    __m256 mv = _mm256_set1_ps(m);
    for (; j + 8 <= n; j += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(x + j));
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, mv);
    for (float l : lanes) m = std::max(m, l);
  }
#endif
  for (; j < n; ++j) m = std::max(m, x[j]);
  return m;
}

// x[j] = exp(x[j] - shift) for j < n (shift finite); returns the sum of the results.
template <typename T>
T exp_shift(T* x, int64_t n, T shift) {
  T sum = 0;
  int64_t j = 0;
#ifdef TESSERA_ATTENTION_AVX2
  if constexpr (std::is_same_v<T, float>) {
    const __m256 sv = _mm256_set1_ps(shift);
    __m256 acc = _mm256_setzero_ps();
    for (; j + 8 <= n; j += 8) {
      __m256 p = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + j), sv));
      _mm256_storeu_ps(x + j, p);
      acc = _mm256_add_ps(acc, p);
    }
    sum = hsum(acc);
  }
#endif
  for (; j < n; ++j) {
    x[j] = std::exp(x[j] - shift);
    sum += x[j];
  }
  return sum;
}

// dst[i, j] = mul * src[i, j] for i < rows, j < d, and 0 for d <= j < ld (row-major,
// source rows of length d).
template <typename In, typename T>
void load_rows(const In* src, int64_t rows, int64_t d, T* dst, int64_t ld, T mul) {
  for (int64_t i = 0; i < rows; ++i) {
    const In* s = src + i * d;
    T* o = dst + i * ld;
    if (mul == T(1)) {
      for (int64_t j = 0; j < d; ++j) o[j] = to_acc(s[j]);
    } else {
      for (int64_t j = 0; j < d; ++j) o[j] = mul * to_acc(s[j]);
    }
    for (int64_t j = d; j < ld; ++j) o[j] = T(0);
  }
}

// dst[j, i] = mul * src[i, j] for j < d: the transpose of a [rows, d] block, [d, ld] with
// zero columns rows <= i < cols.
template <typename In, typename T>
void load_transposed(const In* src, int64_t rows, int64_t cols, int64_t d, T* dst, int64_t ld, T mul) {
  for (int64_t i = 0; i < rows; ++i) {
    const In* s = src + i * d;
    for (int64_t j = 0; j < d; ++j) dst[j * ld + i] = mul * to_acc(s[j]);
  }
  for (int64_t j = 0; j < d; ++j)
    for (int64_t i = rows; i < cols; ++i) dst[j * ld + i] = T(0);
}

// The segment-id range [lo, hi] of each (batch row, block of kBlock tokens). A query
// block and a key block share no document when their ranges do not overlap: the tile
// is skipped. When both ranges are one and the same id, every pair is in one document
// and the tile needs no per-element test. Exact whatever the order of the ids; sorted
// ids (packed documents) make almost every cross-document tile skippable.
class SegmentBlocks {
 public:
  static_assert(kBlockQ == kBlockK, "one block table serves queries and keys");
  static constexpr int64_t kBlock = kBlockQ;

  SegmentBlocks(const int32_t* segments, int64_t batch, int64_t len)
      : segments_(segments), len_(len), blocks_((len + kBlock - 1) / kBlock) {
    if (segments == nullptr) return;
    lo_.resize(static_cast<size_t>(batch * blocks_));
    hi_.resize(lo_.size());
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t blk = 0; blk < blocks_; ++blk) {
        const int32_t* s = segments + b * len + blk * kBlock;
        const auto [lo, hi] = std::minmax_element(s, s + std::min(kBlock, len - blk * kBlock));
        lo_[static_cast<size_t>(b * blocks_ + blk)] = *lo;
        hi_[static_cast<size_t>(b * blocks_ + blk)] = *hi;
      }
  }
  bool active() const { return segments_ != nullptr; }
  // No (query, key) pair of the tile is in one document.
  bool disjoint(int64_t b, int64_t qb, int64_t kb) const {
    if (segments_ == nullptr) return false;
    const size_t q = static_cast<size_t>(b * blocks_ + qb), k = static_cast<size_t>(b * blocks_ + kb);
    return hi_[q] < lo_[k] || hi_[k] < lo_[q];
  }
  // The ids of row b when the tile needs a per-element test, else null.
  const int32_t* tile_ids(int64_t b, int64_t qb, int64_t kb) const {
    if (segments_ == nullptr) return nullptr;
    const size_t q = static_cast<size_t>(b * blocks_ + qb), k = static_cast<size_t>(b * blocks_ + kb);
    const bool uniform = lo_[q] == hi_[q] && lo_[k] == hi_[k] && lo_[q] == lo_[k];
    return uniform ? nullptr : segments_ + b * len_;
  }

 private:
  const int32_t* segments_;
  int64_t len_, blocks_;
  std::vector<int32_t> lo_, hi_;
};

// Sets to -inf the scores of a [nq, nkp] tile (query rows q0.., key columns k0..) that
// the query may not see: padding columns j >= nk, keys after the query when causal,
// keys the user mask hides and keys of another document. mask_bh points at mask[b, h]
// (null: no mask), seg at the segment ids of row b (null: no test).
template <typename T>
void mask_scores(T* s, int64_t ld, int64_t nq, int64_t nk, int64_t nkp, int64_t q0, int64_t k0, bool causal,
                 const uint8_t* mask_bh, int64_t kv_len, const int32_t* seg) {
  const bool diagonal = causal && k0 + nk - 1 > q0;
  if (!diagonal && mask_bh == nullptr && seg == nullptr && nk == nkp) return;
  for (int64_t i = 0; i < nq; ++i) {
    const int64_t t = q0 + i;
    int64_t visible = nk;  // keys [0, visible) of the tile pass the causal test
    if (causal) visible = std::clamp<int64_t>(t - k0 + 1, 0, nk);
    T* row = s + i * ld;
    for (int64_t j = visible; j < nkp; ++j) row[j] = kNegInf<T>;
    if (mask_bh != nullptr) {
      const uint8_t* m = mask_bh + t * kv_len + k0;
      for (int64_t j = 0; j < visible; ++j)
        if (m[j] == 0) row[j] = kNegInf<T>;
    }
    if (seg != nullptr) {
      const int32_t own = seg[t];
      for (int64_t j = 0; j < visible; ++j)
        if (seg[k0 + j] != own) row[j] = kNegInf<T>;
    }
  }
}

// The transposed-tile version: s is [nk, ld] with s[j, i] the score of query q0 + i
// against key k0 + j (rows j < nk, columns i < nq are touched).
template <typename T>
void mask_scores_transposed(T* s, int64_t ld, int64_t nq, int64_t nk, int64_t q0, int64_t k0, bool causal,
                            const uint8_t* mask_bh, int64_t kv_len, const int32_t* seg) {
  const bool diagonal = causal && k0 + nk - 1 > q0;
  if (!diagonal && mask_bh == nullptr && seg == nullptr) return;
  for (int64_t j = 0; j < nk; ++j) {
    const int64_t key = k0 + j;
    T* row = s + j * ld;
    // Causal: queries t < key (i < key - q0) may not see this key.
    const int64_t hidden = causal ? std::clamp<int64_t>(key - q0, 0, nq) : 0;
    for (int64_t i = 0; i < hidden; ++i) row[i] = kNegInf<T>;
    if (mask_bh != nullptr) {
      const uint8_t* m = mask_bh + key;
      for (int64_t i = hidden; i < nq; ++i)
        if (m[(q0 + i) * kv_len] == 0) row[i] = kNegInf<T>;
    }
    if (seg != nullptr) {
      const int32_t own = seg[key];
      for (int64_t i = hidden; i < nq; ++i)
        if (seg[q0 + i] != own) row[i] = kNegInf<T>;
    }
  }
}

// The backward kernels' dQ when their (b, kv head, split) tasks left per-split partials
// (partial: [B * kv_heads * splits][group * T][dp] accumulators): dQ[b, h, t] = scale *
// the sum over splits, in split order (so the thread count changes nothing).
template <typename In, typename T>
void sum_dq_partials(const AttentionShape& sh, int64_t splits, int64_t dp, const T* partial, T scale, In* dq) {
  const int64_t H = sh.heads, Hkv = sh.kv_heads, T_len = sh.q_len, D = sh.head_dim, group = H / Hkv;
  const int64_t group_size = group * T_len * dp;
  parallel_for(sh.batch * H * T_len, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t bh = r / T_len, t = r % T_len;
      const int64_t gi = bh / H * Hkv + bh % H / group, g = bh % H % group;
      for (int64_t d = 0; d < D; ++d) {
        T sum = 0;
        for (int64_t s = 0; s < splits; ++s) sum += partial[(gi * splits + s) * group_size + (g * T_len + t) * dp + d];
        dq[r * D + d] = from_acc<In>(scale * sum);
      }
    }
  });
}

// Checks the arguments shared by the forward and the backward.
inline void validate(const char* op, DType dtype, const AttentionShape& sh) {
  if (dtype != DType::Float64 && dtype != DType::Float32 && dtype != DType::BFloat16 && dtype != DType::Float16)
    fail<DTypeError>("{}: unsupported dtype {} (expected float64, float32, bfloat16 or float16)", op, name(dtype));
  if (sh.batch < 0 || sh.q_len < 0 || sh.kv_len < 0 || sh.head_dim < 0)
    fail<ValueError>("{}: negative size (got batch={}, q_len={}, kv_len={}, head_dim={})", op, sh.batch, sh.q_len,
                     sh.kv_len, sh.head_dim);
  if (sh.heads < 1 || sh.kv_heads < 1 || sh.heads % sh.kv_heads != 0)
    fail<ShapeError>("{}: heads={} is not a positive multiple of kv_heads={}", op, sh.heads, sh.kv_heads);
  if (!std::isfinite(sh.scale)) fail<ValueError>("{}: scale must be finite (got {})", op, sh.scale);
  if (sh.segments != nullptr && sh.q_len != sh.kv_len)
    fail<ShapeError>("{}: segment ids need q_len == kv_len (got {} and {})", op, sh.q_len, sh.kv_len);
}

}  // namespace tessera::cpu::attention_detail
