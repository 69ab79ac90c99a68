// Layout and indexing ops vs naive index arithmetic: reshape, transposes, slices,
// concatenate/stack, take (embedding lookup), take_along_axis, one_hot.
#include "test_util.h"

namespace tessera::test {
namespace {

// A float64 array whose value is its flat index: makes every permutation visible.
Array iota(const Shape& s, DType dt = DType::Float64) {
  std::vector<double> v(static_cast<size_t>(numel(s)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i);
  return make_array(v, s, dt);
}

TEST(Layout, Reshape) {
  Array x = iota({2, 3, 4});
  auto v = values(x);
  EXPECT_SHAPE(reshape(x, {4, 6}), 4, 6);
  EXPECT_CLOSE(reshape(x, {4, 6}), v, 0, 0);
  EXPECT_SHAPE(reshape(x, {-1, 4}), 6, 4);
  EXPECT_SHAPE(reshape(x, {2, -1}), 2, 12);
  EXPECT_SHAPE(x.reshape({24}), 24);
  EXPECT_SHAPE(reshape(iota({1}), {}), );
  EXPECT_SHAPE(reshape(zeros({0, 3}), {3, 0}), 3, 0);
  // Reshape of a non-contiguous result (a transpose) reads it in logical order.
  Array t = transpose(x);
  EXPECT_CLOSE(reshape(t, {-1}), ref_transpose(v, {2, 3, 4}, {2, 1, 0}), 0, 0);
  EXPECT_CLOSE(flatten(t), ref_transpose(v, {2, 3, 4}, {2, 1, 0}), 0, 0);
  EXPECT_SHAPE(flatten(iota({2, 3})), 6);
}

TEST(Layout, TransposeSwapMove) {
  Shape s = {2, 3, 4, 5};
  Array x = iota(s, DType::Float32);
  auto v = values(x);
  for (std::vector<int> perm : std::vector<std::vector<int>>{{0, 1, 2, 3}, {3, 2, 1, 0}, {1, 0, 3, 2}, {2, 0, 3, 1}}) {
    Array y = transpose(x, perm);
    Shape es;
    for (int p : perm) es.push_back(s[p]);
    EXPECT_EQ(y.shape(), es);
    EXPECT_EQ(y.dtype(), DType::Float32);
    EXPECT_CLOSE(y, ref_transpose(v, s, perm), 0, 0);
  }
  EXPECT_CLOSE(transpose(x), ref_transpose(v, s, {3, 2, 1, 0}), 0, 0);
  EXPECT_CLOSE(x.T(), ref_transpose(v, s, {3, 2, 1, 0}), 0, 0);
  EXPECT_CLOSE(swapaxes(x, 1, -1), ref_transpose(v, s, {0, 3, 2, 1}), 0, 0);
  // moveaxis(0 -> 2): [2,3,4,5] -> [3,4,2,5].
  EXPECT_CLOSE(moveaxis(x, 0, 2), ref_transpose(v, s, {1, 2, 0, 3}), 0, 0);
  EXPECT_SHAPE(moveaxis(x, 0, 2), 3, 4, 2, 5);
  EXPECT_CLOSE(moveaxis(x, -1, 0), ref_transpose(v, s, {3, 0, 1, 2}), 0, 0);
  // Large odd transpose (blocked kernels' edges).
  Shape big = {33, 1000 + 7};
  Array b = iota(big);
  EXPECT_CLOSE(transpose(b), ref_transpose(values(b), big, {1, 0}), 0, 0);
}

TEST(Layout, ExpandSqueezeBroadcast) {
  Array x = iota({3, 4});
  EXPECT_SHAPE(expand_dims(x, 0), 1, 3, 4);
  EXPECT_SHAPE(expand_dims(x, -1), 3, 4, 1);
  EXPECT_SHAPE(expand_dims(x, 1), 3, 1, 4);
  EXPECT_CLOSE(expand_dims(x, 1), values(x), 0, 0);
  Array y = iota({1, 3, 1, 4, 1});
  EXPECT_SHAPE(squeeze(y), 3, 4);
  EXPECT_SHAPE(squeeze(y, {0}), 3, 1, 4, 1);
  EXPECT_SHAPE(squeeze(y, {-1, 2}), 1, 3, 4);
  EXPECT_CLOSE(squeeze(y), values(y), 0, 0);
  Array b = broadcast_to(iota({3, 1}), {2, 3, 4});
  EXPECT_SHAPE(b, 2, 3, 4);
  std::vector<double> e;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) e.push_back(j);
  EXPECT_CLOSE(b, e, 0, 0);
  EXPECT_SHAPE(broadcast_to(iota({3}), {0, 3}), 0, 3);
}

TEST(Layout, SliceWithSteps) {
  Shape s = {5, 7, 4};
  Array x = iota(s);
  auto v = values(x);
  struct Case {
    std::vector<int64_t> start, stop, step;
  };
  for (const auto& c : std::vector<Case>{{{0, 0, 0}, {5, 7, 4}, {}},
                                         {{1, 2, 0}, {4, 7, 3}, {1, 2, 1}},
                                         {{0, 1, 1}, {5, 6, 4}, {3, 4, 2}},
                                         {{2, 3, 0}, {2, 5, 4}, {1, 1, 1}}}) {
    Array y = slice(x, c.start, c.stop, c.step);
    Shape es;
    for (int d = 0; d < 3; ++d) {
      int64_t st = c.step.empty() ? 1 : c.step[d];
      es.push_back(std::max<int64_t>(0, (c.stop[d] - c.start[d] + st - 1) / st));
    }
    EXPECT_EQ(y.shape(), es);
    std::vector<double> e;
    for (int64_t i = 0; i < numel(es); ++i) {
      auto idx = unravel(i, es);
      for (int d = 0; d < 3; ++d) idx[d] = c.start[d] + idx[d] * (c.step.empty() ? 1 : c.step[d]);
      e.push_back(v[ravel(idx, s)]);
    }
    EXPECT_CLOSE(y, e, 0, 0);
  }
  // slice_axis along a negative axis with a step.
  Array z = slice_axis(x, -2, 1, 7, 2);
  EXPECT_SHAPE(z, 5, 3, 4);
  std::vector<double> e;
  for (int i = 0; i < 5; ++i)
    for (int j = 1; j < 7; j += 2)
      for (int k = 0; k < 4; ++k) e.push_back(v[(i * 7 + j) * 4 + k]);
  EXPECT_CLOSE(z, e, 0, 0);
}

TEST(Layout, ConcatenateAndStack) {
  Array a = iota({2, 3}), b = random_array({2, 5}, 1), c = random_array({2, 1}, 2);
  Array y = concatenate({a, b, c}, 1);
  EXPECT_SHAPE(y, 2, 9);
  std::vector<double> e;
  auto va = values(a), vb = values(b), vc = values(c);
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) e.push_back(va[i * 3 + j]);
    for (int j = 0; j < 5; ++j) e.push_back(vb[i * 5 + j]);
    e.push_back(vc[i]);
  }
  EXPECT_CLOSE(y, e, 0, 0);
  Array y0 = concatenate({a, iota({4, 3}), zeros({0, 3}, DType::Float64)}, 0);
  EXPECT_SHAPE(y0, 6, 3);
  auto e0 = va;
  for (int i = 0; i < 12; ++i) e0.push_back(i);
  EXPECT_CLOSE(y0, e0, 0, 0);
  EXPECT_CLOSE(concatenate({a, a}, -1),
               ref_transpose(
                   [&] {
                     std::vector<double> t;
                     for (int k = 0; k < 2; ++k) t.insert(t.end(), va.begin(), va.end());
                     return t;
                   }(),
                   {2, 2, 3}, {1, 0, 2}),
               0, 0);
  // Promotion across concatenated dtypes.
  EXPECT_EQ(concatenate({iota({2}, DType::Int32), iota({2}, DType::Float32)}).dtype(), DType::Float32);

  Array s0 = stack({a, a * 2.0, a * 3.0}, 0);
  EXPECT_SHAPE(s0, 3, 2, 3);
  std::vector<double> es;
  for (int k = 1; k <= 3; ++k)
    for (double x : va) es.push_back(x * k);
  EXPECT_CLOSE(s0, es, 0, 0);
  Array s2 = stack({a, a * 2.0}, -1);
  EXPECT_SHAPE(s2, 2, 3, 2);
  EXPECT_CLOSE(s2, ref_transpose(values(stack({a, a * 2.0}, 0)), {2, 2, 3}, {1, 2, 0}), 0, 0);
}

TEST(Indexing, TakeEmbeddingAndNegativeIndices) {
  const int64_t V = 11, D = 7;
  Array table = random_array({V, D}, 3, DType::Float32);
  auto tv = values(table);
  auto ids = random_ints(2 * 5, 4, 0, V - 1);
  Array tok = Array::from_vector<int64_t>(ids, {2, 5});
  Array emb = take(table, tok, 0);
  EXPECT_SHAPE(emb, 2, 5, D);
  EXPECT_EQ(emb.dtype(), DType::Float32);
  std::vector<double> e;
  for (auto id : ids)
    for (int64_t d = 0; d < D; ++d) e.push_back(tv[id * D + d]);
  EXPECT_CLOSE(emb, e, 0, 0);
  // int32 indices, negative indices count from the end, axis = 1.
  Array idx = Array::from_vector<int32_t>({-1, 0, 2, -7}, {4});
  Array t1 = take(table, idx, 1);
  EXPECT_SHAPE(t1, V, 4);
  std::vector<double> e1;
  for (int64_t r = 0; r < V; ++r)
    for (int c : {6, 0, 2, 0}) e1.push_back(tv[r * D + c]);
  EXPECT_CLOSE(t1, e1, 0, 0);
  // Scalar index drops the axis.
  Array t2 = take(table, Array::from_vector<int64_t>({3}, {}), 0);
  EXPECT_SHAPE(t2, D);
  EXPECT_CLOSE(t2, std::vector<double>(tv.begin() + 3 * D, tv.begin() + 4 * D), 0, 0);
}

TEST(Indexing, TakeAlongAxis) {
  Shape s = {3, 6};
  Array x = random_array(s, 5);
  auto v = values(x);
  auto ids = random_ints(3 * 2, 6, 0, 5);
  Array idx = Array::from_vector<int64_t>(ids, {3, 2});
  Array y = take_along_axis(x, idx, 1);
  EXPECT_SHAPE(y, 3, 2);
  std::vector<double> e;
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 2; ++j) e.push_back(v[i * 6 + ids[i * 2 + j]]);
  EXPECT_CLOSE(y, e, 0, 0);
  auto ids0 = random_ints(4 * 6, 7, 0, 2);
  Array y0 = take_along_axis(x, Array::from_vector<int64_t>(ids0, {4, 6}), 0);
  EXPECT_SHAPE(y0, 4, 6);
  std::vector<double> e0;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 6; ++j) e0.push_back(v[ids0[i * 6 + j] * 6 + j]);
  EXPECT_CLOSE(y0, e0, 0, 0);
}

TEST(Indexing, OneHot) {
  Array idx = Array::from_vector<int64_t>({0, 3, 1, 2, 3, 0}, {2, 3});
  Array y = one_hot(idx, 4);
  EXPECT_SHAPE(y, 2, 3, 4);
  EXPECT_EQ(y.dtype(), DType::Float32);
  std::vector<double> e;
  for (int64_t k : {0, 3, 1, 2, 3, 0})
    for (int c = 0; c < 4; ++c) e.push_back(c == k ? 1 : 0);
  EXPECT_CLOSE(y, e, 0, 0);
  EXPECT_EQ(one_hot(idx, 4, DType::BFloat16).dtype(), DType::BFloat16);
}

}  // namespace
}  // namespace tessera::test
