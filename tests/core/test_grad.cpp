// vjp of every differentiable op vs central finite differences in float64
// (check_vjp_fd in test_util.h): unary ops away from kinks, broadcasting binary ops
// (exercising the unbroadcast sum), reductions, matmul / dot_general, layout ops,
// indexing, and the fused nn ops.
#include <cmath>

#include "test_util.h"

namespace tessera::test {
namespace {

using Fn = std::function<Array(const std::vector<Array>&)>;

// Random values in [lo, hi] with |x| >= gap (away from the kinks of abs/relu/max).
Array away_from_zero(const Shape& s, uint32_t seed, double gap = 0.1) {
  auto v = random_values(numel(s), seed, -1, 1);
  for (auto& x : v) x = x < 0 ? x - gap : x + gap;
  return make_array(v, s);
}

TEST(Grad, UnaryOps) {
  struct Case {
    const char* name;
    std::function<Array(const Array&)> op;
    double lo, hi;
  };
  const std::vector<Case> cases = {
      {"negative", [](const Array& a) { return negative(a); }, -1, 1},
      {"abs", [](const Array& a) { return abs(a); }, 0, 0},
      {"sign", [](const Array& a) { return sign(a); }, 0, 0},
      {"square", [](const Array& a) { return square(a); }, -1, 1},
      {"exp", [](const Array& a) { return exp(a); }, -1, 1},
      {"log", [](const Array& a) { return log(a); }, 0.5, 2},
      {"log1p", [](const Array& a) { return log1p(a); }, -0.5, 2},
      {"sqrt", [](const Array& a) { return sqrt(a); }, 0.5, 2},
      {"rsqrt", [](const Array& a) { return rsqrt(a); }, 0.5, 2},
      {"tanh", [](const Array& a) { return tanh(a); }, -2, 2},
      {"erf", [](const Array& a) { return erf(a); }, -2, 2},
      {"sin", [](const Array& a) { return sin(a); }, -3, 3},
      {"cos", [](const Array& a) { return cos(a); }, -3, 3},
      {"sigmoid", [](const Array& a) { return sigmoid(a); }, -4, 4},
      {"relu", [](const Array& a) { return relu(a); }, 0, 0},
      {"silu", [](const Array& a) { return silu(a); }, -4, 4},
      {"gelu_tanh", [](const Array& a) { return gelu(a, true); }, -3, 3},
      {"gelu_erf", [](const Array& a) { return gelu(a, false); }, -3, 3},
      {"astype_f64", [](const Array& a) { return astype(a, DType::Float64); }, -1, 1},
      {"scalar_ops", [](const Array& a) { return 2.0 - (a * 3.0 + 1.0) / 4.0 + 1.5 / (a + 3.0); }, -1, 1},
  };
  uint32_t seed = 1;
  for (const auto& c : cases) {
    Shape s = {3, 5};
    Array x = c.lo == 0 && c.hi == 0 ? away_from_zero(s, seed++) : random_array(s, seed++, DType::Float64, c.lo, c.hi);
    auto op = c.op;
    EXPECT_TRUE(check_vjp_fd(Fn([op](const std::vector<Array>& xs) { return op(xs[0]); }), {x})) << c.name;
  }
}

TEST(Grad, BinaryOpsWithBroadcasting) {
  struct Case {
    const char* name;
    std::function<Array(const Array&, const Array&)> op;
    bool positive_a;
  };
  const std::vector<Case> cases = {
      {"add", [](const Array& a, const Array& b) { return add(a, b); }, false},
      {"subtract", [](const Array& a, const Array& b) { return subtract(a, b); }, false},
      {"multiply", [](const Array& a, const Array& b) { return multiply(a, b); }, false},
      {"divide", [](const Array& a, const Array& b) { return divide(a, b); }, false},
      {"power", [](const Array& a, const Array& b) { return power(a, b); }, true},
      {"maximum", [](const Array& a, const Array& b) { return maximum(a, b); }, false},
      {"minimum", [](const Array& a, const Array& b) { return minimum(a, b); }, false},
      {"operators", [](const Array& a, const Array& b) { return a * b - a / (b * b + 1.0) + (-a); }, false},
  };
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{3, 1, 4}, {2, 1}}, {{}, {2, 3}}, {{2, 3}, {3}}, {{1, 3}, {2, 1}}};
  uint32_t seed = 100;
  for (const auto& c : cases) {
    for (const auto& [sa, sb] : shapes) {
      Array a = c.positive_a ? random_array(sa, seed++, DType::Float64, 0.5, 2) : random_array(sa, seed++);
      Array b = away_from_zero(sb, seed++, 0.3);  // divisors away from 0
      auto op = c.op;
      EXPECT_TRUE(check_vjp_fd(Fn([op](const std::vector<Array>& xs) { return op(xs[0], xs[1]); }), {a, b}))
          << c.name << " " << to_string(sa) << " with " << to_string(sb);
    }
  }
}

TEST(Grad, WhereAndIntegerPathsCarryNoGradient) {
  Array a = random_array({2, 3}, 1), b = random_array({3}, 2);
  Array cond = Array::from_vector<bool>({true, false, true, false, false, true}, {2, 3});
  EXPECT_TRUE(check_vjp_fd(Fn([cond](const std::vector<Array>& xs) { return where(cond, xs[0], xs[1]); }), {a, b}));
  // The condition computed from x (a comparison) carries no gradient.
  EXPECT_TRUE(check_vjp_fd(
      Fn([](const std::vector<Array>& xs) { return where(greater(xs[0], 0.0 * xs[0]), xs[0], xs[0] * xs[0]); }),
      {away_from_zero({7}, 3)}));
  // x * int(x): the integer factor is a constant for the gradient (and for finite
  // differences away from integer boundaries).
  Array x = make_array({0.3, 1.2, 2.7, -1.3, -0.4}, {5});
  EXPECT_TRUE(check_vjp_fd(Fn([](const std::vector<Array>& xs) {
                             return xs[0] * astype(astype(xs[0] * 2.0, DType::Int32), DType::Float64);
                           }),
                           {x}));
  // stop_gradient: d/dx [x * stop_gradient(x)] = x.
  auto g = grad([](const Array& t) { return sum(t * stop_gradient(t)); })(x);
  EXPECT_CLOSE(g, values(x), 1e-15, 0);
  // float32 round trip: the gradient of astype passes through (looser tolerance).
  EXPECT_TRUE(check_vjp_fd(
      Fn([](const std::vector<Array>& xs) { return astype(astype(xs[0], DType::Float32) * 2.0, DType::Float64); }),
      {random_array({4}, 4)}, 1e-2, 1e-4));
}

TEST(Grad, Reductions) {
  Shape s = {3, 4, 2};
  const std::vector<std::vector<int>> axis_sets = {{}, {0}, {-1}, {0, 2}, {1}};
  uint32_t seed = 200;
  for (const auto& axes : axis_sets) {
    for (bool keep : {false, true}) {
      Array x = random_array(s, seed++, DType::Float64, 0.5, 1.5);
      std::string where_ = "axes " + to_string(Shape(axes.begin(), axes.end())) + (keep ? " keepdims" : "");
      EXPECT_TRUE(check_vjp_fd(Fn([=](const std::vector<Array>& xs) { return sum(xs[0], axes, keep); }), {x}))
          << "sum " << where_;
      EXPECT_TRUE(check_vjp_fd(Fn([=](const std::vector<Array>& xs) { return mean(xs[0], axes, keep); }), {x}))
          << "mean " << where_;
      EXPECT_TRUE(check_vjp_fd(Fn([=](const std::vector<Array>& xs) { return max(xs[0], axes, keep); }), {x}))
          << "max " << where_;
      EXPECT_TRUE(check_vjp_fd(Fn([=](const std::vector<Array>& xs) { return min(xs[0], axes, keep); }), {x}))
          << "min " << where_;
      EXPECT_TRUE(check_vjp_fd(Fn([=](const std::vector<Array>& xs) { return prod(xs[0], axes, keep); }), {x}))
          << "prod " << where_;
      EXPECT_TRUE(check_vjp_fd(Fn([=](const std::vector<Array>& xs) { return logsumexp(xs[0], axes, keep); }), {x}))
          << "logsumexp " << where_;
      EXPECT_TRUE(check_vjp_fd(Fn([=](const std::vector<Array>& xs) { return var(xs[0], axes, keep); }), {x}))
          << "var " << where_;
    }
  }
  // Methods.
  EXPECT_TRUE(check_vjp_fd(Fn([](const std::vector<Array>& xs) { return xs[0].sum() + xs[0].mean(); }),
                           {random_array({5}, 9)}));
}

TEST(Grad, MatmulAndDotGeneral) {
  const std::vector<std::pair<Shape, Shape>> mm = {{{3, 4}, {4, 2}}, {{2, 3, 4}, {4, 5}}, {{2, 1, 3, 2}, {3, 2, 4}},
                                                   {{4}, {4, 3}},    {{3, 4}, {4}},       {{5}, {5}},
                                                   {{1, 7}, {7, 1}}};
  uint32_t seed = 300;
  for (const auto& [sa, sb] : mm) {
    EXPECT_TRUE(check_vjp_fd(Fn([](const std::vector<Array>& xs) { return matmul(xs[0], xs[1]); }),
                             {random_array(sa, seed++), random_array(sb, seed++)}))
        << "matmul " << to_string(sa) << " @ " << to_string(sb);
  }
  struct DotCase {
    Shape sa, sb;
    std::vector<int> ac, bc, ab, bb;
  };
  for (const auto& c : std::vector<DotCase>{{{2, 3, 4}, {2, 4, 5}, {2}, {1}, {0}, {0}},
                                            {{4, 2, 3}, {5, 4, 2}, {0, 1}, {1, 2}, {}, {}},
                                            {{3, 2, 4}, {4, 2, 5}, {2}, {0}, {1}, {1}},
                                            {{3}, {4}, {}, {}, {}, {}}}) {
    EXPECT_TRUE(check_vjp_fd(
        Fn([c](const std::vector<Array>& xs) { return dot_general(xs[0], xs[1], c.ac, c.bc, c.ab, c.bb); }),
        {random_array(c.sa, seed++), random_array(c.sb, seed++)}))
        << "dot_general " << to_string(c.sa) << " x " << to_string(c.sb);
  }
}

TEST(Grad, LayoutOps) {
  const std::vector<std::pair<const char*, Fn>> cases = {
      {"reshape",
       [](const std::vector<Array>& xs) {
         return reshape(xs[0], {4, -1});
       }},
      {"transpose",
       [](const std::vector<Array>& xs) {
         return transpose(xs[0], {2, 0, 1});
       }},
      {"T", [](const std::vector<Array>& xs) { return xs[0].T(); }},
      {"swapaxes", [](const std::vector<Array>& xs) { return swapaxes(xs[0], 0, -1); }},
      {"moveaxis", [](const std::vector<Array>& xs) { return moveaxis(xs[0], 2, 0); }},
      {"expand_dims", [](const std::vector<Array>& xs) { return expand_dims(xs[0], 1); }},
      {"squeeze", [](const std::vector<Array>& xs) { return squeeze(expand_dims(xs[0], 0), {0}); }},
      {"broadcast_to",
       [](const std::vector<Array>& xs) {
         return broadcast_to(slice_axis(xs[0], 0, 0, 1), {3, 2, 3, 4});
       }},
      {"slice",
       [](const std::vector<Array>& xs) {
         return slice(xs[0], {0, 1, 0}, {2, 3, 4}, {1, 1, 2});
       }},
      {"slice_axis", [](const std::vector<Array>& xs) { return slice_axis(xs[0], -1, 1, 4, 2); }},
      {"concatenate",
       [](const std::vector<Array>& xs) {
         return concatenate({xs[0], xs[0] * 2.0, xs[0]}, 1);
       }},
      {"stack",
       [](const std::vector<Array>& xs) {
         return stack({xs[0], square(xs[0])}, -1);
       }},
      {"flatten", [](const std::vector<Array>& xs) { return flatten(transpose(xs[0])); }},
  };
  uint32_t seed = 400;
  for (const auto& [name_, f] : cases) EXPECT_TRUE(check_vjp_fd(f, {random_array({2, 3, 4}, seed++)})) << name_;
  // Concatenate / stack of different inputs.
  EXPECT_TRUE(check_vjp_fd(Fn([](const std::vector<Array>& xs) {
                             return concatenate({xs[0], xs[1]}, 0);
                           }),
                           {random_array({2, 3}, 1), random_array({1, 3}, 2)}));
  EXPECT_TRUE(check_vjp_fd(Fn([](const std::vector<Array>& xs) {
                             return stack({xs[0], xs[1]}, 1);
                           }),
                           {random_array({2, 3}, 3), random_array({2, 3}, 4)}));
}

TEST(Grad, Indexing) {
  // Repeated and negative indices: the backward must scatter-add.
  Array idx = Array::from_vector<int64_t>({1, 3, 1, -1, 0, 1}, {2, 3});
  EXPECT_TRUE(
      check_vjp_fd(Fn([idx](const std::vector<Array>& xs) { return take(xs[0], idx, 0); }), {random_array({5, 3}, 1)}));
  EXPECT_TRUE(
      check_vjp_fd(Fn([idx](const std::vector<Array>& xs) { return take(xs[0], idx, 1); }), {random_array({2, 4}, 2)}));
  Array along = Array::from_vector<int64_t>({0, 0, 2, 1, 2, 2}, {2, 3});
  EXPECT_TRUE(check_vjp_fd(Fn([along](const std::vector<Array>& xs) { return take_along_axis(xs[0], along, 1); }),
                           {random_array({2, 4}, 3)}));
  EXPECT_TRUE(check_vjp_fd(Fn([along](const std::vector<Array>& xs) { return take_along_axis(xs[0], along, 0); }),
                           {random_array({3, 3}, 4)}));
}

TEST(Grad, SoftmaxAndNorms) {
  for (int axis : {-1, 0}) {
    EXPECT_TRUE(check_vjp_fd(Fn([axis](const std::vector<Array>& xs) { return softmax(xs[0], axis); }),
                             {random_array({3, 5}, 1, DType::Float64, -2, 2)}))
        << "softmax axis " << axis;
    EXPECT_TRUE(check_vjp_fd(Fn([axis](const std::vector<Array>& xs) { return log_softmax(xs[0], axis); }),
                             {random_array({3, 5}, 2, DType::Float64, -2, 2)}))
        << "log_softmax axis " << axis;
  }
  Array x = random_array({2, 3, 6}, 3, DType::Float64, -2, 2), w = random_array({6}, 4, DType::Float64, 0.5, 1.5),
        b = random_array({6}, 5);
  EXPECT_TRUE(check_vjp_fd(Fn([](const std::vector<Array>& xs) { return layer_norm(xs[0]); }), {x})) << "layer_norm";
  EXPECT_TRUE(check_vjp_fd(Fn([](const std::vector<Array>& xs) { return layer_norm(xs[0], xs[1], xs[2]); }), {x, w, b}))
      << "layer_norm(w, b)";
  EXPECT_TRUE(check_vjp_fd(Fn([](const std::vector<Array>& xs) { return layer_norm(xs[0], xs[1]); }), {x, w}))
      << "layer_norm(w)";
  // A bias without a weight (its gradient was zero on the CPU until the GPU test caught it).
  EXPECT_TRUE(
      check_vjp_fd(Fn([](const std::vector<Array>& xs) { return layer_norm(xs[0], std::nullopt, xs[1]); }), {x, b}))
      << "layer_norm(b)";
  EXPECT_TRUE(check_vjp_fd(Fn([](const std::vector<Array>& xs) { return rms_norm(xs[0]); }), {x})) << "rms_norm";
  EXPECT_TRUE(check_vjp_fd(Fn([](const std::vector<Array>& xs) { return rms_norm(xs[0], xs[1]); }), {x, w}))
      << "rms_norm(w)";
}

TEST(Grad, Attention) {
  struct Case {
    int64_t H, Hkv, T, S;
    bool causal, masked;
  };
  uint32_t seed = 500;
  for (const auto& c : std::vector<Case>{{2, 2, 4, 4, true, false},
                                         {4, 2, 5, 5, true, false},
                                         {2, 1, 3, 6, false, false},
                                         {2, 2, 4, 5, false, true},
                                         {4, 2, 4, 4, true, true}}) {
    const int64_t B = 1, D = 8;
    Array q = random_array({B, c.H, c.T, D}, seed++), k = random_array({B, c.Hkv, c.S, D}, seed++),
          v = random_array({B, c.Hkv, c.S, D}, seed++);
    std::optional<Array> mask;
    if (c.masked) {
      std::vector<bool> m;
      for (auto bit : random_ints(c.T * c.S, seed++, 0, 2)) m.push_back(bit != 0);
      for (int64_t s = 0; s < c.S; ++s) m[s] = false;  // a fully masked row: output 0, gradient 0
      m[c.S] = true;
      mask = Array::from_vector<bool>(m, {1, 1, c.T, c.S});
    }
    bool causal = c.causal;
    EXPECT_TRUE(check_vjp_fd(Fn([causal, mask](const std::vector<Array>& xs) {
                               return scaled_dot_product_attention(xs[0], xs[1], xs[2], causal, mask);
                             }),
                             {q, k, v}))
        << "attention H" << c.H << " Hkv" << c.Hkv << " T" << c.T << " S" << c.S << " causal " << c.causal << " masked "
        << c.masked;
  }
}

TEST(Grad, CrossEntropy) {
  Array targets = Array::from_vector<int64_t>({2, -100, 0, 4, 4, 1}, {2, 3});
  for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    EXPECT_TRUE(
        check_vjp_fd(Fn([targets, r](const std::vector<Array>& xs) { return cross_entropy(xs[0], targets, -100, r); }),
                     {random_array({2, 3, 5}, 7, DType::Float64, -3, 3)}))
        << "cross_entropy reduction " << static_cast<int>(r);
  }
  // Composed with log_softmax-free logits from a matmul (a classifier head).
  Array t1 = Array::from_vector<int32_t>({1, 0, 2, 2}, {4});
  EXPECT_TRUE(check_vjp_fd(Fn([t1](const std::vector<Array>& xs) { return cross_entropy(matmul(xs[0], xs[1]), t1); }),
                           {random_array({4, 3}, 8), random_array({3, 3}, 9)}));
}

TEST(Grad, MultipleOutputsAndReuse) {
  // Two outputs sharing subexpressions; an input used several times.
  ArrayFn f = [](const std::vector<Array>& xs) {
    Array h = tanh(matmul(xs[0], xs[1]));
    return std::vector<Array>{h * xs[0].sum(), sum(h * h, {0})};
  };
  EXPECT_TRUE(check_vjp_fd(f, {random_array({3, 3}, 1), random_array({3, 2}, 2)}));
}

}  // namespace
}  // namespace tessera::test

namespace tessera::test {
namespace {

// The checkers themselves must be able to fail.
TEST(Checkers, DetectWrongGradientsAndValues) {
  // vjp of x * stop_gradient(x) is x; finite differences see 2x.
  EXPECT_FALSE(check_vjp_fd(Fn([](const std::vector<Array>& xs) { return xs[0] * stop_gradient(xs[0]); }),
                            {random_array({4}, 1)}));
  auto v = random_values(10, 2);
  auto w = v;
  w[7] += 1e-6;
  EXPECT_FALSE(all_close(make_array(v, {10}), w, 1e-9, 1e-9));
  EXPECT_TRUE(all_close(make_array(v, {10}), w, 1e-9, 2e-6));
  EXPECT_FALSE(all_close(make_array(v, {10}), std::vector<double>(9, 0.0), 1, 1));
  EXPECT_FALSE(throws_with<ValueError>([] {}, {}));
  EXPECT_FALSE(throws_with<ValueError>([] { throw ShapeError("x"); }, {}));
  EXPECT_FALSE(throws_with<ShapeError>([] { throw ShapeError("add: bad"); }, {"matmul"}));
}

}  // namespace
}  // namespace tessera::test
