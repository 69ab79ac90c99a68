// Element types, their conversions, and type promotion.
//
// Storage / compute: float16 and bfloat16 are stored as 16 bits and computed in float32
// (accumulation_dtype); everything else is computed in its own type.
//
// Promotion (also in docs/dtypes.md): bool < integers < floating, JAX/numpy-like but
// always a member of DType (a rule that would need int16/uint64 takes the next wider
// signed type that exists):
//  * bool with x -> x.
//  * Two unsigned or two signed integers -> the wider one.
//  * Unsigned with signed: the signed type if it is strictly wider, else the next signed
//    type wider than the unsigned one: uint8+int8 -> int32 (no int16), uint32+int8 ->
//    int64, uint32+int32 -> int64, uint32+int64 -> int64.
//  * Integer (or bool) with floating -> that floating type (int64 + float16 -> float16).
//  * bfloat16 with float16 -> float32 (neither holds the other).
//  * Otherwise the wider floating type.
//
//          b     u8    i8    u32   i32   i64   f16   bf16  f32   f64
//   b      b     u8    i8    u32   i32   i64   f16   bf16  f32   f64
//   u8     u8    u8    i32   u32   i32   i64   f16   bf16  f32   f64
//   i8     i8    i32   i8    i64   i32   i64   f16   bf16  f32   f64
//   u32    u32   u32   i64   u32   i64   i64   f16   bf16  f32   f64
//   i32    i32   i32   i32   i64   i32   i64   f16   bf16  f32   f64
//   i64    i64   i64   i64   i64   i64   i64   f16   bf16  f32   f64
//   f16    f16   f16   f16   f16   f16   f16   f16   f32   f32   f64
//   bf16   bf16  bf16  bf16  bf16  bf16  bf16  f32   bf16  f32   f64
//   f32    f32   f32   f32   f32   f32   f32   f32   f32   f32   f64
//   f64    f64   f64   f64   f64   f64   f64   f64   f64   f64   f64
//
// Conversions (convert / store_from_double):
//  * float -> integer: truncate toward zero; NaN -> 0; values outside the target's range
//    saturate to its min / max (unlike C++, where that is undefined behaviour).
//  * integer -> narrower integer: wraps modulo 2^bits (two's complement), like numpy.
//  * anything -> bool: x != 0 (NaN -> true); bool -> anything: 0 / 1.
//  * to a floating type: one correct rounding to nearest, ties to even, from the exact
//    source value (float64 and int64 -> float16 / bfloat16 included: no double
//    rounding); overflow -> +-Inf; NaN -> quiet NaN.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace tessera {

enum class DType : uint8_t { Bool, UInt8, Int8, UInt32, Int32, Int64, Float16, BFloat16, Float32, Float64 };

inline constexpr int kNumDTypes = 10;

size_t itemsize(DType dtype);
std::string_view name(DType dtype);
// The short spelling of the IR and type strings: "f32", "bf16", "i64", "bool".
std::string_view short_name(DType dtype);
// The dtype named by its short or long spelling, or false when there is none.
bool dtype_from_name(std::string_view text, DType* dtype);
bool is_floating(DType dtype);
bool is_integral(DType dtype);  // integers, not bool
bool is_signed(DType dtype);
// Result dtype of a binary op between `a` and `b` (see the header comment).
DType promote_types(DType a, DType b);
// The type computation happens in: float64 for float64, float32 for the other floats.
inline DType accumulation_dtype(DType dtype) { return dtype == DType::Float64 ? DType::Float64 : DType::Float32; }

// bfloat16: the upper 16 bits of an IEEE float32. Conversion from float32 rounds to
// nearest, ties to even; NaN stays NaN (quiet), Inf stays Inf.
struct bfloat16 {
  uint16_t bits = 0;
};

// float16: IEEE 754 binary16. Conversion from float32 rounds to nearest even,
// produces subnormals and Inf on overflow; NaN stays NaN.
struct float16 {
  uint16_t bits = 0;
};

inline float bf16_to_float(bfloat16 x) { return std::bit_cast<float>(static_cast<uint32_t>(x.bits) << 16); }

inline bfloat16 float_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bfloat16{static_cast<uint16_t>((u >> 16) | 0x0040u)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return bfloat16{static_cast<uint16_t>(u >> 16)};
}

float f16_to_float(float16 x);
float16 float_to_f16(float f);

// Compile-time mapping from C++ types to DType.
template <typename T>
struct dtype_of;
template <>
struct dtype_of<bool> {
  static constexpr DType value = DType::Bool;
};
template <>
struct dtype_of<uint8_t> {
  static constexpr DType value = DType::UInt8;
};
template <>
struct dtype_of<int8_t> {
  static constexpr DType value = DType::Int8;
};
template <>
struct dtype_of<uint32_t> {
  static constexpr DType value = DType::UInt32;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = DType::Int32;
};
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = DType::Int64;
};
template <>
struct dtype_of<float16> {
  static constexpr DType value = DType::Float16;
};
template <>
struct dtype_of<bfloat16> {
  static constexpr DType value = DType::BFloat16;
};
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::Float32;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::Float64;
};
template <typename T>
inline constexpr DType dtype_v = dtype_of<T>::value;

// Converts `n` elements between any two dtypes (rules in the header comment: float->int
// truncates toward zero and saturates, NaN->int gives 0; anything->bool is "!= 0").
// src == dst is allowed when from == to.
void convert(DType from, const void* src, DType to, void* dst, int64_t n);

// Reads element i of a buffer of `dtype` as a double (exact except int64 beyond 2^53) /
// writes a double into it with the conversion rules above.
double load_as_double(DType dtype, const void* data, int64_t i);
void store_from_double(DType dtype, void* data, int64_t i, double value);

// dst[i] = dst[i] + src[i] for `count` elements of `dtype`: floats in their own precision
// (bfloat16/float16 through float32, rounded back after each addition), integers
// wrapping; the same on every backend, so reductions built on it are reproducible.
void add_into(void* dst, const void* src, size_t count, DType dtype);

}  // namespace tessera
