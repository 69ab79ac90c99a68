// Helpers for the core tests: random float64 inputs from fixed seeds, a float64
// naive reference toolkit (index helpers, broadcasting, reductions), closeness
// checks with useful messages, and a finite-difference check of vjp.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tessera/tessera.h"

namespace tessera::test {

// TESSERA_TEST_SIZE=small shrinks the big cases (the sanitizer run sets it).
inline bool small_tests() {
  const char* s = std::getenv("TESSERA_TEST_SIZE");
  return s != nullptr && std::string(s) == "small";
}

inline std::string shape_str(const Shape& s) { return to_string(s); }

// ---- random inputs ----
inline std::vector<double> random_values(int64_t n, uint32_t seed, double lo = -1, double hi = 1) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(gen);
  return v;
}

// Values rounded to `dtype` exactly as a stored array of that dtype holds them.
inline std::vector<double> round_to(const std::vector<double>& v, DType dtype) {
  std::vector<unsigned char> buf(v.size() * itemsize(dtype) + 1);
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) store_from_double(dtype, buf.data(), static_cast<int64_t>(i), v[i]);
  for (size_t i = 0; i < v.size(); ++i) out[i] = load_as_double(dtype, buf.data(), static_cast<int64_t>(i));
  return out;
}

// A leaf array of `dtype` holding `v` (converted on the host, so it is a plain leaf).
inline Array make_array(const std::vector<double>& v, const Shape& shape, DType dtype = DType::Float64) {
  if (dtype == DType::Float64) return Array::from_vector<double>(v, shape);
  std::vector<unsigned char> buf(v.size() * itemsize(dtype) + 1);
  for (size_t i = 0; i < v.size(); ++i) store_from_double(dtype, buf.data(), static_cast<int64_t>(i), v[i]);
  return Array::from_data(buf.data(), shape, dtype);
}

inline Array random_array(const Shape& shape, uint32_t seed, DType dtype = DType::Float64, double lo = -1,
                          double hi = 1) {
  return make_array(random_values(numel(shape), seed, lo, hi), shape, dtype);
}

inline std::vector<double> values(const Array& a) { return a.to_vector<double>(); }

inline std::vector<int64_t> random_ints(int64_t n, uint32_t seed, int64_t lo, int64_t hi_inclusive) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int64_t> dist(lo, hi_inclusive);
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(gen);
  return v;
}

// ---- index helpers ----
inline std::vector<int64_t> unravel(int64_t flat, const Shape& shape) {
  std::vector<int64_t> idx(shape.size());
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    idx[d] = shape[d] == 0 ? 0 : flat % shape[d];
    if (shape[d] != 0) flat /= shape[d];
  }
  return idx;
}

inline int64_t ravel(const std::vector<int64_t>& idx, const Shape& shape) {
  int64_t flat = 0;
  for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + idx[d];
  return flat;
}

// Flat index into an array of `in_shape` broadcast to `out_shape` at out index `out_idx`.
inline int64_t broadcast_index(const std::vector<int64_t>& out_idx, const Shape& in_shape, const Shape& out_shape) {
  const size_t off = out_shape.size() - in_shape.size();
  int64_t flat = 0;
  for (size_t d = 0; d < in_shape.size(); ++d) flat = flat * in_shape[d] + (in_shape[d] == 1 ? 0 : out_idx[off + d]);
  return flat;
}

inline Shape ref_broadcast_shape(const Shape& a, const Shape& b) {
  Shape out(std::max(a.size(), b.size()));
  for (size_t i = 0; i < out.size(); ++i) {
    int64_t da = i < out.size() - a.size() ? 1 : a[i - (out.size() - a.size())];
    int64_t db = i < out.size() - b.size() ? 1 : b[i - (out.size() - b.size())];
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// Naive broadcasting binary op in float64.
inline std::vector<double> ref_binary(const std::vector<double>& a, const Shape& sa, const std::vector<double>& b,
                                      const Shape& sb, const std::function<double(double, double)>& fn) {
  Shape so = ref_broadcast_shape(sa, sb);
  int64_t n = numel(so);
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    auto idx = unravel(i, so);
    out[i] = fn(a[broadcast_index(idx, sa, so)], b[broadcast_index(idx, sb, so)]);
  }
  return out;
}

inline std::vector<double> ref_unary(const std::vector<double>& a, const std::function<double(double)>& fn) {
  std::vector<double> out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = fn(a[i]);
  return out;
}

// Output shape of reducing `axes` (already normalized, non-negative; empty = all).
inline Shape ref_reduced_shape(const Shape& s, std::vector<int> axes, bool keepdims) {
  if (axes.empty())
    for (int i = 0; i < static_cast<int>(s.size()); ++i) axes.push_back(i);
  Shape out;
  for (int i = 0; i < static_cast<int>(s.size()); ++i) {
    bool red = std::find(axes.begin(), axes.end(), i) != axes.end();
    if (!red)
      out.push_back(s[i]);
    else if (keepdims)
      out.push_back(1);
  }
  return out;
}

// Naive reduction: each output element gets the list of reduced input values.
inline std::vector<double> ref_reduce(const std::vector<double>& x, const Shape& s, std::vector<int> axes,
                                      const std::function<double(const std::vector<double>&)>& fn) {
  const int nd = static_cast<int>(s.size());
  for (auto& a : axes)
    if (a < 0) a += nd;
  if (axes.empty())
    for (int i = 0; i < nd; ++i) axes.push_back(i);
  Shape kept = ref_reduced_shape(s, axes, true);
  int64_t nout = numel(kept);
  std::vector<std::vector<double>> groups(static_cast<size_t>(nout));
  for (int64_t i = 0; i < numel(s); ++i) {
    auto idx = unravel(i, s);
    for (int a : axes) idx[a] = 0;
    groups[ravel(idx, kept)].push_back(x[i]);
  }
  std::vector<double> out(static_cast<size_t>(nout));
  for (int64_t i = 0; i < nout; ++i) out[i] = fn(groups[i]);
  return out;
}

// Naive transpose: out[idx] = x[perm-permuted idx].
inline std::vector<double> ref_transpose(const std::vector<double>& x, const Shape& s, const std::vector<int>& perm) {
  Shape so(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) so[i] = s[perm[i]];
  std::vector<double> out(x.size());
  for (int64_t i = 0; i < numel(so); ++i) {
    auto oi = unravel(i, so);
    std::vector<int64_t> ii(s.size());
    for (size_t d = 0; d < perm.size(); ++d) ii[perm[d]] = oi[d];
    out[i] = x[ravel(ii, s)];
  }
  return out;
}

// Naive batched matmul on [B, M, K] @ [B, K, N].
inline std::vector<double> ref_matmul(const std::vector<double>& a, const std::vector<double>& b, int64_t B, int64_t M,
                                      int64_t K, int64_t N) {
  std::vector<double> c(static_cast<size_t>(B * M * N), 0.0);
  for (int64_t z = 0; z < B; ++z)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double acc = 0;
        for (int64_t k = 0; k < K; ++k) acc += a[(z * M + i) * K + k] * b[(z * K + k) * N + j];
        c[(z * M + i) * N + j] = acc;
      }
  return c;
}

// ---- closeness ----
// |actual - expected| <= atol + rtol * |expected| elementwise; NaN matches NaN,
// same-signed infinities match. The message lists the first mismatches.
inline ::testing::AssertionResult all_close(const std::vector<double>& actual, const std::vector<double>& expected,
                                            double rtol, double atol) {
  if (actual.size() != expected.size())
    return ::testing::AssertionFailure() << "size mismatch: got " << actual.size() << " elements, expected "
                                         << expected.size();
  std::ostringstream msg;
  int bad = 0;
  double worst = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    double a = actual[i], e = expected[i];
    bool ok;
    if (std::isnan(e))
      ok = std::isnan(a);
    else if (std::isinf(e))
      ok = a == e;
    else
      ok = std::isfinite(a) && std::abs(a - e) <= atol + rtol * std::abs(e);
    if (!ok) {
      if (bad < 8) msg << "\n  [" << i << "] got " << a << ", expected " << e << " (diff " << (a - e) << ")";
      if (std::isfinite(a)) worst = std::max(worst, std::abs(a - e));
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << actual.size() << " elements differ (rtol " << rtol
                                       << ", atol " << atol << ", max abs diff " << worst << "):" << msg.str();
}

inline ::testing::AssertionResult all_close(const Array& actual, const std::vector<double>& expected, double rtol,
                                            double atol) {
  return all_close(actual.to_vector<double>(), expected, rtol, atol);
}

inline ::testing::AssertionResult all_close(const Array& actual, const Array& expected, double rtol, double atol) {
  if (actual.shape() != expected.shape())
    return ::testing::AssertionFailure() << "shape mismatch: got " << to_string(actual.shape()) << ", expected "
                                         << to_string(expected.shape());
  return all_close(actual.to_vector<double>(), expected.to_vector<double>(), rtol, atol);
}

inline void expect_close(const Array& actual, const std::vector<double>& expected, double rtol, double atol,
                         const std::string& what = "") {
  EXPECT_TRUE(all_close(actual, expected, rtol, atol)) << what;
}

#define EXPECT_CLOSE(actual, expected, rtol, atol) \
  EXPECT_TRUE(::tessera::test::all_close((actual), (expected), (rtol), (atol))) << "  for " #actual
#define EXPECT_SHAPE(a, ...) EXPECT_EQ((a).shape(), (::tessera::Shape{__VA_ARGS__})) << "  for " #a

// Tolerance for a result of `dtype` computed from exact float64 reference values.
inline double rtol_for(DType dtype) {
  switch (dtype) {
    case DType::Float64:
      return 1e-12;
    case DType::Float32:
      return 2e-6;
    case DType::BFloat16:
      return 1e-2;
    case DType::Float16:
      return 2e-3;
    default:
      return 0;
  }
}

// ---- finite differences ----
// Sum over outputs of <out_i, ct_i> computed in float64.
inline double weighted_sum(const std::vector<Array>& outs, const std::vector<std::vector<double>>& cts) {
  double acc = 0;
  for (size_t i = 0; i < outs.size(); ++i) {
    if (cts[i].empty()) continue;
    auto v = outs[i].to_vector<double>();
    for (size_t j = 0; j < v.size(); ++j) acc += v[j] * cts[i][j];
  }
  return acc;
}

// Compares vjp(fun) with a random cotangent against central differences
// <f(x+e)-f(x-e), ct> / 2e for every element of every floating input (float64).
// Integer outputs get a zero cotangent. Tolerance: |an - fd| <= tol * max(1, |fd|).
inline ::testing::AssertionResult check_vjp_fd(const ArrayFn& fun, const std::vector<Array>& inputs, double eps = 1e-6,
                                               double tol = 1e-6, uint32_t seed = 1234) {
  std::vector<Array> outs = fun(inputs);
  eval(outs);
  std::vector<Array> cotangents;
  std::vector<std::vector<double>> cts;
  for (size_t i = 0; i < outs.size(); ++i) {
    if (is_floating(outs[i].dtype())) {
      auto c = random_values(outs[i].size(), seed + static_cast<uint32_t>(i));
      cts.push_back(round_to(c, outs[i].dtype()));
      cotangents.push_back(make_array(c, outs[i].shape(), outs[i].dtype()));
    } else {
      cts.emplace_back();
      cotangents.push_back(zeros(outs[i].shape(), outs[i].dtype()));
    }
  }
  auto [vouts, grads] = vjp(fun, inputs, cotangents);
  if (vouts.size() != outs.size())
    return ::testing::AssertionFailure() << "vjp returned " << vouts.size() << " outputs, fun returned " << outs.size();
  for (size_t i = 0; i < outs.size(); ++i) {
    auto r = all_close(vouts[i], outs[i], 1e-12, 1e-12);
    if (!r) return ::testing::AssertionFailure() << "vjp primal output " << i << " differs from fun: " << r.message();
  }
  if (grads.size() != inputs.size())
    return ::testing::AssertionFailure() << "vjp returned " << grads.size() << " cotangents for " << inputs.size()
                                         << " inputs";
  std::ostringstream msg;
  int bad = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!is_floating(inputs[i].dtype())) continue;
    if (grads[i].shape() != inputs[i].shape() || grads[i].dtype() != inputs[i].dtype())
      return ::testing::AssertionFailure()
             << "cotangent " << i << " is " << type_string(grads[i]) << ", input is " << type_string(inputs[i]);
    auto g = grads[i].to_vector<double>();
    auto x = inputs[i].to_vector<double>();
    for (size_t j = 0; j < x.size(); ++j) {
      auto eval_at = [&](double delta) {
        auto xp = x;
        xp[j] += delta;
        std::vector<Array> in2 = inputs;
        in2[i] = make_array(xp, inputs[i].shape(), inputs[i].dtype());
        return weighted_sum(fun(in2), cts);
      };
      double fd = (eval_at(eps) - eval_at(-eps)) / (2 * eps);
      if (!(std::abs(g[j] - fd) <= tol * std::max(1.0, std::abs(fd)))) {
        if (bad < 8)
          msg << "\n  input " << i << " " << type_string(inputs[i]) << " element " << j << ": vjp " << g[j]
              << ", finite difference " << fd;
        ++bad;
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " gradient elements differ from finite differences:" << msg.str();
}

inline ::testing::AssertionResult check_vjp_fd(const std::function<Array(const std::vector<Array>&)>& fun,
                                               const std::vector<Array>& inputs, double eps = 1e-6, double tol = 1e-6) {
  ArrayFn f = [fun](const std::vector<Array>& xs) { return std::vector<Array>{fun(xs)}; };
  return check_vjp_fd(f, inputs, eps, tol);
}

// Numerical gradient of a scalar fun w.r.t. input `arg` (float64 central differences).
inline std::vector<double> fd_grad(const std::function<Array(const std::vector<Array>&)>& fun,
                                   const std::vector<Array>& inputs, size_t arg, double eps = 1e-6) {
  auto x = inputs[arg].to_vector<double>();
  std::vector<double> g(x.size());
  for (size_t j = 0; j < x.size(); ++j) {
    auto at = [&](double d) {
      auto xp = x;
      xp[j] += d;
      auto in2 = inputs;
      in2[arg] = make_array(xp, inputs[arg].shape(), inputs[arg].dtype());
      return fun(in2).item<double>();
    };
    g[j] = (at(eps) - at(-eps)) / (2 * eps);
  }
  return g;
}

// Checks that fn throws E and its message contains every string of `parts`.
template <typename E, typename Fn>
::testing::AssertionResult throws_with(Fn&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
  } catch (const E& e) {
    std::string m = e.what();
    for (const auto& p : parts)
      if (m.find(p) == std::string::npos)
        return ::testing::AssertionFailure() << "message \"" << m << "\" does not contain \"" << p << "\"";
    return ::testing::AssertionSuccess();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw the wrong exception type; message: \"" << e.what() << "\"";
  }
  return ::testing::AssertionFailure() << "did not throw";
}

}  // namespace tessera::test
