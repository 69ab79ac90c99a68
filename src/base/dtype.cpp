#include "tessera/base/dtype.h"

#include <array>
#include <cmath>
#include <limits>
#include <tuple>
#include <type_traits>
#include <utility>

#include "base/half_portable.h"
#include "tessera/base/error.h"

#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace tessera {
namespace {

constexpr int idx(DType d) { return static_cast<int>(d); }

void check_dtype(DType d, const char* where) {
  if (idx(d) < 0 || idx(d) >= kNumDTypes)
    fail<DTypeError>("{}: invalid dtype (got {}; expected 0..{})", where, idx(d), kNumDTypes - 1);
}

// ---- element conversions -------------------------------------------------------

// The exact value of x as a native arithmetic type (halves widen to float exactly).
template <typename T>
inline auto widen(T x) {
  if constexpr (std::is_same_v<T, float16>) {
    return f16_to_float(x);
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    return bf16_to_float(x);
  } else {
    return x;
  }
}

// float -> integer: truncate toward zero, NaN -> 0, saturate outside the target range.
// F(max) is either exact or rounds up to 2^bits, so `v >= hi` catches exactly the
// values whose truncation does not fit.
template <typename To, typename F>
inline To float_to_int(F v) {
  constexpr F kLo = static_cast<F>(std::numeric_limits<To>::min());
  constexpr F kHi = static_cast<F>(std::numeric_limits<To>::max());
  if (v != v) return To{0};
  if (v <= kLo) return std::numeric_limits<To>::min();
  if (v >= kHi) return std::numeric_limits<To>::max();
  return static_cast<To>(v);
}

// Rounds d to float32 with round-to-odd: the truncated value, with its last bit set when
// inexact. A later RNE to 8 or 11 bits of a round-to-odd result equals one direct RNE
// of d (24 >= 11 + 2 bits), which avoids double rounding f64 -> f32 -> f16/bf16.
inline float round_to_odd_float(double d) {
  float f = static_cast<float>(d);
  if (std::isnan(d) || static_cast<double>(f) == d) return f;
  uint32_t b = std::bit_cast<uint32_t>(f);
  if (std::fabs(static_cast<double>(f)) > std::fabs(d)) b -= 1;  // RNE went away from zero
  return std::bit_cast<float>(b | 1u);
}

// Integer -> double that is exact, or (int64 beyond 2^53) round-to-odd at 53 bits, so
// that the subsequent rounding to 16 bits is still a single correct rounding.
template <typename I>
inline double int_to_odd_double(I v) {
  if constexpr (sizeof(I) < 8) {
    return static_cast<double>(v);
  } else {
    const uint64_t mag = v < 0 ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
    if (mag < (uint64_t{1} << 53)) return static_cast<double>(v);
    const int shift = std::bit_width(mag) - 53;
    uint64_t kept = mag >> shift;
    if ((mag & ((uint64_t{1} << shift) - 1)) != 0) kept |= 1u;
    const double d = std::ldexp(static_cast<double>(kept), shift);
    return v < 0 ? -d : d;
  }
}

template <typename H>
inline H float_to_half(float f) {
  if constexpr (std::is_same_v<H, float16>) {
    return float_to_f16(f);
  } else {
    return float_to_bf16(f);
  }
}

template <typename To, typename From>
inline To cast_elem(From x) {
  if constexpr (std::is_same_v<To, From>) {
    return x;
  } else {
    const auto v = widen(x);  // bool, an integer, float or double
    using V = std::remove_const_t<decltype(v)>;
    if constexpr (std::is_same_v<To, bool>) {
      return v != V(0);
    } else if constexpr (std::is_integral_v<To>) {
      if constexpr (std::is_floating_point_v<V>) {
        return float_to_int<To>(v);
      } else {
        return static_cast<To>(v);  // integer narrowing wraps modulo 2^bits
      }
    } else if constexpr (std::is_floating_point_v<To>) {
      return static_cast<To>(v);  // one IEEE rounding (RNE), overflow -> Inf
    } else if constexpr (std::is_same_v<V, float>) {
      return float_to_half<To>(v);
    } else if constexpr (std::is_same_v<V, double>) {
      return float_to_half<To>(round_to_odd_float(v));
    } else {
      return float_to_half<To>(round_to_odd_float(int_to_odd_double(v)));
    }
  }
}

// Bool buffers are read as bytes (any nonzero byte is true) so a stray byte value is not UB.
template <typename From>
inline From load_elem(const void* src, int64_t i) {
  if constexpr (std::is_same_v<From, bool>) {
    return static_cast<const uint8_t*>(src)[i] != 0;
  } else {
    return static_cast<const From*>(src)[i];
  }
}

template <typename From, typename To>
void convert_loop(const void* src, void* dst, int64_t n) {
  To* out = static_cast<To*>(dst);
  for (int64_t i = 0; i < n; ++i) out[i] = cast_elem<To>(load_elem<From>(src, i));
}

// ---- hot pairs: loops the compiler vectorizes, or F16C --------------------------

void f32_to_bf16(const void* src, void* dst, int64_t n) {
  const auto* in = static_cast<const uint32_t*>(src);
  auto* out = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = in[i];
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t quiet_nan = (u >> 16) | 0x0040u;
    out[i] = static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
  }
}

void bf16_to_f32(const void* src, void* dst, int64_t n) {
  const auto* in = static_cast<const uint16_t*>(src);
  auto* out = static_cast<uint32_t*>(dst);
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<uint32_t>(in[i]) << 16;
}

void f32_to_f16(const void* src, void* dst, int64_t n) {
  const auto* in = static_cast<const float*>(src);
  auto* out = static_cast<uint16_t*>(dst);
  int64_t i = 0;
#if defined(__F16C__) && defined(__AVX__)
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
#endif
  for (; i < n; ++i) out[i] = float_to_f16(in[i]).bits;
}

void f16_to_f32(const void* src, void* dst, int64_t n) {
  const auto* in = static_cast<const uint16_t*>(src);
  auto* out = static_cast<float*>(dst);
  int64_t i = 0;
#if defined(__F16C__) && defined(__AVX__)
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
#endif
  for (; i < n; ++i) out[i] = f16_to_float(float16{in[i]});
}

void f32_to_f64(const void* src, void* dst, int64_t n) {
  const auto* in = static_cast<const float*>(src);
  auto* out = static_cast<double*>(dst);
  for (int64_t i = 0; i < n; ++i) out[i] = in[i];
}

void f64_to_f32(const void* src, void* dst, int64_t n) {
  const auto* in = static_cast<const double*>(src);
  auto* out = static_cast<float*>(dst);
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(in[i]);
}

// ---- dispatch table --------------------------------------------------------------

// C++ element types in DType enum order.
using ElementTypes = std::tuple<bool, uint8_t, int8_t, uint32_t, int32_t, int64_t, float16, bfloat16, float, double>;
static_assert(std::tuple_size_v<ElementTypes> == kNumDTypes);

using ConvertFn = void (*)(const void*, void*, int64_t);

template <size_t... I>
constexpr std::array<ConvertFn, kNumDTypes * kNumDTypes> make_table(std::index_sequence<I...>) {
  // Entry [from * kNumDTypes + to]; I enumerates the flattened (from, to) pairs.
  return {&convert_loop<std::tuple_element_t<I / kNumDTypes, ElementTypes>,
                        std::tuple_element_t<I % kNumDTypes, ElementTypes>>...};
}

constexpr auto kConvertTable = make_table(std::make_index_sequence<kNumDTypes * kNumDTypes>{});

template <typename T>
double load_typed(const void* data, int64_t i) {
  return static_cast<double>(widen(load_elem<T>(data, i)));  // int64 beyond 2^53 rounds (RNE)
}

template <typename T>
void store_typed(void* data, int64_t i, double value) {
  static_cast<T*>(data)[i] = cast_elem<T>(value);
}

template <size_t... I>
constexpr auto make_loaders(std::index_sequence<I...>) {
  return std::array<double (*)(const void*, int64_t), kNumDTypes>{
      &load_typed<std::tuple_element_t<I, ElementTypes>>...};
}
template <size_t... I>
constexpr auto make_storers(std::index_sequence<I...>) {
  return std::array<void (*)(void*, int64_t, double), kNumDTypes>{
      &store_typed<std::tuple_element_t<I, ElementTypes>>...};
}
constexpr auto kLoaders = make_loaders(std::make_index_sequence<kNumDTypes>{});
constexpr auto kStorers = make_storers(std::make_index_sequence<kNumDTypes>{});

// Promotion lattice (see the table in dtype.h / docs/dtypes.md).
constexpr DType kB = DType::Bool, kU8 = DType::UInt8, kI8 = DType::Int8, kU32 = DType::UInt32, kI32 = DType::Int32,
                kI64 = DType::Int64, kF16 = DType::Float16, kBF16 = DType::BFloat16, kF32 = DType::Float32,
                kF64 = DType::Float64;
constexpr DType kPromote[kNumDTypes][kNumDTypes] = {
    //         b     u8    i8    u32   i32   i64   f16    bf16   f32   f64
    /* b   */ {kB, kU8, kI8, kU32, kI32, kI64, kF16, kBF16, kF32, kF64},
    /* u8  */ {kU8, kU8, kI32, kU32, kI32, kI64, kF16, kBF16, kF32, kF64},
    /* i8  */ {kI8, kI32, kI8, kI64, kI32, kI64, kF16, kBF16, kF32, kF64},
    /* u32 */ {kU32, kU32, kI64, kU32, kI64, kI64, kF16, kBF16, kF32, kF64},
    /* i32 */ {kI32, kI32, kI32, kI64, kI32, kI64, kF16, kBF16, kF32, kF64},
    /* i64 */ {kI64, kI64, kI64, kI64, kI64, kI64, kF16, kBF16, kF32, kF64},
    /* f16 */ {kF16, kF16, kF16, kF16, kF16, kF16, kF16, kF32, kF32, kF64},
    /* bf16*/ {kBF16, kBF16, kBF16, kBF16, kBF16, kBF16, kF32, kBF16, kF32, kF64},
    /* f32 */ {kF32, kF32, kF32, kF32, kF32, kF32, kF32, kF32, kF32, kF64},
    /* f64 */ {kF64, kF64, kF64, kF64, kF64, kF64, kF64, kF64, kF64, kF64},
};

}  // namespace

size_t itemsize(DType dtype) {
  check_dtype(dtype, "itemsize");
  static constexpr size_t kSizes[kNumDTypes] = {1, 1, 1, 4, 4, 8, 2, 2, 4, 8};
  return kSizes[idx(dtype)];
}

std::string_view name(DType dtype) {
  check_dtype(dtype, "name");
  static constexpr std::string_view kNames[kNumDTypes] = {"bool",  "uint8",   "int8",     "uint32",  "int32",
                                                          "int64", "float16", "bfloat16", "float32", "float64"};
  return kNames[idx(dtype)];
}

std::string_view short_name(DType dtype) {
  check_dtype(dtype, "short_name");
  static constexpr std::string_view kNames[kNumDTypes] = {"bool", "u8",  "i8",   "u32", "i32",
                                                          "i64",  "f16", "bf16", "f32", "f64"};
  return kNames[idx(dtype)];
}

bool dtype_from_name(std::string_view text, DType* dtype) {
  for (int d = 0; d < kNumDTypes; ++d) {
    if (text == short_name(static_cast<DType>(d)) || text == name(static_cast<DType>(d))) {
      *dtype = static_cast<DType>(d);
      return true;
    }
  }
  return false;
}

bool is_floating(DType dtype) {
  check_dtype(dtype, "is_floating");
  return idx(dtype) >= idx(DType::Float16);
}

bool is_integral(DType dtype) {
  check_dtype(dtype, "is_integral");
  return idx(dtype) >= idx(DType::UInt8) && idx(dtype) <= idx(DType::Int64);
}

bool is_signed(DType dtype) {
  check_dtype(dtype, "is_signed");
  return dtype == DType::Int8 || dtype == DType::Int32 || dtype == DType::Int64 || is_floating(dtype);
}

DType promote_types(DType a, DType b) {
  check_dtype(a, "promote_types");
  check_dtype(b, "promote_types");
  return kPromote[idx(a)][idx(b)];
}

float f16_to_float(float16 x) {
#if defined(__F16C__)
  return _cvtsh_ss(x.bits);
#else
  return detail::f16_bits_to_float_portable(x.bits);
#endif
}

float16 float_to_f16(float f) {
#if defined(__F16C__)
  // The vector form: clang's _cvtss_sh macro expands to a compound literal, which
  // -Wpedantic refuses in C++.
  const __m128i h = _mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return float16{static_cast<uint16_t>(_mm_cvtsi128_si32(h))};
#else
  return float16{detail::float_to_f16_bits_portable(f)};
#endif
}

void convert(DType from, const void* src, DType to, void* dst, int64_t n) {
  check_dtype(from, "convert");
  check_dtype(to, "convert");
  if (n < 0) fail<ValueError>("convert: negative element count (got {}; expected >= 0)", n);
  if (n == 0) return;
  if (src == nullptr || dst == nullptr) fail<ValueError>("convert: null buffer for {} elements", n);
  if (from == to) {
    if (from == DType::Bool) {
      // Normalize bytes to 0/1 so the output holds valid bools.
      const auto* in = static_cast<const uint8_t*>(src);
      auto* out = static_cast<uint8_t*>(dst);
      for (int64_t i = 0; i < n; ++i) out[i] = in[i] != 0;
    } else if (src != dst) {
      std::memmove(dst, src, static_cast<size_t>(n) * itemsize(from));
    }
    return;
  }
  ConvertFn fn = nullptr;
  if (from == DType::Float32 && to == DType::BFloat16)
    fn = &f32_to_bf16;
  else if (from == DType::BFloat16 && to == DType::Float32)
    fn = &bf16_to_f32;
  else if (from == DType::Float32 && to == DType::Float16)
    fn = &f32_to_f16;
  else if (from == DType::Float16 && to == DType::Float32)
    fn = &f16_to_f32;
  else if (from == DType::Float32 && to == DType::Float64)
    fn = &f32_to_f64;
  else if (from == DType::Float64 && to == DType::Float32)
    fn = &f64_to_f32;
  else
    fn = kConvertTable[static_cast<size_t>(idx(from) * kNumDTypes + idx(to))];
  fn(src, dst, n);
}

double load_as_double(DType dtype, const void* data, int64_t i) {
  check_dtype(dtype, "load_as_double");
  return kLoaders[idx(dtype)](data, i);
}

void store_from_double(DType dtype, void* data, int64_t i, double value) {
  check_dtype(dtype, "store_from_double");
  kStorers[idx(dtype)](data, i, value);
}

// ---- add_into ----

namespace {

template <typename T>
void add_native(void* dst, const void* src, size_t count) {
  T* d = static_cast<T*>(dst);
  const T* s = static_cast<const T*>(src);
  for (size_t i = 0; i < count; ++i) d[i] = static_cast<T>(d[i] + s[i]);
}

// 16-bit floats add in float32 and the sum is rounded back to 16 bits after every
// addition: the sum "in the element's own dtype", which every backend reproduces.
template <typename H, float (*ToFloat)(H), H (*FromFloat)(float)>
void add_half(void* dst, const void* src, size_t count) {
  H* d = static_cast<H*>(dst);
  const H* s = static_cast<const H*>(src);
  for (size_t i = 0; i < count; ++i) d[i] = FromFloat(ToFloat(d[i]) + ToFloat(s[i]));
}

// Integer sums wrap modulo 2^bits (two's complement), like numpy; computed unsigned
// so overflow is defined.
template <typename T, typename U>
void add_wrapping(void* dst, const void* src, size_t count) {
  T* d = static_cast<T*>(dst);
  const T* s = static_cast<const T*>(src);
  for (size_t i = 0; i < count; ++i) d[i] = static_cast<T>(static_cast<U>(d[i]) + static_cast<U>(s[i]));
}

}  // namespace

void add_into(void* dst, const void* src, size_t count, DType dtype) {
  switch (dtype) {
    case DType::Float32:
      return add_native<float>(dst, src, count);
    case DType::Float64:
      return add_native<double>(dst, src, count);
    case DType::BFloat16:
      return add_half<bfloat16, bf16_to_float, float_to_bf16>(dst, src, count);
    case DType::Float16:
      return add_half<float16, f16_to_float, float_to_f16>(dst, src, count);
    case DType::Int32:
      return add_wrapping<int32_t, uint32_t>(dst, src, count);
    case DType::Int64:
      return add_wrapping<int64_t, uint64_t>(dst, src, count);
    default:
      fail<DTypeError>("add_into: cannot sum {} values (expected float32, float64, bfloat16, float16, int32 or int64)",
                       name(dtype));
  }
}

}  // namespace tessera
