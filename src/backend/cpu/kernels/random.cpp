#include "backend/cpu/kernels/random.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "tessera/base/error.h"
#include "tessera/base/thread_pool.h"

namespace tessera::cpu {
namespace {

constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // Philox multipliers
constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // Weyl key increments
constexpr int kRounds = 10;
constexpr int kBatch = 16;              // blocks per inner batch: 2 AVX2 vectors of lanes
constexpr int64_t kGrainBlocks = 4096;  // blocks per parallel chunk (16K words)

// Philox for kBatch consecutive block counters (first+j low, high, c2, 0): each round is
// (x0, x1, x2, x3) -> (hi(M1*x2) ^ x1 ^ k0, lo(M1*x2), hi(M0*x0) ^ x3 ^ k1, lo(M0*x0)),
// then the key is bumped by the Weyl constants. Output layout: words[4*j + w].
#if defined(__AVX2__)
// 8 blocks per vector; vpmuludq forms the 32x32->64 products of even lanes, a second
// one (after a 32-bit shift) those of odd lanes, and blends regroup hi / lo halves.
inline void mul_hi_lo(__m256i x, __m256i m, __m256i& hi, __m256i& lo) {
  const __m256i even = _mm256_mul_epu32(x, m);
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(x, 32), m);
  lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
  hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
}

void philox_batch(PhiloxKey key, uint64_t first, uint32_t c2, uint32_t* words) {
  static_assert(kBatch % 8 == 0);
  const __m256i m0 = _mm256_set1_epi32(static_cast<int>(kM0)), m1 = _mm256_set1_epi32(static_cast<int>(kM1));
  for (int v = 0; v < kBatch; v += 8) {
    alignas(32) uint32_t c_lo[8], c_hi[8];
    for (int j = 0; j < 8; ++j) {
      const uint64_t c = first + static_cast<uint64_t>(v + j);
      c_lo[j] = static_cast<uint32_t>(c);
      c_hi[j] = static_cast<uint32_t>(c >> 32);
    }
    __m256i x0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(c_lo));
    __m256i x1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(c_hi));
    __m256i x2 = _mm256_set1_epi32(static_cast<int>(c2));
    __m256i x3 = _mm256_setzero_si256();
    uint32_t k0 = key.k0, k1 = key.k1;
    for (int r = 0; r < kRounds; ++r) {
      __m256i hi0, lo0, hi1, lo1;
      mul_hi_lo(x0, m0, hi0, lo0);
      mul_hi_lo(x2, m1, hi1, lo1);
      x0 = _mm256_xor_si256(_mm256_xor_si256(hi1, x1), _mm256_set1_epi32(static_cast<int>(k0)));
      x2 = _mm256_xor_si256(_mm256_xor_si256(hi0, x3), _mm256_set1_epi32(static_cast<int>(k1)));
      x1 = lo1;
      x3 = lo0;
      k0 += kW0;
      k1 += kW1;
    }
    alignas(32) uint32_t o[4][8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(o[0]), x0);
    _mm256_store_si256(reinterpret_cast<__m256i*>(o[1]), x1);
    _mm256_store_si256(reinterpret_cast<__m256i*>(o[2]), x2);
    _mm256_store_si256(reinterpret_cast<__m256i*>(o[3]), x3);
    for (int j = 0; j < 8; ++j)
      for (int w = 0; w < 4; ++w) words[4 * (v + j) + w] = o[w][j];
  }
}
#else
void philox_batch(PhiloxKey key, uint64_t first, uint32_t c2, uint32_t* words) {
  for (int j = 0; j < kBatch; ++j) {
    const uint64_t c = first + static_cast<uint64_t>(j);
    const uint32_t ctr[4] = {static_cast<uint32_t>(c), static_cast<uint32_t>(c >> 32), c2, 0};
    philox4x32_10(ctr, key, words + 4 * j);
  }
}
#endif

// Calls emit(first, count, words) for consecutive runs of Philox blocks [first,
// first+count) of the bits stream (counter word 2 = 0), words[4*j + w] from block first+j.
// Blocks are element-indexed, so the output does not depend on how parallel_for
// partitions them.
template <typename Emit>
void for_each_block(PhiloxKey key, int64_t num_blocks, const Emit& emit) {
  parallel_for(num_blocks, kGrainBlocks, [&](int64_t b0, int64_t b1) {
    uint32_t words[4 * kBatch];
    for (int64_t b = b0; b < b1; b += kBatch) {
      philox_batch(key, static_cast<uint64_t>(b), 0, words);
      emit(b, std::min<int64_t>(kBatch, b1 - b), static_cast<const uint32_t*>(words));
    }
  });
}

void check_args(const char* op, const void* out, int64_t n) {
  if (n < 0) fail<ValueError>("{}: negative element count (got {}; expected >= 0)", op, n);
  if (n > 0 && out == nullptr) fail<ValueError>("{}: null output buffer for {} elements", op, n);
}

void check_float_dtype(const char* op, DType dtype) {
  if (!is_floating(dtype))
    fail<DTypeError>("{}: dtype must be floating (got {}; expected float16, bfloat16, float32 or float64)", op,
                     name(dtype));
}

inline float uniform24(uint32_t w) { return static_cast<float>(w >> 8) * 0x1p-24f; }              // [0, 1)
inline float uniform24_open0(uint32_t w) { return static_cast<float>((w >> 8) + 1) * 0x1p-24f; }  // (0, 1]
inline uint64_t bits53(uint32_t a, uint32_t b) { return (static_cast<uint64_t>(a) << 21) | (b >> 11); }
inline double uniform53(uint32_t a, uint32_t b) { return static_cast<double>(bits53(a, b)) * 0x1p-53; }  // [0, 1)
inline double uniform53_open0(uint32_t a, uint32_t b) { return static_cast<double>(bits53(a, b) + 1) * 0x1p-53; }

// Stores a float32 result into a 16-bit / 32-bit float slot (one RNE rounding).
template <DType D>
inline void store_f(void* out, int64_t i, float v) {
  if constexpr (D == DType::Float32) {
    static_cast<float*>(out)[i] = v;
  } else if constexpr (D == DType::BFloat16) {
    static_cast<bfloat16*>(out)[i] = float_to_bf16(v);
  } else {
    static_cast<float16*>(out)[i] = float_to_f16(v);
  }
}

// The smallest value of `dtype` >= low and the largest < high (both as doubles); equal
// to round(low) when low == high.
struct Bounds {
  double lo, hi;
};

double round_to(DType dtype, double v) {
  double slot = 0;  // 8 bytes: holds any float dtype
  store_from_double(dtype, &slot, 0, v);
  return load_as_double(dtype, &slot, 0);
}

// Next representable value of a 16-bit (sign-magnitude) float format toward +/-inf.
double step16(DType dtype, double v, bool up) {
  uint16_t h = 0;
  store_from_double(dtype, &h, 0, v);
  const bool neg = (h & 0x8000) != 0;
  if ((h & 0x7fff) == 0) {
    h = up ? 0x0001 : 0x8001;
  } else if (neg != up) {
    ++h;  // magnitude grows
  } else {
    --h;
  }
  return load_as_double(dtype, &h, 0);
}

double step(DType dtype, double v, bool up) {
  const double toward = up ? INFINITY : -INFINITY;
  if (dtype == DType::Float64) return std::nextafter(v, toward);
  if (dtype == DType::Float32) return std::nextafter(static_cast<float>(v), static_cast<float>(toward));
  return step16(dtype, v, up);
}

Bounds uniform_bounds(DType dtype, double low, double high) {
  if (!std::isfinite(low) || !std::isfinite(high) || !(low <= high) || !std::isfinite(high - low))
    fail<ValueError>("random_uniform: need finite low <= high (got low={}, high={})", low, high);
  const double lo_r = round_to(dtype, low);
  if (low == high) return {lo_r, lo_r};
  const double lo = lo_r < low ? step(dtype, lo_r, true) : lo_r;
  const double hi_r = round_to(dtype, high);
  const double hi = hi_r >= high ? step(dtype, hi_r, false) : hi_r;
  if (!(lo <= hi) || !std::isfinite(lo) || !std::isfinite(hi))
    fail<ValueError>("random_uniform: no {} value lies in [{}, {})", name(dtype), low, high);
  return {lo, hi};
}

template <DType D>
void uniform_small(PhiloxKey key, double low, double high, const Bounds& b, void* out, int64_t n) {
  // Computed in float32; clamping after the final rounding keeps results in [lo, hi]
  // even where rounding would reach `high`.
  const float lo = static_cast<float>(low), span = static_cast<float>(high - low);
  const float clo = static_cast<float>(b.lo), chi = static_cast<float>(b.hi);
  for_each_block(key, (n + 3) / 4, [&](int64_t blk, int64_t count, const uint32_t* w) {
    const int64_t base = 4 * blk, end = std::min<int64_t>(4 * count, n - base);
    for (int64_t e = 0; e < end; ++e) {
      float v = std::clamp(lo + span * uniform24(w[e]), clo, chi);
      if constexpr (D != DType::Float32) {
        // Rounding to 16 bits can step past the bounds; fall back to the bound itself.
        const float r = D == DType::BFloat16 ? bf16_to_float(float_to_bf16(v)) : f16_to_float(float_to_f16(v));
        v = r > chi ? chi : r < clo ? clo : r;
      }
      store_f<D>(out, base + e, v);
    }
  });
}

template <DType D>
void normal_small(PhiloxKey key, double mean, double stddev, void* out, int64_t n) {
  const float m = static_cast<float>(mean), s = static_cast<float>(stddev);
  constexpr float kTwoPi = 2.0f * std::numbers::pi_v<float>;
  for_each_block(key, (n + 3) / 4, [&](int64_t blk, int64_t count, const uint32_t* w) {
    const int64_t base = 4 * blk;
    for (int64_t p = 0; p < 2 * count; ++p) {  // pair p: words (2p, 2p+1) -> elements base+2p, base+2p+1
      const int64_t i = base + 2 * p;
      if (i >= n) break;
      const float r = std::sqrt(-2.0f * std::log(uniform24_open0(w[2 * p])));
      const float theta = kTwoPi * uniform24(w[2 * p + 1]);
      store_f<D>(out, i, m + s * (r * std::cos(theta)));
      if (i + 1 < n) store_f<D>(out, i + 1, m + s * (r * std::sin(theta)));
    }
  });
}

}  // namespace

void philox4x32_10(const uint32_t counter[4], PhiloxKey key, uint32_t out[4]) {
  uint32_t x0 = counter[0], x1 = counter[1], x2 = counter[2], x3 = counter[3];
  uint32_t k0 = key.k0, k1 = key.k1;
  for (int r = 0; r < kRounds; ++r) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * x0;
    const uint64_t p1 = static_cast<uint64_t>(kM1) * x2;
    x0 = static_cast<uint32_t>(p1 >> 32) ^ x1 ^ k0;
    x1 = static_cast<uint32_t>(p1);
    x2 = static_cast<uint32_t>(p0 >> 32) ^ x3 ^ k1;
    x3 = static_cast<uint32_t>(p0);
    k0 += kW0;
    k1 += kW1;
  }
  out[0] = x0;
  out[1] = x1;
  out[2] = x2;
  out[3] = x3;
}

void random_bits(PhiloxKey key, uint32_t* out, int64_t n) {
  check_args("random_bits", out, n);
  for_each_block(key, (n + 3) / 4, [&](int64_t blk, int64_t count, const uint32_t* w) {
    const int64_t base = 4 * blk;
    std::copy(w, w + std::min<int64_t>(4 * count, n - base), out + base);
  });
}

void split_key(PhiloxKey key, uint32_t* keys, int64_t n) {
  check_args("split_key", keys, n);
  parallel_for((n + kBatch - 1) / kBatch, kGrainBlocks / kBatch, [&](int64_t c0, int64_t c1) {
    uint32_t words[4 * kBatch];
    for (int64_t c = c0; c < c1; ++c) {
      philox_batch(key, static_cast<uint64_t>(c * kBatch), 1, words);
      const int64_t count = std::min<int64_t>(kBatch, n - c * kBatch);
      for (int64_t j = 0; j < count; ++j) {
        keys[2 * (c * kBatch + j)] = words[4 * j];
        keys[2 * (c * kBatch + j) + 1] = words[4 * j + 1];
      }
    }
  });
}

void random_uniform(PhiloxKey key, DType dtype, double low, double high, void* out, int64_t n) {
  check_float_dtype("random_uniform", dtype);
  check_args("random_uniform", out, n);
  const Bounds b = uniform_bounds(dtype, low, high);
  if (n == 0) return;
  switch (dtype) {
    case DType::Float32:
      return uniform_small<DType::Float32>(key, low, high, b, out, n);
    case DType::BFloat16:
      return uniform_small<DType::BFloat16>(key, low, high, b, out, n);
    case DType::Float16:
      return uniform_small<DType::Float16>(key, low, high, b, out, n);
    default:
      break;
  }
  // float64: element i takes 53 bits from stream words 2i, 2i+1 (two elements per block).
  auto* o = static_cast<double*>(out);
  const double span = high - low;
  for_each_block(key, (n + 1) / 2, [&](int64_t blk, int64_t count, const uint32_t* w) {
    const int64_t base = 2 * blk, end = std::min<int64_t>(2 * count, n - base);
    for (int64_t e = 0; e < end; ++e)
      o[base + e] = std::clamp(low + span * uniform53(w[2 * e], w[2 * e + 1]), b.lo, b.hi);
  });
}

void random_normal(PhiloxKey key, DType dtype, double mean, double stddev, void* out, int64_t n) {
  check_float_dtype("random_normal", dtype);
  check_args("random_normal", out, n);
  if (!std::isfinite(mean) || !std::isfinite(stddev) || stddev < 0)
    fail<ValueError>("random_normal: need finite mean and stddev >= 0 (got mean={}, stddev={})", mean, stddev);
  if (n == 0) return;
  switch (dtype) {
    case DType::Float32:
      return normal_small<DType::Float32>(key, mean, stddev, out, n);
    case DType::BFloat16:
      return normal_small<DType::BFloat16>(key, mean, stddev, out, n);
    case DType::Float16:
      return normal_small<DType::Float16>(key, mean, stddev, out, n);
    default:
      break;
  }
  // float64: one block = two 53-bit uniforms = one Box-Muller pair (elements 2b, 2b+1).
  auto* o = static_cast<double*>(out);
  constexpr double kTwoPi = 2.0 * std::numbers::pi;
  for_each_block(key, (n + 1) / 2, [&](int64_t blk, int64_t count, const uint32_t* w) {
    for (int64_t j = 0; j < count; ++j) {
      const int64_t i = 2 * (blk + j);
      const uint32_t* b = w + 4 * j;
      const double r = std::sqrt(-2.0 * std::log(uniform53_open0(b[0], b[1])));
      const double theta = kTwoPi * uniform53(b[2], b[3]);
      o[i] = mean + stddev * (r * std::cos(theta));
      if (i + 1 < n) o[i + 1] = mean + stddev * (r * std::sin(theta));
    }
  });
}

void random_bernoulli(PhiloxKey key, DType p_dtype, const void* p, bool p_scalar, bool* out, int64_t n) {
  check_args("random_bernoulli", out, n);
  if (n == 0) return;
  if (p == nullptr) fail<ValueError>("random_bernoulli: null probability buffer");
  // Validate before the parallel region (workers must not throw).
  const int64_t np = p_scalar ? 1 : n;
  for (int64_t i = 0; i < np; ++i) {
    const double v = load_as_double(p_dtype, p, i);
    if (!(v >= 0.0 && v <= 1.0))
      fail<ValueError>("random_bernoulli: probability p[{}] = {} outside [0, 1]", p_scalar ? 0 : i, v);
  }
  const double p0 = load_as_double(p_dtype, p, 0);
  for_each_block(key, (n + 3) / 4, [&](int64_t blk, int64_t count, const uint32_t* w) {
    const int64_t base = 4 * blk, end = std::min<int64_t>(4 * count, n - base);
    for (int64_t e = 0; e < end; ++e) {
      const double pi = p_scalar ? p0 : load_as_double(p_dtype, p, base + e);
      out[base + e] = static_cast<double>(w[e]) * 0x1p-32 < pi;
    }
  });
}

}  // namespace tessera::cpu
