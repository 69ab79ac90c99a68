// Portable (no F16C) IEEE binary16 <-> float32 conversions. dtype.cpp uses them when
// the compiler does not target F16C; tests check them bit for bit against F16C.
#pragma once

#include <bit>
#include <cstdint>

namespace tessera::detail {

// Exact: every binary16 value is a float32 value. NaN comes back quiet (payload kept).
inline float f16_bits_to_float_portable(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in float32.
    const float mag = static_cast<float>(mant) * 0x1p-24f;
    return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(mag));
  }
  if (exp == 0x1f) {
    const uint32_t quiet = mant != 0 ? 0x00400000u : 0u;
    return std::bit_cast<float>(sign | 0x7f800000u | quiet | (mant << 13));
  }
  // Rebias the exponent from 15 to 127.
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

// Round to nearest, ties to even; |f| >= 65520 (the midpoint between 65504 and 2^16)
// gives Inf; values below 2^-14 become subnormals (or zero); NaN stays a quiet NaN.
inline uint16_t float_to_f16_bits_portable(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((x >> 13) & 0x3ffu));
  if (x >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 (includes Inf)
  if (x >= 0x38800000u) {
    // Normal range [2^-14, 65520): drop 13 mantissa bits with RNE; a carry out of the
    // mantissa correctly bumps the exponent (at most to 65504's neighbour, never Inf).
    const uint32_t odd = (x >> 13) & 1u;
    x += 0xfffu + odd;
    return static_cast<uint16_t>(sign | ((x - (112u << 23)) >> 13));
  }
  // Below 2^-14: adding 0.5f (ulp 2^-24 = the f16 subnormal spacing) makes the FPU round
  // |f| to a multiple of 2^-24 with ties to even; the low bits are then the f16 bits
  // (0x400 when it rounds up to the smallest normal).
  const float shifted = std::bit_cast<float>(x) + 0.5f;
  return static_cast<uint16_t>(sign | (std::bit_cast<uint32_t>(shifted) - 0x3f000000u));
}

}  // namespace tessera::detail
