// layer_norm_rows / rms_norm_rows forward and backward vs float64 references: the
// forward formulas, the analytical gradients (dx, dw, db), and central finite
// differences of the float64 forward kernel.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>

#include "backend/cpu/kernels/nn.h"
#include "nn_test_util.h"
#include "tessera/base/error.h"

namespace tessera::cpu {
namespace {

using namespace testing;

constexpr double kEps = 1e-5;

struct NormRef {
  std::vector<double> y, mean, rstd, dx, dw, db;
};

// Float64 reference for both norms (rms: no centering, no bias). w, b empty = absent.
NormRef ref_norm(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b,
                 const std::vector<double>& dy, int64_t rows, int64_t cols, bool rms) {
  NormRef r;
  r.y.resize(x.size());
  r.dx.resize(x.size());
  r.dw.assign(static_cast<size_t>(cols), 0.0);
  r.db.assign(static_cast<size_t>(cols), 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    const double* xr = x.data() + i * cols;
    double mu = 0, var = 0;
    if (!rms) {
      for (int64_t j = 0; j < cols; ++j) mu += xr[j];
      mu /= static_cast<double>(cols);
    }
    for (int64_t j = 0; j < cols; ++j) var += (xr[j] - mu) * (xr[j] - mu);
    var /= static_cast<double>(cols);
    const double rstd = 1.0 / std::sqrt(var + kEps);
    r.mean.push_back(mu);
    r.rstd.push_back(rstd);
    double mean_g = 0, mean_gx = 0;
    for (int64_t j = 0; j < cols; ++j) {
      const double xhat = (xr[j] - mu) * rstd, wj = w.empty() ? 1.0 : w[j], bj = b.empty() ? 0.0 : b[j];
      const double g = dy[i * cols + j] * wj;
      r.y[i * cols + j] = xhat * wj + bj;
      mean_g += g / static_cast<double>(cols);
      mean_gx += g * xhat / static_cast<double>(cols);
      r.dw[j] += dy[i * cols + j] * xhat;
      r.db[j] += dy[i * cols + j];
    }
    if (rms) mean_g = 0;
    for (int64_t j = 0; j < cols; ++j) {
      const double xhat = (xr[j] - mu) * rstd, g = dy[i * cols + j] * (w.empty() ? 1.0 : w[j]);
      r.dx[i * cols + j] = rstd * (g - mean_g - xhat * mean_gx);
    }
  }
  return r;
}

struct Out {
  Buf y, mean, rstd, dx, dw, db;
};

// Runs forward + backward of one norm with the kernels under test.
Out run_norm(DType dt, const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b,
             const std::vector<double>& dy, int64_t rows, int64_t cols, bool rms) {
  const DType st = accumulation_dtype(dt);
  Buf xb(dt, x), wb(dt, w), bb(dt, b), dyb(dt, dy);
  Out o{Buf(dt, rows * cols), Buf(st, rows), Buf(st, rows), Buf(dt, rows * cols), Buf(dt, cols), Buf(dt, cols)};
  const void* wp = w.empty() ? nullptr : wb.data();
  const void* bp = b.empty() ? nullptr : bb.data();
  void* dwp = w.empty() ? nullptr : o.dw.data();
  void* dbp = b.empty() ? nullptr : o.db.data();
  if (rms) {
    rms_norm_rows(dt, xb.data(), wp, o.y.data(), o.rstd.data(), rows, cols, kEps);
    rms_norm_rows_backward(dt, xb.data(), wp, o.rstd.data(), dyb.data(), o.dx.data(), dwp, rows, cols);
  } else {
    layer_norm_rows(dt, xb.data(), wp, bp, o.y.data(), o.mean.data(), o.rstd.data(), rows, cols, kEps);
    layer_norm_rows_backward(dt, xb.data(), wp, o.mean.data(), o.rstd.data(), dyb.data(), o.dx.data(), dwp, dbp, rows,
                             cols);
  }
  return o;
}

struct Size {
  int64_t rows, cols;
};
const Size kSizes[] = {{1, 7}, {3, 33}, {5, 1000}, {67, 129}, {0, 8}};

void check_against_reference(bool rms) {
  for (DType dt : kFloatTypes) {
    for (auto [rows, cols] : kSizes) {
      for (int affine = 0; affine < 3; ++affine) {  // 0: none, 1: weight only, 2: weight and bias
        const size_t n = static_cast<size_t>(rows * cols), c = static_cast<size_t>(cols);
        auto x = rounded(dt, uniform(n, -2, 3, 101 + static_cast<uint32_t>(cols)));
        auto dy = rounded(dt, uniform(n, -1, 1, 102));
        std::vector<double> w, b;
        if (affine >= 1) w = rounded(dt, uniform(c, 0.5, 1.5, 103));
        if (affine == 2 && !rms) b = rounded(dt, uniform(c, -0.5, 0.5, 104));
        SCOPED_TRACE(::testing::Message() << name(dt) << " " << rows << "x" << cols << " affine=" << affine);
        NormRef ref = ref_norm(x, w, b, dy, rows, cols, rms);
        Out o = run_norm(dt, x, w, b, dy, rows, cols, rms);
        const Tol tol = tol_for(dt);
        expect_close(o.y.values(), ref.y, tol, "y");
        expect_close(o.rstd.values(), ref.rstd, tol_for(accumulation_dtype(dt)), "rstd");
        if (!rms) expect_close(o.mean.values(), ref.mean, tol_for(accumulation_dtype(dt)), "mean");
        // Gradients sum many terms: scale the absolute tolerance with sqrt(terms).
        Tol gtol{tol.atol * std::sqrt(static_cast<double>(cols)), tol.rtol};
        expect_close(o.dx.values(), ref.dx, gtol, "dx");
        if (!w.empty()) {
          Tol wtol{tol.atol * std::sqrt(static_cast<double>(rows + 1)), tol.rtol};
          expect_close(o.dw.values(), ref.dw, wtol, "dw");
          if (!b.empty()) expect_close(o.db.values(), ref.db, wtol, "db");
        }
      }
    }
  }
}

TEST(LayerNorm, MatchesReferenceAllDtypes) { check_against_reference(false); }
TEST(RmsNorm, MatchesReferenceAllDtypes) { check_against_reference(true); }

// Backward of the float64 kernels vs central differences of L = sum(dy * y(x, w, b)).
void check_finite_differences(bool rms) {
  const int64_t rows = 3, cols = 6;
  auto x = uniform(rows * cols, -2, 2, 201), dy = uniform(rows * cols, -1, 1, 202);
  auto w = uniform(cols, 0.5, 1.5, 203), b = rms ? std::vector<double>{} : uniform(cols, -1, 1, 204);
  auto loss = [&](const std::vector<double>& xv, const std::vector<double>& wv, const std::vector<double>& bv) {
    Out o = run_norm(DType::Float64, xv, wv, bv, dy, rows, cols, rms);
    double l = 0;
    for (int64_t i = 0; i < rows * cols; ++i) l += dy[static_cast<size_t>(i)] * o.y.get(i);
    return l;
  };
  Out o = run_norm(DType::Float64, x, w, b, dy, rows, cols, rms);
  const double h = 1e-5, tol = 1e-7;
  auto central = [&](std::vector<double>& v, size_t i, auto&& eval) {
    const double saved = v[i];
    v[i] = saved + h;
    const double lp = eval();
    v[i] = saved - h;
    const double lm = eval();
    v[i] = saved;
    return (lp - lm) / (2 * h);
  };
  auto eval = [&] { return loss(x, w, b); };
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_NEAR(o.dx.get(static_cast<int64_t>(i)), central(x, i, eval), tol) << "dx " << i;
  for (size_t j = 0; j < w.size(); ++j)
    EXPECT_NEAR(o.dw.get(static_cast<int64_t>(j)), central(w, j, eval), tol) << "dw " << j;
  for (size_t j = 0; j < b.size(); ++j)
    EXPECT_NEAR(o.db.get(static_cast<int64_t>(j)), central(b, j, eval), tol) << "db " << j;
}

TEST(LayerNorm, BackwardMatchesFiniteDifferences) { check_finite_differences(false); }
TEST(RmsNorm, BackwardMatchesFiniteDifferences) { check_finite_differences(true); }

TEST(LayerNorm, BitwiseIdenticalAcrossThreadCounts) {
  const int64_t rows = 301, cols = 515;
  for (bool rms : {false, true}) {
    for (DType dt : {DType::Float32, DType::BFloat16}) {
      auto x = uniform(rows * cols, -2, 2, 301), dy = uniform(rows * cols, -1, 1, 302);
      auto w = uniform(cols, 0.5, 1.5, 303), b = rms ? std::vector<double>{} : uniform(cols, -1, 1, 304);
      std::optional<Out> o1, o2;
      with_threads(1, [&] { o1.emplace(run_norm(dt, x, w, b, dy, rows, cols, rms)); });
      with_threads(2, [&] { o2.emplace(run_norm(dt, x, w, b, dy, rows, cols, rms)); });
      EXPECT_TRUE(o1->y.bitwise_equal(o2->y));
      EXPECT_TRUE(o1->rstd.bitwise_equal(o2->rstd));
      EXPECT_TRUE(o1->dx.bitwise_equal(o2->dx));
      EXPECT_TRUE(o1->dw.bitwise_equal(o2->dw));
      EXPECT_TRUE(o1->db.bitwise_equal(o2->db));
    }
  }
}

TEST(LayerNorm, RejectsBadInput) {
  Buf x(DType::Float32, 4), y(DType::Float32, 4), s(DType::Float32, 2);
  EXPECT_THROW(layer_norm_rows(DType::Int64, x.data(), nullptr, nullptr, y.data(), s.data(), s.data(), 2, 2, kEps),
               DTypeError);
  EXPECT_THROW(layer_norm_rows(DType::Float32, x.data(), nullptr, nullptr, y.data(), s.data(), s.data(), 2, 0, kEps),
               ValueError);
  EXPECT_THROW(rms_norm_rows_backward(DType::Float32, x.data(), nullptr, nullptr, y.data(), y.data(), nullptr, 2, 2),
               ValueError);
}

}  // namespace
}  // namespace tessera::cpu
