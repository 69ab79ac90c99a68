// Binary kernels, where, cast and fill vs naive float64 / int64 references, over
// broadcasting layouts and every dtype family; thread-count determinism.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/kernels/elementwise.h"
#include "tessera/base/error.h"
#include "tessera/base/thread_pool.h"

namespace tessera::cpu {
namespace {

constexpr double kPi = 3.14159265358979323846;

std::vector<unsigned char> random_bytes(DType dtype, int64_t n, double lo, double hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<unsigned char> b(std::max<int64_t>(1, n) * itemsize(dtype));
  for (int64_t i = 0; i < n; ++i) {
    double v = dist(rng);
    if (is_integral(dtype)) v = std::round(v);
    if (dtype == DType::Bool) v = v > 0;
    store_from_double(dtype, b.data(), i, v);
  }
  return b;
}

double binary_ref(BinaryOp op, double a, double b, bool integer) {
  double s = 1 / (1 + std::exp(-a));
  switch (op) {
    case BinaryOp::Add:
      return a + b;
    case BinaryOp::Sub:
      return a - b;
    case BinaryOp::Mul:
      return a * b;
    case BinaryOp::Div:
      return integer ? (b == 0 ? 0 : std::trunc(a / b)) : a / b;
    case BinaryOp::Pow:
      if (integer && b < 0) return a == 1 ? 1 : (a == -1 ? (std::fmod(b, 2) == 0 ? 1 : -1) : 0);
      return std::pow(a, b);
    case BinaryOp::Maximum:
      return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b);
    case BinaryOp::Minimum:
      return std::isnan(a) || std::isnan(b) ? NAN : std::min(a, b);
    case BinaryOp::Equal:
      return a == b;
    case BinaryOp::NotEqual:
      return a != b;
    case BinaryOp::Less:
      return a < b;
    case BinaryOp::LessEqual:
      return a <= b;
    case BinaryOp::Greater:
      return a > b;
    case BinaryOp::GreaterEqual:
      return a >= b;
    case BinaryOp::LogicalAnd:
      return a != 0 && b != 0;
    case BinaryOp::LogicalOr:
      return a != 0 || b != 0;
    case BinaryOp::GeluTanhGrad: {
      double k = std::sqrt(2 / kPi), t = std::tanh(k * (a + 0.044715 * a * a * a));
      return b * (0.5 * (1 + t) + 0.5 * a * (1 - t * t) * k * (1 + 3 * 0.044715 * a * a));
    }
    case BinaryOp::GeluErfGrad:
      return b * (0.5 * (1 + std::erf(a / std::sqrt(2.0))) + a * std::exp(-0.5 * a * a) / std::sqrt(2 * kPi));
    case BinaryOp::SiluGrad:
      return b * s * (1 + a * (1 - s));
    case BinaryOp::SigmoidGrad:
      return b * s * (1 - s);
    case BinaryOp::TanhGrad:
      return b * (1 - a * a);
  }
  return 0;
}

bool bool_out(BinaryOp op) { return is_comparison(op) || op == BinaryOp::LogicalAnd || op == BinaryOp::LogicalOr; }

// Runs binary() on a (shape sa) and b (shape sb) and checks every element against the reference.
void check_binary(BinaryOp op, DType dtype, const Shape& sa, const Shape& sb, uint32_t seed) {
  Shape so = broadcast_shapes(sa, sb, "test");
  const int64_t na = numel(sa), nb = numel(sb), no = numel(so);
  const bool integer = is_integral(dtype);
  double lo = integer && !is_signed(dtype) ? 0 : -4, hi = 4;
  auto a = random_bytes(dtype, na, lo, hi, seed);
  auto b = random_bytes(dtype, nb, op == BinaryOp::Pow && !integer ? 0 : lo, hi, seed + 1);
  if (op == BinaryOp::Pow && !integer)  // float pow: positive bases
    for (int64_t i = 0; i < na; ++i)
      store_from_double(dtype, a.data(), i, std::abs(load_as_double(dtype, a.data(), i)) + 0.5);
  DType out_dtype = bool_out(op) ? DType::Bool : dtype;
  std::vector<unsigned char> out(std::max<int64_t>(1, no) * itemsize(out_dtype));
  Strides stra = broadcast_strides(sa, so), strb = broadcast_strides(sb, so);
  binary(op, dtype, a.data(), stra, b.data(), strb, out.data(), so);
  Strides cs = contiguous_strides(so);
  const bool grad = op >= BinaryOp::GeluTanhGrad;
  double tol = dtype == DType::Float64   ? 1e-13
               : dtype == DType::Float32 ? 2e-6
               : dtype == DType::Float16 ? 2e-3
                                         : 1.6e-2;
  if (grad && dtype == DType::Float32) tol = 4e-6;
  for (int64_t i = 0; i < no; ++i) {
    int64_t ia = 0, ib = 0, rem = i;
    for (size_t d = 0; d < so.size(); ++d) {
      int64_t idx = rem / cs[d];
      rem %= cs[d];
      ia += idx * stra[d];
      ib += idx * strb[d];
    }
    double x = load_as_double(dtype, a.data(), ia), y = load_as_double(dtype, b.data(), ib);
    double want = binary_ref(op, x, y, integer || dtype == DType::Bool);
    if (dtype == DType::Bool && !bool_out(op)) want = want != 0;
    if (integer && !bool_out(op)) {  // integer results wrap modulo 2^bits
      const int bits = static_cast<int>(itemsize(dtype)) * 8;
      uint64_t u = static_cast<uint64_t>(static_cast<int64_t>(want));
      if (bits < 64) u &= (uint64_t{1} << bits) - 1;
      if (is_signed(dtype) && bits < 64 && (u >> (bits - 1)) & 1) u |= ~((uint64_t{1} << bits) - 1);
      want = is_signed(dtype) ? static_cast<double>(static_cast<int64_t>(u)) : static_cast<double>(u);
    } else if (!bool_out(op))
      want = load_as_double(
          out_dtype,
          [&] {  // the reference rounded to the output dtype
            static thread_local std::vector<unsigned char> tmp(8);
            store_from_double(out_dtype, tmp.data(), 0, want);
            return tmp.data();
          }(),
          0);
    double got = load_as_double(out_dtype, out.data(), i);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got));
    } else if (integer || bool_out(op) || dtype == DType::Bool) {
      ASSERT_EQ(got, want) << name(dtype) << " op " << static_cast<int>(op) << " a=" << x << " b=" << y;
    } else {
      double scale = grad ? std::abs(y) * (1 + std::abs(x)) : std::abs(want);
      ASSERT_NEAR(got, want, tol * (scale + (grad ? 1 : 0)) + 1e-300)
          << name(dtype) << " op " << static_cast<int>(op) << " a=" << x << " b=" << y << " at " << i << " of "
          << to_string(so);
    }
  }
}

const std::vector<std::pair<Shape, Shape>> kLayouts = {{{1031}, {1031}},
                                                       {{}, {37}},
                                                       {{37}, {}},
                                                       {{3, 1, 5}, {4, 1}},
                                                       {{4, 1}, {3, 1, 5}},
                                                       {{2, 3, 70}, {70}},
                                                       {{2, 3, 70}, {3, 1}},
                                                       {{0, 3}, {3}},
                                                       {{5, 0}, {1, 1}},
                                                       {{1, 1, 1}, {1}},
                                                       {{7}, {1}},
                                                       {{33, 1}, {1, 33}},
                                                       {{2, 1, 3, 1, 9}, {1, 5, 1, 4, 9}}};

TEST(Binary, FloatOpsAllLayouts) {
  const BinaryOp ops[] = {BinaryOp::Add,         BinaryOp::Sub,          BinaryOp::Mul,         BinaryOp::Div,
                          BinaryOp::Pow,         BinaryOp::Maximum,      BinaryOp::Minimum,     BinaryOp::Less,
                          BinaryOp::Equal,       BinaryOp::GreaterEqual, BinaryOp::LogicalAnd,  BinaryOp::GeluTanhGrad,
                          BinaryOp::GeluErfGrad, BinaryOp::SiluGrad,     BinaryOp::SigmoidGrad, BinaryOp::TanhGrad};
  uint32_t seed = 1;
  for (DType dtype : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16})
    for (BinaryOp op : ops)
      for (const auto& [sa, sb] : kLayouts) check_binary(op, dtype, sa, sb, seed++);
}

TEST(Binary, IntegerAndBoolOps) {
  const BinaryOp int_ops[] = {BinaryOp::Add,     BinaryOp::Sub,       BinaryOp::Mul,      BinaryOp::Div,
                              BinaryOp::Pow,     BinaryOp::Maximum,   BinaryOp::Minimum,  BinaryOp::NotEqual,
                              BinaryOp::Greater, BinaryOp::LessEqual, BinaryOp::LogicalOr};
  uint32_t seed = 100;
  for (DType dtype : {DType::Int8, DType::UInt8, DType::Int32, DType::UInt32, DType::Int64})
    for (BinaryOp op : int_ops)
      for (const auto& [sa, sb] : kLayouts) check_binary(op, dtype, sa, sb, seed++);
  for (BinaryOp op : {BinaryOp::Add, BinaryOp::Mul, BinaryOp::Maximum, BinaryOp::Minimum, BinaryOp::LogicalAnd,
                      BinaryOp::LogicalOr, BinaryOp::Equal, BinaryOp::Less})
    for (const auto& [sa, sb] : kLayouts) check_binary(op, DType::Bool, sa, sb, seed++);
  bool t = true;
  bool o;
  EXPECT_THROW(binary(BinaryOp::Sub, DType::Bool, &t, {}, &t, {}, &o, {}), DTypeError);
  int32_t x = 5;
  EXPECT_THROW(binary(BinaryOp::SiluGrad, DType::Int32, &x, {}, &x, {}, &o, {}), DTypeError);
  EXPECT_THROW(binary(BinaryOp::Add, DType::Int32, &x, {1}, &x, {}, &o, {1}), ShapeError);
}

TEST(Binary, IntegerEdgeCases) {
  std::vector<int32_t> a = {7, -7, 7, -7, 5, std::numeric_limits<int32_t>::min(), 2, -1, -1, 1, 3, 0};
  std::vector<int32_t> b = {2, 2, -2, -2, 0, -1, 10, -3, -4, -9, -1, 0};
  std::vector<int32_t> div(a.size()), pw(a.size());
  Strides s = {1};
  binary(BinaryOp::Div, DType::Int32, a.data(), s, b.data(), s, div.data(), {static_cast<int64_t>(a.size())});
  binary(BinaryOp::Pow, DType::Int32, a.data(), s, b.data(), s, pw.data(), {static_cast<int64_t>(a.size())});
  std::vector<int32_t> want_div = {3, -3, -3, 3, 0, std::numeric_limits<int32_t>::min(), 0, 0, 0, 0, -3, 0};
  EXPECT_EQ(div, want_div);
  EXPECT_EQ(pw[0], 49);
  EXPECT_EQ(pw[6], 1024);
  EXPECT_EQ(pw[7], -1);  // (-1)^-3
  EXPECT_EQ(pw[8], 1);   // (-1)^-4
  EXPECT_EQ(pw[9], 1);   // 1^-9
  EXPECT_EQ(pw[10], 0);  // 3^-1
  EXPECT_EQ(pw[11], 1);  // 0^0
}

TEST(Binary, FloatNaNPropagatesThroughMaxMin) {
  std::vector<float> a(19, 1.0f), b(19, 2.0f), out(19);
  a[3] = NAN;
  b[11] = NAN;
  b[18] = NAN;
  for (BinaryOp op : {BinaryOp::Maximum, BinaryOp::Minimum}) {
    binary(op, DType::Float32, a.data(), {1}, b.data(), {1}, out.data(), {19});
    for (int i = 0; i < 19; ++i) EXPECT_EQ(std::isnan(out[i]), i == 3 || i == 11 || i == 18) << i;
  }
}

TEST(Where, BroadcastAllDtypes) {
  for (DType dtype : {DType::Bool, DType::Int8, DType::BFloat16, DType::Float32, DType::Int64, DType::Float64}) {
    for (const auto& [sa, sb] : kLayouts) {
      Shape sc = {sb.empty() ? 1 : sb.back()};
      Shape so = broadcast_shapes(broadcast_shapes(sa, sb, "t"), sc, "t");
      auto c = random_bytes(DType::Bool, numel(sc), -1, 1, 3);
      auto a = random_bytes(dtype, numel(sa), -9, 9, 4);
      auto b = random_bytes(dtype, numel(sb), -9, 9, 5);
      std::vector<unsigned char> out(std::max<int64_t>(1, numel(so)) * itemsize(dtype));
      Strides stc = broadcast_strides(sc, so), sta = broadcast_strides(sa, so), stb = broadcast_strides(sb, so);
      where(c.data(), stc, dtype, a.data(), sta, b.data(), stb, out.data(), so);
      Strides cs = contiguous_strides(so);
      for (int64_t i = 0; i < numel(so); ++i) {
        int64_t ic = 0, ia = 0, ib = 0, rem = i;
        for (size_t d = 0; d < so.size(); ++d) {
          int64_t idx = rem / cs[d];
          rem %= cs[d];
          ic += idx * stc[d];
          ia += idx * sta[d];
          ib += idx * stb[d];
        }
        double want = reinterpret_cast<const bool*>(c.data())[ic] ? load_as_double(dtype, a.data(), ia)
                                                                  : load_as_double(dtype, b.data(), ib);
        ASSERT_EQ(load_as_double(dtype, out.data(), i), want);
      }
    }
  }
}

TEST(Cast, MatchesConvertForAllPairs) {
  const int64_t n = 1037;
  for (int f = 0; f < kNumDTypes; ++f) {
    for (int t = 0; t < kNumDTypes; ++t) {
      DType from = static_cast<DType>(f), to = static_cast<DType>(t);
      auto x = random_bytes(from, n, is_signed(from) || is_floating(from) ? -300 : 0, 300, 9 + f);
      if (is_floating(from)) {  // special values and rounding ties
        store_from_double(from, x.data(), 0, NAN);
        store_from_double(from, x.data(), 1, INFINITY);
        store_from_double(from, x.data(), 2, -INFINITY);
        store_from_double(from, x.data(), 3, 1e-7);
        store_from_double(from, x.data(), 4, 1.0 + 1.0 / 256);  // bf16 tie
      }
      std::vector<unsigned char> got(n * itemsize(to)), want(n * itemsize(to));
      cast(from, x.data(), to, got.data(), n);
      convert(from, x.data(), to, want.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        double g = load_as_double(to, got.data(), i), w = load_as_double(to, want.data(), i);
        if (std::isnan(w)) {
          ASSERT_TRUE(std::isnan(g));
          continue;
        }
        ASSERT_EQ(std::memcmp(got.data() + i * itemsize(to), want.data() + i * itemsize(to), itemsize(to)), 0)
            << name(from) << "->" << name(to) << " at " << i << ": " << g << " vs " << w;
      }
    }
  }
}

TEST(Cast, Float32ToHalvesRoundsToNearestEven) {
  std::mt19937 rng(11);
  std::vector<float> x(4099);
  for (auto& v : x) v = std::bit_cast<float>(static_cast<uint32_t>(rng()));  // every bit pattern kind
  std::vector<bfloat16> bf(x.size());
  std::vector<float16> hf(x.size());
  cast(DType::Float32, x.data(), DType::BFloat16, bf.data(), x.size());
  cast(DType::Float32, x.data(), DType::Float16, hf.data(), x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i])) {
      EXPECT_TRUE(std::isnan(bf16_to_float(bf[i])));
      EXPECT_TRUE(std::isnan(f16_to_float(hf[i])));
      continue;
    }
    ASSERT_EQ(bf[i].bits, float_to_bf16(x[i]).bits) << x[i];
    ASSERT_EQ(hf[i].bits, float_to_f16(x[i]).bits) << x[i];
  }
}

TEST(Fill, EveryDtype) {
  for (int d = 0; d < kNumDTypes; ++d) {
    DType dtype = static_cast<DType>(d);
    for (int64_t n : {0, 1, 100003}) {
      std::vector<unsigned char> out(std::max<int64_t>(1, n) * itemsize(dtype));
      fill(dtype, 3.0, out.data(), n);
      for (int64_t i = 0; i < n; i += 997)
        ASSERT_EQ(load_as_double(dtype, out.data(), i), dtype == DType::Bool ? 1 : 3);
      if (n > 0) {
        ASSERT_EQ(load_as_double(dtype, out.data(), n - 1), dtype == DType::Bool ? 1 : 3);
      }
    }
  }
}

TEST(Elementwise, BitwiseIdenticalAcrossThreadCounts) {
  const int64_t n = 300001;
  auto a = random_bytes(DType::Float32, n, -8, 8, 21);
  auto b = random_bytes(DType::Float32, 1000, -8, 8, 22);
  auto run = [&](int threads) {
    set_num_threads(threads);
    std::vector<float> out(n * 4);
    unary(UnaryOp::GeluTanh, DType::Float32, a.data(), out.data(), n);
    unary(UnaryOp::Exp, DType::Float32, a.data(), out.data() + n, n);
    binary(BinaryOp::GeluErfGrad, DType::Float32, a.data(), {1000, 1}, b.data(), {0, 1}, out.data() + 2 * n,
           {300, 1000});
    binary(BinaryOp::Mul, DType::Float32, a.data(), {1, 0}, b.data(), {0, 1}, out.data() + 3 * n, {300, 1000});
    return out;
  };
  int saved = num_threads();
  auto one = run(1), two = run(2);
  set_num_threads(saved);
  EXPECT_EQ(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace tessera::cpu
