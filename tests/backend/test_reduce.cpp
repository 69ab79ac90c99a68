// Reductions and arg reductions vs naive float64 / int64 references over every axis
// set of 1-4 d shapes, every dtype family, NaN handling, and thread determinism.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/kernels/reduce.h"
#include "tessera/base/error.h"
#include "tessera/base/thread_pool.h"

namespace tessera::cpu {
namespace {

std::vector<unsigned char> random_bytes(DType dtype, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(is_signed(dtype) || is_floating(dtype) ? -3 : 0, 3);
  std::vector<unsigned char> b(std::max<int64_t>(1, n) * itemsize(dtype));
  for (int64_t i = 0; i < n; ++i) {
    double v = dist(rng);
    if (!is_floating(dtype)) v = std::round(v);
    if (dtype == DType::Bool) v = v > 1;
    if (is_floating(dtype)) v = 1 + v / 8;  // keeps Prod well scaled
    store_from_double(dtype, b.data(), i, v);
  }
  return b;
}

// Naive reference in double: out index = input index with reduced axes dropped.
std::vector<double> naive_reduce(ReduceOp op, DType dtype, const void* x, const Shape& shape,
                                 const std::vector<int>& axes) {
  Shape out_shape;
  std::vector<bool> red(shape.size());
  for (int a : axes) red[a] = true;
  for (size_t d = 0; d < shape.size(); ++d)
    if (!red[d]) out_shape.push_back(shape[d]);
  double init = op == ReduceOp::Sum ? 0 : op == ReduceOp::Prod ? 1 : op == ReduceOp::Max ? -INFINITY : INFINITY;
  std::vector<double> out(numel(out_shape), init);
  Strides cs = contiguous_strides(shape), ocs = contiguous_strides(out_shape);
  for (int64_t i = 0; i < numel(shape); ++i) {
    int64_t rem = i, o = 0, k = 0;
    for (size_t d = 0; d < shape.size(); ++d) {
      int64_t idx = rem / cs[d];
      rem %= cs[d];
      if (!red[d]) o += idx * ocs[k++];
    }
    double v = load_as_double(dtype, x, i);
    double& acc = out[o];
    if (op == ReduceOp::Sum)
      acc += v;
    else if (op == ReduceOp::Prod)
      acc *= v;
    else if (std::isnan(v) || std::isnan(acc))
      acc = NAN;
    else
      acc = op == ReduceOp::Max ? std::max(acc, v) : std::min(acc, v);
  }
  return out;
}

std::vector<std::vector<int>> all_axis_sets(int ndim) {
  std::vector<std::vector<int>> sets;
  for (int mask = 1; mask < (1 << ndim); ++mask) {
    std::vector<int> s;
    for (int d = 0; d < ndim; ++d)
      if (mask & (1 << d)) s.push_back(d);
    sets.push_back(s);
  }
  return sets;
}

void check(ReduceOp op, DType dtype, const Shape& shape, uint32_t seed) {
  auto x = random_bytes(dtype, numel(shape), seed);
  for (const auto& axes : all_axis_sets(static_cast<int>(shape.size()))) {
    int64_t out_n = 1, red_n = 1;
    for (size_t d = 0; d < shape.size(); ++d)
      (std::find(axes.begin(), axes.end(), static_cast<int>(d)) != axes.end() ? red_n : out_n) *= shape[d];
    if (red_n == 0 && (op == ReduceOp::Max || op == ReduceOp::Min)) {
      if (out_n > 0) {
        std::vector<unsigned char> out(out_n * itemsize(dtype));
        EXPECT_THROW(reduce(op, dtype, x.data(), shape, axes, out.data()), ValueError);
      }
      continue;
    }
    auto want = naive_reduce(op, dtype, x.data(), shape, axes);
    std::vector<unsigned char> out(std::max<int64_t>(1, out_n) * itemsize(dtype));
    reduce(op, dtype, x.data(), shape, axes, out.data());
    double tol = dtype == DType::Float64   ? 1e-12
                 : dtype == DType::Float32 ? 1e-5
                 : dtype == DType::Float16 ? 2e-3
                                           : 1e-2;
    for (int64_t i = 0; i < out_n; ++i) {
      double w = want[i];
      if (!is_floating(dtype)) {  // integers wrap / bool saturates, like a store into the dtype
        std::vector<unsigned char> tmp(8);
        if (dtype == DType::Bool)
          w = w != 0;
        else if (dtype == DType::UInt8 || dtype == DType::Int8)
          w = static_cast<double>(dtype == DType::UInt8
                                      ? static_cast<int64_t>(static_cast<uint8_t>(static_cast<int64_t>(w)))
                                      : static_cast<int64_t>(static_cast<int8_t>(static_cast<int64_t>(w))));
        ASSERT_EQ(load_as_double(dtype, out.data(), i), w)
            << name(dtype) << " " << to_string(shape) << " axes " << axes.size();
      } else {
        ASSERT_NEAR(load_as_double(dtype, out.data(), i), w, tol * std::abs(w) + 1e-6)
            << name(dtype) << " op " << static_cast<int>(op) << " " << to_string(shape) << " axes[0] " << axes[0];
      }
    }
  }
}

TEST(Reduce, AllOpsDtypesAndAxisSets) {
  const std::vector<Shape> shapes = {{1},        {7},    {1031},    {3, 5},       {1, 9},      {40, 1},   {2, 3, 4},
                                     {3, 1, 65}, {0, 4}, {2, 0, 3}, {2, 3, 5, 7}, {4, 600, 3}, {1, 5000}, {9000, 3}};
  uint32_t seed = 1;
  for (DType dtype : {DType::Float32, DType::Float64, DType::BFloat16, DType::Float16, DType::Int32, DType::Int64,
                      DType::UInt8, DType::Int8, DType::UInt32, DType::Bool})
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min})
      for (const Shape& s : shapes) {
        if (op == ReduceOp::Prod && (!is_floating(dtype) || numel(s) > 100)) continue;  // overflow / underflow
        check(op, dtype, s, seed++);
      }
}

TEST(Reduce, Float32SumOfMillionIsAccurate) {
  const int64_t n = 1 << 20;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n);
  double exact = 0;
  for (auto& v : x) exact += (v = dist(rng));
  float row = 0;
  reduce(ReduceOp::Sum, DType::Float32, x.data(), {n}, {0}, &row);
  EXPECT_NEAR(row, exact, 2e-6 * exact);
  float col[2];
  reduce(ReduceOp::Sum, DType::Float32, x.data(), {n / 2, 2}, {0}, col);  // leading-axis path
  double e0 = 0, e1 = 0;
  for (int64_t i = 0; i < n; i += 2) e0 += x[i], e1 += x[i + 1];
  EXPECT_NEAR(col[0], e0, 2e-6 * e0);
  EXPECT_NEAR(col[1], e1, 2e-6 * e1);
}

TEST(Reduce, MaxMinPropagateNaN) {
  std::vector<float> x(3 * 100, 1.0f);
  x[150] = NAN;  // row 1
  float mx[3], mn[3];
  reduce(ReduceOp::Max, DType::Float32, x.data(), {3, 100}, {1}, mx);
  reduce(ReduceOp::Min, DType::Float32, x.data(), {3, 100}, {1}, mn);
  EXPECT_EQ(mx[0], 1.0f);
  EXPECT_TRUE(std::isnan(mx[1]));
  EXPECT_TRUE(std::isnan(mn[1]));
  float col[100];
  reduce(ReduceOp::Max, DType::Float32, x.data(), {3, 100}, {0}, col);
  EXPECT_TRUE(std::isnan(col[50]));
  EXPECT_EQ(col[49], 1.0f);
}

TEST(Reduce, MaxOfInfinitiesIsInfinite) {
  // The identity of max/min is -inf/+inf for floats, not the largest finite value.
  std::vector<float> x(2 * 9, -INFINITY);
  for (int i = 9; i < 18; ++i) x[static_cast<size_t>(i)] = INFINITY;
  float mx[2], mn[2];
  reduce(ReduceOp::Max, DType::Float32, x.data(), {2, 9}, {1}, mx);
  reduce(ReduceOp::Min, DType::Float32, x.data(), {2, 9}, {1}, mn);
  EXPECT_EQ(mx[0], -INFINITY);
  EXPECT_EQ(mn[1], INFINITY);
}

TEST(Reduce, BitwiseIdenticalAcrossThreadCounts) {
  std::mt19937 rng(9);
  std::normal_distribution<float> dist;
  std::vector<float> x(3 * 1000 * 700);
  for (auto& v : x) v = dist(rng);
  auto run = [&](int threads) {
    set_num_threads(threads);
    std::vector<float> out;
    for (const auto& axes : std::vector<std::vector<int>>{{0}, {1}, {2}, {0, 2}, {1, 2}, {0, 1, 2}}) {
      std::vector<float> o(3 * 1000 * 700);
      reduce(ReduceOp::Sum, DType::Float32, x.data(), {3, 1000, 700}, axes, o.data());
      out.insert(out.end(), o.begin(), o.end());
    }
    return out;
  };
  int saved = num_threads();
  auto one = run(1), two = run(2);
  set_num_threads(saved);
  EXPECT_EQ(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)), 0);
}

TEST(ArgReduce, FirstIndexAndNaN) {
  for (DType dtype : {DType::Float32, DType::Int32, DType::BFloat16, DType::Float64, DType::UInt8}) {
    const Shape shape = {3, 17, 5};
    auto x = random_bytes(dtype, numel(shape), 4);
    for (int axis = 0; axis < 3; ++axis) {
      for (bool is_max : {true, false}) {
        Shape out_shape = shape;
        out_shape.erase(out_shape.begin() + axis);
        std::vector<int64_t> got(numel(out_shape));
        arg_reduce(is_max, dtype, x.data(), shape, axis, got.data());
        Strides cs = contiguous_strides(shape);
        for (int64_t o = 0; o < numel(out_shape); ++o) {
          int64_t inner = axis == 2 ? 1 : (axis == 1 ? 5 : 85);
          int64_t outer_i = o / inner, inner_i = o % inner;
          int64_t base = outer_i * shape[axis] * inner + inner_i, best = 0;
          for (int64_t l = 1; l < shape[axis]; ++l) {
            double v = load_as_double(dtype, x.data(), base + l * inner),
                   b = load_as_double(dtype, x.data(), base + best * inner);
            if (is_max ? v > b : v < b) best = l;
          }
          ASSERT_EQ(got[o], best) << name(dtype) << " axis " << axis;
        }
      }
    }
  }
  std::vector<float> v = {1, 5, NAN, 5, NAN};
  int64_t i;
  arg_reduce(true, DType::Float32, v.data(), {5}, 0, &i);
  EXPECT_EQ(i, 2);
  arg_reduce(false, DType::Float32, v.data(), {5}, 0, &i);
  EXPECT_EQ(i, 2);
  std::vector<float> e;
  EXPECT_THROW(arg_reduce(true, DType::Float32, e.data(), {2, 0}, 1, &i), ValueError);
}

}  // namespace
}  // namespace tessera::cpu
