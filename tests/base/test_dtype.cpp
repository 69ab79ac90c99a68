// dtype: names and sizes, promotion, and conversions checked against an independent
// reference (nearest representable value found by search over all 16-bit patterns).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "base/half_portable.h"
#include "tessera/base/dtype.h"
#include "tessera/base/error.h"

namespace tessera {
namespace {

constexpr DType kAll[] = {DType::Bool,  DType::UInt8,   DType::Int8,     DType::UInt32,  DType::Int32,
                          DType::Int64, DType::Float16, DType::BFloat16, DType::Float32, DType::Float64};

// Decodes a 16-bit pattern from first principles (not via the code under test).
double decode_f16(uint16_t h) {
  const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  const double s = (h & 0x8000) ? -1.0 : 1.0;
  if (e == 0) return s * std::ldexp(m, -24);
  if (e == 31) return m ? std::numeric_limits<double>::quiet_NaN() : s * INFINITY;
  return s * std::ldexp(1024 + m, e - 25);
}
double decode_bf16(uint16_t h) {
  const int e = (h >> 7) & 0xff, m = h & 0x7f;
  const double s = (h & 0x8000) ? -1.0 : 1.0;
  if (e == 0) return s * std::ldexp(m, -133);
  if (e == 255) return m ? std::numeric_limits<double>::quiet_NaN() : s * INFINITY;
  return s * std::ldexp(128 + m, e - 134);
}

// Reference RNE to a 16-bit format: positive values of patterns 0..inf_bits, where the
// Inf pattern stands for 2^(emax+1) so that overflow follows the usual tie rule.
struct Ref16 {
  std::vector<long double> vals;
  uint16_t inf_bits;
  Ref16(bool is_f16) : inf_bits(is_f16 ? 0x7c00 : 0x7f80) {
    for (uint32_t b = 0; b < inf_bits; ++b) vals.push_back(is_f16 ? decode_f16(b) : decode_bf16(b));
    vals.push_back(is_f16 ? 65536.0L : std::ldexp(1.0L, 128));
  }
  uint16_t round(long double x) const {
    if (std::isnan(x)) return 0x7fff;  // caller checks NaN-ness only
    const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    const long double a = std::fabs(x);
    if (a >= vals.back()) return sign | inf_bits;
    const auto hi = static_cast<size_t>(std::upper_bound(vals.begin(), vals.end(), a) - vals.begin());
    const size_t lo = hi - 1;
    const long double mid = (vals[lo] + vals[hi]) / 2;  // exact: few significant bits
    size_t pick = a < mid ? lo : a > mid ? hi : ((lo & 1) ? hi : lo);
    return static_cast<uint16_t>(sign | pick);
  }
};
const Ref16& ref_f16() {
  static const Ref16 r(true);
  return r;
}
const Ref16& ref_bf16() {
  static const Ref16 r(false);
  return r;
}

bool f16_is_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff); }
bool bf16_is_nan(uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x7f); }

TEST(DType, NamesSizesKinds) {
  EXPECT_EQ(name(DType::Float32), "float32");
  EXPECT_EQ(name(DType::BFloat16), "bfloat16");
  EXPECT_EQ(name(DType::Bool), "bool");
  EXPECT_EQ(itemsize(DType::Float16), 2u);
  EXPECT_EQ(itemsize(DType::Int64), 8u);
  EXPECT_EQ(itemsize(DType::Bool), 1u);
  EXPECT_TRUE(is_floating(DType::BFloat16));
  EXPECT_FALSE(is_floating(DType::Int32));
  EXPECT_TRUE(is_integral(DType::UInt8));
  EXPECT_FALSE(is_integral(DType::Bool));
  EXPECT_FALSE(is_integral(DType::Float32));
  EXPECT_TRUE(is_signed(DType::Int8));
  EXPECT_FALSE(is_signed(DType::UInt32));
  EXPECT_TRUE(is_signed(DType::Float16));
  EXPECT_FALSE(is_signed(DType::Bool));
  EXPECT_THROW(itemsize(static_cast<DType>(42)), DTypeError);
}

TEST(DType, PromotionTable) {
  for (DType a : kAll) {
    EXPECT_EQ(promote_types(a, a), a);
    EXPECT_EQ(promote_types(DType::Bool, a), a);
    for (DType b : kAll) {
      const DType r = promote_types(a, b);
      EXPECT_EQ(r, promote_types(b, a)) << name(a) << " " << name(b);
      EXPECT_GE(static_cast<int>(r), 0);
      EXPECT_LT(static_cast<int>(r), kNumDTypes);
      if (is_floating(a) || is_floating(b)) {
        EXPECT_TRUE(is_floating(r));
      }
      // Two integers: the result holds every value of both (checked via itemsize/signedness).
      if (is_integral(a) && is_integral(b)) {
        auto holds = [&](DType big, DType small) {
          if (is_signed(big) == is_signed(small)) return itemsize(big) >= itemsize(small);
          return is_signed(big) && itemsize(big) > itemsize(small);
        };
        EXPECT_TRUE(holds(r, a) && holds(r, b)) << name(a) << " " << name(b);
      }
    }
  }
  EXPECT_EQ(promote_types(DType::UInt8, DType::Int8), DType::Int32);
  EXPECT_EQ(promote_types(DType::Int64, DType::UInt32), DType::Int64);
  EXPECT_EQ(promote_types(DType::UInt32, DType::Int32), DType::Int64);
  EXPECT_EQ(promote_types(DType::UInt8, DType::UInt32), DType::UInt32);
  EXPECT_EQ(promote_types(DType::BFloat16, DType::Float16), DType::Float32);
  EXPECT_EQ(promote_types(DType::Int64, DType::Float16), DType::Float16);
  EXPECT_EQ(promote_types(DType::Int32, DType::BFloat16), DType::BFloat16);
  EXPECT_EQ(promote_types(DType::Float32, DType::Float64), DType::Float64);
  EXPECT_EQ(promote_types(DType::Float16, DType::Float32), DType::Float32);
}

TEST(DType, F16ExhaustiveRoundTrip) {
  std::vector<uint16_t> all(65536), back(65536);
  std::vector<float> widened(65536);
  for (uint32_t b = 0; b < 65536; ++b) all[b] = static_cast<uint16_t>(b);
  convert(DType::Float16, all.data(), DType::Float32, widened.data(), 65536);
  convert(DType::Float32, widened.data(), DType::Float16, back.data(), 65536);
  for (uint32_t b = 0; b < 65536; ++b) {
    const auto h = static_cast<uint16_t>(b);
    const float f = f16_to_float(float16{h});
    const float fp = detail::f16_bits_to_float_portable(h);
    const double want = decode_f16(h);
    if (f16_is_nan(h)) {
      ASSERT_TRUE(std::isnan(f) && std::isnan(fp) && std::isnan(widened[b])) << b;
      ASSERT_TRUE(f16_is_nan(float_to_f16(f).bits) && f16_is_nan(back[b])) << b;
      ASSERT_EQ(std::bit_cast<uint32_t>(f), std::bit_cast<uint32_t>(fp)) << b;
      ASSERT_EQ(float_to_f16(f).bits, detail::float_to_f16_bits_portable(f)) << b;
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), want) << b;
    ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << b;
    ASSERT_EQ(std::bit_cast<uint32_t>(f), std::bit_cast<uint32_t>(fp)) << b;
    ASSERT_EQ(std::bit_cast<uint32_t>(widened[b]), std::bit_cast<uint32_t>(f)) << b;
    ASSERT_EQ(float_to_f16(f).bits, h) << b;
    ASSERT_EQ(detail::float_to_f16_bits_portable(f), h) << b;
    ASSERT_EQ(back[b], h) << b;
  }
}

TEST(DType, BF16ExhaustiveRoundTrip) {
  std::vector<uint16_t> all(65536), back(65536);
  std::vector<float> widened(65536);
  for (uint32_t b = 0; b < 65536; ++b) all[b] = static_cast<uint16_t>(b);
  convert(DType::BFloat16, all.data(), DType::Float32, widened.data(), 65536);
  convert(DType::Float32, widened.data(), DType::BFloat16, back.data(), 65536);
  for (uint32_t b = 0; b < 65536; ++b) {
    const auto h = static_cast<uint16_t>(b);
    const float f = bf16_to_float(bfloat16{h});
    if (bf16_is_nan(h)) {
      ASSERT_TRUE(std::isnan(f) && std::isnan(widened[b]));
      ASSERT_TRUE(bf16_is_nan(float_to_bf16(f).bits) && bf16_is_nan(back[b])) << b;
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), decode_bf16(h)) << b;
    ASSERT_EQ(float_to_bf16(f).bits, h) << b;
    ASSERT_EQ(back[b], h) << b;
  }
}

uint16_t f16(float f) { return float_to_f16(f).bits; }
uint16_t bf16(float f) { return float_to_bf16(f).bits; }

TEST(DType, F16RoundingEdgeCases) {
  // Ties between 1 and 1+2^-10 go to the even neighbour.
  EXPECT_EQ(f16(1.0f + 0x1p-11f), 0x3c00);
  EXPECT_EQ(f16(1.0f + 3 * 0x1p-11f), 0x3c02);
  EXPECT_EQ(f16(std::nextafter(1.0f + 0x1p-11f, 2.0f)), 0x3c01);
  EXPECT_EQ(f16(std::nextafter(1.0f + 3 * 0x1p-11f, 0.0f)), 0x3c01);
  // Overflow: 65504 is the max; 65520 is the rounding boundary to Inf (tie -> even = Inf).
  EXPECT_EQ(f16(65504.0f), 0x7bff);
  EXPECT_EQ(f16(std::nextafter(65520.0f, 0.0f)), 0x7bff);
  EXPECT_EQ(f16(65520.0f), 0x7c00);
  EXPECT_EQ(f16(-65520.0f), 0xfc00);
  EXPECT_EQ(f16(1e10f), 0x7c00);
  EXPECT_EQ(f16(INFINITY), 0x7c00);
  EXPECT_EQ(f16(-INFINITY), 0xfc00);
  EXPECT_TRUE(f16_is_nan(f16(NAN)));
  EXPECT_TRUE(f16_is_nan(f16(-NAN)));
  // Subnormals: smallest 2^-24; 2^-25 is a tie between 0 and 2^-24 -> 0 (even).
  EXPECT_EQ(f16(0x1p-24f), 0x0001);
  EXPECT_EQ(f16(0x1p-25f), 0x0000);
  EXPECT_EQ(f16(std::nextafter(0x1p-25f, 1.0f)), 0x0001);
  EXPECT_EQ(f16(3 * 0x1p-25f), 0x0002);
  EXPECT_EQ(f16(-0x1p-24f), 0x8001);
  EXPECT_EQ(f16(1e-30f), 0x0000);
  EXPECT_EQ(f16(0x1p-14f), 0x0400);                 // smallest normal
  EXPECT_EQ(f16(0x1p-14f - 0x1p-25f), 0x0400);      // tie 0x3ff/0x400 -> even
  EXPECT_EQ(f16(0x1p-14f - 3 * 0x1p-25f), 0x03fe);  // tie 0x3fe/0x3ff -> even
  EXPECT_EQ(f16(-0.0f), 0x8000);
  EXPECT_EQ(f16(0.0f), 0x0000);
  EXPECT_EQ(bf16(-0.0f), 0x8000);
  EXPECT_EQ(bf16(1.0f + 0x1p-8f), 0x3f80);
  EXPECT_EQ(bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
  EXPECT_EQ(bf16(std::nextafter(1.0f + 0x1p-8f, 2.0f)), 0x3f81);
  EXPECT_EQ(bf16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_TRUE(bf16_is_nan(bf16(NAN)));
}

// Every float whose low 13 bits sit around the f16 rounding point (and bf16's, bit 15),
// for every value of the high bits: F16C, the portable path and convert() against the
// reference.
TEST(DType, Float32ToHalfSweepAgainstReference) {
  const uint32_t kLow[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff};
  std::vector<float> in;
  for (uint32_t hi = 0; hi < (1u << 18); ++hi)
    for (uint32_t low : kLow) in.push_back(std::bit_cast<float>(((hi << 13) | low) ^ ((hi & 1) << 31)));
  std::vector<uint16_t> out(in.size());
  convert(DType::Float32, in.data(), DType::Float16, out.data(), static_cast<int64_t>(in.size()));
  for (size_t i = 0; i < in.size(); ++i) {
    const uint16_t want = ref_f16().round(in[i]);
    if (std::isnan(in[i])) {
      ASSERT_TRUE(f16_is_nan(out[i]) && f16_is_nan(f16(in[i])));
      continue;
    }
    ASSERT_EQ(f16(in[i]), want) << in[i];
    ASSERT_EQ(detail::float_to_f16_bits_portable(in[i]), want) << in[i];
    ASSERT_EQ(out[i], want) << in[i];
  }
  std::mt19937 rng(7);
  std::vector<float> rin(100001);
  for (auto& v : rin) v = std::bit_cast<float>(static_cast<uint32_t>(rng()));
  std::vector<uint16_t> rout(rin.size());
  convert(DType::Float32, rin.data(), DType::BFloat16, rout.data(), static_cast<int64_t>(rin.size()));
  for (size_t i = 0; i < rin.size(); ++i) {
    if (std::isnan(rin[i])) {
      ASSERT_TRUE(bf16_is_nan(rout[i]));
      continue;
    }
    ASSERT_EQ(rout[i], ref_bf16().round(rin[i])) << rin[i];
  }
}

TEST(DType, Float64ToHalfNoDoubleRounding) {
  // Just above an f16 / bf16 tie by less than a float32 ulp: going through float32 with
  // RNE would land on the tie and round to even (down); correct rounding goes up.
  const double f16_case = 1.0 + 0x1p-11 + 0x1p-40;
  const double bf16_case = 1.0 + 0x1p-8 + 0x1p-40;
  uint16_t h = 0;
  convert(DType::Float64, &f16_case, DType::Float16, &h, 1);
  EXPECT_EQ(h, 0x3c01);
  convert(DType::Float64, &bf16_case, DType::BFloat16, &h, 1);
  EXPECT_EQ(h, 0x3f81);
  const double below = 1.0 + 0x1p-11 - 0x1p-40;
  convert(DType::Float64, &below, DType::Float16, &h, 1);
  EXPECT_EQ(h, 0x3c00);
  store_from_double(DType::Float16, &h, 0, 65519.999999);
  EXPECT_EQ(h, 0x7bff);
  store_from_double(DType::Float16, &h, 0, 1e300);
  EXPECT_EQ(h, 0x7c00);
  store_from_double(DType::BFloat16, &h, 0, -1e300);
  EXPECT_EQ(h, 0xff80);
  store_from_double(DType::Float16, &h, 0, 0x1p-25 + 0x1p-60);
  EXPECT_EQ(h, 0x0001);
  // int64 beyond 2^53: 2^62 + 2^54 + 1 is just above a bf16 tie.
  const int64_t big = (int64_t{1} << 62) + (int64_t{1} << 54) + 1;
  convert(DType::Int64, &big, DType::BFloat16, &h, 1);
  EXPECT_EQ(decode_bf16(h), std::ldexp(1.0, 62) + std::ldexp(1.0, 55));

  std::mt19937_64 rng(11);
  std::vector<double> d(20001);
  for (size_t i = 0; i < d.size(); ++i) {
    // Random doubles, many of them near ties (a 16-bit value plus a tiny offset).
    const double base = decode_f16(static_cast<uint16_t>(rng() & 0x7bff)) * ((rng() & 1) ? 1 : -1);
    d[i] = (i % 2) ? base * (1.0 + std::ldexp(static_cast<double>(rng() % 2049) - 1024.0, -22))
                   : std::ldexp(static_cast<double>(rng() >> 11), -static_cast<int>(rng() % 90) - 20);
  }
  std::vector<uint16_t> o16(d.size()), ob16(d.size());
  convert(DType::Float64, d.data(), DType::Float16, o16.data(), static_cast<int64_t>(d.size()));
  convert(DType::Float64, d.data(), DType::BFloat16, ob16.data(), static_cast<int64_t>(d.size()));
  for (size_t i = 0; i < d.size(); ++i) {
    ASSERT_EQ(o16[i], ref_f16().round(d[i])) << d[i];
    ASSERT_EQ(ob16[i], ref_bf16().round(d[i])) << d[i];
  }
  std::vector<int64_t> ints(5001);
  for (auto& v : ints) v = static_cast<int64_t>(rng()) >> (rng() % 60);
  std::vector<uint16_t> oi(ints.size());
  convert(DType::Int64, ints.data(), DType::BFloat16, oi.data(), static_cast<int64_t>(ints.size()));
  for (size_t i = 0; i < ints.size(); ++i) ASSERT_EQ(oi[i], ref_bf16().round(static_cast<long double>(ints[i])));
}

template <typename To, typename From>
To conv(From x) {
  To out{};
  convert(dtype_v<From>, &x, dtype_v<To>, &out, 1);
  return out;
}

TEST(DType, FloatToIntTruncatesAndSaturates) {
  EXPECT_EQ(conv<int32_t>(2.7f), 2);
  EXPECT_EQ(conv<int32_t>(-2.7f), -2);
  EXPECT_EQ(conv<int32_t>(NAN), 0);
  EXPECT_EQ(conv<int64_t>(-NAN), 0);
  EXPECT_EQ(conv<uint8_t>(NAN), 0);
  EXPECT_EQ(conv<int32_t>(1e10f), std::numeric_limits<int32_t>::max());
  EXPECT_EQ(conv<int32_t>(-1e10f), std::numeric_limits<int32_t>::min());
  EXPECT_EQ(conv<int32_t>(2147483520.0f), 2147483520);  // largest float below 2^31
  EXPECT_EQ(conv<int32_t>(2147483648.0f), std::numeric_limits<int32_t>::max());
  EXPECT_EQ(conv<int32_t>(-2147483648.0f), std::numeric_limits<int32_t>::min());
  EXPECT_EQ(conv<int32_t>(2147483647.9), 2147483647);
  EXPECT_EQ(conv<int32_t>(-2147483648.9), std::numeric_limits<int32_t>::min());
  EXPECT_EQ(conv<uint8_t>(300.0f), 255);
  EXPECT_EQ(conv<uint8_t>(-1.0f), 0);
  EXPECT_EQ(conv<uint8_t>(-0.9f), 0);
  EXPECT_EQ(conv<uint8_t>(255.9), 255);
  EXPECT_EQ(conv<int8_t>(-128.9f), -128);
  EXPECT_EQ(conv<int8_t>(127.5), 127);
  EXPECT_EQ(conv<int8_t>(-1e9), -128);
  EXPECT_EQ(conv<uint32_t>(4294967040.0f), 4294967040u);
  EXPECT_EQ(conv<uint32_t>(4294967296.0), std::numeric_limits<uint32_t>::max());
  EXPECT_EQ(conv<uint32_t>(-3.5), 0u);
  EXPECT_EQ(conv<int64_t>(9.3e18f), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(conv<int64_t>(0x1p63), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(conv<int64_t>(-0x1p63), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(conv<int64_t>(0x1p62), int64_t{1} << 62);
  EXPECT_EQ(conv<int64_t>(static_cast<double>(INFINITY)), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(conv<int32_t>(-INFINITY), std::numeric_limits<int32_t>::min());
  EXPECT_EQ(conv<int8_t>(float16{0x7c00}), 127);   // f16 +Inf
  EXPECT_EQ(conv<int32_t>(bfloat16{0xc020}), -2);  // bf16 -2.5
  EXPECT_EQ(conv<int32_t>(float16{0x4100}), 2);    // f16 2.5
  EXPECT_EQ(conv<uint8_t>(int32_t{-1}), 255);      // integer narrowing wraps
  EXPECT_EQ(conv<int8_t>(uint32_t{200}), -56);
  EXPECT_EQ(conv<bool>(NAN), true);
  EXPECT_EQ(conv<bool>(-0.0), false);
  EXPECT_EQ(conv<bool>(float16{0x8000}), false);
  EXPECT_EQ(conv<bool>(int64_t{1} << 40), true);
  EXPECT_EQ(conv<float>(true), 1.0f);
  EXPECT_EQ(conv<float16>(true).bits, 0x3c00);
}

// Every (from, to) pair on values that every type holds exactly; expected results from
// the documented rules computed here independently.
TEST(DType, AllPairsOnSmallValues) {
  std::mt19937 rng(3);
  const int64_t n = 37;
  std::vector<double> vals(n);
  for (auto& v : vals) v = static_cast<double>(static_cast<int>(rng() % 241) - 120) / ((rng() & 1) ? 1 : 4);
  vals[0] = 0;
  vals[1] = -0.25;
  for (DType from : kAll) {
    std::vector<uint8_t> src(n * 8);
    std::vector<double> held(n);
    for (int64_t i = 0; i < n; ++i) {
      double v = vals[i];
      if (!is_floating(from)) v = std::trunc(v);
      if (from == DType::Bool) v = v != 0;
      if (from == DType::UInt8 || from == DType::UInt32) v = std::fabs(v);
      store_from_double(from, src.data(), i, v);
      held[i] = v;
      ASSERT_EQ(load_as_double(from, src.data(), i), v) << name(from);
    }
    for (DType to : kAll) {
      std::vector<uint8_t> dst(n * 8 + 1, 0xAB);
      convert(from, src.data(), to, dst.data(), n);
      EXPECT_EQ(dst[itemsize(to) * n], 0xAB) << "wrote past the end";
      for (int64_t i = 0; i < n; ++i) {
        const double v = held[i];
        double want = 0;
        if (to == DType::Bool) {
          want = v != 0;
        } else if (is_floating(to)) {
          want = v;
        } else {
          const double t = std::trunc(v);
          if (to == DType::UInt8 || to == DType::UInt32) {
            const double m = to == DType::UInt8 ? 256.0 : 4294967296.0;
            want = is_floating(from) ? std::max(t, 0.0) : (t < 0 ? t + m : t);
          } else {
            want = t;
          }
        }
        ASSERT_EQ(load_as_double(to, dst.data(), i), want) << name(from) << "->" << name(to) << " v=" << v;
      }
    }
  }
}

TEST(DType, HotPathsMatchScalarAtOddSizes) {
  std::mt19937 rng(5);
  for (int64_t n : {0, 1, 7, 8, 9, 33, 1000, 1031}) {
    std::vector<float> f(static_cast<size_t>(n));
    for (auto& v : f) v = std::ldexp(static_cast<float>(rng() % 100000) - 50000.0f, static_cast<int>(rng() % 40) - 30);
    std::vector<uint16_t> h(f.size()), b(f.size());
    std::vector<float> fh(f.size()), fb(f.size());
    std::vector<double> d(f.size());
    std::vector<float> fd(f.size());
    convert(DType::Float32, f.data(), DType::Float16, h.data(), n);
    convert(DType::Float16, h.data(), DType::Float32, fh.data(), n);
    convert(DType::Float32, f.data(), DType::BFloat16, b.data(), n);
    convert(DType::BFloat16, b.data(), DType::Float32, fb.data(), n);
    convert(DType::Float32, f.data(), DType::Float64, d.data(), n);
    convert(DType::Float64, d.data(), DType::Float32, fd.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(h[i], ref_f16().round(f[i]));
      ASSERT_EQ(b[i], ref_bf16().round(f[i]));
      ASSERT_EQ(static_cast<double>(fh[i]), decode_f16(h[i]));
      ASSERT_EQ(static_cast<double>(fb[i]), decode_bf16(b[i]));
      ASSERT_EQ(d[i], static_cast<double>(f[i]));
      ASSERT_EQ(fd[i], f[i]);
    }
    std::vector<float> same(f.size());
    convert(DType::Float32, f.data(), DType::Float32, same.data(), n);
    EXPECT_EQ(same, f);
  }
}

TEST(DType, BadArguments) {
  float x = 0;
  EXPECT_THROW(convert(DType::Float32, &x, DType::Float32, &x, -1), ValueError);
  EXPECT_THROW(convert(static_cast<DType>(99), &x, DType::Float32, &x, 1), DTypeError);
  EXPECT_NO_THROW(convert(DType::Float32, nullptr, DType::Float16, nullptr, 0));
}

TEST(DType, ShortAndLongNamesRoundTrip) {
  for (int d = 0; d < kNumDTypes; ++d) {
    DType dtype = static_cast<DType>(d), back = DType::Bool;
    ASSERT_TRUE(dtype_from_name(short_name(dtype), &back)) << short_name(dtype);
    EXPECT_EQ(back, dtype);
    ASSERT_TRUE(dtype_from_name(name(dtype), &back)) << name(dtype);
    EXPECT_EQ(back, dtype);
  }
  EXPECT_EQ(short_name(DType::BFloat16), "bf16");
  DType untouched = DType::Int8;
  EXPECT_FALSE(dtype_from_name("f33", &untouched));
  EXPECT_FALSE(dtype_from_name("", &untouched));
  EXPECT_EQ(untouched, DType::Int8);
}

}  // namespace
}  // namespace tessera
