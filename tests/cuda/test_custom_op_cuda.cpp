// A custom op with CUDA source (core/custom_op.h): compiled at run time with NVRTC,
// launched with the definition's grid and scalars, equal to its CPU kernel; and the
// error for a custom op without CUDA source in a GPU program. Skips without a GPU.
#include <gtest/gtest.h>

#include "cuda/cuda_test_util.h"
#include "tessera/backend/cuda.h"
#include "tessera/core/custom_op.h"
#include "tessera/tessera.h"

namespace tessera {
namespace {

constexpr const char* kSource = R"(
extern "C" __global__ void affine(const float* x, float* y, long long n, long long k, long long b) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] * (float)k + (float)b;
}
)";

void register_affine(const std::string& name, bool with_cuda) {
  if (find_custom_op(name)) return;
  CustomOpDefinition d;
  d.name = name;
  d.input_dtypes = {DType::Float32};
  d.infer = [](const std::vector<TensorSpec>& in, const CustomAttributes&) { return in; };
  d.cpu_kernel = [](const std::vector<InputBuffer>& in, const std::vector<OutputBuffer>& out,
                    const CustomAttributes& at) {
    const auto k = static_cast<float>(attribute_int(at, "k", "affine")),
               b = static_cast<float>(attribute_int(at, "b", "affine"));
    for (int64_t i = 0; i < in[0].numel(); ++i) out[0].as<float>()[i] = in[0].as<const float>()[i] * k + b;
  };
  if (with_cuda) {
    d.cuda = CustomCudaKernel{
        kSource, "affine",
        [](const std::vector<TensorSpec>& in, const std::vector<TensorSpec>&, const CustomAttributes& at) {
          const int64_t n = numel(in[0].shape);
          CudaLaunch l;
          l.block = {256, 1, 1};
          l.grid = {static_cast<unsigned>((n + 255) / 256), 1, 1};
          l.scalars = {n, attribute_int(at, "k", "affine"), attribute_int(at, "b", "affine")};
          return l;
        }};
  }
  register_custom_op(std::move(d));
}

TEST(CustomOpCuda, NvrtcKernelMatchesTheCpuKernel) {
  TESSERA_REQUIRE_GPU();
  register_affine("test_affine_cuda", true);
  std::vector<float> v(1000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) * 0.25f - 100.0f;
  Array x = Array::from_vector(v, {10, 100});
  auto fn = [](const Array& a) {
    return custom_op("test_affine_cuda", {a}, {{"k", int64_t{3}}, {"b", int64_t{-2}}})[0];
  };
  JitOptions gpu;
  gpu.device = "cuda";
  Array on_gpu = jit(fn, gpu)(x);
  Array on_cpu = jit(fn)(x);
  EXPECT_EQ(on_gpu.to_vector<float>(), on_cpu.to_vector<float>());
}

TEST(CustomOpCuda, WithoutCudaSourceAGpuProgramNamesTheOp) {
  TESSERA_REQUIRE_GPU();
  register_affine("test_affine_cpu_only", false);
  JitOptions gpu;
  gpu.device = "cuda";
  auto f = jit(
      [](const Array& a) {
        return custom_op("test_affine_cpu_only", {a}, {{"k", int64_t{1}}, {"b", int64_t{0}}})[0];
      },
      gpu);
  try {
    f(Array::from_vector(std::vector<float>{1, 2, 3}));
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("test_affine_cpu_only"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera
