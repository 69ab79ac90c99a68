// Philox random numbers on the GPU (backend/cuda/eval_random.cpp, kernels/random.h)
// against the CPU: element i of a stream is a pure function of (key, i), so the GPU
// must produce the CPU's values. Bits, split keys, uniform (every float dtype, bounds
// that need clamping) and bernoulli are compared bit for bit over many sizes (1, 2, 3,
// 4, 5 and odd thousands: the tails of 4-word Philox blocks); normal goes through log,
// sin and cos, which the CPU takes from glibc and the GPU from CUDA's double functions:
// the last float32 bit may differ, so float32 is compared at 1e-6 relative (most
// elements are still bitwise equal).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/kernels/random.h"
#include "backend/cuda/kernels/random.h"
#include "backend/cuda/run_on_gpu.h"
#include "cuda/cuda_test_util.h"
#include "tessera/core/ops.h"
#include "tessera/core/random.h"

namespace ts = tessera;
using ts::Array;
using ts::DType;
using ts::Shape;
using ts::cuda_test::rel_error;

namespace {

uint64_t next_seed() {
  static uint64_t seed = 0x5EED0000;
  return seed += 0x9E3779B97F4A7C15ull;
}

const int64_t kSizes[] = {1, 2, 3, 4, 5, 8, 17, 1000, 4099, 100003};
const DType kFloatTypes[] = {DType::Float32, DType::BFloat16, DType::Float16, DType::Float64};

// Bytes equal; returns how many elements differ (reported once).
size_t count_differing(const Array& gpu, const Array& cpu) {
  const size_t n = cpu.nbytes(), item = cpu.itemsize();
  const auto* a = static_cast<const unsigned char*>(gpu.raw_data());
  const auto* b = static_cast<const unsigned char*>(cpu.raw_data());
  size_t differing = 0;
  for (size_t i = 0; i < n; i += item) differing += std::memcmp(a + i, b + i, item) != 0;
  return differing;
}

void expect_gpu_equals_cpu(const Array& y, const std::string& what) {
  std::vector<Array> gpu = ts::cuda::run_on_gpu(y);
  y.eval();
  ASSERT_EQ(gpu.size(), 1u) << what;
  ASSERT_EQ(gpu[0].shape(), y.shape()) << what;
  ASSERT_EQ(gpu[0].dtype(), y.dtype()) << what;
  EXPECT_EQ(count_differing(gpu[0], y), 0u) << what << ": elements differ";
}

struct HostKey {
  ts::cpu::PhiloxKey key;
  std::vector<uint32_t> words;
};
HostKey host_key() {
  const uint64_t seed = next_seed();
  const uint32_t k0 = static_cast<uint32_t>(seed >> 32), k1 = static_cast<uint32_t>(seed);
  return {{k0, k1}, {k0, k1}};
}

}  // namespace

TEST(CudaRandom, BitsMatchCpuBitwise) {
  TESSERA_REQUIRE_GPU();
  for (int64_t n : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{4}, int64_t{5}, int64_t{1000}, int64_t{65537},
                    int64_t{(1 << 20) + 3}}) {
    HostKey k = host_key();
    std::vector<uint32_t> cpu(static_cast<size_t>(n));
    ts::cpu::random_bits(k.key, cpu.data(), n);
    ts::cuda_test::DeviceBuffer<uint32_t> d_key(k.words), d_out(static_cast<size_t>(n));
    d_out.poison();
    ts::cuda::random_bits(d_key.get(), d_out.get(), n, nullptr);
    EXPECT_EQ(d_out.download(), cpu) << "n = " << n;
  }
}

TEST(CudaRandom, PhiloxKnownAnswer) {
  TESSERA_REQUIRE_GPU();
  // Random123's philox4x32_10 vector: counter (0, 0, 0, 0) under key (0, 0) gives
  // 6627e8d5 e169c58d bc57ac4c 9b00dbd8 — element 0..3 of the stream with key (0, 0).
  ts::cuda_test::DeviceBuffer<uint32_t> d_key(std::vector<uint32_t>{0, 0}), d_out(4);
  ts::cuda::random_bits(d_key.get(), d_out.get(), 4, nullptr);
  EXPECT_EQ(d_out.download(), (std::vector<uint32_t>{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
}

TEST(CudaRandom, SplitMatchesCpuBitwise) {
  TESSERA_REQUIRE_GPU();
  for (int64_t num : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{1000}, int64_t{4099}}) {
    Array key = ts::key(next_seed());
    expect_gpu_equals_cpu(ts::random::split(key, num), "split into " + std::to_string(num));
  }
}

TEST(CudaRandom, UniformMatchesCpuBitwise) {
  TESSERA_REQUIRE_GPU();
  const std::pair<double, double> ranges[] = {{0.0, 1.0}, {-2.0, 3.0}, {0.99, 1.0}, {-1e-3, 1e-3}, {100.0, 100.5}};
  for (DType dtype : kFloatTypes)
    for (int64_t n : kSizes)
      for (const auto& [low, high] : ranges) {
        Array key = ts::key(next_seed());
        expect_gpu_equals_cpu(ts::random::uniform(key, {n}, dtype, low, high),
                              std::string(ts::name(dtype)) + " uniform n=" + std::to_string(n) + " [" +
                                  std::to_string(low) + ", " + std::to_string(high) + ")");
      }
  // A multi-dimensional shape is the same stream.
  expect_gpu_equals_cpu(ts::random::uniform(ts::key(7), {3, 5, 7}, DType::Float32), "f32 uniform [3, 5, 7]");
}

TEST(CudaRandom, NormalMatchesCpu) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : kFloatTypes)
    for (int64_t n : kSizes)
      for (const auto& [mean, stddev] : {std::pair{0.0, 1.0}, std::pair{3.0, 0.02}}) {
        Array key = ts::key(next_seed());
        Array y = ts::random::normal(key, {n}, dtype, mean, stddev);
        std::vector<Array> gpu = ts::cuda::run_on_gpu(y);
        y.eval();
        const std::string what = std::string(ts::name(dtype)) + " normal n=" + std::to_string(n);
        if (dtype == DType::Float64) {
          // CUDA's double log/sin/cos are within 1-2 ulp of glibc's.
          const std::vector<double> a = gpu[0].to_vector<double>(), b = y.to_vector<double>();
          double num = 0, den = 0;
          for (size_t i = 0; i < a.size(); ++i) {
            num += (a[i] - b[i]) * (a[i] - b[i]);
            den += b[i] * b[i];
          }
          EXPECT_LT(std::sqrt(num / den), 1e-14) << what;
          continue;
        }
        // float32: glibc's logf / sincosf are not always correctly rounded (about 1% of
        // their results differ from the correctly rounded float, measured over every
        // 24-bit input), the GPU's double-evaluated ones nearly always are: some elements
        // differ in the last bit. 16-bit results may then round the other way.
        const double tolerance = dtype == DType::Float32 ? 1e-6 : 1e-3;
        EXPECT_LT(rel_error(gpu[0].to_vector<float>(), y.to_vector<float>()), tolerance) << what;
        const size_t differing = count_differing(gpu[0], y);
        EXPECT_LE(differing, static_cast<size_t>(n / 10 + 1))
            << what << ": " << differing << " of " << n << " elements differ bitwise";
      }
}

TEST(CudaRandom, BernoulliMatchesCpuBitwise) {
  TESSERA_REQUIRE_GPU();
  for (int64_t n : kSizes) {
    Array key = ts::key(next_seed());
    expect_gpu_equals_cpu(ts::random::bernoulli(key, 0.3, {n}), "p = 0.3, n = " + std::to_string(n));
    // A probability per element, float32 and bfloat16.
    for (DType pdtype : {DType::Float32, DType::BFloat16}) {
      Array p = ts::astype(ts::random::uniform(ts::key(next_seed()), {n}, DType::Float32), pdtype);
      p.eval();
      expect_gpu_equals_cpu(ts::random::bernoulli(key, p, {n}), std::string("p ") + std::string(ts::name(pdtype)) +
                                                                    " per element, n = " + std::to_string(n));
    }
  }
  // p = 0 never fires and p = 1 always does.
  expect_gpu_equals_cpu(ts::random::bernoulli(ts::key(3), 0.0, {1000}), "p = 0");
  expect_gpu_equals_cpu(ts::random::bernoulli(ts::key(3), 1.0, {1000}), "p = 1");
}

TEST(CudaRandom, BernoulliScalarProbabilityLauncher) {
  TESSERA_REQUIRE_GPU();
  // One p for every element (the launcher's p_scalar path) against the CPU kernel.
  const int64_t n = 10007;
  HostKey k = host_key();
  const std::vector<float> p = {0.71f};
  std::vector<unsigned char> cpu(static_cast<size_t>(n));
  ts::cpu::random_bernoulli(k.key, DType::Float32, p.data(), true, reinterpret_cast<bool*>(cpu.data()), n);
  ts::cuda_test::DeviceBuffer<uint32_t> d_key(k.words);
  ts::cuda_test::DeviceBuffer<float> d_p(p);
  ts::cuda_test::DeviceBuffer<unsigned char> d_out(static_cast<size_t>(n));
  d_out.poison();
  ts::cuda::random_bernoulli(d_key.get(), DType::Float32, d_p.get(), true, reinterpret_cast<bool*>(d_out.get()), n,
                             nullptr);
  EXPECT_EQ(d_out.download(), cpu);
}
