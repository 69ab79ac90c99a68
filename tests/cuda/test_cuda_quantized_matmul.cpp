// int8 (AQT) GEMMs on the GPU (backend/cuda/kernels/quantized_gemm.h) against the CPU's:
// the same quantized bytes and exact int32 sums, so quantized_matmul's product and both
// int8 backward GEMMs (stochastically rounded from the key) are bitwise the CPU's, in
// float32 and bfloat16, transposed or not, with leading dims, a zero row and a
// non-finite value; the fused epilogue (bias, GELU with its pre-activation) made by the
// compiler for a GPU program, its bias bitwise and its GELU (the GPU's own kernel) close;
// cuBLASLt and the dp4a fallback give the same bits. Skips without a device.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backend/cuda/kernels/gemm.h"
#include "backend/cuda/run_on_gpu.h"
#include "cuda/cuda_test_util.h"
#include "tessera/api/jit.h"
#include "tessera/backend/device_data.h"
#include "tessera/core/ops.h"
#include "tessera/core/random.h"
#include "tessera/core/transforms.h"
#include "tessera/ir/primitives/quantized.h"

namespace ts = tessera;
using ts::Array;
using ts::Tree;

namespace {

Array random(const ts::Shape& shape, uint32_t seed, ts::DType dtype, float scale = 1.0f) {
  std::vector<float> v(static_cast<size_t>(ts::numel(shape)));
  uint32_t s = seed;
  for (float& x : v) {
    s = s * 1664525u + 1013904223u;
    x = (static_cast<float>(s >> 8) / static_cast<float>(1u << 24) * 2.0f - 1.0f) * scale;
  }
  return Array::from_vector(v, shape).astype(dtype).eval();
}

bool bitwise(const Array& a, const Array& b) {
  ts::backend::fetch_to_host(a);
  ts::backend::fetch_to_host(b);
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw_data(), b.raw_data(), static_cast<size_t>(a.size()) * ts::itemsize(a.dtype())) == 0;
}

std::vector<float> values(const Array& a) { return a.astype(ts::DType::Float32).to_vector<float>(); }

ts::JitOptions on_cuda() {
  ts::JitOptions o;
  o.device = "cuda";
  return o;
}

// y = quantized_matmul(x, w) and the gradients of sum(float(y) * r): the forward rounds to
// nearest, dX = dY W^T and dW = X^T dY round dY stochastically from the key.
TEST(GpuQuantizedMatmul, ProductAndInt8BackwardAreBitwiseTheCpus) {
  TESSERA_REQUIRE_GPU();
  for (const ts::DType dtype : {ts::DType::Float32, ts::DType::BFloat16})
    for (const bool transpose_w : {false, true}) {
      Array x = random({3, 40, 72}, 1, dtype);
      if (!transpose_w) {  // a zero row and a row with an infinity: NaN results in that row only
        std::vector<float> v = x.astype(ts::DType::Float32).to_vector<float>();
        std::fill(v.begin() + 5 * 72, v.begin() + 6 * 72, 0.0f);
        v[9 * 72 + 3] = std::numeric_limits<float>::infinity();
        x = Array::from_vector(v, x.shape()).astype(dtype).eval();
      }
      const Array w = random(transpose_w ? ts::Shape{56, 72} : ts::Shape{72, 56}, 2, dtype, 0.5f);
      const Array r = random({3, 40, 56}, 3, ts::DType::Float32);
      const Array key = ts::key(7);
      auto step = [&](const Tree& args) {
        ts::QuantizedMatmulOptions o;
        o.transpose_w = transpose_w;
        o.key = args.at("key").leaf();
        o.salt = 5;
        auto loss = [&](const std::vector<Array>& in) {
          return ts::sum(ts::astype(ts::quantized_matmul(in[0], in[1], o), ts::DType::Float32) * args.at("r").leaf());
        };
        auto [value, grads] = ts::value_and_grad(loss)({args.at("x").leaf(), args.at("w").leaf()});
        return Tree{{"y", ts::quantized_matmul(args.at("x").leaf(), args.at("w").leaf(), o)},
                    {"dx", grads[0]},
                    {"dw", grads[1]}};
      };
      const Tree args{{"x", x}, {"w", w}, {"r", r}, {"key", key}};
      const Tree cpu = ts::jit(step)(args);
      const Tree gpu = ts::jit(step, on_cuda())(args);
      ASSERT_TRUE(ts::backend::on_device(gpu.at("y").leaf()));
      const std::string what = std::string(ts::name(dtype)) + (transpose_w ? " transposed w" : "");
      for (const char* leaf : {"y", "dx", "dw"})
        EXPECT_TRUE(bitwise(gpu.at(leaf).leaf(), cpu.at(leaf).leaf())) << what << " " << leaf;
    }
}

// gelu(quantized_matmul(x, w) + b): the compiler fuses it into matmul_epilogue int8=true
// (bias and the pre-activation in the dequantizing pass, then the GPU's GELU kernel).
TEST(GpuQuantizedMatmul, FusedEpilogueMatchesTheCpu) {
  TESSERA_REQUIRE_GPU();
  for (const ts::DType dtype : {ts::DType::Float32, ts::DType::BFloat16}) {
    const Array x = random({64, 96}, 11, dtype), w = random({96, 80}, 12, dtype, 0.5f);
    const Array b = random({80}, 13, dtype);
    auto fwd = [](const Tree& a) {
      const Array s = ts::quantized_matmul(a.at("x").leaf(), a.at("w").leaf()) + a.at("b").leaf();
      return Tree{{"s", s}, {"y", ts::gelu(s)}};
    };
    const Tree args{{"x", x}, {"w", w}, {"b", b}};
    ts::Jitted gpu_fn = ts::jit(fwd, on_cuda());
    const Tree cpu = ts::jit(fwd)(args), gpu = gpu_fn(args);
    EXPECT_NE(gpu_fn.lowered(args).optimized_text().find("int8=true"), std::string::npos)
        << "the GPU program has no fused int8 epilogue:\n"
        << gpu_fn.lowered(args).optimized_text();
    EXPECT_TRUE(bitwise(gpu.at("s").leaf(), cpu.at("s").leaf())) << ts::name(dtype);
    const double tol = dtype == ts::DType::Float32 ? 1e-5 : 1e-2;
    EXPECT_LT(ts::cuda_test::rel_error(values(gpu.at("y").leaf()), values(cpu.at("y").leaf())), tol) << ts::name(dtype);
  }
}

// cuBLASLt's int8 product and the dp4a kernel give the same C, odd sizes included (K not
// a multiple of 16, N not of 4), a stochastically rounded operand too.
TEST(GpuQuantizedMatmul, CublasLtAndTheFallbackAgree) {
  TESSERA_REQUIRE_GPU();
  const ts::cuda::GemmOptions saved = ts::cuda::gemm_options();
  for (const auto& [m, n, k] : {std::array<int64_t, 3>{128, 256, 512}, std::array<int64_t, 3>{37, 13, 70}}) {
    const Array x = random({m, k}, 21, ts::DType::BFloat16), w = random({k, n}, 22, ts::DType::BFloat16);
    // The primitive as a backward GEMM uses it: A rounded stochastically from the key.
    ts::QuantizedMatmulConfig c;
    c.stochastic_a = true;
    c.salt = 9;
    const Array key = ts::key(3);
    auto run = [&](bool reference_only) {
      ts::cuda::GemmOptions opts = saved;
      opts.reference_only = reference_only;
      ts::cuda::set_gemm_options(opts);
      return ts::cuda::run_on_gpu(ts::quantized_matmul_op(x, w, c, &key))[0];
    };
    const Array lt = run(false), ref = run(true);
    ts::cuda::set_gemm_options(saved);
    EXPECT_TRUE(bitwise(lt, ref)) << m << "x" << n << "x" << k;
    EXPECT_TRUE(bitwise(lt, ts::quantized_matmul_op(x, w, c, &key).eval()))
        << m << "x" << n << "x" << k << " vs the CPU";
  }
}

}  // namespace
