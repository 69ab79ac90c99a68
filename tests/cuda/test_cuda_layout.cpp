// The layout kernels on the GPU (backend/cuda/eval_layout.cpp, kernels/copy.h) against
// the CPU backend: transpose (every permutation of rank-3 and rank-4 shapes with odd and
// size-1 dims, so both the tiled and the plain strided kernel run; the attention layouts;
// a rank-9 copy that cannot be merged below 8 dims), broadcast_to, slice with steps,
// slice_pad, concatenate (up to 40 inputs, empty ones among them) and reshape. Copies
// move bits, so every result must equal the CPU's byte for byte, for every element size.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/kernels/copy.h"
#include "backend/cuda/run_on_gpu.h"
#include "cuda/cuda_test_util.h"
#include "tessera/core/ops.h"
#include "tessera/ir/primitives/layout.h"

namespace ts = tessera;
using ts::Array;
using ts::DType;
using ts::Shape;

namespace {

uint64_t next_seed() {
  static uint64_t seed = 7000;
  return ++seed;
}

// Fresh values of any dtype: normal floats, random 64-bit integers wrapped to the
// integer type, random bools.
Array random_array(const Shape& shape, DType dtype) {
  const int64_t n = ts::numel(shape);
  std::vector<unsigned char> bytes(static_cast<size_t>(n) * ts::itemsize(dtype));
  const uint64_t seed = next_seed();
  std::mt19937_64 rng(seed);
  if (ts::is_floating(dtype)) {
    std::vector<float> f = ts::cuda_test::random_floats(static_cast<size_t>(n), seed);
    ts::convert(DType::Float32, f.data(), dtype, bytes.data(), n);
  } else if (dtype == DType::Bool) {
    for (unsigned char& b : bytes) b = static_cast<unsigned char>(rng() & 1);
  } else {
    std::vector<int64_t> v(static_cast<size_t>(n));
    for (int64_t& x : v) x = static_cast<int64_t>(rng());
    ts::convert(DType::Int64, v.data(), dtype, bytes.data(), n);
  }
  return Array::from_data(bytes.data(), shape, dtype);
}

std::string describe(const Shape& shape, DType dtype) { return std::string(ts::name(dtype)) + ts::to_string(shape); }

// Byte equality, reporting the first differing element.
void expect_same_bytes(const Array& gpu, const Array& cpu, const std::string& what) {
  ASSERT_EQ(gpu.shape(), cpu.shape()) << what;
  ASSERT_EQ(gpu.dtype(), cpu.dtype()) << what;
  const size_t n = cpu.nbytes(), item = cpu.itemsize();
  const auto* a = static_cast<const unsigned char*>(gpu.raw_data());
  const auto* b = static_cast<const unsigned char*>(cpu.raw_data());
  for (size_t i = 0; i < n; ++i) {
    if (a[i] != b[i]) {
      ADD_FAILURE() << what << ": element " << i / item << " of " << cpu.size() << " differs";
      return;
    }
  }
}

// Runs y's primitive on the GPU, then y on the CPU; the results must be identical.
void expect_gpu_equals_cpu(const Array& y, const std::string& what) {
  ASSERT_FALSE(y.is_leaf()) << what << ": the op folded away (nothing to run)";
  std::vector<Array> gpu = ts::cuda::run_on_gpu(y);
  y.eval();
  ASSERT_EQ(gpu.size(), 1u) << what;
  expect_same_bytes(gpu[0], y, what);
}

// One dtype per element size (1, 2, 4, 8 bytes) plus bool.
const DType kSizes[] = {DType::Bool, DType::BFloat16, DType::Float32, DType::Int64};
const DType kAllTypes[] = {DType::Bool,  DType::UInt8,   DType::Int8,     DType::UInt32,  DType::Int32,
                           DType::Int64, DType::Float16, DType::BFloat16, DType::Float32, DType::Float64};

std::string perm_text(const std::vector<int>& perm) {
  std::string s = "perm";
  for (int p : perm) s += " " + std::to_string(p);
  return s;
}

void expect_every_permutation(const Shape& shape, DType dtype) {
  Array x = random_array(shape, dtype);
  std::vector<int> perm(shape.size());
  std::iota(perm.begin(), perm.end(), 0);
  int tried = 0;
  while (std::next_permutation(perm.begin(), perm.end())) {  // every order but the identity (a no-op op)
    expect_gpu_equals_cpu(ts::transpose(x, perm), describe(shape, dtype) + " " + perm_text(perm));
    ++tried;
  }
  int expected = 1;
  for (size_t i = 2; i <= shape.size(); ++i) expected *= static_cast<int>(i);
  EXPECT_EQ(tried, expected - 1);
}

}  // namespace

TEST(CudaTranspose, EveryPermutationOfRank3) {
  TESSERA_REQUIRE_GPU();
  // [5, 33, 17]: moving 17 next to 33 tiles (both >= 16), next to 5 does not.
  for (DType dtype : kSizes)
    for (const Shape& shape : {Shape{5, 33, 17}, Shape{40, 1, 48}, Shape{2, 3, 4}})
      expect_every_permutation(shape, dtype);
}

TEST(CudaTranspose, EveryPermutationOfRank4) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : kSizes)
    for (const Shape& shape : {Shape{3, 18, 5, 37}, Shape{2, 1, 33, 20}}) expect_every_permutation(shape, dtype);
}

TEST(CudaTranspose, EveryDtype) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : kAllTypes) {
    Array x = random_array({7, 45, 19}, dtype);
    expect_gpu_equals_cpu(ts::transpose(x, {2, 0, 1}), describe(x.shape(), dtype) + " perm 2 0 1");
    expect_gpu_equals_cpu(ts::transpose(x, {1, 0, 2}), describe(x.shape(), dtype) + " perm 1 0 2");
  }
}

TEST(CudaTranspose, AttentionLayouts) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : {DType::Float32, DType::BFloat16}) {
    // [B, T, H, D] -> [B, H, T, D] and back (contiguous runs of D: 16-byte words), and
    // K^T: [B, H, T, D] -> [B, H, D, T] (the last axis moves: tiles).
    Array x = random_array({8, 256, 12, 64}, dtype);
    expect_gpu_equals_cpu(ts::transpose(x, {0, 2, 1, 3}), describe(x.shape(), dtype) + " BTHD->BHTD");
    Array y = random_array({8, 12, 256, 64}, dtype);
    expect_gpu_equals_cpu(ts::transpose(y, {0, 2, 1, 3}), describe(y.shape(), dtype) + " BHTD->BTHD");
    expect_gpu_equals_cpu(ts::transpose(y, {0, 1, 3, 2}), describe(y.shape(), dtype) + " BHTD->BHDT");
  }
}

TEST(CudaTranspose, LargeMatrices) {
  TESSERA_REQUIRE_GPU();
  expect_gpu_equals_cpu(ts::transpose(random_array({1000, 1030}, DType::Float32)), "f32[1000, 1030]^T");
  expect_gpu_equals_cpu(ts::transpose(random_array({4097, 33}, DType::UInt8)), "u8[4097, 33]^T");
  expect_gpu_equals_cpu(ts::transpose(random_array({769, 2304}, DType::BFloat16)), "bf16[769, 2304]^T");
}

TEST(CudaTranspose, RankNineSplitsOnTheHost) {
  TESSERA_REQUIRE_GPU();
  // Reversing nine dims of 2 leaves nothing to merge: more dims than one launch carries.
  Array x = random_array(Shape(9, 2), DType::Float32);
  expect_gpu_equals_cpu(ts::transpose(x), "f32[2 x 9] reversed");
  Array y = random_array({3, 2, 3, 2, 3, 2, 3, 2, 3, 2}, DType::Int8);
  expect_gpu_equals_cpu(ts::transpose(y, {9, 7, 5, 3, 1, 8, 6, 4, 2, 0}), "i8 rank 10");
}

TEST(CudaBroadcast, ShapesAndDtypes) {
  TESSERA_REQUIRE_GPU();
  const std::vector<std::pair<Shape, Shape>> cases = {{{1, 5, 1}, {4, 5, 7}}, {{7}, {3, 2, 7}},    {{}, {9, 3}},
                                                      {{3, 1}, {3, 1000}},    {{1, 64}, {33, 64}}, {{5}, {5}}};
  for (DType dtype : kAllTypes)
    for (const auto& [from, to] : cases) {
      Array x = random_array(from, dtype);
      Array y = ts::broadcast_to(x, to);
      if (y.is_leaf()) continue;  // same shape: no op
      expect_gpu_equals_cpu(y, describe(from, dtype) + " -> " + ts::to_string(to));
    }
}

TEST(CudaSlice, StepsAndDtypes) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : kAllTypes) {
    Array x = random_array({10, 17, 9}, dtype);
    expect_gpu_equals_cpu(ts::slice(x, {1, 0, 2}, {9, 17, 9}, {2, 3, 1}), describe(x.shape(), dtype) + " stepped");
    expect_gpu_equals_cpu(ts::slice(x, {3, 5, 0}, {4, 16, 9}), describe(x.shape(), dtype) + " contiguous rows");
    expect_gpu_equals_cpu(ts::slice(x, {0, 0, 8}, {10, 17, 9}), describe(x.shape(), dtype) + " last column");
  }
  // Aligned contiguous column blocks (16-byte words) and an empty result.
  Array w = random_array({8, 64}, DType::Float32);
  expect_gpu_equals_cpu(ts::slice(w, {0, 16}, {8, 48}), "f32[8, 64][:, 16:48]");
  expect_gpu_equals_cpu(ts::slice(w, {0, 3}, {8, 3}), "f32[8, 64][:, 3:3]");
}

TEST(CudaSlicePad, ZerosAroundTheSlice) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : kAllTypes) {
    const Shape full{10, 17, 9};
    Array g = random_array({4, 6, 7}, dtype);
    Array y = Array::make(
        full, dtype, std::make_shared<ts::SlicePad>(full, std::vector<int64_t>{1, 0, 2}, std::vector<int64_t>{2, 3, 1}),
        {g});
    expect_gpu_equals_cpu(y, describe(full, dtype) + " slice_pad");
  }
  Array e = random_array({0, 3}, DType::Float32);
  Array z = Array::make(
      {4, 3}, DType::Float32,
      std::make_shared<ts::SlicePad>(Shape{4, 3}, std::vector<int64_t>{2, 0}, std::vector<int64_t>{1, 1}), {e});
  expect_gpu_equals_cpu(z, "slice_pad of an empty slice is zeros");
}

TEST(CudaConcatenate, AxesAndDtypes) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : kAllTypes) {
    std::vector<Array> parts = {random_array({3, 5, 7}, dtype), random_array({3, 1, 7}, dtype),
                                random_array({3, 0, 7}, dtype), random_array({3, 11, 7}, dtype)};
    expect_gpu_equals_cpu(ts::concatenate(parts, 1), describe({3, 17, 7}, dtype) + " axis 1");
    std::vector<Array> rows = {random_array({2, 9}, dtype), random_array({5, 9}, dtype)};
    expect_gpu_equals_cpu(ts::concatenate(rows, 0), describe({7, 9}, dtype) + " axis 0");
    std::vector<Array> cols = {random_array({4, 3}, dtype), random_array({4, 13}, dtype), random_array({4, 1}, dtype)};
    expect_gpu_equals_cpu(ts::concatenate(cols, -1), describe({4, 17}, dtype) + " last axis");
  }
  // Aligned rows (16-byte words): the fused QKV layout.
  std::vector<Array> qkv = {random_array({64, 768}, DType::BFloat16), random_array({64, 768}, DType::BFloat16),
                            random_array({64, 768}, DType::BFloat16)};
  expect_gpu_equals_cpu(ts::concatenate(qkv, 1), "bf16 qkv");
}

TEST(CudaConcatenate, MoreInputsThanOneLaunchCarries) {
  TESSERA_REQUIRE_GPU();
  std::vector<Array> parts;
  for (int i = 0; i < 70; ++i) parts.push_back(random_array({2, i % 4, 5}, DType::Float32));  // 1 in 4 empty
  expect_gpu_equals_cpu(ts::concatenate(parts, 1), "70 inputs along axis 1");
  std::vector<Array> rows;
  for (int i = 0; i < 40; ++i) rows.push_back(random_array({1 + i % 3, 6}, DType::Int32));
  expect_gpu_equals_cpu(ts::concatenate(rows, 0), "40 inputs along axis 0");
}

TEST(CudaReshape, CopiesWhenNotAliased) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : {DType::Bool, DType::BFloat16, DType::Float64}) {
    Array x = random_array({6, 35}, dtype);
    expect_gpu_equals_cpu(ts::reshape(x, {35, 6}), describe(x.shape(), dtype) + " -> [35, 6]");
  }
}

TEST(CudaStridedCopy, GeneralStridesAgainstAHostLoop) {
  TESSERA_REQUIRE_GPU();
  // dst[(c0, c1, c2)] at offset 3 with strides (40, 1, 8) from src at offset 5 with
  // strides (1, 7, 0) (a broadcast dim): the launcher on its own, checked by a host loop.
  const Shape shape{6, 5, 4};
  const ts::Strides src_strides{1, 7, 0}, dst_strides{40, 1, 8};
  std::vector<uint16_t> src(64);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint16_t>(1000 + i);
  std::vector<uint16_t> expected(3 + 5 * 40 + 4 + 3 * 8 + 1, 0xFFFF);  // the last element written is 3 + 200 + 4 + 24
  for (int64_t a = 0; a < 6; ++a)
    for (int64_t b = 0; b < 5; ++b)
      for (int64_t c = 0; c < 4; ++c) expected[3 + a * 40 + b + c * 8] = src[5 + a + b * 7];
  ts::cuda_test::DeviceBuffer<uint16_t> d_src(src), d_dst(expected.size());
  d_dst.poison();
  ts::cuda::strided_copy(2, shape, d_src.get(), 5, src_strides, d_dst.get(), 3, dst_strides, nullptr);
  EXPECT_EQ(d_dst.download(), expected);
}
