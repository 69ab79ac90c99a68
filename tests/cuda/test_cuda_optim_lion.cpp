// Lion on the GPU (backend/cuda/eval_optim.cpp, kernels/optim.h) against the CPU kernel:
// the lion_update primitive for every float dtype (static and dynamic lr), sign(0) and
// NaN, and the multi-tensor launcher over many tensors of odd sizes (chunks split across
// launches). Both devices run one fma sequence with coefficients rounded on the host
// (the dynamic lr is only read and rounded), so every comparison is bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backend/cpu/kernels/optim.h"
#include "backend/cuda/kernels/optim.h"
#include "backend/cuda/run_on_gpu.h"
#include "cuda/cuda_test_util.h"
#include "tessera/core/ops.h"

namespace ts = tessera;
using ts::Array;
using ts::DType;
using ts::Shape;

namespace {

uint64_t next_seed() {
  static uint64_t seed = 9500;
  return ++seed;
}

Array random_array(const Shape& shape, DType dtype, float scale) {
  std::vector<float> v = ts::cuda_test::random_floats(static_cast<size_t>(ts::numel(shape)), next_seed(), scale);
  Array x = Array::from_vector(v, shape);
  if (dtype != DType::Float32) x = ts::astype(x, dtype);
  x.eval();
  return x;
}

// Same bytes, except that any NaN matches any NaN (payloads are not specified).
void expect_same_values(const Array& gpu, const Array& cpu, const std::string& what) {
  ASSERT_EQ(gpu.shape(), cpu.shape()) << what;
  ASSERT_EQ(gpu.dtype(), cpu.dtype()) << what;
  const std::vector<double> g = gpu.to_vector<double>(), c = cpu.to_vector<double>();
  const size_t item = cpu.itemsize();
  const auto* a = static_cast<const unsigned char*>(gpu.raw_data());
  const auto* b = static_cast<const unsigned char*>(cpu.raw_data());
  size_t differing = 0, first = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    const bool same = std::isnan(c[i]) ? std::isnan(g[i]) : std::memcmp(a + i * item, b + i * item, item) == 0;
    if (!same && differing++ == 0) first = i;
  }
  EXPECT_EQ(differing, 0u) << what << ": " << differing << " of " << c.size() << " elements differ, first at " << first
                           << " (gpu " << (c.empty() ? 0 : g[first]) << ", cpu " << (c.empty() ? 0 : c[first]) << ")";
}

const DType kFloatTypes[] = {DType::Float32, DType::BFloat16, DType::Float16, DType::Float64};

struct State {
  Array p, g, m;
};

State random_state(const Shape& shape, DType dtype) {
  return {random_array(shape, dtype, 1.0f), random_array(shape, dtype, 1.0f),
          random_array(shape, ts::accumulation_dtype(dtype), 0.1f)};
}

ts::LionConfig test_config() {
  ts::LionConfig config;
  config.lr = 3e-3;
  config.beta1 = 0.9;
  config.beta2 = 0.99;
  config.weight_decay = 0.1;
  return config;
}

}  // namespace

TEST(CudaLion, MatchesCpuBitwise) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : kFloatTypes)
    for (const Shape& shape : {Shape{100003}, Shape{3, 7}, Shape{1}}) {
      State s = random_state(shape, dtype);
      std::vector<Array> outs = ts::lion_update(s.p, s.g, s.m, test_config());
      std::vector<Array> gpu = ts::cuda::run_on_gpu(outs[0]);
      ts::eval(outs);
      ASSERT_EQ(gpu.size(), 2u);
      const std::string what = std::string(ts::name(dtype)) + ts::to_string(shape);
      expect_same_values(gpu[0], outs[0], what + " param");
      expect_same_values(gpu[1], outs[1], what + " m");
    }
}

TEST(CudaLion, DynamicLrIsBitwiseTheCpu) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : kFloatTypes)
    for (DType lr_dtype : {DType::Float32, DType::Float64, DType::BFloat16}) {
      State s = random_state({4099}, dtype);
      std::vector<Array> outs = ts::lion_update(s.p, s.g, s.m, Array::scalar(2e-3, lr_dtype), test_config());
      std::vector<Array> gpu = ts::cuda::run_on_gpu(outs[0]);
      ts::eval(outs);
      ASSERT_EQ(gpu.size(), 2u);
      const std::string what = std::string(ts::name(dtype)) + " lr " + std::string(ts::name(lr_dtype));
      expect_same_values(gpu[0], outs[0], what + " param");
      expect_same_values(gpu[1], outs[1], what + " m");
    }
}

TEST(CudaLion, SignOfZeroAndNaNAsTheCpu) {
  TESSERA_REQUIRE_GPU();
  // g = m = 0 (c = +0), g = m = -0 (c = -0) and g = NaN, among ordinary elements.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> p(40, 0.5f), g(40, 0.25f), m(40, 0.0f);
  g[1] = 0, g[2] = -0.0f, m[2] = -0.0f, g[3] = nan;
  for (DType dtype : kFloatTypes) {
    Array pa = Array::from_vector(p, {40}), ga = Array::from_vector(g, {40}), ma = Array::from_vector(m, {40});
    if (dtype != DType::Float32) pa = ts::astype(pa, dtype), ga = ts::astype(ga, dtype);
    if (dtype == DType::Float64) ma = ts::astype(ma, dtype);
    std::vector<Array> outs = ts::lion_update(pa, ga, ma, test_config());
    std::vector<Array> gpu = ts::cuda::run_on_gpu(outs[0]);
    ts::eval(outs);
    expect_same_values(gpu[0], outs[0], std::string(ts::name(dtype)) + " param");
    expect_same_values(gpu[1], outs[1], std::string(ts::name(dtype)) + " m");
    EXPECT_TRUE(std::isnan(gpu[0].to_vector<double>()[3]));
  }
}

TEST(CudaLion, NegativeDynamicLrPoisonsParams) {
  TESSERA_REQUIRE_GPU();
  // The CPU throws for lr < 0; the device cannot, so the parameters become NaN.
  State s = random_state({33}, DType::Float32);
  std::vector<Array> outs = ts::lion_update(s.p, s.g, s.m, Array::scalar(-1e-3, DType::Float32), test_config());
  std::vector<Array> gpu = ts::cuda::run_on_gpu(outs[0]);
  for (float x : gpu[0].to_vector<float>()) EXPECT_TRUE(std::isnan(x));
  for (float x : gpu[1].to_vector<float>()) EXPECT_TRUE(std::isfinite(x));
}

namespace {

// The multi-tensor launcher against the CPU kernel on host copies, for `sizes`.
template <typename T>
void expect_lion_multi_tensor_matches_cpu(DType dtype, const std::vector<int64_t>& sizes, const ts::cuda::LionHyper& h,
                                          double lr_on_device = -1) {
  struct Host {
    std::vector<T> p, g;
    std::vector<float> m;
  };
  std::vector<Host> host;
  std::vector<ts::cuda_test::DeviceBuffer<T>> dp, dg;
  std::vector<ts::cuda_test::DeviceBuffer<float>> dm;
  std::vector<ts::cuda::LionTensor> tensors;
  for (int64_t n : sizes) {
    Host t;
    std::vector<float> p = ts::cuda_test::random_floats(n, next_seed());
    std::vector<float> g = ts::cuda_test::random_floats(n, next_seed());
    t.m = ts::cuda_test::random_floats(n, next_seed(), 0.1f);
    t.p.resize(n);
    t.g.resize(n);
    ts::convert(DType::Float32, p.data(), dtype, t.p.data(), n);
    ts::convert(DType::Float32, g.data(), dtype, t.g.data(), n);
    dp.emplace_back(t.p);
    dg.emplace_back(t.g);
    dm.emplace_back(t.m);
    tensors.push_back({dp.back().get(), dg.back().get(), dm.back().get(), n});
    host.push_back(std::move(t));
  }
  ts::cuda::lion_multi_tensor(dtype, tensors, h, nullptr);
  ts::cpu::LionConfig c;
  c.lr = lr_on_device >= 0 ? lr_on_device : h.lr;
  c.beta1 = h.beta1;
  c.beta2 = h.beta2;
  c.weight_decay = h.weight_decay;
  for (size_t i = 0; i < sizes.size(); ++i) {
    Host& t = host[i];
    ts::cpu::lion_update(dtype, t.p.data(), t.g.data(), t.m.data(), sizes[i], c);
    const std::string what =
        std::string(ts::name(dtype)) + " tensor " + std::to_string(i) + " of " + std::to_string(sizes[i]);
    const std::vector<T> p = dp[i].download();
    EXPECT_EQ(std::memcmp(p.data(), t.p.data(), p.size() * sizeof(T)), 0) << what << " param";
    EXPECT_EQ(dm[i].download(), t.m) << what << " m";
  }
}

}  // namespace

TEST(CudaLionMultiTensor, ManyOddTensorsMatchCpu) {
  TESSERA_REQUIRE_GPU();
  ts::cuda::LionHyper h;
  h.lr = 6e-4;
  h.beta1 = 0.95;
  h.beta2 = 0.98;
  h.weight_decay = 0.1;
  // 45 tensors (more than one launch's 36), sizes around the 64K chunk, empty ones, and
  // a 21M-element tensor (329 chunks: more than one launch's 320, continued from slot 0).
  std::vector<int64_t> sizes = {1, 7, 65535, 65536, 65537, 0, 300001, 33};
  for (int i = 0; i < 37; ++i) sizes.push_back(1 + i * 997);
  sizes.push_back(21'500'001);
  sizes.push_back(5);
  expect_lion_multi_tensor_matches_cpu<float>(DType::Float32, sizes, h);
  expect_lion_multi_tensor_matches_cpu<ts::bfloat16>(DType::BFloat16, {3, 65537, 1000, 0, 77}, h);
  expect_lion_multi_tensor_matches_cpu<ts::float16>(DType::Float16, {3, 65537, 1000, 77}, h);
}

TEST(CudaLionMultiTensor, DynamicLr) {
  TESSERA_REQUIRE_GPU();
  const std::vector<float> lr = {1.5e-3f};
  ts::cuda_test::DeviceBuffer<float> d_lr(lr);
  ts::cuda::LionHyper h;
  h.lr = 123.0;  // ignored: the device value wins
  h.weight_decay = 0.05;
  h.lr_device = d_lr.get();
  h.lr_dtype = DType::Float32;
  expect_lion_multi_tensor_matches_cpu<float>(DType::Float32, {1000, 70000, 3}, h, lr[0]);
}
