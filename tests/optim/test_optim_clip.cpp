// global_norm and clip_by_global_norm against float64 references: the norm over
// every leaf of mixed dtypes, clipping only above the threshold.
#include <gtest/gtest.h>

#include <cstring>

#include "optim/optim_test_util.h"

namespace tessera::test {
namespace {

TEST(OptimClip, GlobalNormMatchesReference) {
  std::vector<LeafSpec> leaves = test_leaves();
  Values g = random_values_for(leaves, 21, DType::Float32);
  Values copy = g;
  const double want = ref_clip(copy, 0);
  Array norm = optim::global_norm(tree_of(leaves, g, DType::Float32));
  ASSERT_EQ(norm.dtype(), DType::Float32);
  ASSERT_EQ(norm.ndim(), 0);
  EXPECT_NEAR(norm.item<float>(), want, 1e-6 * want);
}

TEST(OptimClip, GlobalNormOfMixedDtypes) {
  Values f64 = {{"a", random_values(7, 1)}};
  Values bf16 = {{"b", round_to(random_values(9, 2, -4, 4), DType::BFloat16)}};
  Tree g{{"a", make_array(f64["a"], {7}, DType::Float64)}, {"b", make_array(bf16["b"], {3, 3}, DType::BFloat16)}};
  double sq = 0;
  for (double x : f64["a"]) sq += x * x;
  for (double x : bf16["b"]) sq += x * x;
  Array norm = optim::global_norm(g);
  EXPECT_EQ(norm.dtype(), DType::Float32);
  EXPECT_NEAR(norm.item<float>(), std::sqrt(sq), 1e-6 * std::sqrt(sq));
  EXPECT_EQ(optim::global_norm(Tree{}).item<float>(), 0.0f) << "no gradients: norm 0";
}

TEST(OptimClip, LeavesGradientsUnderTheThresholdUntouched) {
  std::vector<LeafSpec> leaves = test_leaves();
  Values g = random_values_for(leaves, 22, DType::Float32);
  Tree grads = tree_of(leaves, g, DType::Float32);
  Values copy = g;
  const double norm = ref_clip(copy, 0);
  auto [clipped, got_norm] = optim::clip_by_global_norm(grads, norm * 1.01);
  EXPECT_NEAR(got_norm.item<float>(), norm, 1e-6 * norm);
  std::vector<Array> a = clipped.leaves(), b = grads.leaves();
  eval(a);
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_EQ(std::memcmp(a[i].raw_data(), b[i].raw_data(), a[i].nbytes()), 0) << "leaf " << i << " changed";
}

TEST(OptimClip, ScalesGradientsOverTheThreshold) {
  std::vector<LeafSpec> leaves = test_leaves();
  Values g = random_values_for(leaves, 23, DType::Float64);
  Values want = g;
  const double norm = ref_clip(want, 0.25);
  ASSERT_GT(norm, 1.0) << "the case must exceed the threshold";
  auto [clipped, got_norm] = optim::clip_by_global_norm(tree_of(leaves, g, DType::Float64), 0.25);
  EXPECT_NEAR(got_norm.item<float>(), norm, 1e-6 * norm) << "the norm returned is the one before clipping";
  expect_close(values_of(clipped), want, 1e-13, "clipped");
  EXPECT_NEAR(optim::global_norm(clipped).item<float>(), 0.25, 1e-6) << "the clipped norm is the threshold";
  for (const Array& c : clipped.leaves()) EXPECT_EQ(c.dtype(), DType::Float64) << "dtypes are kept";
}

TEST(OptimClip, ZeroGradientsStayFinite) {
  Tree g{{"w", zeros({4})}};
  auto [clipped, norm] = optim::clip_by_global_norm(g, 1.0);
  EXPECT_EQ(norm.item<float>(), 0.0f);
  for (double x : clipped.at("w").leaf().to_vector<double>()) EXPECT_EQ(x, 0.0);
}

TEST(OptimClip, RejectsBadThresholdsAndIntegerGradients) {
  Tree g{{"w", zeros({4})}};
  expect_error<ValueError>([&] { optim::clip_by_global_norm(g, 0); }, {"max_norm", "0"});
  expect_error<ValueError>([&] { optim::clip_by_global_norm(g, -1); }, {"max_norm"});
  Tree ints{{"layer", Tree{{"idx", zeros({2}, DType::Int32)}}}};
  expect_error<DTypeError>([&] { optim::global_norm(ints); }, {"layer.idx", "floating"});
}

}  // namespace
}  // namespace tessera::test
