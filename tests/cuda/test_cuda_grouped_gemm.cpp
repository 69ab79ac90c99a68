// The grouped GEMM kernels (backend/cuda/kernels/grouped_gemm.h) against the CPU's: the
// product and both gradients (the weight gradient's kernel), transposed or not, with an
// empty group and rows past the groups, in float32 and bfloat16; the same bits on a
// second run. Skips without a device.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "tessera/api/jit.h"
#include "tessera/backend/device_data.h"
#include "tessera/core/ops.h"
#include "tessera/core/transforms.h"

namespace ts = tessera;
using ts::Array;
using ts::Tree;

namespace {

std::vector<float> values(const Array& a) { return a.astype(ts::DType::Float32).to_vector<float>(); }

Array random(const ts::Shape& shape, uint32_t seed, ts::DType dtype) {
  std::vector<float> v(static_cast<size_t>(ts::numel(shape)));
  uint32_t s = seed;
  for (float& x : v) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<float>(s >> 8) / static_cast<float>(1u << 24) * 2.0f - 1.0f;
  }
  return Array::from_vector(v, shape).astype(dtype).eval();
}

// The product and the gradients of sum(product^2) for a and w.
ts::JitFn product_and_gradients(const Array& sizes, bool trans) {
  return [sizes, trans](const Tree& args, const ts::StaticArgs&) {
    auto loss = [&](const std::vector<Array>& in) {
      return ts::sum(ts::square(ts::astype(ts::grouped_matmul(in[0], in[1], sizes, trans), ts::DType::Float32)));
    };
    auto [value, grads] = ts::value_and_grad(loss)({args.at("a").leaf(), args.at("w").leaf()});
    return Tree{{"out", ts::grouped_matmul(args.at("a").leaf(), args.at("w").leaf(), sizes, trans)},
                {"da", grads[0]},
                {"dw", grads[1]}};
  };
}

TEST(GpuGroupedGemm, ProductAndGradientsMatchCpu) {
  TESSERA_REQUIRE_GPU();
  // 2 batches of 40 rows, 4 groups: batch 0 has an empty group, batch 1 leaves 3 rows over.
  const Array sizes = Array::from_vector(std::vector<int64_t>{10, 0, 20, 10, 7, 10, 10, 10}, {2, 4});
  for (const ts::DType dtype : {ts::DType::Float32, ts::DType::BFloat16})
    for (const bool trans : {false, true}) {
      const Array a = random({2, 40, 48}, 1, dtype);
      const Array w = random(trans ? ts::Shape{4, 32, 48} : ts::Shape{4, 48, 32}, 2, dtype);
      const ts::JitFn step = product_and_gradients(sizes, trans);
      const Tree args{{"a", a}, {"w", w}};
      const Tree cpu = ts::jit(step)(args);
      ts::JitOptions options;
      options.device = "cuda";
      ts::Jitted on_gpu = ts::jit(step, options);
      const Tree gpu = on_gpu(args);
      ASSERT_TRUE(ts::backend::on_device(gpu.at("out").leaf()));
      const double tolerance = dtype == ts::DType::Float32 ? ts::cuda_test::kF32Tolerance : 3e-2;
      const std::vector<Array> want = cpu.leaves(), got = gpu.leaves();
      const std::string what = std::string(ts::name(dtype)) + (trans ? " trans" : "");
      for (size_t i = 0; i < want.size(); ++i)
        EXPECT_LT(ts::cuda_test::rel_error(values(got[i]), values(want[i])), tolerance)
            << what << " " << cpu.paths()[i];
      // The rows past batch 1's groups are zero.
      const std::vector<float> out = values(gpu.at("out").leaf());
      for (size_t j = (40 + 37) * 32; j < out.size(); ++j) EXPECT_EQ(out[j], 0.0f) << what;
      const std::vector<Array> again = on_gpu(args).leaves();
      for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(values(again[i]), values(got[i])) << what << " run 2";
    }
}

// With a shard dim (expert parallelism's [S, G, N, K] by [S, E, K, M]): one grouped GEMM
// per shard on its own matrices, as on the CPU.
TEST(GpuGroupedGemm, AShardDimMatchesCpu) {
  TESSERA_REQUIRE_GPU();
  const Array sizes = Array::from_vector(std::vector<int64_t>{10, 0, 20, 10, 7, 10, 10, 10}, {2, 2, 2});
  const Array a = random({2, 2, 40, 48}, 3, ts::DType::Float32);
  const Array w = random({2, 2, 48, 32}, 4, ts::DType::Float32);
  const ts::JitFn step = product_and_gradients(sizes, false);
  const Tree args{{"a", a}, {"w", w}};
  const Tree cpu = ts::jit(step)(args);
  ts::JitOptions options;
  options.device = "cuda";
  const Tree gpu = ts::jit(step, options)(args);
  const std::vector<Array> want = cpu.leaves(), got = gpu.leaves();
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_LT(ts::cuda_test::rel_error(values(got[i]), values(want[i])), ts::cuda_test::kF32Tolerance)
        << cpu.paths()[i];
}

}  // namespace
