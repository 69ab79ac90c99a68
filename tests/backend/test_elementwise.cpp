// Elementwise kernels vs naive float64 references: every op family, every dtype
// family, broadcasting layouts, special values, and thread-count determinism.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/kernels/elementwise.h"
#include "tessera/base/error.h"
#include "tessera/base/thread_pool.h"

namespace tessera::cpu {
namespace {

constexpr double kPi = 3.14159265358979323846;

struct Buffer {
  DType dtype;
  std::vector<unsigned char> bytes;
  Buffer(DType d, int64_t n) : dtype(d), bytes(std::max<int64_t>(1, n) * itemsize(d)) {}
  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }
  double at(int64_t i) const { return load_as_double(dtype, bytes.data(), i); }
  void set(int64_t i, double v) { store_from_double(dtype, bytes.data(), i, v); }
};

Buffer random_buffer(DType dtype, int64_t n, double lo, double hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  Buffer b(dtype, n);
  for (int64_t i = 0; i < n; ++i) {
    double v = dist(rng);
    if (is_integral(dtype)) v = std::round(v);
    if (dtype == DType::Bool) v = v > 0;
    b.set(i, v);
  }
  return b;
}

double unary_ref(UnaryOp op, double x) {
  switch (op) {
    case UnaryOp::Neg:
      return -x;
    case UnaryOp::Abs:
      return std::abs(x);
    case UnaryOp::Sign:
      return x > 0 ? 1 : (x < 0 ? -1 : x);
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
      return 1 / std::sqrt(x);
    case UnaryOp::Tanh:
      return std::tanh(x);
    case UnaryOp::Erf:
      return std::erf(x);
    case UnaryOp::GeluTanh:
      return 0.5 * x * (1 + std::tanh(std::sqrt(2 / kPi) * (x + 0.044715 * x * x * x)));
    case UnaryOp::GeluErf:
      return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
    case UnaryOp::Silu:
      return x / (1 + std::exp(-x));
    case UnaryOp::Sigmoid:
      return 1 / (1 + std::exp(-x));
    case UnaryOp::Relu:
      return x > 0 ? x : 0;
    case UnaryOp::Sin:
      return std::sin(x);
    case UnaryOp::Cos:
      return std::cos(x);
    case UnaryOp::LogicalNot:
      return x == 0;
    case UnaryOp::Copy:
      return x;
  }
  return 0;
}

const UnaryOp kFloatUnary[] = {UnaryOp::Neg,  UnaryOp::Abs,      UnaryOp::Sign,    UnaryOp::Square, UnaryOp::Exp,
                               UnaryOp::Log,  UnaryOp::Log1p,    UnaryOp::Sqrt,    UnaryOp::Rsqrt,  UnaryOp::Tanh,
                               UnaryOp::Erf,  UnaryOp::GeluTanh, UnaryOp::GeluErf, UnaryOp::Silu,   UnaryOp::Sigmoid,
                               UnaryOp::Relu, UnaryOp::Sin,      UnaryOp::Cos,     UnaryOp::Copy};

// Relative tolerance of one rounding in `dtype` (results are computed in float32 at least).
double dtype_tol(DType d) {
  switch (d) {
    case DType::Float64:
      return 1e-14;
    case DType::Float32:
      return 2e-6;
    case DType::Float16:
      return 2e-3;
    case DType::BFloat16:
      return 1.6e-2;
    default:
      return 0;
  }
}

bool close(double got, double want, double rtol, double atol) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isinf(want)) return got == want;
  return std::abs(got - want) <= atol + rtol * std::abs(want);
}

TEST(Unary, FloatDtypesMatchFloat64Reference) {
  for (DType dtype : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16}) {
    for (UnaryOp op : kFloatUnary) {
      for (int64_t n : {0, 1, 7, 33, 1031}) {
        bool positive = op == UnaryOp::Log || op == UnaryOp::Sqrt || op == UnaryOp::Rsqrt;
        Buffer x = random_buffer(dtype, n, positive ? 0.01 : -6, 6, 17 + static_cast<uint32_t>(n));
        Buffer out(dtype, n);
        unary(op, dtype, x.data(), out.data(), n);
        double tol = dtype_tol(dtype);
        for (int64_t i = 0; i < n; ++i) {
          double xi = x.at(i), want = unary_ref(op, xi);
          // Sin/cos/log near a zero of the function: allow an absolute error of one input ulp.
          ASSERT_TRUE(close(out.at(i), want, 2 * tol, 2 * tol))
              << name(dtype) << " op " << static_cast<int>(op) << " x=" << xi << " got " << out.at(i) << " want "
              << want;
        }
      }
    }
  }
}

// The AVX2 float32 exp/log/tanh/erf against double over wide ranges, including saturation.
TEST(Unary, Float32TranscendentalAccuracy) {
  std::mt19937 rng(3);
  auto check = [&](UnaryOp op, double lo, double hi, double rtol, double atol) {
    const int64_t n = 20000;
    std::uniform_real_distribution<double> dist(lo, hi);
    std::vector<float> x(n), y(n);
    for (auto& v : x) v = static_cast<float>(dist(rng));
    unary(op, DType::Float32, x.data(), y.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      double want = unary_ref(op, x[i]);
      if (op == UnaryOp::Exp && want < 1.2e-38) {  // subnormal results: absolute ulp-level
        ASSERT_NEAR(y[i], want, 2e-45) << "exp(" << x[i] << ")";
        continue;
      }
      if (want > std::numeric_limits<float>::max()) {
        ASSERT_EQ(y[i], INFINITY) << static_cast<int>(op) << " x=" << x[i];
        continue;
      }
      ASSERT_LE(std::abs(y[i] - want), atol + rtol * std::abs(want))
          << "op " << static_cast<int>(op) << " x=" << x[i] << " got " << y[i] << " want " << want;
    }
  };
  check(UnaryOp::Exp, -110, 95, 2.5e-7, 0);
  check(UnaryOp::Exp, -1, 1, 2.5e-7, 0);
  check(UnaryOp::Log, 1e-3, 1e3, 2.5e-7, 1e-7 * 0.0);
  check(UnaryOp::Log, 0.5, 2, 2.5e-7, 1e-7);
  check(UnaryOp::Tanh, -20, 20, 0, 1e-6);
  check(UnaryOp::Tanh, -1, 1, 1e-6, 0);
  check(UnaryOp::Erf, -6, 6, 0, 1e-6);
  check(UnaryOp::Erf, -0.6, 0.6, 1e-6, 0);
  check(UnaryOp::Sigmoid, -100, 100, 1e-6, 1e-7);
  check(UnaryOp::Silu, -100, 100, 1e-6, 1e-6);
  check(UnaryOp::GeluTanh, -20, 20, 1e-6, 1e-6);
  check(UnaryOp::GeluErf, -20, 20, 1e-6, 1e-5);
  // Log over every binade, subnormals included.
  for (int e = -149; e < 128; ++e) {
    float x[3] = {std::ldexp(1.0f, e), std::ldexp(1.37f, e), std::ldexp(1.9f, e)};
    float y[3];
    if (e > 126) x[2] = x[1];
    unary(UnaryOp::Log, DType::Float32, x, y, 3);
    for (int j = 0; j < 3; ++j)
      ASSERT_NEAR(y[j], std::log(static_cast<double>(x[j])), 3e-7 * std::abs(std::log(x[j])) + 1e-7) << x[j];
  }
}

TEST(Unary, Float32SpecialValues) {
  const float inf = INFINITY, nan = NAN;
  std::vector<float> x = {inf, -inf, nan, 0.0f, -0.0f, 100.0f, -100.0f, 1e-30f, 3.4e38f};
  std::vector<float> y(x.size());
  unary(UnaryOp::Exp, DType::Float32, x.data(), y.data(), x.size());
  EXPECT_EQ(y[0], inf);
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_TRUE(std::isnan(y[2]));
  EXPECT_EQ(y[3], 1.0f);
  EXPECT_EQ(y[5], inf);
  EXPECT_NEAR(y[6], std::exp(-100.0), 1e-45);  // subnormal
  unary(UnaryOp::Log, DType::Float32, x.data(), y.data(), x.size());
  EXPECT_EQ(y[0], inf);
  EXPECT_TRUE(std::isnan(y[1]));
  EXPECT_TRUE(std::isnan(y[2]));
  EXPECT_EQ(y[3], -inf);
  EXPECT_EQ(y[4], -inf);
  EXPECT_TRUE(std::isnan(y[6]));
  for (UnaryOp op : {UnaryOp::Tanh, UnaryOp::Erf, UnaryOp::Sigmoid}) {
    unary(op, DType::Float32, x.data(), y.data(), x.size());
    double hi = 1.0, lo = op == UnaryOp::Sigmoid ? 0.0 : -1.0;
    EXPECT_EQ(y[0], hi) << static_cast<int>(op);
    EXPECT_EQ(y[1], lo) << static_cast<int>(op);
    EXPECT_TRUE(std::isnan(y[2]));
    EXPECT_EQ(y[5], hi);
    EXPECT_NEAR(y[6], lo, 1e-43);
  }
  for (UnaryOp op : {UnaryOp::GeluTanh, UnaryOp::GeluErf, UnaryOp::Silu}) {
    unary(op, DType::Float32, x.data(), y.data(), x.size());
    EXPECT_EQ(y[0], inf);
    EXPECT_TRUE(std::isnan(y[2]));
    EXPECT_EQ(y[5], 100.0f);
    EXPECT_NEAR(y[6], 0.0f, 1e-6);
  }
}

TEST(Unary, Integers) {
  for (DType dtype : {DType::Int8, DType::UInt8, DType::Int32, DType::UInt32, DType::Int64}) {
    const int64_t n = 101;
    Buffer x = random_buffer(dtype, n, is_signed(dtype) ? -10 : 0, 10, 5);
    for (UnaryOp op : {UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Sign, UnaryOp::Square, UnaryOp::Relu, UnaryOp::Copy}) {
      if (op == UnaryOp::Neg && !is_signed(dtype)) continue;
      Buffer out(dtype, n);
      unary(op, dtype, x.data(), out.data(), n);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out.at(i), unary_ref(op, x.at(i))) << name(dtype);
    }
    Buffer out(dtype, n);
    EXPECT_THROW(unary(UnaryOp::Exp, dtype, x.data(), out.data(), n), DTypeError);
  }
  int8_t m = -128, r;
  unary(UnaryOp::Neg, DType::Int8, &m, &r, 1);  // wraps like numpy
  EXPECT_EQ(r, -128);
}

TEST(Unary, LogicalNotWritesBool) {
  std::vector<float> x = {0.0f, 1.0f, -2.0f, NAN};
  bool out[4];
  unary(UnaryOp::LogicalNot, DType::Float32, x.data(), out, 4);
  EXPECT_TRUE(out[0]);
  EXPECT_FALSE(out[1]);
  EXPECT_FALSE(out[2]);
  EXPECT_FALSE(out[3]);
  bool b[3] = {true, false, true}, nb[3];
  unary(UnaryOp::LogicalNot, DType::Bool, b, nb, 3);
  EXPECT_FALSE(nb[0]);
  EXPECT_TRUE(nb[1]);
}

}  // namespace
}  // namespace tessera::cpu
