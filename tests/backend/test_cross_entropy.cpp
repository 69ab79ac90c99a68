// cross_entropy_rows forward / backward vs float64 references (loss, lse, dlogits),
// central finite differences of the float64 forward, ignore_index and bad targets.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "backend/cpu/kernels/nn.h"
#include "nn_test_util.h"
#include "tessera/base/error.h"

namespace tessera::cpu {
namespace {

using namespace testing;

constexpr int64_t kIgnore = -100;

struct CeRef {
  std::vector<double> loss, lse, dlogits;
};

CeRef ref_ce(const std::vector<double>& x, const std::vector<int64_t>& t, const std::vector<double>& dloss,
             int64_t rows, int64_t vocab) {
  CeRef r;
  r.dlogits.assign(x.size(), 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    const double* xr = x.data() + i * vocab;
    const double m = *std::max_element(xr, xr + vocab);
    double s = 0;
    for (int64_t j = 0; j < vocab; ++j) s += std::exp(xr[j] - m);
    const double lse = m + std::log(s);
    r.lse.push_back(lse);
    const bool ignored = t[i] == kIgnore;
    r.loss.push_back(ignored ? 0.0 : lse - xr[t[i]]);
    if (ignored) continue;
    for (int64_t j = 0; j < vocab; ++j) {
      r.dlogits[i * vocab + j] = dloss[i] * (std::exp(xr[j] - lse) - (j == t[i] ? 1.0 : 0.0));
    }
  }
  return r;
}

std::vector<int64_t> make_targets(int64_t rows, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> pick(0, vocab - 1);
  std::vector<int64_t> t(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) t[i] = (i % 5 == 3) ? kIgnore : pick(rng);  // every 5th row ignored
  return t;
}

struct Size {
  int64_t rows, vocab;
};
const Size kSizes[] = {{1, 1}, {4, 7}, {6, 33}, {5, 1000}, {9, 1031}, {0, 10}};

TEST(CrossEntropy, MatchesReferenceAllDtypes) {
  for (DType dt : kFloatTypes) {
    for (auto [rows, vocab] : kSizes) {
      const DType st = accumulation_dtype(dt);
      auto x = rounded(dt, uniform(static_cast<size_t>(rows * vocab), -8, 8, 401 + static_cast<uint32_t>(vocab)));
      auto t = make_targets(rows, vocab, 402);
      auto dloss = rounded(st, uniform(static_cast<size_t>(rows), 0.1, 2, 403));
      Buf xb(dt, x), loss(st, rows), lse(st, rows), dl(st, dloss), dx(dt, rows * vocab);
      cross_entropy_rows(dt, xb.data(), t.data(), rows, vocab, vocab, kIgnore, loss.data(), lse.data());
      cross_entropy_rows_backward(dt, xb.data(), t.data(), lse.data(), dl.data(), dx.data(), rows, vocab, vocab,
                                  kIgnore);
      SCOPED_TRACE(::testing::Message() << name(dt) << " " << rows << "x" << vocab);
      CeRef ref = ref_ce(x, t, dloss, rows, vocab);
      const Tol stol = tol_for(st);
      expect_close(loss.values(), ref.loss, {stol.atol * 10, stol.rtol}, "loss");
      expect_close(lse.values(), ref.lse, {stol.atol * 10, stol.rtol}, "lse");
      expect_close(dx.values(), ref.dlogits, tol_for(dt), "dlogits");
    }
  }
}

TEST(CrossEntropy, LargeLogitsKeepPrecision) {
  std::vector<double> x = {1000.0, 1001.5, 999.25, 1000.75};
  std::vector<int64_t> t = {2};
  Buf xb(DType::Float32, x), loss(DType::Float32, 1), lse(DType::Float32, 1);
  cross_entropy_rows(DType::Float32, xb.data(), t.data(), 1, 4, 4, kIgnore, loss.data(), lse.data());
  CeRef ref = ref_ce(x, t, {1.0}, 1, 4);
  EXPECT_NEAR(loss.get(0), ref.loss[0], 1e-5);
}

TEST(CrossEntropy, BackwardMatchesFiniteDifferences) {
  const int64_t rows = 4, vocab = 7;
  auto x = uniform(rows * vocab, -3, 3, 411);
  auto t = make_targets(rows, vocab, 412);
  auto dloss = uniform(rows, 0.5, 1.5, 413);
  auto loss_sum = [&](const std::vector<double>& xv) {  // L = sum_r dloss_r * loss_r
    Buf xb(DType::Float64, xv), loss(DType::Float64, rows), lse(DType::Float64, rows);
    cross_entropy_rows(DType::Float64, xb.data(), t.data(), rows, vocab, vocab, kIgnore, loss.data(), lse.data());
    double l = 0;
    for (int64_t i = 0; i < rows; ++i) l += dloss[i] * loss.get(i);
    return l;
  };
  Buf xb(DType::Float64, x), loss(DType::Float64, rows), lse(DType::Float64, rows), dl(DType::Float64, dloss);
  Buf dx(DType::Float64, rows * vocab);
  cross_entropy_rows(DType::Float64, xb.data(), t.data(), rows, vocab, vocab, kIgnore, loss.data(), lse.data());
  cross_entropy_rows_backward(DType::Float64, xb.data(), t.data(), lse.data(), dl.data(), dx.data(), rows, vocab, vocab,
                              kIgnore);
  const double h = 1e-5;
  for (size_t i = 0; i < x.size(); ++i) {
    auto xp = x, xm = x;
    xp[i] += h;
    xm[i] -= h;
    EXPECT_NEAR(dx.get(static_cast<int64_t>(i)), (loss_sum(xp) - loss_sum(xm)) / (2 * h), 1e-8) << i;
  }
}

TEST(CrossEntropy, OutOfRangeTargetNamesRowAndValue) {
  const int64_t rows = 3, vocab = 5;
  Buf xb(DType::Float32, uniform(rows * vocab, -1, 1, 421)), loss(DType::Float32, rows), lse(DType::Float32, rows);
  for (int64_t bad : {int64_t{5}, int64_t{-1}}) {
    std::vector<int64_t> t = {0, bad, 4};
    try {
      cross_entropy_rows(DType::Float32, xb.data(), t.data(), rows, vocab, vocab, kIgnore, loss.data(), lse.data());
      ADD_FAILURE() << "expected ValueError for target " << bad;
    } catch (const ValueError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("row 1"), std::string::npos) << msg;
      EXPECT_NE(msg.find(std::to_string(bad)), std::string::npos) << msg;
      EXPECT_NE(msg.find("vocab size 5"), std::string::npos) << msg;
    }
  }
  // ignore_index itself is accepted anywhere, and yields a zero loss and gradient row.
  std::vector<int64_t> t = {kIgnore, 2, kIgnore};
  Buf dl(DType::Float32, std::vector<double>{1, 1, 1}), dx(DType::Float32, rows * vocab);
  cross_entropy_rows(DType::Float32, xb.data(), t.data(), rows, vocab, vocab, kIgnore, loss.data(), lse.data());
  cross_entropy_rows_backward(DType::Float32, xb.data(), t.data(), lse.data(), dl.data(), dx.data(), rows, vocab, vocab,
                              kIgnore);
  EXPECT_EQ(loss.get(0), 0.0);
  EXPECT_EQ(loss.get(2), 0.0);
  EXPECT_GT(loss.get(1), 0.0);
  for (int64_t j = 0; j < vocab; ++j) EXPECT_EQ(dx.get(2 * vocab + j), 0.0);
}

TEST(CrossEntropy, BitwiseIdenticalAcrossThreadCounts) {
  const int64_t rows = 203, vocab = 1003;
  for (DType dt : {DType::Float32, DType::Float16}) {
    const DType st = accumulation_dtype(dt);
    Buf xb(dt, uniform(rows * vocab, -5, 5, 431));
    auto t = make_targets(rows, vocab, 432);
    Buf dl(st, uniform(rows, 0.5, 1.5, 433));
    Buf l1(st, rows), l2(st, rows), s1(st, rows), s2(st, rows), d1(dt, rows * vocab), d2(dt, rows * vocab);
    with_threads(1, [&] {
      cross_entropy_rows(dt, xb.data(), t.data(), rows, vocab, vocab, kIgnore, l1.data(), s1.data());
      cross_entropy_rows_backward(dt, xb.data(), t.data(), s1.data(), dl.data(), d1.data(), rows, vocab, vocab,
                                  kIgnore);
    });
    with_threads(2, [&] {
      cross_entropy_rows(dt, xb.data(), t.data(), rows, vocab, vocab, kIgnore, l2.data(), s2.data());
      cross_entropy_rows_backward(dt, xb.data(), t.data(), s2.data(), dl.data(), d2.data(), rows, vocab, vocab,
                                  kIgnore);
    });
    EXPECT_TRUE(l1.bitwise_equal(l2));
    EXPECT_TRUE(s1.bitwise_equal(s2));
    EXPECT_TRUE(d1.bitwise_equal(d2));
  }
}

// A padded vocabulary: rows of `stride` logits whose first `classes` are the classes.
// The result equals the unpadded rows' (the padding, filled with large values here,
// never enters the softmax) and the padding's gradient is written as 0.
TEST(CrossEntropy, PaddedRowsMatchTheUnpaddedClasses) {
  for (DType dt : kFloatTypes) {
    const int64_t rows = 5, classes = 1031, stride = 1152;
    const DType st = accumulation_dtype(dt);
    auto x = rounded(dt, uniform(static_cast<size_t>(rows * classes), -8, 8, 441));
    std::vector<double> padded(static_cast<size_t>(rows * stride), 50.0);
    for (int64_t r = 0; r < rows; ++r) std::copy_n(x.begin() + r * classes, classes, padded.begin() + r * stride);
    auto t = make_targets(rows, classes, 442);
    t[3] = kIgnore;
    auto dloss = rounded(st, uniform(static_cast<size_t>(rows), 0.1, 2, 443));
    Buf xb(dt, padded), loss(st, rows), lse(st, rows), dl(st, dloss);
    Buf dx(dt, std::vector<double>(static_cast<size_t>(rows * stride), 7.0));  // poisoned
    cross_entropy_rows(dt, xb.data(), t.data(), rows, stride, classes, kIgnore, loss.data(), lse.data());
    cross_entropy_rows_backward(dt, xb.data(), t.data(), lse.data(), dl.data(), dx.data(), rows, stride, classes,
                                kIgnore);
    SCOPED_TRACE(name(dt));
    CeRef ref = ref_ce(x, t, dloss, rows, classes);
    const Tol stol = tol_for(st);
    expect_close(loss.values(), ref.loss, {stol.atol * 10, stol.rtol}, "loss");
    std::vector<double> got = dx.values(), got_classes;
    for (int64_t r = 0; r < rows; ++r) {
      got_classes.insert(got_classes.end(), got.begin() + r * stride, got.begin() + r * stride + classes);
      for (int64_t j = classes; j < stride; ++j)
        ASSERT_EQ(got[static_cast<size_t>(r * stride + j)], 0.0) << r << "," << j;
    }
    expect_close(got_classes, ref.dlogits, tol_for(dt), "dlogits");
  }
}

TEST(CrossEntropy, MoreClassesThanTheRowHoldsIsAnError) {
  Buf xb(DType::Float32, uniform(8, -1, 1, 451)), loss(DType::Float32, 2), lse(DType::Float32, 2);
  std::vector<int64_t> t = {0, 1};
  EXPECT_THROW(cross_entropy_rows(DType::Float32, xb.data(), t.data(), 2, 4, 5, kIgnore, loss.data(), lse.data()),
               ValueError);
}

}  // namespace
}  // namespace tessera::cpu
