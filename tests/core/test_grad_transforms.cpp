// The gradient transforms as a user sees them: grad of grad (vs finite differences
// of the analytic first gradient), value_and_grad, argnums, and grad over a Tree of
// parameters (a 2-layer MLP loss).
#include <cmath>

#include "test_util.h"

namespace tessera::test {
namespace {

using Fn = std::function<Array(const std::vector<Array>&)>;
using Unary = std::function<Array(const Array&)>;

// Checks the second derivative of a scalar f by differentiating x -> grad(f)(x)
// with vjp (a Hessian-vector product) against finite differences of grad(f).
::testing::AssertionResult check_grad_of_grad(const Unary& f, const Array& x, double tol = 1e-6) {
  auto df = grad(f);
  return check_vjp_fd(Fn([df](const std::vector<Array>& xs) { return df(xs[0]); }), {x}, 1e-5, tol);
}

TEST(GradOfGrad, ScalarSecondDerivativeClosedForm) {
  // f(x) = tanh(x)^3: f'' = 6 t (1 - t^2)^2 - 6 t^3 (1 - t^2), t = tanh x.
  Unary f = [](const Array& x) { return sum(power(tanh(x), full({}, 3.0, DType::Float64))); };
  auto d2 = grad(grad(f));
  for (double x0 : {-1.3, -0.2, 0.4, 1.1}) {
    double t = std::tanh(x0);
    double expected = 6 * t * (1 - t * t) * (1 - t * t) - 6 * t * t * t * (1 - t * t);
    Array x = Array::scalar(x0, DType::Float64);
    EXPECT_NEAR(d2(x).item<double>(), expected, 1e-10) << "x = " << x0;
  }
  // Third derivative of exp is exp.
  Unary e = [](const Array& x) { return exp(x * 2.0); };
  EXPECT_NEAR(grad(grad(grad(e)))(Array::scalar(0.3, DType::Float64)).item<double>(), 8 * std::exp(0.6), 1e-9);
}

TEST(GradOfGrad, HessianVectorProductsVsFiniteDifferences) {
  Array w = random_array({6}, 11);
  const std::vector<std::pair<const char*, Unary>> cases = {
      {"sum(tanh^3)", [](const Array& x) { return sum(tanh(x) * tanh(x) * tanh(x)); }},
      {"gelu_tanh", [](const Array& x) { return sum(gelu(x, true) * x); }},
      {"gelu_erf", [](const Array& x) { return sum(gelu(x, false)); }},
      {"silu/sigmoid", [](const Array& x) { return sum(silu(x) + sigmoid(x * x)); }},
      {"softmax",
       [w](const Array& x) {
         return sum(softmax(reshape(x, {2, 3}), -1) * reshape(w, {2, 3}));
       }},
      {"log_softmax",
       [w](const Array& x) {
         return sum(log_softmax(reshape(x, {3, 2}), 0) * reshape(w, {3, 2}));
       }},
      {"layer_norm",
       [w](const Array& x) {
         return sum(layer_norm(reshape(x, {2, 3})) * reshape(w, {2, 3}));
       }},
      {"rms_norm",
       [w](const Array& x) {
         return sum(rms_norm(reshape(x, {2, 3})) * reshape(w, {2, 3}));
       }},
      {"logsumexp/var", [](const Array& x) { return logsumexp(x) + var(x) * 3.0; }},
      {"matmul",
       [w](const Array& x) {
         Array m = reshape(x, {2, 3});
         return sum(square(matmul(m, transpose(m))));
       }},
      {"cross_entropy",
       [](const Array& x) {
         return cross_entropy(reshape(x, {2, 3}), Array::from_vector<int64_t>({2, 0}, {2}));
       }},
  };
  uint32_t seed = 20;
  for (const auto& [name_, f] : cases) EXPECT_TRUE(check_grad_of_grad(f, random_array({6}, seed++))) << name_;
}

TEST(GradOfGrad, AttentionTiny) {
  Array k = random_array({1, 1, 3, 4}, 31), v = random_array({1, 1, 3, 4}, 32), w = random_array({1, 2, 3, 4}, 33);
  for (bool causal : {true, false}) {
    Unary f = [=](const Array& q) { return sum(scaled_dot_product_attention(q, k, v, causal) * w); };
    EXPECT_TRUE(check_grad_of_grad(f, random_array({1, 2, 3, 4}, 34))) << "causal " << causal;
  }
  // Second order w.r.t. k and v too (through the composite).
  Array q = random_array({1, 2, 3, 4}, 35);
  Unary fk = [=](const Array& kk) { return sum(scaled_dot_product_attention(q, kk, v, true) * w); };
  EXPECT_TRUE(check_grad_of_grad(fk, k)) << "d2/dk2";
  Unary fv = [=](const Array& vv) { return sum(square(scaled_dot_product_attention(q, k, vv, false))); };
  EXPECT_TRUE(check_grad_of_grad(fv, v)) << "d2/dv2";
}

TEST(Grad, ValueAndGradAndArgnums) {
  ScalarFn f = [](const std::vector<Array>& xs) { return sum(xs[0] * tanh(xs[1]) + xs[2] * xs[2]); };
  Array a = random_array({3}, 1), b = random_array({3}, 2), c = random_array({2, 1}, 3);
  auto va = values(a), vb = values(b), vc = values(c);
  double fv = 0;
  for (int i = 0; i < 3; ++i) fv += 2 * va[i] * std::tanh(vb[i]);  // broadcast [3] x [2, 1] -> [2, 3]
  for (int i = 0; i < 2; ++i) fv += 3 * vc[i] * vc[i];
  auto [value, grads] = value_and_grad(f)({a, b, c});
  EXPECT_NEAR(value.item<double>(), fv, 1e-12);
  ASSERT_EQ(grads.size(), 3u);
  std::vector<double> ga, gb, gc;
  for (int i = 0; i < 3; ++i) ga.push_back(2 * std::tanh(vb[i]));
  for (int i = 0; i < 3; ++i) gb.push_back(2 * va[i] * (1 - std::tanh(vb[i]) * std::tanh(vb[i])));
  for (int i = 0; i < 2; ++i) gc.push_back(6 * vc[i]);
  EXPECT_CLOSE(grads[0], ga, 1e-12, 1e-14);
  EXPECT_CLOSE(grads[1], gb, 1e-12, 1e-14);
  EXPECT_CLOSE(grads[2], gc, 1e-12, 1e-14);
  EXPECT_EQ(grads[2].shape(), c.shape());

  auto g1 = grad(f, {1})({a, b, c});
  ASSERT_EQ(g1.size(), 1u);
  EXPECT_CLOSE(g1[0], gb, 1e-12, 1e-14);
  auto g02 = grad(f, {0, 2})({a, b, c});
  ASSERT_EQ(g02.size(), 2u);
  EXPECT_CLOSE(g02[0], ga, 1e-12, 1e-14);
  EXPECT_CLOSE(g02[1], gc, 1e-12, 1e-14);
  auto [v2, g2] = value_and_grad(f, {2})({a, b, c});
  EXPECT_NEAR(v2.item<double>(), fv, 1e-12);
  ASSERT_EQ(g2.size(), 1u);
  EXPECT_CLOSE(g2[0], gc, 1e-12, 1e-14);
  // An integer input that is not differentiated is fine.
  ScalarFn h = [](const std::vector<Array>& xs) { return sum(take(xs[0], xs[1], 0)); };
  auto gh = grad(h, {0})({a, Array::from_vector<int64_t>({0, 2, 2})});
  EXPECT_CLOSE(gh[0], std::vector<double>({1, 0, 2}), 0, 0);
}

TEST(Grad, Float32GradientsMatchFloat64) {
  // The same loss in float32: the gradient dtype follows the input.
  Unary f = [](const Array& x) { return mean(square(gelu(x)) + softmax(x)); };
  Array x64 = random_array({4, 5}, 5);
  Array x32 = astype(x64, DType::Float32).eval();
  Array g32 = grad(f)(x32);
  EXPECT_EQ(g32.dtype(), DType::Float32);
  EXPECT_CLOSE(g32, values(grad(f)(x64)), 1e-4, 1e-6);
  Array xb = astype(x64, DType::BFloat16).eval();
  EXPECT_EQ(grad(f)(xb).dtype(), DType::BFloat16);
}

// 2-layer MLP loss over a Tree of parameters.
Array mlp_loss(const Tree& p, const Array& x, const Array& y) {
  Array h = tanh(matmul(x, p.at("layers").at(size_t{0}).at("w").leaf()) + p.at("layers").at(size_t{0}).at("b").leaf());
  Array logits = matmul(h, p.at("layers").at(size_t{1}).at("w").leaf()) + p.at("layers").at(size_t{1}).at("b").leaf();
  return cross_entropy(logits, y) + 0.01 * sum(square(p.at("scale").leaf()));
}

TEST(Grad, TreeOfParametersMlp) {
  Tree params = {
      {"layers", Tree::list({Tree{{"w", random_array({4, 6}, 1)}, {"b", random_array({6}, 2)}},
                             Tree{{"w", random_array({6, 3}, 3)}, {"b", random_array({3}, 4)}}})},
      {"scale", random_array({2}, 5)},
  };
  Array x = random_array({5, 4}, 6);
  Array y = Array::from_vector<int64_t>({0, 2, 1, 1, 2}, {5});
  TreeFn loss = [x, y](const Tree& p) { return mlp_loss(p, x, y); };
  auto [value, g] = value_and_grad(loss)(params);
  EXPECT_NEAR(value.item<double>(), loss(params).item<double>(), 1e-12);
  ASSERT_TRUE(g.same_structure(params));
  EXPECT_EQ(g.paths(), params.paths());
  Tree g2 = grad(loss)(params);
  auto leaves = params.leaves();
  auto gl = g.leaves(), gl2 = g2.leaves();
  ASSERT_EQ(gl.size(), leaves.size());
  for (size_t i = 0; i < leaves.size(); ++i) {
    Fn as_list = [&](const std::vector<Array>& ls) { return loss(params.with_leaves(ls)); };
    auto fd = fd_grad(as_list, leaves, i);
    EXPECT_CLOSE(gl[i], fd, 1e-6, 1e-8) << params.paths()[i];
    EXPECT_CLOSE(gl2[i], values(gl[i]), 0, 0) << params.paths()[i];
  }
}

}  // namespace
}  // namespace tessera::test
