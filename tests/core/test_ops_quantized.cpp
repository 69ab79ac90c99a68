// quantized_matmul (AQT int8) as an op: the forward within the quantization bound of the
// float product; gradients: the straight-through form equal to matmul's bitwise, the
// int8 backward GEMMs close to them and reproducible from the key; leading dims, the
// transposed weight, vmap, the IR round trip; bad input named.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "tessera/compiler/primitive_registry.h"
#include "tessera/core/random.h"
#include "tessera/ir/primitives/quantized.h"
#include "test_util.h"

namespace tessera::test {
namespace {

// Largest |a - b| over the largest |b| (0 when b is all zeros).
double relative_error(const Array& a, const Array& b) {
  const std::vector<double> va = values(a), vb = values(b);
  double err = 0, scale = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    err = std::max(err, std::abs(va[i] - vb[i]));
    scale = std::max(scale, std::abs(vb[i]));
  }
  return scale == 0 ? err : err / scale;
}

bool bitwise(const Array& a, const Array& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw_data(), b.raw_data(), static_cast<size_t>(a.size()) * itemsize(a.dtype())) == 0;
}

TEST(QuantizedMatmul, ForwardIsCloseToTheFloatProduct) {
  for (DType dtype : {DType::Float32, DType::BFloat16}) {
    const Array x = random_array({4, 32, 64}, 1, dtype), w = random_array({64, 48}, 2, dtype, -0.5, 0.5);
    const Array y = quantized_matmul(x, w).eval();
    EXPECT_EQ(y.shape(), (Shape{4, 32, 48}));
    EXPECT_EQ(y.dtype(), dtype);
    // 64 products with relative steps of 1/254 on each side: about 1% of the result's scale.
    const double err = relative_error(y, matmul(astype(x, DType::Float64), astype(w, DType::Float64)));
    EXPECT_LT(err, 0.03) << name(dtype);
    EXPECT_GT(err, 1e-5) << name(dtype) << ": suspiciously exact for int8";
  }
}

TEST(QuantizedMatmul, TransposedWeightEqualsTheTransposedCopy) {
  const Array x = random_array({16, 32}, 3, DType::Float32), table = random_array({24, 32}, 4, DType::Float32);
  QuantizedMatmulOptions o;
  o.transpose_w = true;
  const Array direct = quantized_matmul(x, table, o).eval();
  const Array copied = quantized_matmul(x, transpose(table).eval()).eval();
  EXPECT_TRUE(bitwise(direct, copied));
}

// sum(y * r) has the cotangent r whatever y is: the straight-through gradients are then
// exactly matmul's.
TEST(QuantizedMatmul, StraightThroughGradientsAreMatmuls) {
  const Array x = random_array({32, 64}, 5, DType::Float32), w = random_array({64, 16}, 6, DType::Float32);
  const Array r = random_array({32, 16}, 7, DType::Float32);
  QuantizedMatmulOptions o;
  o.int8_backward = false;
  auto int8 = grad([&](const std::vector<Array>& a) { return sum(quantized_matmul(a[0], a[1], o) * r); });
  auto plain = grad([&](const std::vector<Array>& a) { return sum(matmul(a[0], a[1]) * r); });
  const std::vector<Array> gi = int8({x, w}), gp = plain({x, w});
  EXPECT_TRUE(bitwise(gi[0].eval(), gp[0].eval()));
  EXPECT_TRUE(bitwise(gi[1].eval(), gp[1].eval()));
}

TEST(QuantizedMatmul, Int8BackwardGradientsAreCloseAndFollowTheKey) {
  const Array x = random_array({64, 96}, 8, DType::Float32), w = random_array({96, 32}, 9, DType::Float32);
  const Array r = random_array({64, 32}, 10, DType::Float32);
  auto grads_with = [&](std::optional<Array> key) {
    QuantizedMatmulOptions o;
    o.key = key;
    auto g = grad([&](const std::vector<Array>& a) { return sum(quantized_matmul(a[0], a[1], o) * r); },
                  std::vector<int>{0, 1});
    std::vector<Array> out = g({x, w});
    for (Array& a : out) a = a.eval();
    return out;
  };
  auto plain = grad([&](const std::vector<Array>& a) { return sum(matmul(a[0], a[1]) * r); });
  const std::vector<Array> reference = plain({x, w});
  const std::vector<Array> a = grads_with(key(1)), again = grads_with(key(1));
  const std::vector<Array> other = grads_with(key(2)), nearest = grads_with(std::nullopt);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_LT(relative_error(a[i], reference[i]), 0.05) << "input " << i;
    EXPECT_TRUE(bitwise(a[i], again[i])) << "the same key rounds the same way, input " << i;
    EXPECT_FALSE(bitwise(a[i], other[i])) << "another key draws other noise, input " << i;
    EXPECT_FALSE(bitwise(a[i], nearest[i])) << "no key: nearest rounding, input " << i;
    EXPECT_LT(relative_error(nearest[i], reference[i]), 0.05) << "input " << i;
  }
}

// Each row of x is quantized on its own, so mapping over a batch of rows-blocks gives the
// rows of the whole product bitwise.
TEST(QuantizedMatmul, VmapOverBatchesEqualsTheWholeProduct) {
  const Array x = random_array({3, 8, 32}, 11, DType::Float32), w = random_array({32, 16}, 12, DType::Float32);
  auto mapped = vmap([&](const std::vector<Array>& a) { return std::vector<Array>{quantized_matmul(a[0], w)}; });
  const Array y = mapped({x})[0].eval();
  EXPECT_TRUE(bitwise(y, quantized_matmul(x, w).eval()));
}

// A batched weight (per-example weights) takes the loop rule: each example's product.
TEST(QuantizedMatmul, VmapOverBatchedWeightsEqualsEachExample) {
  const Array x = random_array({8, 32}, 17, DType::Float32), w = random_array({3, 32, 16}, 18, DType::Float32);
  auto mapped = vmap([&](const std::vector<Array>& a) { return std::vector<Array>{quantized_matmul(x, a[0])}; });
  const Array y = mapped({w})[0].eval();
  ASSERT_EQ(y.shape(), (Shape{3, 8, 16}));
  for (int64_t i = 0; i < 3; ++i) {
    const Array wi = slice_axis(w, 0, i, i + 1).eval();
    EXPECT_TRUE(bitwise(slice_axis(y, 0, i, i + 1).eval(),
                        reshape(quantized_matmul(x, reshape(wi, {32, 16})), {1, 8, 16}).eval()))
        << "example " << i;
  }
}

TEST(QuantizedMatmul, AttributesRoundTripThroughTheParser) {
  QuantizedMatmulConfig c;
  c.trans_a = true;
  c.stochastic_b = true;
  c.int8_backward = false;
  c.salt = 4000000000u;
  const QuantizedMatmul p(c);
  const PrimitivePtr back = compiler::make_primitive(p.name(), p.attributes());
  EXPECT_EQ(back->attributes(), p.attributes());
  EXPECT_TRUE(back->is_equivalent(p));
}

TEST(QuantizedMatmul, BadInputIsNamed) {
  const Array x = random_array({4, 8}, 13, DType::Float32), w = random_array({8, 4}, 14, DType::Float32);
  EXPECT_TRUE(throws_with<DTypeError>([&] { quantized_matmul(astype(x, DType::Float16), astype(w, DType::Float16)); },
                                      {"expected float32 or bfloat16"}));
  EXPECT_TRUE(throws_with<ShapeError>(
      [&] {
        quantized_matmul(x, random_array({6, 4}, 15, DType::Float32));
      },
      {"not aligned"}));
  EXPECT_TRUE(throws_with<ShapeError>(
      [&] {
        quantized_matmul(x, random_array({2, 8, 4}, 16, DType::Float32));
      },
      {"expected x [..., K] and w [K, N]"}));
  QuantizedMatmulOptions o;
  o.key = zeros({2}, DType::Float32);
  EXPECT_TRUE(throws_with<ValueError>([&] { quantized_matmul(x, w, o); }, {"expected a random key, uint32 [2]"}));
}

}  // namespace
}  // namespace tessera::test
