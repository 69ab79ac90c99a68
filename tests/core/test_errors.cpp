// Bad input gives a clear exception of the right type whose message names the op,
// the shapes or values involved, and what was expected.
#include "test_util.h"

namespace tessera::test {
namespace {

// Builds and evaluates: some errors surface at graph construction, data-dependent
// ones (index values, targets) at evaluation.
template <typename Fn>
auto run(Fn fn) {
  return [fn] { fn().eval(); };
}

TEST(Errors, BroadcastShapes) {
  Array a = zeros({2, 3}), b = zeros({4});
  EXPECT_TRUE(throws_with<ShapeError>(run([&] { return add(a, b); }), {"add", "[2, 3]", "[4]"}));
  EXPECT_TRUE(throws_with<ShapeError>(run([&] { return a * b; }), {"multiply", "[2, 3]", "[4]"}));
  EXPECT_TRUE(throws_with<ShapeError>(run([&] { return less(a, b); }), {"less", "[2, 3]", "[4]"}));
  EXPECT_TRUE(throws_with<ShapeError>(run([&] { return where(zeros({5}, DType::Bool), a, a); }), {"where", "[5]"}));
  EXPECT_TRUE(throws_with<ShapeError>(run([&] {
                                        return broadcast_to(a, {3, 3});
                                      }),
                                      {"broadcast_to", "[2, 3]", "[3, 3]"}));
}

TEST(Errors, Matmul) {
  EXPECT_TRUE(throws_with<ShapeError>(run([] {
                                        return matmul(zeros({2, 3}), zeros({4, 5}));
                                      }),
                                      {"matmul", "[2, 3]", "[4, 5]", "3", "4"}));
  EXPECT_TRUE(throws_with<ShapeError>(run([] { return matmul(zeros({2, 2, 3}), zeros({3, 3, 4})); }), {"matmul"}));
  EXPECT_TRUE(throws_with<ShapeError>(run([] { return matmul(zeros({}), zeros({3})); }), {"matmul"}));
  EXPECT_TRUE(throws_with<ShapeError>(run([] {
                                        return dot_general(zeros({2, 3}), zeros({4, 5}), {1}, {0});
                                      }),
                                      {"dot_general", "3", "4"}));
  EXPECT_TRUE(throws_with<DTypeError>(run([] {
                                        return matmul(zeros({2, 2}, DType::Bool), zeros({2, 2}, DType::Bool));
                                      }),
                                      {"matmul", "bool"}));
}

TEST(Errors, LayoutArguments) {
  Array x = zeros({2, 3, 4});
  EXPECT_TRUE(throws_with<ShapeError>(run([&] { return reshape(x, {5, 5}); }), {"reshape", "[2, 3, 4]", "[5, 5]"}));
  EXPECT_TRUE(throws_with<ShapeError>(run([&] { return reshape(x, {-1, 5}); }), {"reshape", "[2, 3, 4]"}));
  EXPECT_ANY_THROW(reshape(x, {-1, -1}).eval());
  EXPECT_TRUE(throws_with<AxisError>(run([&] { return sum(x, {5}); }), {"sum", "axis 5", "3"}));
  EXPECT_TRUE(throws_with<AxisError>(run([&] { return softmax(x, -4); }), {"softmax", "-4", "3"}));
  EXPECT_TRUE(throws_with<AxisError>(run([&] { return sum(x, {0, -3}); }), {"sum"}));  // repeated axis
  EXPECT_TRUE(throws_with<AxisError>(run([&] { return argmax(x, 3); }), {"argmax", "axis 3"}));
  EXPECT_TRUE(throws_with<AxisError>(run([&] { return transpose(x, {0, 0, 1}); }), {"transpose"}));
  EXPECT_ANY_THROW(transpose(x, {0, 1}).eval());
  EXPECT_TRUE(throws_with<AxisError>(run([&] { return expand_dims(x, 4); }), {"expand_dims"}));
  EXPECT_ANY_THROW(squeeze(x, {0}).eval());  // dim 0 has size 2
  EXPECT_TRUE(throws_with<ShapeError>(run([&] {
                                        return concatenate({x, zeros({2, 4, 4})}, 0);
                                      }),
                                      {"concatenate", "[2, 3, 4]", "[2, 4, 4]"}));
  EXPECT_TRUE(throws_with<ShapeError>(run([&] { return stack({x, zeros({2, 3})}); }), {"stack"}));
  EXPECT_ANY_THROW(concatenate({}, 0).eval());
  EXPECT_ANY_THROW(slice(x, {0, 0, 0}, {2, 3, 4}, {1, 0, 1}).eval());  // zero step
  EXPECT_ANY_THROW(slice(x, {0, 0}, {2, 3}).eval());                   // wrong length
}

TEST(Errors, DTypes) {
  EXPECT_TRUE(throws_with<DTypeError>(run([] { return softmax(zeros({2, 3}, DType::Int32)); }), {"softmax", "int32"}));
  EXPECT_TRUE(throws_with<DTypeError>(run([] {
                                        return layer_norm(zeros({2, 3}, DType::Int64));
                                      }),
                                      {"layer_norm", "int64"}));
  EXPECT_TRUE(throws_with<DTypeError>(run([] {
                                        return cross_entropy(zeros({2, 3}), zeros({2}, DType::Float32));
                                      }),
                                      {"cross_entropy", "float32"}));
  EXPECT_TRUE(throws_with<DTypeError>(run([] {
                                        return take(zeros({4, 3}), zeros({2}, DType::Float32), 0);
                                      }),
                                      {"take", "float32"}));
  EXPECT_ANY_THROW(random::uniform(key(1), {3}, DType::Int32).eval());
}

TEST(Errors, ShapeOverflowAndNegativeSizes) {
  EXPECT_TRUE(throws_with<ShapeError>([] { zeros({int64_t{1} << 40, int64_t{1} << 40}); }, {"overflow"}));
  EXPECT_ANY_THROW(zeros({-1, 3}));
  EXPECT_TRUE(throws_with<ShapeError>([] { Array::from_vector<float>({1, 2, 3}, {2, 2}); }, {"from_vector"}));
}

TEST(Errors, IndexValues) {
  Array table = zeros({4, 3});
  EXPECT_TRUE(throws_with<ValueError>(run([&] {
                                        return take(table, Array::from_vector<int64_t>({0, 4}), 0);
                                      }),
                                      {"take", "4"}));
  EXPECT_TRUE(
      throws_with<ValueError>(run([&] { return take(table, Array::from_vector<int64_t>({-5}), 0); }), {"take", "-5"}));
  EXPECT_ANY_THROW(take_along_axis(table, Array::from_vector<int64_t>({0, 0, 3, 0}, {4, 1}), 1).eval());
  EXPECT_TRUE(throws_with<ValueError>(run([] {
                                        return cross_entropy(zeros({2, 5}), Array::from_vector<int64_t>({1, 7}));
                                      }),
                                      {"cross_entropy", "7"}));
  EXPECT_TRUE(throws_with<ValueError>(run([] {
                                        return cross_entropy(zeros({2, 5}), Array::from_vector<int64_t>({-3, 1}));
                                      }),
                                      {"cross_entropy", "-3"}));
  EXPECT_TRUE(throws_with<ShapeError>(run([] {
                                        return cross_entropy(zeros({2, 5}), Array::from_vector<int64_t>({1, 2, 3}));
                                      }),
                                      {"cross_entropy"}));
  EXPECT_TRUE(throws_with<ValueError>(run([] { return max(zeros({0, 3}), {0}); }), {"max"}));
}

TEST(Errors, Attention) {
  Array q = zeros({1, 3, 4, 8}), k = zeros({1, 2, 4, 8});
  EXPECT_ANY_THROW(scaled_dot_product_attention(q, k, k).eval());  // 3 heads not a multiple of 2
  EXPECT_ANY_THROW(scaled_dot_product_attention(zeros({1, 2, 4, 8}), zeros({1, 2, 4, 7}), zeros({1, 2, 4, 8})).eval());
  EXPECT_ANY_THROW(scaled_dot_product_attention(zeros({2, 4, 8}), zeros({2, 4, 8}), zeros({2, 4, 8})).eval());
  EXPECT_ANY_THROW(scaled_dot_product_attention(zeros({1, 2, 4, 8}), zeros({1, 2, 4, 8}), zeros({1, 2, 4, 8}), false,
                                                zeros({3, 3}, DType::Bool))
                       .eval());
}

TEST(Errors, Transforms) {
  Array x = random_array({3}, 1);
  // grad of a non-scalar output.
  EXPECT_TRUE(throws_with<TransformError>([&] { grad([](const Array& a) { return a * 2.0; })(x); }, {"grad"}));
  // grad of an integer output.
  EXPECT_TRUE(throws_with<TransformError>([&] { grad([](const Array& a) { return argmax(a, 0); })(x); }, {"grad"}));
  // grad w.r.t. an integer input.
  EXPECT_TRUE(throws_with<TransformError>(
      [] {
        grad([](const Array& a) { return sum(astype(a, DType::Float32)); })(Array::from_vector<int32_t>({1, 2}));
      },
      {"grad", "int32"}));
  ScalarFn f = [](const std::vector<Array>& xs) { return sum(xs[0]); };
  EXPECT_ANY_THROW(grad(f, {3})({x}));  // argnum out of range
  // vmap: mismatched batch sizes, bad in_axes.
  ArrayFn add2 = [](const std::vector<Array>& xs) { return std::vector<Array>{xs[0] + xs[1]}; };
  EXPECT_ANY_THROW(vmap(add2)({zeros({3, 2}), zeros({4, 2})}));
  EXPECT_ANY_THROW(vmap(add2, {0, 2})({zeros({3, 2}), zeros({3, 2})}));
  EXPECT_ANY_THROW(vmap(add2, {kNotMapped, kNotMapped})({zeros({3, 2}), zeros({3, 2})}));
}

TEST(Errors, EveryErrorIsATesseraError) {
  // Catchable as tessera::Error (and std::runtime_error).
  EXPECT_THROW(add(zeros({2}), zeros({3})).eval(), Error);
  EXPECT_THROW(sum(zeros({2}), {1}).eval(), std::runtime_error);
  EXPECT_THROW(zeros({2}).item<float>(), ShapeError);
  EXPECT_THROW((void)zeros({2}).data<double>(), Error);  // wrong element type
}

}  // namespace
}  // namespace tessera::test
