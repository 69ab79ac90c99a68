// AdamW on the GPU (backend/cuda/eval_optim.cpp, kernels/optim.h) against the CPU
// kernel: the adamw_update primitive for every float dtype (static and dynamic lr/step),
// and the multi-tensor launcher over many tensors of odd sizes (chunks split across
// launches, a tensor continued from one launch into the next). The GPU runs the CPU's
// exact operation sequence (the AVX2/FMA sequence of the default x86-64-v3 CPU build),
// so results are compared bit for bit where the coefficients come from the host.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <optional>
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
using ts::cuda_test::rel_error;

namespace {

uint64_t next_seed() {
  static uint64_t seed = 9000;
  return ++seed;
}

Array random_array(const Shape& shape, DType dtype, float scale, bool positive = false) {
  std::vector<float> v = ts::cuda_test::random_floats(static_cast<size_t>(ts::numel(shape)), next_seed(), scale);
  if (positive)
    for (float& x : v) x = std::fabs(x);
  Array x = Array::from_vector(v, shape);
  if (dtype != DType::Float32) x = ts::astype(x, dtype);
  x.eval();
  return x;
}

void expect_same_bytes(const Array& gpu, const Array& cpu, const std::string& what) {
  ASSERT_EQ(gpu.shape(), cpu.shape()) << what;
  ASSERT_EQ(gpu.dtype(), cpu.dtype()) << what;
  const size_t n = cpu.nbytes(), item = cpu.itemsize();
  const auto* a = static_cast<const unsigned char*>(gpu.raw_data());
  const auto* b = static_cast<const unsigned char*>(cpu.raw_data());
  size_t differing = 0, first = 0;
  for (size_t i = 0; i < n; i += item) {
    if (std::memcmp(a + i, b + i, item) != 0 && differing++ == 0) first = i / item;
  }
  EXPECT_EQ(differing, 0u) << what << ": " << differing << " of " << cpu.size() << " elements differ, first at "
                           << first << " (gpu " << gpu.to_vector<double>()[first] << ", cpu "
                           << cpu.to_vector<double>()[first] << ")";
}

const DType kFloatTypes[] = {DType::Float32, DType::BFloat16, DType::Float16, DType::Float64};

struct State {
  Array p, g, m, v;
};

State random_state(const Shape& shape, DType dtype) {
  const DType acc = ts::accumulation_dtype(dtype);
  return {random_array(shape, dtype, 1.0f), random_array(shape, dtype, 1.0f), random_array(shape, acc, 0.1f),
          random_array(shape, acc, 0.01f, true)};
}

}  // namespace

TEST(CudaAdamW, MatchesCpuBitwise) {
  TESSERA_REQUIRE_GPU();
  ts::AdamWConfig config;
  config.lr = 3e-3;
  config.beta1 = 0.9;
  config.beta2 = 0.95;
  config.eps = 1e-8;
  config.weight_decay = 0.1;
  config.step = 7;
  for (DType dtype : kFloatTypes)
    for (const Shape& shape : {Shape{100003}, Shape{3, 7}, Shape{1}}) {
      State s = random_state(shape, dtype);
      std::vector<Array> outs = ts::adamw_update(s.p, s.g, s.m, s.v, config);
      std::vector<Array> gpu = ts::cuda::run_on_gpu(outs[0]);
      ts::eval(outs);
      ASSERT_EQ(gpu.size(), 3u);
      const std::string what = std::string(ts::name(dtype)) + ts::to_string(shape);
      expect_same_bytes(gpu[0], outs[0], what + " param");
      expect_same_bytes(gpu[1], outs[1], what + " m");
      expect_same_bytes(gpu[2], outs[2], what + " v");
    }
}

TEST(CudaAdamW, DynamicLrAndStep) {
  TESSERA_REQUIRE_GPU();
  ts::AdamWConfig config;
  config.weight_decay = 0.01;
  for (DType dtype : {DType::Float32, DType::BFloat16})
    for (int64_t step : {1, 2, 5, 1000}) {
      State s = random_state({4099}, dtype);
      Array lr = Array::scalar(2e-3, DType::Float32);
      Array t = Array::scalar(static_cast<double>(step), DType::Int64);
      std::vector<Array> outs = ts::adamw_update(s.p, s.g, s.m, s.v, lr, t, config);
      std::vector<Array> gpu = ts::cuda::run_on_gpu(outs[0]);
      ts::eval(outs);
      ASSERT_EQ(gpu.size(), 3u);
      // The bias corrections come from the device's pow here (glibc's on the CPU): equal
      // up to the last bit of c1 and c2, so compare at 1e-6; m and v do not use them.
      const std::string what = std::string(ts::name(dtype)) + " step " + std::to_string(step);
      EXPECT_LT(rel_error(gpu[0].to_vector<float>(), outs[0].to_vector<float>()), 1e-6) << what;
      expect_same_bytes(gpu[1], outs[1], what + " m");
      expect_same_bytes(gpu[2], outs[2], what + " v");
    }
}

TEST(CudaAdamW, ScaledGradientIsTheMultiplyBitwise) {
  TESSERA_REQUIRE_GPU();
  // grad_scale (the clip factor folded into the update) against the same update of the
  // multiplied gradient (the multiply run by the CPU, whose rounding is the op's), both
  // on the GPU: bit for bit; m and v bitwise the CPU's fused form too.
  ts::AdamWConfig config;
  config.weight_decay = 0.1;
  config.beta2 = 0.95;
  for (DType dtype : kFloatTypes) {
    State s = random_state({70001}, dtype);
    Array lr = Array::scalar(2e-3, DType::Float32), t = Array::scalar(3.0, DType::Int64);
    Array scale = ts::astype(Array::scalar(0.3712345, DType::Float64), dtype);
    scale.eval();
    std::vector<Array> fused = ts::adamw_update(s.p, s.g, s.m, s.v, lr, t, scale, config);
    std::vector<Array> plain = ts::adamw_update(s.p, ts::multiply(s.g, scale), s.m, s.v, lr, t, config);
    std::vector<Array> gpu_fused = ts::cuda::run_on_gpu(fused[0]);
    std::vector<Array> gpu_plain = ts::cuda::run_on_gpu(plain[0]);
    ts::eval(fused);
    ASSERT_EQ(gpu_fused.size(), 3u);
    const std::string what = std::string(ts::name(dtype)) + " scaled";
    for (int i = 0; i < 3; ++i) expect_same_bytes(gpu_fused[i], gpu_plain[i], what + " output " + std::to_string(i));
    expect_same_bytes(gpu_fused[1], fused[1], what + " m against the CPU");
    expect_same_bytes(gpu_fused[2], fused[2], what + " v against the CPU");
    EXPECT_LT(rel_error(gpu_fused[0].to_vector<float>(), fused[0].to_vector<float>()), 1e-6) << what;
  }
}

TEST(CudaAdamW, LowPrecisionGradientsOfFloat32Params) {
  TESSERA_REQUIRE_GPU();
  // bfloat16/float16 gradients of float32 parameters (the simplify pass folds their
  // widening convert into the update): bitwise the CPU's (static lr and step), scaled or not.
  ts::AdamWConfig config;
  config.lr = 3e-3;
  config.weight_decay = 0.1;
  config.step = 4;
  for (DType low : {DType::BFloat16, DType::Float16}) {
    State s = random_state({70001}, DType::Float32);
    Array g = random_array({70001}, low, 1.0f);
    std::vector<Array> outs = ts::adamw_update(s.p, g, s.m, s.v, config);
    std::vector<Array> gpu = ts::cuda::run_on_gpu(outs[0]);
    ts::eval(outs);
    for (int i = 0; i < 3; ++i)
      expect_same_bytes(gpu[i], outs[i], std::string(ts::name(low)) + " gradient, output " + std::to_string(i));
    Array lr = Array::scalar(2e-3, DType::Float32), t = Array::scalar(3.0, DType::Int64);
    Array scale = Array::scalar(0.3712345, DType::Float32);
    std::vector<Array> fused = ts::adamw_update(s.p, g, s.m, s.v, lr, t, scale, config);
    std::vector<Array> wide = ts::adamw_update(s.p, ts::astype(g, DType::Float32), s.m, s.v, lr, t, scale, config);
    std::vector<Array> gpu_fused = ts::cuda::run_on_gpu(fused[0]), gpu_wide = ts::cuda::run_on_gpu(wide[0]);
    for (int i = 0; i < 3; ++i)
      expect_same_bytes(gpu_fused[i], gpu_wide[i], std::string(ts::name(low)) + " scaled, output " + std::to_string(i));
  }
}

TEST(CudaAdamW, InvalidDynamicStepPoisonsParams) {
  TESSERA_REQUIRE_GPU();
  // The CPU throws for step 0; the device cannot, so the parameters become NaN.
  State s = random_state({33}, DType::Float32);
  std::vector<Array> outs = ts::adamw_update(s.p, s.g, s.m, s.v, Array::scalar(1e-3, DType::Float32),
                                             Array::scalar(0, DType::Int32), ts::AdamWConfig{});
  std::vector<Array> gpu = ts::cuda::run_on_gpu(outs[0]);
  for (float x : gpu[0].to_vector<float>()) EXPECT_TRUE(std::isnan(x));
  for (float x : gpu[1].to_vector<float>()) EXPECT_TRUE(std::isfinite(x));
}

namespace {

// The multi-tensor launcher against the CPU kernel on host copies, for `sizes`.
// `grad_scale`: a gradient scale to put on the device (hyper.grad_scale_device) and give
// the CPU kernel too. G: the gradients' storage type (T, or bf16/f16 for float32 T).
template <typename T, typename G = T>
void expect_multi_tensor_matches_cpu(DType dtype, const std::vector<int64_t>& sizes, ts::cuda::AdamWHyper h,
                                     const std::vector<float>* lr_and_step_on_device = nullptr,
                                     const T* grad_scale = nullptr) {
  struct Host {
    std::vector<T> p;
    std::vector<G> g;
    std::vector<float> m, v;
  };
  const DType grad_dtype = ts::dtype_of<G>::value;
  std::vector<Host> host;
  std::vector<ts::cuda_test::DeviceBuffer<T>> dp;
  std::vector<ts::cuda_test::DeviceBuffer<G>> dg;
  std::vector<ts::cuda_test::DeviceBuffer<float>> dm, dv;
  std::vector<ts::cuda::AdamWTensor> tensors;
  for (int64_t n : sizes) {
    Host t;
    std::vector<float> p = ts::cuda_test::random_floats(n, next_seed());
    std::vector<float> g = ts::cuda_test::random_floats(n, next_seed());
    t.m = ts::cuda_test::random_floats(n, next_seed(), 0.1f);
    t.v = ts::cuda_test::random_floats(n, next_seed(), 0.01f);
    for (float& x : t.v) x = std::fabs(x);
    t.p.resize(n);
    t.g.resize(n);
    ts::convert(DType::Float32, p.data(), dtype, t.p.data(), n);
    ts::convert(DType::Float32, g.data(), grad_dtype, t.g.data(), n);
    dp.emplace_back(t.p);
    dg.emplace_back(t.g);
    dm.emplace_back(t.m);
    dv.emplace_back(t.v);
    tensors.push_back({dp.back().get(), dg.back().get(), dm.back().get(), dv.back().get(), n});
    host.push_back(std::move(t));
  }
  std::optional<ts::cuda_test::DeviceBuffer<T>> d_scale;
  if (grad_scale != nullptr) {
    d_scale.emplace(std::vector<T>{*grad_scale});
    h.grad_scale_device = d_scale->get();
  }
  h.grad_dtype = grad_dtype;
  ts::cuda::adamw_multi_tensor(dtype, tensors, h, nullptr);
  ts::cpu::AdamWConfig c;
  c.grad_scale = grad_scale;
  c.grad_dtype = grad_dtype;
  c.lr = h.lr;
  c.beta1 = h.beta1;
  c.beta2 = h.beta2;
  c.eps = h.eps;
  c.weight_decay = h.weight_decay;
  c.step = h.step;
  if (lr_and_step_on_device != nullptr) {
    c.lr = (*lr_and_step_on_device)[0];
    c.step = static_cast<int64_t>((*lr_and_step_on_device)[1]);
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    Host& t = host[i];
    ts::cpu::adamw_update(dtype, t.p.data(), t.g.data(), t.m.data(), t.v.data(), sizes[i], c);
    const std::string what =
        std::string(ts::name(dtype)) + " tensor " + std::to_string(i) + " of " + std::to_string(sizes[i]);
    const std::vector<T> p = dp[i].download();
    const std::vector<float> m = dm[i].download(), v = dv[i].download();
    if (lr_and_step_on_device == nullptr) {
      EXPECT_EQ(std::memcmp(p.data(), t.p.data(), p.size() * sizeof(T)), 0) << what << " param";
    } else {
      std::vector<float> pf(p.size()), tf(p.size());
      ts::convert(dtype, p.data(), DType::Float32, pf.data(), sizes[i]);
      ts::convert(dtype, t.p.data(), DType::Float32, tf.data(), sizes[i]);
      EXPECT_LT(rel_error(pf, tf), 1e-6) << what << " param";
    }
    EXPECT_EQ(m, t.m) << what << " m";
    EXPECT_EQ(v, t.v) << what << " v";
  }
}

}  // namespace

TEST(CudaAdamWMultiTensor, ManyOddTensorsMatchCpu) {
  TESSERA_REQUIRE_GPU();
  ts::cuda::AdamWHyper h;
  h.lr = 6e-4;
  h.beta1 = 0.9;
  h.beta2 = 0.95;
  h.weight_decay = 0.1;
  h.step = 3;
  // 45 tensors (more than one launch's 36), sizes around the 64K chunk, empty ones, and
  // a 21M-element tensor (329 chunks: more than one launch's 320, so it continues into
  // the next launch from slot 0).
  std::vector<int64_t> sizes = {1, 7, 65535, 65536, 65537, 0, 300001, 33};
  for (int i = 0; i < 37; ++i) sizes.push_back(1 + i * 997);
  sizes.push_back(21'500'001);
  sizes.push_back(5);
  expect_multi_tensor_matches_cpu<float>(DType::Float32, sizes, h);
  expect_multi_tensor_matches_cpu<ts::bfloat16>(DType::BFloat16, {3, 65537, 1000, 0, 77}, h);
  expect_multi_tensor_matches_cpu<ts::float16>(DType::Float16, {3, 65537, 1000, 77}, h);
}

TEST(CudaAdamWMultiTensor, ScaledGradientsMatchCpu) {
  TESSERA_REQUIRE_GPU();
  ts::cuda::AdamWHyper h;
  h.lr = 6e-4;
  h.beta2 = 0.95;
  h.weight_decay = 0.1;
  h.step = 5;
  const float scale = 0.2718f;
  expect_multi_tensor_matches_cpu<float>(DType::Float32, {1, 65537, 300001, 33}, h, nullptr, &scale);
  const ts::bfloat16 scale_bf16 = ts::float_to_bf16(0.2718f);
  expect_multi_tensor_matches_cpu<ts::bfloat16>(DType::BFloat16, {3, 65537, 77}, h, nullptr, &scale_bf16);
}

TEST(CudaAdamWMultiTensor, Bfloat16GradientsOfFloat32Params) {
  TESSERA_REQUIRE_GPU();
  // hyper.grad_dtype: float32 parameters, bfloat16 gradients, with a grad_scale, against
  // the CPU kernel given the same dtypes.
  ts::cuda::AdamWHyper h;
  h.lr = 6e-4;
  h.beta2 = 0.95;
  h.weight_decay = 0.1;
  h.step = 2;
  const float scale = 0.61f;
  expect_multi_tensor_matches_cpu<float, ts::bfloat16>(DType::Float32, {1, 65537, 300001, 77}, h, nullptr, &scale);
}

TEST(CudaAdamWMultiTensor, UnalignedTensorsTakeTheScalarPath) {
  TESSERA_REQUIRE_GPU();
  // Views one element into their buffers (not 16-byte aligned): the kernel's four-wide
  // path does not apply and the scalar one gives the CPU's bits.
  ts::cuda::AdamWHyper h;
  h.lr = 1e-3;
  h.weight_decay = 0.1;
  h.step = 3;
  const int64_t n = 70001;
  std::vector<float> p = ts::cuda_test::random_floats(n + 1, next_seed()),
                     g = ts::cuda_test::random_floats(n + 1, next_seed());
  std::vector<float> m = ts::cuda_test::random_floats(n + 1, next_seed(), 0.1f),
                     v = ts::cuda_test::random_floats(n + 1, next_seed(), 0.01f);
  for (float& x : v) x = std::fabs(x);
  ts::cuda_test::DeviceBuffer<float> dp(p), dg(g), dm(m), dv(v);
  ts::cuda::adamw_multi_tensor(DType::Float32, {{dp.get() + 1, dg.get() + 1, dm.get() + 1, dv.get() + 1, n}}, h,
                               nullptr);
  ts::cpu::AdamWConfig c;
  c.lr = h.lr;
  c.weight_decay = h.weight_decay;
  c.step = h.step;
  ts::cpu::adamw_update(DType::Float32, p.data() + 1, g.data() + 1, m.data() + 1, v.data() + 1, n, c);
  EXPECT_EQ(dp.download(), p);
  EXPECT_EQ(dm.download(), m);
  EXPECT_EQ(dv.download(), v);
}

TEST(CudaAdamWMultiTensor, DynamicLrAndStep) {
  TESSERA_REQUIRE_GPU();
  const std::vector<float> lr = {1.5e-3f}, step = {4.0f};
  ts::cuda_test::DeviceBuffer<float> d_lr(lr);
  ts::cuda_test::DeviceBuffer<int64_t> d_step(std::vector<int64_t>{4});
  ts::cuda::AdamWHyper h;
  h.lr = 123.0;  // ignored: the device values win
  h.step = 99;
  h.weight_decay = 0.05;
  h.lr_device = d_lr.get();
  h.lr_dtype = DType::Float32;
  h.step_device = d_step.get();
  h.step_dtype = DType::Int64;
  const std::vector<float> lr_and_step = {lr[0], step[0]};
  expect_multi_tensor_matches_cpu<float>(DType::Float32, {1000, 70000, 3}, h, &lr_and_step);
}
