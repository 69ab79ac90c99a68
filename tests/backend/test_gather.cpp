// gather / scatter_add / gather_along / scatter_add_along on [outer, axis_len, inner]
// views vs naive loops: negative indices, duplicates (accumulated in index order),
// every dtype, out-of-range errors, and thread-count independence.
#include <gtest/gtest.h>

#include <string>

#include "backend/cpu/kernels/gather.h"
#include "nn_test_util.h"
#include "tessera/base/error.h"

namespace tessera::cpu {
namespace {

using namespace testing;

const DType kAllTypes[] = {DType::Float64, DType::Float32, DType::BFloat16, DType::Float16, DType::Int64,
                           DType::Int32,   DType::UInt32,  DType::Int8,     DType::UInt8};

std::vector<int64_t> random_indices(int64_t n, int64_t axis_len, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> pick(-axis_len, axis_len - 1);  // negatives count from the end
  std::vector<int64_t> idx(static_cast<size_t>(n));
  for (auto& i : idx) i = pick(rng);
  return idx;
}

// Small integers: exact in every dtype, so sums are comparable exactly.
std::vector<double> small_values(int64_t n, uint32_t seed) {
  auto v = uniform(static_cast<size_t>(n), 0, 8, seed);
  for (auto& e : v) e = std::floor(e);
  return v;
}

struct Dims {
  int64_t outer, axis_len, inner, n_idx;
};
const Dims kDims[] = {{1, 1, 1, 1}, {2, 7, 3, 11}, {3, 33, 1, 40}, {1, 50, 1030, 17}, {4, 5, 0, 3}, {2, 6, 4, 0}};

TEST(Gather, GatherAndScatterAddMatchNaiveLoops) {
  for (DType dt : kAllTypes) {
    for (auto [outer, axis_len, inner, n_idx] : kDims) {
      SCOPED_TRACE(::testing::Message() << name(dt) << " " << outer << "x" << axis_len << "x" << inner
                                        << " n=" << n_idx);
      auto idx = random_indices(n_idx, axis_len, 601);
      auto x = small_values(outer * axis_len * inner, 602);
      Buf xb(dt, x), out(dt, outer * n_idx * inner);
      gather(dt, xb.data(), outer, axis_len, inner, idx.data(), n_idx, out.data());
      auto upd = small_values(outer * n_idx * inner, 603);
      Buf ub(dt, upd), acc(dt, x);  // scatter into a copy of x
      scatter_add(dt, ub.data(), outer, axis_len, inner, idx.data(), n_idx, acc.data());
      std::vector<double> want_acc = x;
      for (int64_t o = 0; o < outer; ++o) {
        for (int64_t i = 0; i < n_idx; ++i) {
          const int64_t src = idx[i] < 0 ? idx[i] + axis_len : idx[i];
          for (int64_t r = 0; r < inner; ++r) {
            ASSERT_EQ(out.get((o * n_idx + i) * inner + r), x[(o * axis_len + src) * inner + r]);
            want_acc[(o * axis_len + src) * inner + r] += upd[(o * n_idx + i) * inner + r];
          }
        }
      }
      Buf want(dt, want_acc);  // wraps / rounds like the kernel for exact small sums
      for (int64_t i = 0; i < acc.size(); ++i) ASSERT_EQ(acc.get(i), want.get(i)) << i;
    }
  }
}

TEST(Gather, AlongAxisMatchesNaiveLoops) {
  for (DType dt : kAllTypes) {
    for (auto [outer, axis_len, inner, n_idx] : kDims) {
      SCOPED_TRACE(::testing::Message() << name(dt) << " " << outer << "x" << axis_len << "x" << inner
                                        << " n=" << n_idx);
      const int64_t count = outer * n_idx * inner;
      auto idx = random_indices(count, axis_len, 611);
      auto x = small_values(outer * axis_len * inner, 612);
      auto upd = small_values(count, 613);
      Buf xb(dt, x), out(dt, count), ub(dt, upd), acc(dt, x);
      gather_along(dt, xb.data(), outer, axis_len, inner, idx.data(), n_idx, out.data());
      scatter_add_along(dt, ub.data(), outer, axis_len, inner, idx.data(), n_idx, acc.data());
      std::vector<double> want_acc = x;
      for (int64_t o = 0; o < outer; ++o) {
        for (int64_t j = 0; j < n_idx; ++j) {
          for (int64_t r = 0; r < inner; ++r) {
            const int64_t p = (o * n_idx + j) * inner + r;
            const int64_t src = idx[p] < 0 ? idx[p] + axis_len : idx[p];
            ASSERT_EQ(out.get(p), x[(o * axis_len + src) * inner + r]);
            want_acc[(o * axis_len + src) * inner + r] += upd[p];
          }
        }
      }
      Buf want(dt, want_acc);
      for (int64_t i = 0; i < acc.size(); ++i) ASSERT_EQ(acc.get(i), want.get(i)) << i;
    }
  }
}

TEST(Gather, ScatterAddAccumulatesDuplicatesInIndexOrder) {
  // Float32 sums are order dependent: in index order each +4 ties back to 1e8 and the
  // result is 0; summing the 4s first gives 16.
  std::vector<int64_t> idx = {0, 0, 0, 0, 0};
  Buf upd(DType::Float32, std::vector<double>{1e8, 4, 4, 4, -1e8}), out(DType::Float32, 1);
  out.set(0, 0);
  scatter_add(DType::Float32, upd.data(), 1, 1, 1, idx.data(), 5, out.data());
  const float in_order = (((1e8f + 4.0f) + 4.0f) + 4.0f) - 1e8f;
  const float fours_first = ((4.0f + 4.0f) + 4.0f + 1e8f) - 1e8f;
  ASSERT_NE(in_order, fours_first);  // the example does discriminate orders
  EXPECT_EQ(out.get(0), in_order);
}

TEST(Gather, BitwiseIdenticalAcrossThreadCounts) {
  const int64_t outer = 3, axis_len = 97, inner = 600, n_idx = 200;
  auto idx = random_indices(n_idx, axis_len, 621);
  auto idx_along = random_indices(outer * n_idx * inner, axis_len, 622);
  for (DType dt : {DType::Float32, DType::BFloat16}) {
    Buf upd(dt, uniform(static_cast<size_t>(outer * n_idx * inner), -1, 1, 623));
    Buf base(dt, uniform(static_cast<size_t>(outer * axis_len * inner), -1, 1, 624));
    Buf a1 = base, a2 = base, b1 = base, b2 = base;
    with_threads(1, [&] {
      scatter_add(dt, upd.data(), outer, axis_len, inner, idx.data(), n_idx, a1.data());
      scatter_add_along(dt, upd.data(), outer, axis_len, inner, idx_along.data(), n_idx, b1.data());
    });
    with_threads(2, [&] {
      scatter_add(dt, upd.data(), outer, axis_len, inner, idx.data(), n_idx, a2.data());
      scatter_add_along(dt, upd.data(), outer, axis_len, inner, idx_along.data(), n_idx, b2.data());
    });
    EXPECT_TRUE(a1.bitwise_equal(a2));
    EXPECT_TRUE(b1.bitwise_equal(b2));
  }
}

TEST(Gather, OutOfRangeIndexThrowsWithPositionAndValue) {
  Buf x(DType::Float32, 2 * 4 * 3), out(DType::Float32, 2 * 3 * 3);
  std::vector<int64_t> idx = {1, 4, 0};
  try {
    gather(DType::Float32, x.data(), 2, 4, 3, idx.data(), 3, out.data());
    ADD_FAILURE() << "expected ValueError";
  } catch (const ValueError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("position 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("got 4"), std::string::npos) << msg;
  }
  idx = {-5, 0, 0};
  EXPECT_THROW(scatter_add(DType::Float32, out.data(), 2, 4, 3, idx.data(), 3, x.data()), ValueError);
  std::vector<int64_t> along(2 * 3 * 3, 0);
  along[7] = 9;
  EXPECT_THROW(gather_along(DType::Float32, x.data(), 2, 4, 3, along.data(), 3, out.data()), ValueError);
  EXPECT_THROW(scatter_add_along(DType::Float32, out.data(), 2, 4, 3, along.data(), 3, x.data()), ValueError);
}

}  // namespace
}  // namespace tessera::cpu
