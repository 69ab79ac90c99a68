// grouped_matmul and its weight gradient (ir/primitives/grouped_matmul.h) against a
// float64 loop over the groups' rows, in float64 / float32 / bfloat16, transposed and
// not, with empty groups and rows past the last group; gradients of both (and of the
// gradient) by finite differences; jit gives the eager bits; bitwise equal for 1 and 2
// threads; bad shapes, dtypes and sizes are clear errors. With a leading shard dim each
// shard is the rank-3 op on its own matrices.
#include <gtest/gtest.h>

#include <vector>

#include "core/test_util.h"
#include "tessera/base/thread_pool.h"
#include "tessera/core/ops.h"
#include "tessera/core/transforms.h"
#include "tessera/ir/primitives/grouped_matmul.h"
#include "tessera/tessera.h"

namespace tessera {
namespace {

using test::all_close;
using test::random_array;

// out[g, n, :] = a[g, n, :] W_e for the group e holding row n (W_e = w[e] or w[e]^T).
std::vector<double> reference(const Array& a, const Array& w, const std::vector<int64_t>& sizes, bool trans_w) {
  const int64_t g_count = a.shape(0), rows = a.shape(1), k = a.shape(2), e_count = w.shape(0);
  const int64_t m = w.shape(trans_w ? 1 : 2);
  const std::vector<double> av = a.to_vector<double>(), wv = w.to_vector<double>();
  std::vector<double> out(static_cast<size_t>(g_count * rows * m), 0.0);
  for (int64_t g = 0; g < g_count; ++g) {
    int64_t row = 0;
    for (int64_t e = 0; e < e_count; ++e)
      for (int64_t r = 0; r < sizes[static_cast<size_t>(g * e_count + e)]; ++r, ++row)
        for (int64_t j = 0; j < m; ++j) {
          double acc = 0;
          for (int64_t i = 0; i < k; ++i)
            acc += av[static_cast<size_t>((g * rows + row) * k + i)] *
                   wv[static_cast<size_t>(trans_w ? (e * m + j) * k + i : (e * k + i) * m + j)];
          out[static_cast<size_t>((g * rows + row) * m + j)] = acc;
        }
  }
  return out;
}

Array sizes_array(const std::vector<int64_t>& sizes, int64_t batches, DType dtype = DType::Int64) {
  const Array s = Array::from_vector(sizes, {batches, static_cast<int64_t>(sizes.size()) / batches});
  return dtype == DType::Int64 ? s : astype(s, dtype).eval();
}

// What f throws, or "(no error)".
std::string message(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return std::string(e.what());
  }
  return std::string("(no error)");
}

// 2 batches of 7 rows, 3 groups (one empty in batch 0; batch 1 leaves a row over).
const std::vector<int64_t> kSizes{3, 0, 4, 2, 2, 2};

TEST(GroupedMatmul, MatchesTheLoopOverGroups) {
  for (const DType dtype : {DType::Float64, DType::Float32, DType::BFloat16})
    for (const bool trans : {false, true}) {
      const Array a = random_array({2, 7, 5}, 1, dtype);
      const Array w = random_array(trans ? Shape{3, 4, 5} : Shape{3, 5, 4}, 2, dtype);
      const Array out = grouped_matmul(a, w, sizes_array(kSizes, 2), trans);
      EXPECT_EQ(out.shape(), (Shape{2, 7, 4}));
      EXPECT_TRUE(all_close(out, reference(a, w, kSizes, trans), test::rtol_for(dtype), test::rtol_for(dtype)))
          << name(dtype) << " trans " << trans;
      // The row past batch 1's groups is zero.
      const std::vector<double> v = out.to_vector<double>();
      for (int64_t j = 0; j < 4; ++j) EXPECT_EQ(v[static_cast<size_t>((7 + 6) * 4 + j)], 0.0);
      // int32 sizes give the same bits.
      EXPECT_EQ(grouped_matmul(a, w, sizes_array(kSizes, 2, DType::Int32), trans).to_vector<double>(), v);
    }
}

TEST(GroupedMatmul, WeightGradSumsEachGroupsRowsOverTheBatches) {
  const Array x = random_array({2, 7, 5}, 3), y = random_array({2, 7, 4}, 4);
  const Array out = grouped_matmul_weight_grad_op(x, y, sizes_array(kSizes, 2), false);
  ASSERT_EQ(out.shape(), (Shape{3, 5, 4}));
  const std::vector<double> xv = x.to_vector<double>(), yv = y.to_vector<double>();
  std::vector<double> want(3 * 5 * 4, 0.0);
  for (int64_t g = 0; g < 2; ++g) {
    int64_t row = 0;
    for (int64_t e = 0; e < 3; ++e)
      for (int64_t r = 0; r < kSizes[static_cast<size_t>(g * 3 + e)]; ++r, ++row)
        for (int64_t i = 0; i < 5; ++i)
          for (int64_t j = 0; j < 4; ++j)
            want[static_cast<size_t>((e * 5 + i) * 4 + j)] +=
                xv[static_cast<size_t>((g * 7 + row) * 5 + i)] * yv[static_cast<size_t>((g * 7 + row) * 4 + j)];
  }
  EXPECT_TRUE(all_close(out, want, 1e-12, 1e-12));
  // Transposed: [E, M, K].
  const Array t = grouped_matmul_weight_grad_op(x, y, sizes_array(kSizes, 2), true);
  ASSERT_EQ(t.shape(), (Shape{3, 4, 5}));
  EXPECT_TRUE(all_close(t, transpose(out, {0, 2, 1}).eval(), 1e-12, 1e-12));
}

TEST(GroupedMatmul, GradientsMatchFiniteDifferences) {
  const Array sizes = sizes_array(kSizes, 2);
  for (const bool trans : {false, true}) {
    const Array a = random_array({2, 7, 3}, 5);
    const Array w = random_array(trans ? Shape{3, 2, 3} : Shape{3, 3, 2}, 6);
    EXPECT_TRUE(test::check_vjp_fd(
        [&](const std::vector<Array>& in) { return grouped_matmul(in[0], in[1], sizes, trans); }, {a, w}))
        << "trans " << trans;
    // The weight gradient's own gradient (second order through grouped_matmul).
    const Array y = random_array({2, 7, 2}, 7);
    EXPECT_TRUE(test::check_vjp_fd(
        [&](const std::vector<Array>& in) { return grouped_matmul_weight_grad_op(in[0], in[1], sizes, trans); },
        {a, y}))
        << "weight grad, trans " << trans;
  }
}

TEST(GroupedMatmul, JitAndThreadCountsGiveTheSameBits) {
  const Array a = random_array({2, 64, 48}, 8, DType::Float32), w = random_array({3, 48, 40}, 9, DType::Float32);
  const Array sizes = sizes_array({20, 0, 40, 21, 21, 22}, 2);
  const ScalarFn loss = [&](const std::vector<Array>& in) { return sum(square(grouped_matmul(in[0], in[1], sizes))); };
  auto step = [&](const std::vector<Array>& in) {
    const auto [value, grads] = value_and_grad(loss)(in);
    return std::vector<Array>{value, grads[0], grads[1]};
  };
  const std::vector<Array> eager = step({a, w});
  const int saved = num_threads();
  std::vector<std::vector<std::vector<float>>> runs;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    const std::vector<Array> got = jit(step)({a, w});
    std::vector<std::vector<float>> bits;
    for (const Array& x : got) bits.push_back(x.to_vector<float>());
    runs.push_back(bits);
  }
  set_num_threads(saved);
  EXPECT_EQ(runs[0], runs[1]);
  for (size_t i = 0; i < eager.size(); ++i) EXPECT_EQ(runs[0][i], eager[i].to_vector<float>()) << "output " << i;
}

// Expert parallelism's shard dim: a [S, G, N, K] with w [S, E, K, M] and sizes
// [S, G, E] is, shard by shard, the rank-3 op on that shard's slices (bitwise), and so
// is the weight gradient [S, E, K, M].
TEST(GroupedMatmul, AShardDimGivesEachShardItsOwnMatrices) {
  const std::vector<int64_t> other{1, 5, 1, 0, 0, 7};
  std::vector<int64_t> both = kSizes;
  both.insert(both.end(), other.begin(), other.end());
  const Array sizes = Array::from_vector(both, {2, 2, 3});
  for (const bool trans : {false, true}) {
    const Array a = random_array({2, 2, 7, 5}, 21, DType::Float32);
    const Array w = random_array(trans ? Shape{2, 3, 4, 5} : Shape{2, 3, 5, 4}, 22, DType::Float32);
    const Array y = random_array({2, 2, 7, 4}, 23, DType::Float32);
    const Array out = grouped_matmul(a, w, sizes, trans);
    const Array grad = grouped_matmul_weight_grad_op(a, y, sizes, trans);
    ASSERT_EQ(out.shape(), (Shape{2, 2, 7, 4}));
    ASSERT_EQ(grad.shape(), trans ? (Shape{2, 3, 4, 5}) : (Shape{2, 3, 5, 4}));
    for (int64_t s = 0; s < 2; ++s) {
      auto at = [&](const Array& x) { return squeeze(slice_axis(x, 0, s, s + 1), {0}); };
      EXPECT_EQ(at(out).to_vector<float>(), grouped_matmul(at(a), at(w), at(sizes), trans).to_vector<float>())
          << "shard " << s << " trans " << trans;
      EXPECT_EQ(at(grad).to_vector<float>(),
                grouped_matmul_weight_grad_op(at(a), at(y), at(sizes), trans).to_vector<float>())
          << "weight grad, shard " << s << " trans " << trans;
    }
    const Array a64 = random_array({2, 2, 7, 3}, 24);
    const Array w64 = random_array(trans ? Shape{2, 3, 2, 3} : Shape{2, 3, 3, 2}, 25);
    EXPECT_TRUE(test::check_vjp_fd(
        [&](const std::vector<Array>& in) { return grouped_matmul(in[0], in[1], sizes, trans); }, {a64, w64}))
        << "trans " << trans;
    EXPECT_TRUE(test::check_vjp_fd(
        [&](const std::vector<Array>& in) { return grouped_matmul_weight_grad_op(in[0], in[1], sizes, trans); },
        {a64, random_array({2, 2, 7, 2}, 26)}))
        << "weight grad, trans " << trans;
  }
  const Array a = random_array({2, 2, 7, 5}, 1);
  EXPECT_NE(message([&] {
              grouped_matmul(a, random_array({3, 3, 5, 4}, 2), sizes);
            }).find("[shards, groups, K, M]"),
            std::string::npos);
  EXPECT_NE(message([&] {
              grouped_matmul(a, random_array({2, 3, 5, 4}, 2), sizes_array(kSizes, 2));
            }).find("group sizes [2, 3] (expected [2, 2, groups]"),
            std::string::npos);
}

TEST(GroupedMatmul, BadInputIsAClearError) {
  const Array a = random_array({2, 7, 5}, 1), w = random_array({3, 5, 4}, 2);
  EXPECT_NE(message([&] {
              grouped_matmul(a, random_array({3, 6, 4}, 2), sizes_array(kSizes, 2));
            }).find("a [2, 7, 5] has K=5 but w [3, 6, 4] has K=6"),
            std::string::npos);
  EXPECT_NE(message([&] {
              grouped_matmul(a, w, sizes_array({1, 2, 3, 4}, 2));
            }).find("group sizes [2, 2] for the 3 matrices of w [3, 5, 4]"),
            std::string::npos);
  EXPECT_NE(message([&] {
              grouped_matmul(a, w, astype(sizes_array(kSizes, 2), DType::Float32));
            }).find("group sizes of dtype float32 (expected int32 or int64)"),
            std::string::npos);
  EXPECT_NE(message([&] {
              grouped_matmul(a, astype(w, DType::Float32), sizes_array(kSizes, 2));
            }).find("operand dtypes differ"),
            std::string::npos);
  EXPECT_NE(message([&] {
              grouped_matmul(a, w, sizes_array({3, 0, 5, 2, 2, 2}, 2)).eval();
            }).find("the groups of batch 0 hold 8 rows or more, but the operand has 7"),
            std::string::npos);
  EXPECT_NE(message([&] {
              grouped_matmul(a, w, sizes_array({3, -1, 4, 2, 2, 2}, 2)).eval();
            }).find("group 1 of batch 0 has -1 rows"),
            std::string::npos);
}

}  // namespace
}  // namespace tessera
