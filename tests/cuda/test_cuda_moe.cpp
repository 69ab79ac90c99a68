// A mixture-of-experts model (nn/moe.h: router softmax and top-k, the prefix-count
// matmuls, scatter-add and gathers of the dispatch, the experts' grouped GEMMs when
// dropless and batched GEMMs with a capacity) on the GPU: its loss and gradients match
// the CPU's, dropless and with a capacity, in float32 and bfloat16 compute. Skips
// without a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "tessera/api/jit.h"
#include "tessera/backend/cuda.h"
#include "tessera/backend/device_data.h"
#include "tessera/core/ops.h"
#include "tessera/core/transforms.h"
#include "tessera/models/model.h"

namespace ts = tessera;
using ts::Array;
using ts::Tree;

namespace {

std::vector<float> values(const Array& a) { return a.astype(ts::DType::Float32).to_vector<float>(); }

TEST(GpuMoE, LossAndGradientsMatchCpu) {
  TESSERA_REQUIRE_GPU();
  for (const char* dtype : {"float32", "bfloat16"})
    for (double capacity_factor : {0.0, 1.0}) {
      ts::models::ModelConfig c = ts::models::preset("mixtral-tiny");
      c.vocab = 64;
      c.dim = 64;
      c.context = 32;
      c.compute_dtype = dtype;
      c.moe_capacity_factor = capacity_factor;
      const ts::models::Model model(c);
      std::vector<int32_t> ids(4 * 32);
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 37 + 11) % 64);
      const Array tokens = Array::from_vector(ids, {4, 32});
      std::rotate(ids.begin(), ids.begin() + 1, ids.end());
      const Array targets = Array::from_vector(ids, {4, 32});
      auto step = [&](const Tree& a) {
        auto [loss, grads] =
            ts::value_and_grad([&](const Tree& p) { return model.loss(p, tokens, targets); })(a.at("params"));
        return Tree{{"loss", loss}, {"grads", grads}};
      };
      const Tree args{{"params", model.init(3)}};
      const Tree cpu = ts::jit(step)(args);
      ts::JitOptions options;
      options.device = "cuda";
      const Tree gpu = ts::jit(step, options)(args);
      ASSERT_TRUE(ts::backend::on_device(gpu.at("loss").leaf()));
      const double tolerance = std::string(dtype) == "float32" ? ts::cuda_test::kF32Tolerance : 3e-2;
      const std::vector<Array> want = cpu.leaves(), got = gpu.leaves();
      ASSERT_EQ(want.size(), got.size());
      for (size_t i = 0; i < want.size(); ++i)
        EXPECT_LT(ts::cuda_test::rel_error(values(got[i]), values(want[i])), tolerance)
            << dtype << " capacity " << capacity_factor << " " << cpu.paths()[i];
    }
}

}  // namespace
