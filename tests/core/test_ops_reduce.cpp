// Reductions vs naive float64 references over many axis sets (negative axes,
// keepdims, empty = all), result dtypes, empty inputs and thread-count determinism.
#include <cmath>
#include <numeric>

#include "test_util.h"

namespace tessera::test {
namespace {

using Group = std::vector<double>;
using RefFn = std::function<double(const Group&)>;
using OpFn = std::function<Array(const Array&, const std::vector<int>&, bool)>;

double g_sum(const Group& g) { return std::accumulate(g.begin(), g.end(), 0.0); }
double g_mean(const Group& g) { return g_sum(g) / static_cast<double>(g.size()); }
double g_max(const Group& g) { return *std::max_element(g.begin(), g.end()); }
double g_min(const Group& g) { return *std::min_element(g.begin(), g.end()); }
double g_prod(const Group& g) {
  double p = 1;
  for (double x : g) p *= x;
  return p;
}
double g_lse(const Group& g) {
  double m = g_max(g), s = 0;
  for (double x : g) s += std::exp(x - m);
  return m + std::log(s);
}
double g_var(const Group& g) {
  double m = g_mean(g), s = 0;
  for (double x : g) s += (x - m) * (x - m);
  return s / static_cast<double>(g.size());
}

struct ReduceCase {
  const char* name;
  OpFn op;
  RefFn ref;
};

std::vector<ReduceCase> reduce_cases() {
  return {
      {"sum", [](const Array& a, const std::vector<int>& ax, bool k) { return sum(a, ax, k); }, g_sum},
      {"mean", [](const Array& a, const std::vector<int>& ax, bool k) { return mean(a, ax, k); }, g_mean},
      {"max", [](const Array& a, const std::vector<int>& ax, bool k) { return max(a, ax, k); }, g_max},
      {"min", [](const Array& a, const std::vector<int>& ax, bool k) { return min(a, ax, k); }, g_min},
      {"prod", [](const Array& a, const std::vector<int>& ax, bool k) { return prod(a, ax, k); }, g_prod},
      {"logsumexp", [](const Array& a, const std::vector<int>& ax, bool k) { return logsumexp(a, ax, k); }, g_lse},
      {"var", [](const Array& a, const std::vector<int>& ax, bool k) { return var(a, ax, k); }, g_var},
  };
}

std::vector<int> normalized(std::vector<int> axes, int nd) {
  for (auto& a : axes)
    if (a < 0) a += nd;
  return axes;
}

TEST(Reduce, AllOpsAxisSetsKeepdims) {
  const Shape s = {3, 4, 5};
  const std::vector<std::vector<int>> axis_sets = {{},     {0},      {1},    {2},    {-1},
                                                   {0, 2}, {-1, -3}, {1, 2}, {2, 0}, {0, 1, 2}};
  for (DType dt : {DType::Float64, DType::Float32, DType::BFloat16}) {
    // In [0.5, 1.5] so prod stays well conditioned.
    auto v = round_to(random_values(numel(s), 21, 0.5, 1.5), dt);
    Array x = make_array(v, s, dt);
    for (const auto& c : reduce_cases()) {
      for (const auto& axes : axis_sets) {
        for (bool keep : {false, true}) {
          Array y = c.op(x, axes, keep);
          auto nax = normalized(axes, 3);
          Shape es = ref_reduced_shape(s, nax, keep);
          EXPECT_EQ(y.shape(), es) << c.name << " axes " << to_string(Shape(axes.begin(), axes.end())) << " keepdims "
                                   << keep;
          EXPECT_EQ(y.dtype(), dt) << c.name;
          double rtol = dt == DType::Float64 ? 1e-12 : dt == DType::Float32 ? 1e-5 : 2e-2;
          EXPECT_TRUE(all_close(y, ref_reduce(v, s, axes, c.ref), rtol, rtol * 0.1))
              << c.name << " " << name(dt) << " axes " << to_string(Shape(axes.begin(), axes.end())) << " keepdims "
              << keep;
        }
      }
    }
  }
}

TEST(Reduce, ArgmaxArgmin) {
  const Shape s = {4, 7, 3};
  auto v = random_values(numel(s), 5);
  Array x = make_array(v, s, DType::Float32);
  auto vf = round_to(v, DType::Float32);
  for (int axis : {0, 1, 2, -1, -2}) {
    int na = axis < 0 ? axis + 3 : axis;
    for (bool keep : {false, true}) {
      Array am = argmax(x, axis, keep), an = argmin(x, axis, keep);
      EXPECT_EQ(am.dtype(), DType::Int64);
      EXPECT_EQ(an.dtype(), DType::Int64);
      EXPECT_EQ(am.shape(), ref_reduced_shape(s, {na}, keep)) << "axis " << axis;
      Shape kept = ref_reduced_shape(s, {na}, true);
      std::vector<double> emax(numel(kept)), emin(numel(kept));
      std::vector<double> bmax(numel(kept), -1e300), bmin(numel(kept), 1e300);
      for (int64_t i = 0; i < numel(s); ++i) {
        auto idx = unravel(i, s);
        int64_t pos = idx[na];
        idx[na] = 0;
        int64_t o = ravel(idx, kept);
        if (vf[i] > bmax[o]) bmax[o] = vf[i], emax[o] = static_cast<double>(pos);
        if (vf[i] < bmin[o]) bmin[o] = vf[i], emin[o] = static_cast<double>(pos);
      }
      EXPECT_CLOSE(am, emax, 0, 0) << "axis " << axis;
      EXPECT_CLOSE(an, emin, 0, 0) << "axis " << axis;
    }
  }
  // Ties: the first occurrence (numpy).
  Array t = make_array({1, 3, 3, 0, 0, 2}, {6}, DType::Int32);
  EXPECT_EQ(argmax(t, 0).item<int64_t>(), 1);
  EXPECT_EQ(argmin(t, 0).item<int64_t>(), 3);
  EXPECT_EQ(argmax(t, 0).ndim(), 0);
}

TEST(Reduce, IntegerAndBoolSums) {
  Array b = Array::from_vector<bool>({true, false, true, true, true, false}, {2, 3});
  EXPECT_EQ(sum(b).dtype(), DType::Int64);
  EXPECT_EQ(sum(b).item<int64_t>(), 4);
  EXPECT_CLOSE(sum(b, {1}), std::vector<double>({2, 2}), 0, 0);
  // int8 accumulates in int64: 200 * 100 does not wrap.
  Array i8 = full({200}, 100, DType::Int8);
  EXPECT_EQ(sum(i8).dtype(), DType::Int64);
  EXPECT_EQ(sum(i8).item<int64_t>(), 20000);
  Array i32 = full({3, 1000}, 2000000, DType::Int32);
  EXPECT_EQ(sum(i32).dtype(), DType::Int64);
  EXPECT_EQ(sum(i32).item<int64_t>(), int64_t{6000000000});
  EXPECT_CLOSE(sum(i32, {-1}), std::vector<double>(3, 2e9), 0, 0);
  // mean of ints -> float32.
  Array m = mean(make_array({1, 2, 3, 4}, {2, 2}, DType::Int32), {0});
  EXPECT_EQ(m.dtype(), DType::Float32);
  EXPECT_CLOSE(m, std::vector<double>({2, 3}), 0, 0);
  EXPECT_EQ(max(make_array({1, 5, 3}, {3}, DType::Int32)).dtype(), DType::Int32);
  EXPECT_EQ(max(make_array({1, 5, 3}, {3}, DType::Int32)).item<int>(), 5);
  EXPECT_EQ(min(make_array({1, -5, 3}, {3}, DType::Int64)).item<int64_t>(), -5);
  // Sum of floats keeps the dtype.
  EXPECT_EQ(sum(random_array({4}, 1, DType::Float16)).dtype(), DType::Float16);
}

TEST(Reduce, EmptyInputs) {
  Array e = zeros({0, 3});
  EXPECT_SHAPE(sum(e, {0}), 3);
  EXPECT_CLOSE(sum(e, {0}), std::vector<double>(3, 0), 0, 0);
  EXPECT_CLOSE(prod(e, {0}), std::vector<double>(3, 1), 0, 0);
  EXPECT_EQ(sum(e).item<float>(), 0.0f);
  // Reducing a non-empty axis of an empty array gives an empty result, not an error.
  EXPECT_SHAPE(max(e, {1}), 0);
  EXPECT_EQ(max(e, {1}).eval().size(), 0);
  // max/min over an empty axis have no identity.
  EXPECT_THROW(max(e, {0}).eval(), ValueError);
  EXPECT_THROW(min(e).eval(), ValueError);
  EXPECT_THROW(argmax(e, 0).eval(), ValueError);
}

TEST(Reduce, LogsumexpIsStable) {
  Array x = make_array({1000, 1000, -1000, 999}, {2, 2}, DType::Float32);
  EXPECT_CLOSE(logsumexp(x, {1}), std::vector<double>({1000 + std::log(2.0), 999}), 1e-6, 0);
  Array y = make_array({-1e4, -1e4}, {2}, DType::Float64);
  EXPECT_NEAR(logsumexp(y).item<double>(), -1e4 + std::log(2.0), 1e-9);
}

TEST(Reduce, MethodsAndLargeSums) {
  const int64_t n = small_tests() ? 5003 : 200003;
  auto v = random_values(n, 31);
  Array x = make_array(v, {n}, DType::Float32);
  double exact = g_sum(round_to(v, DType::Float32));
  EXPECT_NEAR(x.sum().item<double>(), exact, 1e-5 * static_cast<double>(n) * 1e-2 + 1e-3);
  EXPECT_NEAR(x.mean().item<double>(), exact / static_cast<double>(n), 1e-5);
  // Large column sums: [n/7, 7] over axis 0.
  const int64_t rows = n / 7;
  Array m = make_array(std::vector<double>(v.begin(), v.begin() + rows * 7), {rows, 7}, DType::Float64);
  auto vm = values(m);
  EXPECT_CLOSE(sum(m, {0}), ref_reduce(vm, {rows, 7}, {0}, g_sum), 1e-10, 1e-10);
  EXPECT_CLOSE(var(m, {0}), ref_reduce(vm, {rows, 7}, {0}, g_var), 1e-10, 1e-12);
}

TEST(Reduce, BitwiseIdenticalAcrossThreadCounts) {
  const int64_t n = small_tests() ? 70001 : 1000003;
  Array x = random_array({n}, 41, DType::Float32);
  Array m = random_array({n / 1000, 1000}, 42, DType::Float32);
  auto run = [&] {
    std::vector<Array> outs = {sum(x), mean(x), logsumexp(x), var(x), sum(m, {0}), max(m, {1}), sum(m, {1})};
    eval(outs);
    std::vector<std::vector<float>> r;
    for (auto& o : outs) r.push_back(o.to_vector<float>());
    return r;
  };
  int saved = num_threads();
  set_num_threads(1);
  auto r1 = run();
  set_num_threads(2);
  auto r2 = run();
  set_num_threads(saved);
  ASSERT_EQ(r1.size(), r2.size());
  for (size_t i = 0; i < r1.size(); ++i)
    EXPECT_EQ(0, std::memcmp(r1[i].data(), r2[i].data(), r1[i].size() * sizeof(float))) << "output " << i;
}

}  // namespace
}  // namespace tessera::test
