// softmax_rows / log-softmax and their backward vs float64 references: the forward
// formula, the analytical gradient, and central finite differences of the forward.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "backend/cpu/kernels/nn.h"
#include "nn_test_util.h"
#include "tessera/base/error.h"

namespace tessera::cpu {
namespace {

using namespace testing;

std::vector<double> ref_softmax(const std::vector<double>& x, int64_t rows, int64_t cols, bool log) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    const double* xr = x.data() + r * cols;
    double m = *std::max_element(xr, xr + cols), s = 0;
    for (int64_t j = 0; j < cols; ++j) s += std::exp(xr[j] - m);
    for (int64_t j = 0; j < cols; ++j) y[r * cols + j] = log ? xr[j] - m - std::log(s) : std::exp(xr[j] - m) / s;
  }
  return y;
}

// dx = J^T dy with J the softmax (or log-softmax) Jacobian, from the inputs.
std::vector<double> ref_softmax_grad(const std::vector<double>& x, const std::vector<double>& dy, int64_t rows,
                                     int64_t cols, bool log) {
  std::vector<double> p = ref_softmax(x, rows, cols, false), dx(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double s = 0;
    for (int64_t j = 0; j < cols; ++j) s += log ? dy[r * cols + j] : dy[r * cols + j] * p[r * cols + j];
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t i = r * cols + j;
      dx[i] = log ? dy[i] - p[i] * s : p[i] * (dy[i] - s);
    }
  }
  return dx;
}

struct Size {
  int64_t rows, cols;
};
const Size kSizes[] = {{1, 1}, {3, 7}, {5, 33}, {2, 1000}, {3, 1031}, {0, 5}};

TEST(Softmax, ForwardMatchesReferenceAllDtypes) {
  for (DType dt : kFloatTypes) {
    for (auto [rows, cols] : kSizes) {
      for (bool log : {false, true}) {
        auto x = rounded(dt, uniform(static_cast<size_t>(rows * cols), -6, 6, 7 + static_cast<uint32_t>(cols)));
        Buf xb(dt, x), yb(dt, rows * cols);
        softmax_rows(dt, xb.data(), yb.data(), rows, cols, log);
        SCOPED_TRACE(::testing::Message() << name(dt) << " " << rows << "x" << cols << " log=" << log);
        expect_close(yb.values(), ref_softmax(x, rows, cols, log), tol_for(dt), "softmax");
      }
    }
  }
}

TEST(Softmax, LargeLogitsDoNotOverflow) {
  std::vector<double> x = {1000.0, 999.0, -1000.0, 998.0, 1000.0};
  for (DType dt : {DType::Float32, DType::Float64}) {
    Buf xb(dt, x), yb(dt, 5), lb(dt, 5);
    softmax_rows(dt, xb.data(), yb.data(), 1, 5, false);
    softmax_rows(dt, xb.data(), lb.data(), 1, 5, true);
    expect_close(yb.values(), ref_softmax(x, 1, 5, false), tol_for(dt), "softmax");
    expect_close(lb.values(), ref_softmax(x, 1, 5, true), tol_for(dt), "log_softmax");
  }
}

TEST(Softmax, BackwardMatchesAnalyticalGradient) {
  for (DType dt : kFloatTypes) {
    for (auto [rows, cols] : kSizes) {
      for (bool log : {false, true}) {
        const size_t n = static_cast<size_t>(rows * cols);
        auto x = rounded(dt, uniform(n, -3, 3, 11));
        Buf xb(dt, x), yb(dt, rows * cols), dxb(dt, rows * cols);
        Buf dyb(dt, uniform(n, -1, 1, 12));
        softmax_rows(dt, xb.data(), yb.data(), rows, cols, log);
        softmax_rows_backward(dt, yb.data(), dyb.data(), dxb.data(), rows, cols, log);
        SCOPED_TRACE(::testing::Message() << name(dt) << " " << rows << "x" << cols << " log=" << log);
        // Low precision: the saved y is rounded, so the tolerance scales with the gradient size.
        Tol tol = tol_for(dt);
        if (dt == DType::BFloat16 || dt == DType::Float16) tol.atol *= 4;
        expect_close(dxb.values(), ref_softmax_grad(x, dyb.values(), rows, cols, log), tol, "dx");
      }
    }
  }
}

TEST(Softmax, BackwardMatchesFiniteDifferences) {
  const int64_t rows = 3, cols = 9;
  for (bool log : {false, true}) {
    auto x = uniform(rows * cols, -2, 2, 21);
    auto dy = uniform(rows * cols, -1, 1, 22);
    // L(x) = sum(dy * f(x)) with f the float64 forward kernel.
    auto loss = [&](const std::vector<double>& xv) {
      Buf xb(DType::Float64, xv), yb(DType::Float64, rows * cols);
      softmax_rows(DType::Float64, xb.data(), yb.data(), rows, cols, log);
      double l = 0;
      for (int64_t i = 0; i < rows * cols; ++i) l += dy[static_cast<size_t>(i)] * yb.get(i);
      return l;
    };
    Buf xb(DType::Float64, x), yb(DType::Float64, rows * cols), dyb(DType::Float64, dy),
        dxb(DType::Float64, rows * cols);
    softmax_rows(DType::Float64, xb.data(), yb.data(), rows, cols, log);
    softmax_rows_backward(DType::Float64, yb.data(), dyb.data(), dxb.data(), rows, cols, log);
    const double h = 1e-5;
    for (int64_t i = 0; i < rows * cols; ++i) {
      auto xp = x, xm = x;
      xp[static_cast<size_t>(i)] += h;
      xm[static_cast<size_t>(i)] -= h;
      EXPECT_NEAR(dxb.get(i), (loss(xp) - loss(xm)) / (2 * h), 1e-8) << "log=" << log << " i=" << i;
    }
  }
}

TEST(Softmax, BitwiseIdenticalAcrossThreadCounts) {
  const int64_t rows = 257, cols = 515;
  for (DType dt : {DType::Float32, DType::BFloat16}) {
    Buf x(dt, uniform(rows * cols, -5, 5, 31)), dy(dt, uniform(rows * cols, -1, 1, 32));
    Buf y1(dt, rows * cols), y2(dt, rows * cols), d1(dt, rows * cols), d2(dt, rows * cols);
    with_threads(1, [&] {
      softmax_rows(dt, x.data(), y1.data(), rows, cols, false);
      softmax_rows_backward(dt, y1.data(), dy.data(), d1.data(), rows, cols, false);
    });
    with_threads(2, [&] {
      softmax_rows(dt, x.data(), y2.data(), rows, cols, false);
      softmax_rows_backward(dt, y2.data(), dy.data(), d2.data(), rows, cols, false);
    });
    EXPECT_TRUE(y1.bitwise_equal(y2));
    EXPECT_TRUE(d1.bitwise_equal(d2));
  }
}

TEST(Softmax, RejectsBadInput) {
  Buf x(DType::Int32, 4), y(DType::Int32, 4);
  EXPECT_THROW(softmax_rows(DType::Int32, x.data(), y.data(), 2, 2, false), DTypeError);
  Buf xf(DType::Float32, 4), yf(DType::Float32, 4);
  EXPECT_THROW(softmax_rows(DType::Float32, xf.data(), yf.data(), -1, 2, false), ValueError);
}

}  // namespace
}  // namespace tessera::cpu
