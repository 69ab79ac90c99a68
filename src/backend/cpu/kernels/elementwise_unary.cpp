// Unary elementwise kernels, cast and fill.
//
// float32 runs through 8-wide AVX2 functors; the last partial vector of a chunk is
// padded and run through the same vector code, so every element gets the same
// result whatever its position (and the thread count). bfloat16/float16 are
// converted to float32 in small blocks and reuse the float32 path.
#include <cmath>
#include <cstring>
#include <limits>
#include <string_view>
#include <type_traits>

#include "backend/cpu/kernels/elementwise.h"
#include "backend/cpu/kernels/elementwise_detail.h"
#include "backend/cpu/kernels/vector_math.h"

namespace tessera::cpu {
namespace {

using detail::Compute;
using detail::kIsHalf;
using detail::TypeTag;

std::string_view op_name(UnaryOp op) {
  static constexpr std::string_view kNames[] = {
      "neg", "abs",       "sign",     "square", "exp",     "log",  "log1p", "sqrt", "rsqrt",       "tanh",
      "erf", "gelu_tanh", "gelu_erf", "silu",   "sigmoid", "relu", "sin",   "cos",  "logical_not", "copy"};
  return kNames[static_cast<int>(op)];
}

// Scalar definition of every floating op, in the compute type F (float or double).
template <typename F>
F scalar_op(UnaryOp op, F x) {
  switch (op) {
    case UnaryOp::Neg:
      return -x;
    case UnaryOp::Abs:
      return std::abs(x);
    case UnaryOp::Sign:
      return x > F(0) ? F(1) : (x < F(0) ? F(-1) : x);  // keeps 0, -0, NaN
    case UnaryOp::Square:
      return x * x;
    case UnaryOp::Exp:
      return std::exp(x);
    case UnaryOp::Log:
      return std::log(x);
    case UnaryOp::Log1p:
      return std::log1p(x);
    case UnaryOp::Sqrt:
      return std::sqrt(x);
    case UnaryOp::Rsqrt:
      return F(1) / std::sqrt(x);
    case UnaryOp::Tanh:
      return std::tanh(x);
    case UnaryOp::Erf:
      return std::erf(x);
    case UnaryOp::GeluTanh:
      return F(0.5) * x * (F(1) + std::tanh(F(vmath::kSqrt2OverPi) * (x + F(vmath::kGeluCubic) * x * x * x)));
    case UnaryOp::GeluErf:
      return F(0.5) * x * (F(1) + std::erf(x * F(vmath::kInvSqrt2)));
    case UnaryOp::Silu:
      return x / (F(1) + std::exp(-x));
    case UnaryOp::Sigmoid:
      return F(1) / (F(1) + std::exp(-x));
    case UnaryOp::Relu:
      return x > F(0) ? x : (x != x ? x : F(0));
    case UnaryOp::Sin:
      return std::sin(x);
    case UnaryOp::Cos:
      return std::cos(x);
    case UnaryOp::Copy:
      return x;
    case UnaryOp::LogicalNot:
      break;
  }
  return x;
}

#ifdef __AVX2__
// Runs an 8-wide functor over n floats; the tail goes through a padded vector.
template <typename V>
void run_vec(const float* x, float* out, int64_t n, V&& vec) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, vec(_mm256_loadu_ps(x + i)));
  if (i < n) {
    alignas(32) float buf[8] = {};
    std::memcpy(buf, x + i, sizeof(float) * (n - i));
    _mm256_store_ps(buf, vec(_mm256_load_ps(buf)));
    std::memcpy(out + i, buf, sizeof(float) * (n - i));
  }
}

// The AVX2 version of the ops that have one; returns false for the rest.
bool unary_f32_avx2(UnaryOp op, const float* x, float* out, int64_t n) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  switch (op) {
    case UnaryOp::Neg:
      run_vec(x, out, n, [&](__m256 v) { return _mm256_xor_ps(v, sign); });
      return true;
    case UnaryOp::Abs:
      run_vec(x, out, n, [&](__m256 v) { return _mm256_andnot_ps(sign, v); });
      return true;
    case UnaryOp::Square:
      run_vec(x, out, n, [](__m256 v) { return _mm256_mul_ps(v, v); });
      return true;
    case UnaryOp::Sqrt:
      run_vec(x, out, n, [](__m256 v) { return _mm256_sqrt_ps(v); });
      return true;
    case UnaryOp::Rsqrt:
      run_vec(x, out, n, [](__m256 v) { return _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_sqrt_ps(v)); });
      return true;
    case UnaryOp::Relu:  // max(x, 0) with NaN kept: max_ps returns its 2nd operand on NaN
      run_vec(x, out, n, [](__m256 v) { return _mm256_max_ps(_mm256_setzero_ps(), v); });
      return true;
    case UnaryOp::Exp:
      run_vec(x, out, n, [](__m256 v) { return vmath::exp(v); });
      return true;
    case UnaryOp::Log:
      run_vec(x, out, n, [](__m256 v) { return vmath::log(v); });
      return true;
    case UnaryOp::Tanh:
      run_vec(x, out, n, [](__m256 v) { return vmath::tanh(v); });
      return true;
    case UnaryOp::Erf:
      run_vec(x, out, n, [](__m256 v) { return vmath::erf(v); });
      return true;
    case UnaryOp::Sigmoid:
      run_vec(x, out, n, [](__m256 v) { return vmath::sigmoid(v); });
      return true;
    case UnaryOp::Silu:
      run_vec(x, out, n, [](__m256 v) { return vmath::silu(v); });
      return true;
    case UnaryOp::GeluTanh:
      run_vec(x, out, n, [](__m256 v) { return vmath::gelu_tanh(v); });
      return true;
    case UnaryOp::GeluErf:
      run_vec(x, out, n, [](__m256 v) { return vmath::gelu_erf(v); });
      return true;
    default:
      return false;
  }
}
#endif

void unary_f32(UnaryOp op, const float* x, float* out, int64_t n) {
#ifdef __AVX2__
  if (unary_f32_avx2(op, x, out, n)) return;
#endif
  if (op == UnaryOp::Copy) {
    if (x != out) std::memmove(out, x, sizeof(float) * n);
    return;
  }
  for (int64_t i = 0; i < n; ++i) out[i] = scalar_op<float>(op, x[i]);
}

template <typename T>
void unary_int(UnaryOp op, const T* x, T* out, int64_t n) {
  using U = std::make_unsigned_t<T>;
  switch (op) {
    case UnaryOp::Neg:  // two's-complement wrap, like numpy
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(U(0) - static_cast<U>(x[i]));
      return;
    case UnaryOp::Abs:
      for (int64_t i = 0; i < n; ++i) out[i] = x[i] < T(0) ? static_cast<T>(U(0) - static_cast<U>(x[i])) : x[i];
      return;
    case UnaryOp::Sign:
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>((x[i] > T(0)) - (x[i] < T(0)));
      return;
    case UnaryOp::Square:
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(static_cast<U>(x[i]) * static_cast<U>(x[i]));
      return;
    case UnaryOp::Relu:
      for (int64_t i = 0; i < n; ++i) out[i] = x[i] > T(0) ? x[i] : T(0);
      return;
    case UnaryOp::Copy:
      if (x != out) std::memmove(out, x, sizeof(T) * n);
      return;
    default:
      fail<DTypeError>("{}: not defined for integer dtype {} (cast to a floating dtype first)", op_name(op),
                       name(dtype_v<T>));
  }
}

template <typename T>
void unary_chunk(UnaryOp op, const T* x, T* out, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    unary_f32(op, x, out, n);
  } else if constexpr (std::is_same_v<T, double>) {
    for (int64_t i = 0; i < n; ++i) out[i] = scalar_op<double>(op, x[i]);
  } else if constexpr (kIsHalf<T>) {
    constexpr int64_t kBlock = 512;
    float buf[kBlock];
    for (int64_t i = 0; i < n; i += kBlock) {
      int64_t m = std::min(kBlock, n - i);
      cast_span(dtype_v<T>, x + i, DType::Float32, buf, m);  // vectorized, bit-identical to load/store
      unary_f32(op, buf, buf, m);
      cast_span(DType::Float32, buf, dtype_v<T>, out + i, m);
    }
  } else if constexpr (std::is_same_v<T, bool>) {
    if (op != UnaryOp::Copy && op != UnaryOp::Abs && op != UnaryOp::Relu && op != UnaryOp::Square &&
        op != UnaryOp::Sign)
      fail<DTypeError>("{}: not defined for dtype bool", op_name(op));
    if (x != out) std::memmove(out, x, n);
  } else {
    unary_int<T>(op, x, out, n);
  }
}

}  // namespace

void unary(UnaryOp op, DType dtype, const void* x, void* out, int64_t n) {
  if (n < 0) fail<ValueError>("unary {}: negative element count (got {})", op_name(op), n);
  if (n == 0) return;
  if (op == UnaryOp::LogicalNot) {
    detail::dispatch(dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* xs = static_cast<const T*>(x);
      bool* o = static_cast<bool*>(out);
      parallel_for(n, detail::kStreamGrain, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) o[i] = !(detail::load(xs[i]) != Compute<T>(0));
      });
    });
    return;
  }
  detail::dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* xs = static_cast<const T*>(x);
    T* o = static_cast<T*>(out);
    // Transcendentals cost more per element: smaller chunks still amortize scheduling.
    parallel_for(n, detail::kStreamGrain, [&](int64_t b, int64_t e) { unary_chunk<T>(op, xs + b, o + b, e - b); });
  });
}

void unary_span(UnaryOp op, DType dtype, const void* x, void* out, int64_t n) {
  if (n <= 0) return;
  detail::dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* xs = static_cast<const T*>(x);
    if (op == UnaryOp::LogicalNot) {
      bool* o = static_cast<bool*>(out);
      for (int64_t i = 0; i < n; ++i) o[i] = !(detail::load(xs[i]) != Compute<T>(0));
    } else {
      unary_chunk<T>(op, xs, static_cast<T*>(out), n);
    }
  });
}

namespace {

// f32 <-> bf16/f16 fast paths; bit-identical to float_to_bf16 / float_to_f16 (RNE).
void f32_to_bf16(const float* x, bfloat16* out, int64_t n) {
  int64_t i = 0;
#ifdef __AVX2__
  const __m256i round_base = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  const __m256i quiet = _mm256_set1_epi32(0x00400000);
  for (; i + 16 <= n; i += 16) {
    __m256i r[2];
    for (int h = 0; h < 2; ++h) {
      __m256i u = _mm256_castps_si256(_mm256_loadu_ps(x + i + 8 * h));
      __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
      __m256i rounded =
          _mm256_add_epi32(u, _mm256_add_epi32(round_base, _mm256_and_si256(_mm256_srli_epi32(u, 16), one)));
      __m256i v = _mm256_blendv_epi8(rounded, _mm256_or_si256(u, quiet), nan);
      r[h] = _mm256_srli_epi32(v, 16);
    }
    // packus works per 128-bit lane: fix the lane order afterwards.
    __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r[0], r[1]), 0xd8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), packed);
  }
#endif
  for (; i < n; ++i) out[i] = float_to_bf16(x[i]);
}

void bf16_to_f32(const bfloat16* x, float* out, int64_t n) {
  int64_t i = 0;
#ifdef __AVX2__
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
#endif
  for (; i < n; ++i) out[i] = bf16_to_float(x[i]);
}

void f32_to_f16(const float* x, float16* out, int64_t n) {
  int64_t i = 0;
#ifdef __F16C__
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
#endif
  for (; i < n; ++i) out[i] = float_to_f16(x[i]);
}

void f16_to_f32(const float16* x, float* out, int64_t n) {
  int64_t i = 0;
#ifdef __F16C__
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))));
#endif
  for (; i < n; ++i) out[i] = f16_to_float(x[i]);
}

}  // namespace

void cast(DType from, const void* x, DType to, void* out, int64_t n) {
  if (n < 0) fail<ValueError>("cast: negative element count (got {})", n);
  if (n == 0) return;
  const auto* src = static_cast<const unsigned char*>(x);
  auto* dst = static_cast<unsigned char*>(out);
  const size_t in_size = itemsize(from), out_size = itemsize(to);
  parallel_for(n, detail::kStreamGrain,
               [&](int64_t b, int64_t e) { cast_span(from, src + b * in_size, to, dst + b * out_size, e - b); });
}

void cast_span(DType from, const void* s, DType to, void* d, int64_t m) {
  if (m <= 0) return;
  if (from == to) {
    std::memmove(d, s, m * itemsize(from));
  } else if (from == DType::Float32 && to == DType::BFloat16) {
    f32_to_bf16(static_cast<const float*>(s), static_cast<bfloat16*>(d), m);
  } else if (from == DType::BFloat16 && to == DType::Float32) {
    bf16_to_f32(static_cast<const bfloat16*>(s), static_cast<float*>(d), m);
  } else if (from == DType::Float32 && to == DType::Float16) {
    f32_to_f16(static_cast<const float*>(s), static_cast<float16*>(d), m);
  } else if (from == DType::Float16 && to == DType::Float32) {
    f16_to_f32(static_cast<const float16*>(s), static_cast<float*>(d), m);
  } else {
    convert(from, s, to, d, m);
  }
}

void fill(DType dtype, double value, void* out, int64_t n) {
  if (n < 0) fail<ValueError>("fill: negative element count (got {})", n);
  if (n == 0) return;
  store_from_double(dtype, out, 0, value);
  detail::dispatch_bytes(dtype, [&](auto tag) {
    using U = typename decltype(tag)::type;
    U* o = static_cast<U*>(out);
    const U v = o[0];
    parallel_for(n, detail::kStreamGrain, [&](int64_t b, int64_t e) { std::fill(o + b, o + e, v); });
  });
}

}  // namespace tessera::cpu
