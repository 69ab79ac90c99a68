// Elementwise ops vs float64 std:: references: every unary and binary op, numpy
// broadcasting (size-1 dims, scalars, empty dims), dtype promotion and weak scalars.
#include <cmath>
#include <numbers>

#include "test_util.h"

namespace tessera::test {
namespace {

struct UnaryCase {
  const char* name;
  std::function<Array(const Array&)> op;
  std::function<double(double)> ref;
  double lo, hi;  // input domain
};

double ref_gelu_tanh(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
}
double ref_gelu_erf(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
double ref_sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

std::vector<UnaryCase> unary_cases() {
  return {
      {"negative", [](const Array& a) { return negative(a); }, [](double x) { return -x; }, -3, 3},
      {"abs", [](const Array& a) { return abs(a); }, [](double x) { return std::abs(x); }, -3, 3},
      {"sign", [](const Array& a) { return sign(a); }, [](double x) { return double((x > 0) - (x < 0)); }, -3, 3},
      {"square", [](const Array& a) { return square(a); }, [](double x) { return x * x; }, -3, 3},
      {"exp", [](const Array& a) { return exp(a); }, [](double x) { return std::exp(x); }, -10, 10},
      {"log", [](const Array& a) { return log(a); }, [](double x) { return std::log(x); }, 1e-3, 50},
      {"log1p", [](const Array& a) { return log1p(a); }, [](double x) { return std::log1p(x); }, -0.9, 5},
      {"sqrt", [](const Array& a) { return sqrt(a); }, [](double x) { return std::sqrt(x); }, 0, 20},
      {"rsqrt", [](const Array& a) { return rsqrt(a); }, [](double x) { return 1 / std::sqrt(x); }, 0.01, 20},
      {"tanh", [](const Array& a) { return tanh(a); }, [](double x) { return std::tanh(x); }, -6, 6},
      {"erf", [](const Array& a) { return erf(a); }, [](double x) { return std::erf(x); }, -4, 4},
      {"sin", [](const Array& a) { return sin(a); }, [](double x) { return std::sin(x); }, -6, 6},
      {"cos", [](const Array& a) { return cos(a); }, [](double x) { return std::cos(x); }, -6, 6},
      {"sigmoid", [](const Array& a) { return sigmoid(a); }, ref_sigmoid, -12, 12},
      {"relu", [](const Array& a) { return relu(a); }, [](double x) { return x > 0 ? x : 0.0; }, -3, 3},
      {"silu", [](const Array& a) { return silu(a); }, [](double x) { return x * ref_sigmoid(x); }, -8, 8},
      {"gelu_tanh", [](const Array& a) { return gelu(a, true); }, ref_gelu_tanh, -6, 6},
      {"gelu_erf", [](const Array& a) { return gelu(a, false); }, ref_gelu_erf, -6, 6},
  };
}

TEST(Unary, AllOpsAllFloatDtypesVsStd) {
  // 1037: vector body plus a tail; also odd shape [7, 3] and the empty [0, 3].
  const std::vector<Shape> shapes = {{1037}, {7, 3}, {0, 3}, {}};
  for (const auto& c : unary_cases()) {
    for (DType dt : {DType::Float64, DType::Float32, DType::BFloat16, DType::Float16}) {
      for (size_t si = 0; si < shapes.size(); ++si) {
        const Shape& s = shapes[si];
        auto v = round_to(random_values(numel(s), 11 + static_cast<uint32_t>(si), c.lo, c.hi), dt);
        Array x = make_array(v, s, dt);
        Array y = c.op(x);
        EXPECT_EQ(y.dtype(), dt) << c.name;
        EXPECT_EQ(y.shape(), s) << c.name;
        auto expected = ref_unary(v, c.ref);
        double rtol = dt == DType::Float64 ? 1e-12 : dt == DType::Float32 ? 1e-5 : dt == DType::Float16 ? 2e-3 : 1e-2;
        double atol = dt == DType::Float64 ? 1e-14 : dt == DType::Float32 ? 1e-6 : dt == DType::Float16 ? 1e-3 : 1e-2;
        EXPECT_TRUE(all_close(y, expected, rtol, atol)) << c.name << " " << name(dt) << " shape " << to_string(s);
      }
    }
  }
}

TEST(Unary, IntegerInputs) {
  std::vector<double> v = {-3, -1, 0, 2, 5, 7, -100};
  Array x = make_array(v, {7}, DType::Int32);
  EXPECT_EQ(negative(x).dtype(), DType::Int32);
  EXPECT_CLOSE(negative(x), ref_unary(v, [](double a) { return -a; }), 0, 0);
  EXPECT_EQ(abs(x).dtype(), DType::Int32);
  EXPECT_CLOSE(abs(x), ref_unary(v, [](double a) { return std::abs(a); }), 0, 0);
  EXPECT_CLOSE(sign(x), ref_unary(v, [](double a) { return double((a > 0) - (a < 0)); }), 0, 0);
  EXPECT_EQ(square(x).dtype(), DType::Int32);
  EXPECT_CLOSE(square(x), ref_unary(v, [](double a) { return a * a; }), 0, 0);
  EXPECT_CLOSE(relu(x), ref_unary(v, [](double a) { return a > 0 ? a : 0; }), 0, 0);
  // Transcendental ops on integers compute in float32.
  std::vector<double> small = {-3, -1, 0, 2, 5, 7, 1};
  Array xs = make_array(small, {7}, DType::Int32);
  Array e = exp(xs);
  EXPECT_EQ(e.dtype(), DType::Float32);
  EXPECT_CLOSE(e, ref_unary(small, [](double a) { return std::exp(a); }), 1e-5, 0);
  EXPECT_EQ(tanh(xs).dtype(), DType::Float32);
  EXPECT_EQ(sqrt(make_array({4, 9}, {2}, DType::Int64)).dtype(), DType::Float32);
  EXPECT_CLOSE(sqrt(make_array({4, 9}, {2}, DType::Int64)), std::vector<double>({2, 3}), 1e-6, 0);
  EXPECT_EQ(sigmoid(make_array({0, 1}, {2}, DType::UInt8)).dtype(), DType::Float32);
}

TEST(Unary, LogicalNotAndStopGradient) {
  Array b = Array::from_vector<bool>({true, false, false, true}, {2, 2});
  Array n = logical_not(b);
  EXPECT_EQ(n.dtype(), DType::Bool);
  EXPECT_CLOSE(n, std::vector<double>({0, 1, 1, 0}), 0, 0);
  Array x = random_array({3, 4}, 5);
  EXPECT_CLOSE(stop_gradient(x), values(x), 0, 0);
}

struct BinaryCase {
  const char* name;
  std::function<Array(const Array&, const Array&)> op;
  std::function<double(double, double)> ref;
  bool positive_a = false;  // power needs a positive base
};

std::vector<BinaryCase> arith_cases() {
  return {
      {"add", [](const Array& a, const Array& b) { return add(a, b); }, [](double a, double b) { return a + b; }},
      {"subtract", [](const Array& a, const Array& b) { return subtract(a, b); },
       [](double a, double b) { return a - b; }},
      {"multiply", [](const Array& a, const Array& b) { return multiply(a, b); },
       [](double a, double b) { return a * b; }},
      {"divide", [](const Array& a, const Array& b) { return divide(a, b); }, [](double a, double b) { return a / b; }},
      {"power", [](const Array& a, const Array& b) { return power(a, b); },
       [](double a, double b) { return std::pow(a, b); }, true},
      {"maximum", [](const Array& a, const Array& b) { return maximum(a, b); },
       [](double a, double b) { return std::max(a, b); }},
      {"minimum", [](const Array& a, const Array& b) { return minimum(a, b); },
       [](double a, double b) { return std::min(a, b); }},
  };
}

std::vector<BinaryCase> compare_cases() {
  return {
      {"equal", [](const Array& a, const Array& b) { return equal(a, b); }, [](double a, double b) { return a == b; }},
      {"not_equal", [](const Array& a, const Array& b) { return not_equal(a, b); },
       [](double a, double b) { return a != b; }},
      {"less", [](const Array& a, const Array& b) { return less(a, b); }, [](double a, double b) { return a < b; }},
      {"less_equal", [](const Array& a, const Array& b) { return less_equal(a, b); },
       [](double a, double b) { return a <= b; }},
      {"greater", [](const Array& a, const Array& b) { return greater(a, b); },
       [](double a, double b) { return a > b; }},
      {"greater_equal", [](const Array& a, const Array& b) { return greater_equal(a, b); },
       [](double a, double b) { return a >= b; }},
  };
}

const std::vector<std::pair<Shape, Shape>>& broadcast_pairs() {
  static const std::vector<std::pair<Shape, Shape>> pairs = {
      {{3, 1, 5}, {4, 1}}, {{}, {2, 3}},     {{2, 3}, {}},     {{7, 33}, {7, 33}},           {{1, 5}, {6, 1}},
      {{0, 3}, {3}},       {{0, 3}, {1, 3}}, {{1037}, {1037}}, {{2, 1, 3, 1}, {1, 4, 1, 5}},
  };
  return pairs;
}

TEST(Binary, ArithmeticBroadcastingAllFloatDtypes) {
  for (const auto& c : arith_cases()) {
    for (DType dt : {DType::Float64, DType::Float32, DType::BFloat16}) {
      uint32_t seed = 100;
      for (const auto& [sa, sb] : broadcast_pairs()) {
        double lo = c.positive_a ? 0.1 : -2;
        auto va = round_to(random_values(numel(sa), seed++, lo, 2), dt);
        auto vb = round_to(random_values(numel(sb), seed++, -2, 2), dt);
        if (std::string(c.name) == "divide")  // keep divisors away from zero
          for (auto& x : vb) x = x < 0 ? x - 0.5 : x + 0.5;
        vb = round_to(vb, dt);
        Array a = make_array(va, sa, dt), b = make_array(vb, sb, dt);
        Array y = c.op(a, b);
        EXPECT_EQ(y.dtype(), dt) << c.name;
        EXPECT_EQ(y.shape(), ref_broadcast_shape(sa, sb)) << c.name << " " << to_string(sa) << " " << to_string(sb);
        double rtol = dt == DType::Float64 ? 1e-13 : dt == DType::Float32 ? 1e-5 : 1e-2;
        double atol = dt == DType::Float64 ? 1e-14 : dt == DType::Float32 ? 1e-6 : 1e-2;
        EXPECT_TRUE(all_close(y, ref_binary(va, sa, vb, sb, c.ref), rtol, atol))
            << c.name << " " << name(dt) << " " << to_string(sa) << " with " << to_string(sb);
      }
    }
  }
}

TEST(Binary, Int32Arithmetic) {
  Shape sa = {3, 1, 5}, sb = {4, 1};
  std::vector<double> va, vb;
  for (auto x : random_ints(numel(sa), 1, -50, 50)) va.push_back(static_cast<double>(x));
  for (auto x : random_ints(numel(sb), 2, -50, 50)) vb.push_back(static_cast<double>(x));
  Array a = make_array(va, sa, DType::Int32), b = make_array(vb, sb, DType::Int32);
  for (const auto& c : arith_cases()) {
    std::string n = c.name;
    if (n == "divide" || n == "power") continue;
    Array y = c.op(a, b);
    EXPECT_EQ(y.dtype(), DType::Int32) << n;
    EXPECT_TRUE(all_close(y, ref_binary(va, sa, vb, sb, c.ref), 0, 0)) << n;
  }
}

TEST(Binary, ComparisonsGiveBool) {
  for (DType dt : {DType::Float64, DType::Float32, DType::BFloat16, DType::Int32}) {
    Shape sa = {3, 1, 5}, sb = {4, 1};
    // Small integers so that equality happens often.
    std::vector<double> va, vb;
    for (auto x : random_ints(numel(sa), 3, -2, 2)) va.push_back(static_cast<double>(x));
    for (auto x : random_ints(numel(sb), 4, -2, 2)) vb.push_back(static_cast<double>(x));
    Array a = make_array(va, sa, dt), b = make_array(vb, sb, dt);
    for (const auto& c : compare_cases()) {
      Array y = c.op(a, b);
      EXPECT_EQ(y.dtype(), DType::Bool) << c.name << " " << name(dt);
      EXPECT_SHAPE(y, 3, 4, 5);
      EXPECT_TRUE(all_close(y, ref_binary(va, sa, vb, sb, c.ref), 0, 0)) << c.name << " " << name(dt);
    }
  }
  // Mixed dtypes compare after promotion: 1 (int32) == 1.0 (float32).
  Array i = make_array({1, 2}, {2}, DType::Int32), f = make_array({1, 2.5}, {2}, DType::Float32);
  EXPECT_CLOSE(equal(i, f), std::vector<double>({1, 0}), 0, 0);
  EXPECT_CLOSE(less(i, f), std::vector<double>({0, 1}), 0, 0);
}

TEST(Binary, LogicalOps) {
  Array a = Array::from_vector<bool>({true, true, false, false}, {4});
  Array b = Array::from_vector<bool>({true, false, true, false}, {4});
  EXPECT_EQ(logical_and(a, b).dtype(), DType::Bool);
  EXPECT_CLOSE(logical_and(a, b), std::vector<double>({1, 0, 0, 0}), 0, 0);
  EXPECT_CLOSE(logical_or(a, b), std::vector<double>({1, 1, 1, 0}), 0, 0);
  // Broadcast [2, 1] with [4].
  Array c = Array::from_vector<bool>({true, false}, {2, 1});
  EXPECT_CLOSE(logical_and(c, b), std::vector<double>({1, 0, 1, 0, 0, 0, 0, 0}), 0, 0);
}

TEST(Binary, Promotion) {
  auto f32 = make_array({1, 2}, {2}, DType::Float32);
  auto f64 = make_array({0.5, 0.25}, {2}, DType::Float64);
  auto bf = make_array({1, 2}, {2}, DType::BFloat16);
  auto f16 = make_array({1, 2}, {2}, DType::Float16);
  auto i32 = make_array({3, 4}, {2}, DType::Int32);
  auto i8 = make_array({3, 4}, {2}, DType::Int8);
  auto u8 = make_array({3, 4}, {2}, DType::UInt8);
  auto b = Array::from_vector<bool>({true, false});
  EXPECT_EQ(add(f32, f64).dtype(), DType::Float64);
  EXPECT_CLOSE(add(f32, f64), std::vector<double>({1.5, 2.25}), 0, 0);
  EXPECT_EQ(add(bf, f16).dtype(), DType::Float32);
  EXPECT_EQ(add(i32, f32).dtype(), DType::Float32);
  EXPECT_CLOSE(add(i32, f32), std::vector<double>({4, 6}), 0, 0);
  EXPECT_EQ(add(i32, bf).dtype(), DType::BFloat16);
  EXPECT_EQ(add(u8, i8).dtype(), DType::Int32);
  EXPECT_EQ(add(b, i8).dtype(), DType::Int8);
  EXPECT_CLOSE(add(b, i8), std::vector<double>({4, 4}), 0, 0);
  EXPECT_EQ(multiply(i32, make_array({1, 1}, {2}, DType::Int64)).dtype(), DType::Int64);
}

TEST(Binary, ScalarOperatorsKeepDtype) {
  auto v = round_to(random_values(6, 9), DType::BFloat16);
  Array x = make_array(v, {2, 3}, DType::BFloat16);
  Array y = x * 2.0;
  EXPECT_EQ(y.dtype(), DType::BFloat16);
  EXPECT_CLOSE(y, ref_unary(v, [](double a) { return a * 2; }), 0, 0);
  EXPECT_EQ((2.0 * x).dtype(), DType::BFloat16);
  EXPECT_EQ((x + 1.0).dtype(), DType::BFloat16);
  EXPECT_EQ((x - 1.0).dtype(), DType::BFloat16);
  EXPECT_EQ((x / 3.0).dtype(), DType::BFloat16);
  EXPECT_EQ((1.0 - x).dtype(), DType::BFloat16);
  EXPECT_EQ((1.0 / x).dtype(), DType::BFloat16);

  auto w = random_values(5, 10, 0.5, 2);
  Array f = make_array(w, {5}, DType::Float32);
  EXPECT_EQ((f * 0.1).dtype(), DType::Float32);
  EXPECT_CLOSE(3.0 - f, ref_unary(round_to(w, DType::Float32), [](double a) { return 3 - a; }), 1e-6, 1e-7);
  EXPECT_CLOSE(2.0 / f, ref_unary(round_to(w, DType::Float32), [](double a) { return 2 / a; }), 1e-6, 0);
  EXPECT_CLOSE(-f, ref_unary(round_to(w, DType::Float32), [](double a) { return -a; }), 0, 0);

  Array i = make_array({1, 2, 3}, {3}, DType::Int32);
  EXPECT_EQ((i + 1.0).dtype(), DType::Int32);
  EXPECT_CLOSE(i + 1.0, std::vector<double>({2, 3, 4}), 0, 0);
  // A non-integral scalar with an integer array gives float32 (scalar_like).
  EXPECT_EQ((i * 0.5).dtype(), DType::Float32);
  EXPECT_CLOSE(i * 0.5, std::vector<double>({0.5, 1, 1.5}), 0, 0);
  EXPECT_EQ(scalar_like(2.0, x).dtype(), DType::BFloat16);
  EXPECT_EQ(scalar_like(2.0, i).dtype(), DType::Int32);
  EXPECT_EQ(scalar_like(2.5, i).dtype(), DType::Float32);
  EXPECT_EQ(scalar_like(2.5, i).ndim(), 0);
  // Array-array operators.
  Array a = random_array({4, 1}, 1), b = random_array({3}, 2);
  EXPECT_CLOSE(a + b, ref_binary(values(a), {4, 1}, values(b), {3}, [](double p, double q) { return p + q; }), 1e-15,
               0);
  EXPECT_CLOSE(a - b, ref_binary(values(a), {4, 1}, values(b), {3}, [](double p, double q) { return p - q; }), 1e-15,
               1e-16);
  EXPECT_CLOSE(a * b, ref_binary(values(a), {4, 1}, values(b), {3}, [](double p, double q) { return p * q; }), 1e-15,
               0);
  EXPECT_CLOSE(a / b, ref_binary(values(a), {4, 1}, values(b), {3}, [](double p, double q) { return p / q; }), 1e-15,
               0);
}

TEST(Where, BroadcastAndCastCondition) {
  Shape sc = {3, 1}, sa = {1, 4}, sb = {};
  std::vector<double> vc = {1, 0, 2.5};  // float condition: cast to bool (!= 0)
  Array cond = make_array(vc, sc, DType::Float32);
  auto va = random_values(4, 1);
  Array a = make_array(va, sa);
  Array b = make_array({-7}, sb);
  Array y = where(cond, a, b);
  EXPECT_SHAPE(y, 3, 4);
  EXPECT_EQ(y.dtype(), DType::Float64);
  std::vector<double> expected;
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) expected.push_back(vc[i] != 0 ? va[j] : -7);
  EXPECT_CLOSE(y, expected, 0, 0);
  // Promotion of a and b: int32 with float32 -> float32.
  Array yi = where(Array::from_vector<bool>({true, false}), make_array({1, 2}, {2}, DType::Int32),
                   make_array({0.5, 0.25}, {2}, DType::Float32));
  EXPECT_EQ(yi.dtype(), DType::Float32);
  EXPECT_CLOSE(yi, std::vector<double>({1, 0.25}), 0, 0);
}

TEST(Astype, ConversionRules) {
  Array x = make_array({-1.7, -0.5, 0.5, 1.7, 300.0, 0}, {6});
  EXPECT_EQ(astype(x, DType::Int32).dtype(), DType::Int32);
  EXPECT_CLOSE(astype(x, DType::Int32), std::vector<double>({-1, 0, 0, 1, 300, 0}), 0, 0);
  EXPECT_CLOSE(astype(x, DType::Bool), std::vector<double>({1, 1, 1, 1, 1, 0}), 0, 0);
  EXPECT_CLOSE(astype(x, DType::UInt8), std::vector<double>({0, 0, 0, 1, 255, 0}), 0, 0);  // saturates
  auto v = random_values(33, 3, -100, 100);
  Array d = make_array(v, {33});
  EXPECT_CLOSE(astype(d, DType::BFloat16), round_to(v, DType::BFloat16), 0, 0);
  EXPECT_CLOSE(astype(d, DType::Float32), round_to(v, DType::Float32), 0, 0);
  EXPECT_CLOSE(d.astype(DType::Float16), round_to(v, DType::Float16), 0, 0);
  EXPECT_CLOSE(astype(astype(d, DType::Float32), DType::Float64), round_to(v, DType::Float32), 0, 0);
  EXPECT_CLOSE(astype(Array::from_vector<bool>({true, false}), DType::Float32), std::vector<double>({1, 0}), 0, 0);
}

TEST(Creation, ZerosOnesFullArange) {
  EXPECT_CLOSE(zeros({2, 3}), std::vector<double>(6, 0), 0, 0);
  EXPECT_EQ(zeros({2, 3}).dtype(), DType::Float32);
  EXPECT_EQ(ones({4}, DType::Int32).dtype(), DType::Int32);
  EXPECT_CLOSE(ones({4}, DType::Int32), std::vector<double>(4, 1), 0, 0);
  EXPECT_CLOSE(full({2, 2}, 2.5, DType::Float64), std::vector<double>(4, 2.5), 0, 0);
  EXPECT_EQ(zeros({0, 5}).size(), 0);
  Array r = random_array({3, 2}, 1, DType::BFloat16);
  EXPECT_EQ(zeros_like(r).dtype(), DType::BFloat16);
  EXPECT_EQ(ones_like(r).shape(), r.shape());
  EXPECT_CLOSE(arange(5), std::vector<double>({0, 1, 2, 3, 4}), 0, 0);
  EXPECT_EQ(arange(5).dtype(), DType::Int64);
  EXPECT_CLOSE(arange(1, 2, 0.25, DType::Float32), std::vector<double>({1, 1.25, 1.5, 1.75}), 0, 0);
  EXPECT_CLOSE(arange(5, 0, -2), std::vector<double>({5, 3, 1}), 0, 0);
  EXPECT_EQ(arange(3, 3).size(), 0);
  EXPECT_EQ(Array::scalar(3.5, DType::Float64).item<double>(), 3.5);
  EXPECT_EQ(Array::scalar(3.5).dtype(), DType::Float32);
}

TEST(Elementwise, ChainedGraphEvaluatesOnce) {
  // A diamond: x feeds two branches joined again; eval of several outputs at once.
  auto v = random_values(50, 77);
  Array x = make_array(v, {5, 10});
  Array a = exp(x);
  Array b = a * x;
  Array c = a + b;
  eval({b, c});
  EXPECT_TRUE(b.is_evaluated());
  EXPECT_TRUE(c.is_evaluated());
  std::vector<double> eb, ec;
  for (double t : v) {
    eb.push_back(std::exp(t) * t);
    ec.push_back(std::exp(t) + std::exp(t) * t);
  }
  EXPECT_CLOSE(b, eb, 1e-14, 0);
  EXPECT_CLOSE(c, ec, 1e-14, 0);
}

}  // namespace
}  // namespace tessera::test
