// The gathers and scatter-adds on the GPU (backend/cuda/eval_indexing.cpp,
// kernels/gather.h) against the CPU backend: take (the GPT embedding lookup and other
// axes), its gradient scatter_add (deterministic: duplicates summed in position order;
// bitwise the CPU's for float32, float64 and integers, within rounding for 16-bit
// floats), take_along_axis and its scatter-add, every dtype, negative indices, int32
// indices, and what happens to out-of-range indices (the CPU throws; the GPU writes NaN
// or drops the update).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/kernels/gather.h"
#include "backend/cuda/run_on_gpu.h"
#include "cuda/cuda_test_util.h"
#include "tessera/core/ops.h"
#include "tessera/ir/primitives/indexing.h"

namespace ts = tessera;
using ts::Array;
using ts::DType;
using ts::Shape;
using ts::cuda_test::rel_error;

namespace {

uint64_t next_seed() {
  static uint64_t seed = 8000;
  return ++seed;
}

// Fresh values of any dtype (normal floats, wrapped random integers, random bools).
Array random_array(const Shape& shape, DType dtype, float scale = 1.0f) {
  const int64_t n = ts::numel(shape);
  std::vector<unsigned char> bytes(static_cast<size_t>(n) * ts::itemsize(dtype));
  const uint64_t seed = next_seed();
  std::mt19937_64 rng(seed);
  if (ts::is_floating(dtype)) {
    std::vector<float> f = ts::cuda_test::random_floats(static_cast<size_t>(n), seed, scale);
    ts::convert(DType::Float32, f.data(), dtype, bytes.data(), n);
  } else if (dtype == DType::Bool) {
    for (unsigned char& b : bytes) b = static_cast<unsigned char>(rng() & 1);
  } else {
    std::vector<int64_t> v(static_cast<size_t>(n));
    for (int64_t& x : v) x = static_cast<int64_t>(rng() % 1000) - 500;
    ts::convert(DType::Int64, v.data(), dtype, bytes.data(), n);
  }
  return Array::from_data(bytes.data(), shape, dtype);
}

// int64 indices uniform in [lo, hi).
std::vector<int64_t> random_ids(int64_t n, int64_t lo, int64_t hi) {
  std::mt19937_64 rng(next_seed());
  std::uniform_int_distribution<int64_t> dist(lo, hi - 1);
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t& x : v) x = dist(rng);
  return v;
}

Array index_array(const std::vector<int64_t>& ids, const Shape& shape) { return Array::from_vector(ids, shape); }

std::string describe(const Shape& shape, DType dtype) { return std::string(ts::name(dtype)) + ts::to_string(shape); }

bool is_half(DType d) { return d == DType::BFloat16 || d == DType::Float16; }

void expect_same_bytes(const Array& gpu, const Array& cpu, const std::string& what) {
  ASSERT_EQ(gpu.shape(), cpu.shape()) << what;
  ASSERT_EQ(gpu.dtype(), cpu.dtype()) << what;
  const size_t n = cpu.nbytes(), item = cpu.itemsize();
  const auto* a = static_cast<const unsigned char*>(gpu.raw_data());
  const auto* b = static_cast<const unsigned char*>(cpu.raw_data());
  for (size_t i = 0; i < n; ++i) {
    if (a[i] != b[i]) {
      ADD_FAILURE() << what << ": element " << i / item << " of " << cpu.size() << " differs (gpu "
                    << gpu.to_vector<double>()[i / item] << ", cpu " << cpu.to_vector<double>()[i / item] << ")";
      return;
    }
  }
}

// GPU result of y's primitive (one output), then y on the CPU.
Array gpu_then_cpu(const Array& y) {
  std::vector<Array> gpu = ts::cuda::run_on_gpu(y);
  y.eval();
  EXPECT_EQ(gpu.size(), 1u);
  return gpu.at(0);
}

void expect_gpu_equals_cpu(const Array& y, const std::string& what) { expect_same_bytes(gpu_then_cpu(y), y, what); }

const DType kAllTypes[] = {DType::Bool,  DType::UInt8,   DType::Int8,     DType::UInt32,  DType::Int32,
                           DType::Int64, DType::Float16, DType::BFloat16, DType::Float32, DType::Float64};

Array scatter_add(const Array& ids, const Array& updates, const Shape& shape, int axis) {
  return Array::make(shape, updates.dtype(), std::make_shared<ts::TakeScatterAdd>(shape, axis), {ids, updates});
}

Array scatter_add_along(const Array& ids, const Array& updates, const Shape& shape, int axis) {
  return Array::make(shape, updates.dtype(), std::make_shared<ts::TakeAlongScatterAdd>(shape, axis), {ids, updates});
}

}  // namespace

TEST(CudaTake, EmbeddingLookup) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : kAllTypes) {
    // Repeated and negative ids; rows of 67 elements (not a multiple of any word).
    Array table = random_array({1000, 67}, dtype);
    Array ids = index_array(random_ids(4 * 33, -1000, 1000), {4, 33});
    expect_gpu_equals_cpu(ts::take(table, ids, 0), describe({4, 33, 67}, dtype) + " embedding");
  }
  for (DType dtype : {DType::Float32, DType::BFloat16}) {
    Array table = random_array({5000, 768}, dtype);
    Array ids = index_array(random_ids(8 * 256, 0, 5000), {8, 256});
    expect_gpu_equals_cpu(ts::take(table, ids, 0), describe({8, 256, 768}, dtype) + " GPT-sized embedding");
  }
}

TEST(CudaTake, OtherAxes) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : kAllTypes) {
    Array x = random_array({5, 7, 9}, dtype);
    expect_gpu_equals_cpu(ts::take(x, index_array(random_ids(12, -7, 7), {4, 3}), 1),
                          describe(x.shape(), dtype) + " axis 1");
    expect_gpu_equals_cpu(ts::take(x, index_array(random_ids(6, -9, 9), {6}), 2),
                          describe(x.shape(), dtype) + " axis 2");
    expect_gpu_equals_cpu(ts::take(x, index_array({3}, {}), 0), describe(x.shape(), dtype) + " scalar index");
  }
}

TEST(CudaTake, Int32IdsAndOutOfRangeIds) {
  TESSERA_REQUIRE_GPU();
  // The launcher directly: int32 ids, and ids the CPU would reject (rows of NaN on the GPU).
  const int64_t vocab = 10, dim = 5;
  std::vector<float> table = ts::cuda_test::random_floats(vocab * dim, next_seed());
  const std::vector<int32_t> ids = {3, -1, 10, -11, 0, 9};
  ts::cuda_test::DeviceBuffer<float> d_table(table), d_out(ids.size() * dim);
  ts::cuda_test::DeviceBuffer<int32_t> d_ids(ids);
  d_out.poison();
  ts::cuda::gather(DType::Float32, d_table.get(), 1, vocab, dim, d_ids.get(), DType::Int32,
                   static_cast<int64_t>(ids.size()), d_out.get(), nullptr);
  const std::vector<float> out = d_out.download();
  const int64_t rows[] = {3, 9, -1, -1, 0, 9};
  for (size_t i = 0; i < ids.size(); ++i)
    for (int64_t c = 0; c < dim; ++c) {
      const float got = out[i * dim + c];
      if (rows[i] < 0) {
        EXPECT_TRUE(std::isnan(got)) << "id " << ids[i] << " is out of range: expected NaN, got " << got;
      } else {
        EXPECT_EQ(got, table[rows[i] * dim + c]) << "id " << ids[i] << " column " << c;
      }
    }
  // Integer tables get zeros for out-of-range ids.
  std::vector<int32_t> itable(vocab * dim);
  for (size_t i = 0; i < itable.size(); ++i) itable[i] = static_cast<int32_t>(i + 1);
  ts::cuda_test::DeviceBuffer<int32_t> d_itable(itable), d_iout(ids.size() * dim);
  d_iout.poison();
  ts::cuda::gather(DType::Int32, d_itable.get(), 1, vocab, dim, d_ids.get(), DType::Int32,
                   static_cast<int64_t>(ids.size()), d_iout.get(), nullptr);
  const std::vector<int32_t> iout = d_iout.download();
  for (size_t i = 0; i < ids.size(); ++i)
    for (int64_t c = 0; c < dim; ++c)
      EXPECT_EQ(iout[i * dim + c], rows[i] < 0 ? 0 : itable[rows[i] * dim + c]) << "id " << ids[i];
}

TEST(CudaScatterAdd, EmbeddingGradientSumsDuplicates) {
  TESSERA_REQUIRE_GPU();
  // 500 ids over a vocabulary of 50 (about 10 of each, negatives too): every row sums
  // duplicates. Exact types must match the CPU bitwise (same order, same arithmetic).
  const int64_t vocab = 50, dim = 67;
  for (DType dtype : kAllTypes) {
    Array ids = index_array(random_ids(500, -vocab, vocab), {20, 25});
    Array upd = random_array({20, 25, dim}, dtype);
    Array y = scatter_add(ids, upd, {vocab, dim}, 0);
    const std::string what = describe({vocab, dim}, dtype) + " scatter_add";
    if (!is_half(dtype)) {
      expect_gpu_equals_cpu(y, what);
      continue;
    }
    // 16-bit floats: the GPU sums in float32 and rounds once, the CPU rounds after every
    // addition. Both against the float32 sum of the same values.
    Array gpu = gpu_then_cpu(y);
    Array ref = scatter_add(ids, ts::astype(upd, DType::Float32), {vocab, dim}, 0);
    ref.eval();
    EXPECT_LT(rel_error(gpu.to_vector<float>(), ref.to_vector<float>()), 4e-3) << what << " vs float32 sum";
    EXPECT_LT(rel_error(gpu.to_vector<float>(), y.to_vector<float>()), ts::cuda_test::kBf16Tolerance) << what;
  }
}

TEST(CudaScatterAdd, GptSizedAndLongRuns) {
  TESSERA_REQUIRE_GPU();
  const int64_t vocab = 5000, dim = 768;
  std::vector<int64_t> ids = random_ids(8 * 256, 0, 300);  // heavy duplication
  for (size_t i = 0; i < 1000; ++i) ids[i * 2] = 4999;     // one id 1000 times (a long run)
  Array id_array = index_array(ids, {8, 256});
  for (DType dtype : {DType::Float32, DType::BFloat16}) {
    Array upd = random_array({8, 256, dim}, dtype, 0.1f);
    Array y = scatter_add(id_array, upd, {vocab, dim}, 0);
    Array gpu = ts::cuda::run_on_gpu(y).at(0);
    Array again = ts::cuda::run_on_gpu(y).at(0);
    y.eval();
    if (dtype == DType::Float32) {
      expect_same_bytes(gpu, y, "f32 GPT-sized scatter_add");
    } else {
      // The CPU adds in bf16 (rounding after each of up to 1000 duplicates: 2.5e-2 from
      // the float32 sum, measured on an H100); the GPU sums in float32 and rounds once.
      Array ref = scatter_add(id_array, ts::astype(upd, DType::Float32), {vocab, dim}, 0);
      ref.eval();
      EXPECT_LT(rel_error(gpu.to_vector<float>(), ref.to_vector<float>()), 4e-3) << "bf16 vs the float32 sum";
    }
    // Deterministic: a second run gives the same bytes.
    EXPECT_EQ(std::memcmp(gpu.raw_data(), again.raw_data(), gpu.nbytes()), 0) << describe({vocab, dim}, dtype);
  }
}

TEST(CudaScatterAdd, InnerAxis) {
  TESSERA_REQUIRE_GPU();
  // outer > 1: the gradient of take along axis 1.
  for (DType dtype : {DType::Float32, DType::Float64, DType::Int32}) {
    Array ids = index_array(random_ids(37, -11, 11), {37});
    Array upd = random_array({3, 37, 5}, dtype);
    expect_gpu_equals_cpu(scatter_add(ids, upd, {3, 11, 5}, 1), describe({3, 11, 5}, dtype) + " axis 1");
    Array ids2 = index_array(random_ids(6, 0, 4), {2, 3});
    Array upd2 = random_array({7, 2, 3}, dtype);
    expect_gpu_equals_cpu(scatter_add(ids2, upd2, {7, 4}, 1), describe({7, 4}, dtype) + " last axis");
  }
}

TEST(CudaScatterAdd, OutOfRangeIdsAreDropped) {
  TESSERA_REQUIRE_GPU();
  const int64_t vocab = 6, dim = 3;
  const std::vector<int64_t> ids = {2, 6, -1, 2, -7, 100, 0};
  std::vector<float> upd(ids.size() * dim);
  for (size_t i = 0; i < upd.size(); ++i) upd[i] = static_cast<float>(i + 1);
  std::vector<float> expected(vocab * dim, 0.0f);
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t row = ids[i] < 0 ? ids[i] + vocab : ids[i];
    if (row < 0 || row >= vocab) continue;
    for (int64_t c = 0; c < dim; ++c) expected[row * dim + c] += upd[i * dim + c];
  }
  const size_t scratch_bytes = ts::cuda::scatter_add_scratch_bytes(static_cast<int64_t>(ids.size()), vocab);
  ts::cuda_test::DeviceBuffer<float> d_upd(upd), d_out(vocab * dim);
  ts::cuda_test::DeviceBuffer<int64_t> d_ids(ids);
  ts::cuda_test::DeviceBuffer<unsigned char> d_scratch(scratch_bytes);
  d_out.poison();
  ts::cuda::scatter_add(DType::Float32, d_upd.get(), 1, vocab, dim, d_ids.get(), DType::Int64,
                        static_cast<int64_t>(ids.size()), d_out.get(), d_scratch.get(), scratch_bytes, nullptr);
  EXPECT_EQ(d_out.download(), expected);
}

TEST(CudaTakeAlong, AxesAndDtypes) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : kAllTypes) {
    Array x = random_array({6, 10, 7}, dtype);
    expect_gpu_equals_cpu(ts::take_along_axis(x, index_array(random_ids(6 * 4 * 7, -10, 10), {6, 4, 7}), 1),
                          describe(x.shape(), dtype) + " axis 1");
    expect_gpu_equals_cpu(ts::take_along_axis(x, index_array(random_ids(3 * 10 * 7, -6, 6), {3, 10, 7}), 0),
                          describe(x.shape(), dtype) + " axis 0");
    expect_gpu_equals_cpu(ts::take_along_axis(x, index_array(random_ids(6 * 10 * 2, -7, 7), {6, 10, 2}), 2),
                          describe(x.shape(), dtype) + " axis 2");
  }
  // The cross-entropy pattern: one target per row of a wide row.
  Array logits = random_array({33, 50257}, DType::BFloat16);
  expect_gpu_equals_cpu(ts::take_along_axis(logits, index_array(random_ids(33, 0, 50257), {33, 1}), 1),
                        "bf16 logits at targets");
}

TEST(CudaScatterAddAlong, AxesAndDtypes) {
  TESSERA_REQUIRE_GPU();
  // One thread per column adds in index order in the element type: bitwise the CPU's.
  for (DType dtype : kAllTypes) {
    const Shape full{6, 10, 7};
    Array ids1 = index_array(random_ids(6 * 25 * 7, -10, 10), {6, 25, 7});
    expect_gpu_equals_cpu(scatter_add_along(ids1, random_array({6, 25, 7}, dtype), full, 1),
                          describe(full, dtype) + " axis 1");
    Array ids0 = index_array(random_ids(9 * 10 * 7, -6, 6), {9, 10, 7});
    expect_gpu_equals_cpu(scatter_add_along(ids0, random_array({9, 10, 7}, dtype), full, 0),
                          describe(full, dtype) + " axis 0");
    Array ids2 = index_array(random_ids(6 * 10 * 3, -7, 7), {6, 10, 3});
    expect_gpu_equals_cpu(scatter_add_along(ids2, random_array({6, 10, 3}, dtype), full, 2),
                          describe(full, dtype) + " axis 2");
  }
}
