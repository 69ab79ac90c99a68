// The row-copy fast path of strided_copy / strided_store (innermost dim unit-stride on
// both sides after collapsing): inner-contiguous permutations in both loop orders,
// last-axis slices, reversed outer dims, rows longer than one parallel chunk, runs
// below and above one vector move, size-1 and empty dims, every item size, checked
// against a naive index-by-index reference at 1 and 2 threads.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "backend/cpu/kernels/copy.h"
#include "tessera/base/thread_pool.h"

namespace tessera::cpu {
namespace {

// dst[i] = src[offset + sum idx_k * strides_k] for the row-major index i of `shape`.
template <typename T>
std::vector<T> naive_gather(const std::vector<T>& src, int64_t offset, const Strides& strides, const Shape& shape) {
  const int64_t n = numel(shape);
  std::vector<T> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    int64_t off = offset, rem = i;
    for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
      off += (rem % shape[d]) * strides[d];
      rem /= shape[d];
    }
    out[static_cast<size_t>(i)] = src[static_cast<size_t>(off)];
  }
  return out;
}

template <typename T>
std::vector<T> pattern(int64_t n) {
  std::vector<T> v(static_cast<size_t>(n));
  // Distinct low bytes for neighbours, so a shifted or swapped run cannot match.
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<T>(i * 131 + 17);
  return v;
}

// Source strides of the permutation `perm` of a contiguous array of shape `in`.
Strides permuted_strides(const Shape& in, const std::vector<int>& perm, Shape& out_shape) {
  Strides cs = contiguous_strides(in);
  Strides st;
  out_shape.clear();
  for (int p : perm) {
    st.push_back(cs[static_cast<size_t>(p)]);
    out_shape.push_back(in[static_cast<size_t>(p)]);
  }
  return st;
}

struct GatherCase {
  const char* name;
  Shape shape;
  Strides strides;
  int64_t offset;
  int64_t src_size;
};

std::vector<GatherCase> gather_cases() {
  std::vector<GatherCase> cases;
  auto perm = [&](const char* name, const Shape& in, const std::vector<int>& p) {
    Shape out;
    Strides st = permuted_strides(in, p, out);
    cases.push_back({name, out, st, 0, numel(in)});
  };
  perm("split heads", {3, 40, 4, 16}, {0, 2, 1, 3});  // source order is shorter inside
  perm("merge heads", {3, 4, 40, 16}, {0, 2, 1, 3});  // destination order
  perm("equal extents", {2, 5, 5, 9}, {0, 2, 1, 3});  // tie: destination order
  perm("short runs", {2, 7, 3, 2}, {0, 2, 1, 3});     // runs below one vector move
  perm("odd run", {2, 9, 3, 37}, {2, 0, 1, 3});       // run not a multiple of 32 bytes
  perm("3 outer dims", {3, 5, 4, 2, 40}, {3, 1, 0, 2, 4});
  perm("size-1 dims", {1, 6, 1, 5, 33}, {2, 3, 0, 1, 4});
  perm("inner size 1", {4, 6, 1}, {1, 0, 2});  // collapses to a true transpose
  cases.push_back({"last-axis slice", {64, 40}, {120, 1}, 40, 64 * 120});
  cases.push_back({"slice with row step", {9, 50}, {2 * 77, 1}, 3, 18 * 77});
  cases.push_back({"reversed rows", {12, 70}, {-70, 1}, 11 * 70, 12 * 70});
  cases.push_back({"broadcast rows", {5, 3, 48}, {0, 48, 1}, 0, 3 * 48});
  cases.push_back({"long row", {2, 70001}, {70003, 1}, 1, 2 * 70003});  // split across chunks
  cases.push_back({"one long row", {150000}, {1}, 7, 150007});
  cases.push_back({"empty outer", {0, 4, 64}, {256, 64, 1}, 0, 1});
  cases.push_back({"empty inner", {3, 0}, {5, 1}, 0, 1});
  return cases;
}

template <typename T>
void check_gathers(DType dtype) {
  const int saved = num_threads();
  for (const GatherCase& c : gather_cases()) {
    auto src = pattern<T>(c.src_size);
    auto want = naive_gather(src, c.offset, c.strides, c.shape);
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      std::vector<T> got(want.size() + 1, T(0x5a));  // +1 sentinel: nothing written past the end
      strided_copy(dtype, src.data(), c.offset, c.strides, c.shape, got.data());
      EXPECT_EQ(got.back(), T(0x5a)) << c.name;
      got.pop_back();
      ASSERT_EQ(got, want) << c.name << " " << to_string(c.shape) << " threads " << threads;
    }
  }
  set_num_threads(saved);
}

TEST(StridedCopyRows, MatchesNaiveForEveryItemSize) {
  check_gathers<uint8_t>(DType::UInt8);
  check_gathers<uint16_t>(DType::BFloat16);  // copies move bytes: any 16-bit payload works
  check_gathers<float>(DType::Float32);
  check_gathers<double>(DType::Float64);
}

// Concatenate-style stores: a contiguous block written into a wider buffer along the
// last axis, and a head-merge permutation written through destination strides.
template <typename T>
void check_stores(DType dtype) {
  {
    const Shape shape{33, 40};
    const int64_t width = 100, col = 37;
    auto src = pattern<T>(numel(shape));
    std::vector<T> got(static_cast<size_t>(shape[0] * width), T(3)), want = got;
    strided_store(dtype, src.data(), shape, got.data(), col, {width, 1});
    for (int64_t i = 0; i < shape[0]; ++i)
      for (int64_t j = 0; j < shape[1]; ++j)
        want[static_cast<size_t>(i * width + col + j)] = src[static_cast<size_t>(i * shape[1] + j)];
    EXPECT_EQ(got, want);
  }
  {
    // src [2, 3, 10, 24] stored into dst [2, 10, 3, 24].
    const Shape shape{2, 3, 10, 24};
    const Strides dst_strides{720, 24, 72, 1};
    auto src = pattern<T>(numel(shape));
    std::vector<T> got(static_cast<size_t>(numel(shape))), want(got.size());
    strided_store(dtype, src.data(), shape, got.data(), 0, dst_strides);
    int64_t i = 0;
    for (int64_t a = 0; a < 2; ++a)
      for (int64_t b = 0; b < 3; ++b)
        for (int64_t c = 0; c < 10; ++c)
          for (int64_t d = 0; d < 24; ++d)
            want[static_cast<size_t>(a * 720 + b * 24 + c * 72 + d)] = src[static_cast<size_t>(i++)];
    EXPECT_EQ(got, want);
  }
}

TEST(StridedStoreRows, MatchesNaiveForEveryItemSize) {
  check_stores<uint8_t>(DType::UInt8);
  check_stores<uint16_t>(DType::Float16);
  check_stores<float>(DType::Float32);
  check_stores<double>(DType::Float64);
}

}  // namespace
}  // namespace tessera::cpu
