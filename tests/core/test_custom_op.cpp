// Custom ops (core/custom_op.h) as a user writes them: evaluation, grad against finite
// differences in float64 (a vjp written with ops, and one that is another custom op),
// grad of grad, vmap (the loop fallback), jit, the IR spelling and its round trip
// through make_primitive, and the errors for definitions and calls that are wrong.
#include <gtest/gtest.h>

#include "core/custom_op_test_ops.h"
#include "core/test_util.h"
#include "tessera/compiler/primitive_registry.h"
#include "tessera/tessera.h"

namespace tessera::test {
namespace {

class CustomOp : public ::testing::Test {
 protected:
  void SetUp() override { register_test_custom_ops(); }
};

std::vector<double> poly_ref(const std::vector<double>& x, double a, double b) {
  std::vector<double> y;
  for (double v : x) y.push_back(a * v * v + b * v);
  return y;
}

TEST_F(CustomOp, EvaluatesItsCpuKernelLazily) {
  Array x = random_array({3, 5}, 1, DType::Float32);
  Array y = test_poly(x, 1.5, -2.0);
  EXPECT_FALSE(y.is_evaluated());
  EXPECT_EQ(y.shape(), (Shape{3, 5}));
  EXPECT_TRUE(all_close(y, poly_ref(values(x), 1.5, -2.0), 1e-6, 1e-6));
  // Composes with built-in ops in one graph.
  Array z = add(test_poly(exp(x), 0.5, 1.0), x);
  std::vector<double> ex;
  for (double v : values(x)) ex.push_back(0.5 * std::exp(v) * std::exp(v) + std::exp(v) + v);
  EXPECT_TRUE(all_close(z, ex, 1e-5, 1e-5));
}

TEST_F(CustomOp, GradMatchesFiniteDifferencesInFloat64) {
  Array x = random_array({4, 3}, 2, DType::Float64);
  EXPECT_TRUE(check_vjp_fd([](const std::vector<Array>& a) { return test_poly(sin(a[0]), 0.7, 0.3); }, {x}));
  // The vjp of test_row_cumsum is another custom op (the reverse scan); its kernel is
  // float32 only, so compare with float64 finite differences at float32 tolerance.
  Array m = random_array({3, 6}, 3, DType::Float32);
  auto loss = [](const std::vector<Array>& a) { return sum(multiply(custom_op("test_row_cumsum", {a[0]})[0], a[0])); };
  std::vector<double> fd =
      fd_grad([&](const std::vector<Array>& a) { return loss({a[0].astype(DType::Float32)}).astype(DType::Float64); },
              {m.astype(DType::Float64)}, 0, 1e-3);
  Array g = grad(loss)({m})[0];
  EXPECT_TRUE(all_close(g, fd, 2e-3, 2e-3));
}

TEST_F(CustomOp, GradOfGradDifferentiatesTheVjpsOps) {
  // d/dx (a x^2 + b x) = 2 a x + b; d2/dx2 = 2 a.
  auto first = [](const Array& x) { return sum(test_poly(x, 1.25, 0.5)); };
  auto second = grad([&](const Array& x) { return sum(grad(first)(x)); });
  Array x = random_array({5}, 4, DType::Float64);
  EXPECT_TRUE(all_close(second(x), std::vector<double>(5, 2.5), 1e-12, 1e-12));
}

TEST_F(CustomOp, VmapLoopsOverTheBatchWithoutARule) {
  Array xs = random_array({4, 3, 5}, 5, DType::Float32);
  auto per_example = [](const std::vector<Array>& a) {
    return std::vector<Array>{custom_op("test_row_cumsum", {a[0]})[0]};
  };
  Array batched = vmap(per_example)({xs})[0];
  ASSERT_EQ(batched.shape(), (Shape{4, 3, 5}));
  for (int64_t b = 0; b < 4; ++b) {
    Array one = custom_op("test_row_cumsum", {squeeze(slice_axis(xs, 0, b, b + 1), {0})})[0];
    EXPECT_TRUE(all_close(squeeze(slice_axis(batched, 0, b, b + 1), {0}), one, 0, 0)) << "example " << b;
  }
  // Batch on another axis, and per-example gradients through the custom vjp.
  Array moved = vmap(per_example, {1})({transpose(xs, {1, 0, 2})})[0];
  EXPECT_TRUE(all_close(moved, batched, 0, 0));
  auto per_example_grad = vmap([](const std::vector<Array>& a) {
    return grad([](const std::vector<Array>& x) { return sum(test_poly(x[0], 2.0, 1.0)); })(a);
  });
  Array g = per_example_grad({xs})[0];
  std::vector<double> expected;
  for (double v : values(xs)) expected.push_back(4.0 * v + 1.0);
  EXPECT_TRUE(all_close(g, expected, 1e-6, 1e-6));
}

TEST_F(CustomOp, JitTracesPrintsAndRunsIt) {
  auto f = jit([](const std::vector<Array>& a) {
    return std::vector<Array>{custom_op("test_row_cumsum", {test_poly(a[0], 0.5, 2.0)})[0]};
  });
  Array x = random_array({2, 4}, 6, DType::Float32);
  Array eager = custom_op("test_row_cumsum", {test_poly(x, 0.5, 2.0)})[0];
  EXPECT_TRUE(all_close(f(std::vector<Array>{x})[0], eager, 0, 0));
  const std::string text = f.lowered(std::vector<Array>{x}).text();
  EXPECT_NE(text.find("test_poly(%"), std::string::npos) << text;
  EXPECT_NE(text.find("{a=0.5, b=2.0}"), std::string::npos) << text;
  EXPECT_NE(text.find("test_row_cumsum(%"), std::string::npos) << text;
  // The cost model is the definition's.
  EXPECT_EQ(graph_cost({test_poly(x, 1.0, 1.0)}).flops, 4.0 * 8);
}

TEST_F(CustomOp, AttributesRoundTripThroughTheIrText) {
  CustomAttributes at{{"n", int64_t{-3}}, {"scale", 1e-300}, {"whole", 2.0}, {"mode", std::string("causal_v2")}};
  Array x = random_array({2, 2}, 7, DType::Float32);
  // test_poly ignores attributes it does not read; the primitive still carries them.
  at["a"] = 1.0;
  at["b"] = 0.0;
  PrimitivePtr p = custom_op("test_poly", {x}, at)[0].primitive();
  EXPECT_EQ(p->attributes(), "a=1.0, b=0.0, mode=\"causal_v2\", n=-3, scale=1e-300, whole=2.0");
  PrimitivePtr back = compiler::make_primitive(p->name(), p->attributes());
  EXPECT_TRUE(back->is_equivalent(*p));
  EXPECT_EQ(*custom_op_attributes(*back), at);
}

CustomOpDefinition minimal(const std::string& name) {
  CustomOpDefinition d;
  d.name = name;
  d.infer = same_as_input;
  d.cpu_kernel = [](const std::vector<InputBuffer>&, const std::vector<OutputBuffer>&, const CustomAttributes&) {};
  return d;
}

TEST_F(CustomOp, BadDefinitionsAreRefusedWithTheReason) {
  CustomOpDefinition no_kernel = minimal("test_no_kernel");
  no_kernel.cpu_kernel = nullptr;
  EXPECT_TRUE(throws_with<ValueError>([&] { register_custom_op(no_kernel); }, {"test_no_kernel", "no cpu_kernel"}));
  CustomOpDefinition no_infer = minimal("test_no_infer");
  no_infer.infer = nullptr;
  EXPECT_TRUE(throws_with<ValueError>([&] { register_custom_op(no_infer); }, {"test_no_infer", "no infer"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { register_custom_op(minimal("add")); }, {"'add'", "built-in primitive"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { register_custom_op(minimal("matmul")); }, {"built-in"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { register_custom_op(minimal("my-op")); }, {"'my-op'", "not valid"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { register_custom_op(minimal("test_poly")); }, {"already registered"}));
  CustomOpDefinition bad_spec = minimal("test_bad_spec");
  bad_spec.sharding = CustomSharding::factors("b t, b t -> b t", {"b"});
  EXPECT_TRUE(throws_with<ValueError>([&] { register_custom_op(bad_spec); }, {"describes 2 inputs (expected 1)"}));
  bad_spec.sharding = CustomSharding::factors("b t -> b t", {"h"});
  EXPECT_TRUE(throws_with<ValueError>([&] { register_custom_op(bad_spec); }, {"shardable factor 'h'"}));
  CustomOpDefinition no_launch = minimal("test_no_launch");
  no_launch.cuda = CustomCudaKernel{"extern \"C\" __global__ void k() {}", "k", nullptr};
  EXPECT_TRUE(throws_with<ValueError>([&] { register_custom_op(no_launch); }, {"no launch function"}));
  EXPECT_EQ(find_custom_op("test_no_kernel"), nullptr);
}

TEST_F(CustomOp, BadCallsNameTheOpTheInputAndWhatWasExpected) {
  Array x = random_array({2, 3}, 8, DType::Float32);
  EXPECT_TRUE(throws_with<ValueError>(
      [&] {
        custom_op("test_row_cumsum", {x, x});
      },
      {"test_row_cumsum", "2 inputs", "expected 1"}));
  EXPECT_TRUE(throws_with<DTypeError>([&] { custom_op("test_row_cumsum", {x.astype(DType::Float64)}); },
                                      {"test_row_cumsum", "input 0", "f64[2, 3]", "expected float32"}));
  EXPECT_TRUE(throws_with<ShapeError>([&] { custom_op("test_row_cumsum", {reshape(x, {6})}); },
                                      {"test_row_cumsum", "[6]", "rank 2"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { custom_op("test_nonexistent", {x}); },
                                      {"'test_nonexistent'", "register_custom_op"}));
  // infer reads the attributes, so a missing one is refused when the op is called.
  EXPECT_TRUE(throws_with<ValueError>(
      [&] {
        custom_op("test_poly", {x}, {{"a", 1.0}});
      },
      {"test_poly", "missing double attribute 'b'"}));
  EXPECT_TRUE(throws_with<ValueError>(
      [&] {
        custom_op("test_poly", {x}, {{"a", 1.0}, {"b", 1.0}, {"s", std::string("x,y")}});
      },
      {"'s'", "contains ','"}));
  // grad through an op without a vjp.
  CustomOpDefinition no_vjp = minimal("test_no_vjp");
  register_custom_op(no_vjp);
  EXPECT_TRUE(throws_with<TransformError>(
      [&] { grad([](const std::vector<Array>& a) { return sum(custom_op("test_no_vjp", a)[0]); })({x}); },
      {"test_no_vjp", "no vjp"}));
  EXPECT_TRUE(unregister_custom_op("test_no_vjp"));
  EXPECT_FALSE(unregister_custom_op("test_no_vjp"));
}

}  // namespace
}  // namespace tessera::test
