// strided_copy / strided_store vs a naive index-by-index reference: transposes,
// slices with negative and zero strides, broadcasts, empty shapes, every item size.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cpu/kernels/copy.h"
#include "tessera/base/error.h"
#include "tessera/base/thread_pool.h"

namespace tessera::cpu {
namespace {

// Naive: dst[i] = src[offset + sum idx_k * strides_k] for the row-major index i.
template <typename T>
std::vector<T> naive_gather(const std::vector<T>& src, int64_t offset, const Strides& strides, const Shape& shape) {
  int64_t n = numel(shape);
  std::vector<T> out(n);
  Strides cs = contiguous_strides(shape);
  for (int64_t i = 0; i < n; ++i) {
    int64_t off = offset, rem = i;
    for (size_t d = 0; d < shape.size(); ++d) {
      off += (rem / cs[d]) * strides[d];
      rem %= cs[d];
    }
    out[i] = src[off];
  }
  return out;
}

template <typename T>
std::vector<T> iota_buffer(int64_t n) {
  std::vector<T> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<T>(i * 7 + 3);
  return v;
}

struct Case {
  Shape shape;
  Strides strides;
  int64_t offset;
  int64_t src_size;
};

const std::vector<Case> kCases = {
    {{5, 7}, {1, 5}, 0, 35},                    // transpose
    {{70, 45}, {1, 70}, 0, 70 * 45},            // transpose, partial tiles
    {{3, 40, 33}, {1, 99, 3}, 0, 3 * 40 * 33},  // 3-d permutation
    {{2, 3, 4}, {12, 4, 1}, 0, 24},             // contiguous
    {{10}, {-1}, 9, 10},                        // reversed
    {{4, 6}, {-6, -1}, 23, 24},                 // both reversed
    {{4, 6}, {0, 1}, 0, 6},                     // broadcast rows
    {{6, 4}, {1, 0}, 0, 6},                     // broadcast columns
    {{3, 1, 5}, {10, 99, 2}, 1, 30},            // slice with step, size-1 dim
    {{0, 5}, {5, 1}, 0, 1},                     // empty
    {{}, {}, 4, 5},                             // scalar
    {{1, 1}, {0, 0}, 2, 3},                     // broadcast scalar
    {{33, 65}, {-1, 33}, 32, 33 * 65},          // negative-stride transpose
};

template <typename T>
void check_all(DType dtype) {
  for (const Case& c : kCases) {
    auto src = iota_buffer<T>(c.src_size);
    auto want = naive_gather(src, c.offset, c.strides, c.shape);
    std::vector<T> got(std::max<int64_t>(1, numel(c.shape)));
    strided_copy(dtype, src.data(), c.offset, c.strides, c.shape, got.data());
    got.resize(want.size());
    ASSERT_EQ(got, want) << to_string(c.shape);
  }
}

TEST(StridedCopy, MatchesNaiveForEveryItemSize) {
  check_all<uint8_t>(DType::UInt8);
  check_all<uint16_t>(DType::BFloat16);  // copies move bytes: any 16-bit payload works
  check_all<float>(DType::Float32);
  check_all<double>(DType::Float64);
}

TEST(StridedCopy, LargeTransposeAndDeterminism) {
  const int64_t r = 513, c = 1029;
  auto src = iota_buffer<float>(r * c);
  auto want = naive_gather(src, 0, {1, c}, {c, r});
  int saved = num_threads();
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    std::vector<float> got(r * c);
    strided_copy(DType::Float32, src.data(), 0, {1, c}, {c, r}, got.data());
    ASSERT_EQ(got, want);
  }
  set_num_threads(saved);
}

TEST(StridedStore, InverseOfGather) {
  // Write a [4, 6] block into a [10, 9] buffer at (3, 2), transposed and plain.
  for (bool transpose : {false, true}) {
    std::vector<int32_t> dst(90, -1), src = iota_buffer<int32_t>(24);
    Shape shape = transpose ? Shape{6, 4} : Shape{4, 6};
    Strides strides = transpose ? Strides{1, 9} : Strides{9, 1};
    strided_store(DType::Int32, src.data(), shape, dst.data(), 3 * 9 + 2, strides);
    std::vector<int32_t> want(90, -1);
    for (int64_t i = 0; i < shape[0]; ++i)
      for (int64_t j = 0; j < shape[1]; ++j) want[3 * 9 + 2 + i * strides[0] + j * strides[1]] = src[i * shape[1] + j];
    EXPECT_EQ(dst, want);
  }
  std::vector<int64_t> dst(10, 0), src = {1, 2, 3, 4, 5};
  strided_store(DType::Int64, src.data(), {5}, dst.data(), 9, {-2});  // reversed, every other
  EXPECT_EQ(dst, (std::vector<int64_t>{0, 5, 0, 4, 0, 3, 0, 2, 0, 1}));
}

TEST(StridedCopy, RejectsMismatchedRank) {
  float x = 0, y = 0;
  EXPECT_THROW(strided_copy(DType::Float32, &x, 0, {1}, {1, 1}, &y), ShapeError);
}

}  // namespace
}  // namespace tessera::cpu
