// A mixture-of-experts model (nn/moe.h, the llama family with moe_experts) trained on a
// mesh: data, FSDP, tensor and expert axes (the experts' weights split over `expert`,
// the batch too) give the one-device losses and parameters after 3 AdamW steps
// (relative < 1e-5), dropless and with a capacity factor. The partitioner places the
// routing's gathers and prefix counts; an all-to-all dispatch is not built yet.
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "spmd/parallel_train_util.h"
#include "spmd/spmd_test_util.h"
#include "tessera/models/model.h"
#include "tessera/optim/optimizer.h"
#include "tessera/spmd/api.h"
#include "tessera/train/parallel.h"
#include "tessera/train/train_step.h"

namespace tessera::train {
namespace {

using testing::expect_close;
using testing::VirtualDevices;

constexpr int64_t kBatch = 8, kSeq = 16, kSteps = 3;

models::ModelConfig mixtral(double capacity_factor) {
  models::ModelConfig c = models::preset("mixtral-tiny");
  c.vocab = 64;
  c.dim = 32;
  c.heads = 4;
  c.kv_heads = 2;
  c.mlp_dim = 48;
  c.context = kSeq;
  c.moe_capacity_factor = capacity_factor;
  return c;
}

struct MoeRun {
  std::vector<double> losses;
  Tree params;
};

MoeRun train(const models::ModelConfig& c, const std::string& mesh_text) {
  const models::Model model(c);
  const optim::Optimizer optimizer(testing::test_adamw(), model.specs());
  Tree params = model.init(3), opt = optimizer.init(params);
  std::optional<Layout> layout;
  if (!mesh_text.empty()) {
    layout.emplace(spmd::Mesh::parse(mesh_text), default_axis_rules(), model.specs());
    params = layout->shard_params(params);
    opt = layout->shard_opt_state(opt);
  }
  TrainStep step(model, optimizer, 1, layout ? &*layout : nullptr);
  MoeRun run;
  for (int64_t s = 0; s < kSteps; ++s) {
    data::Batch b = testing::random_batch(kBatch, kSeq, c.vocab, static_cast<uint64_t>(10 + s));
    run.losses.push_back(step.run(params, opt, {layout ? layout->shard_batch(b) : b}, 1e-2, std::nullopt).loss);
  }
  run.params = layout ? Layout::gather(params) : params;
  return run;
}

TEST(ParallelMoE, EveryLayoutTrainsAsOneDevice) {
  for (double factor : {0.0, 1.0}) {
    const models::ModelConfig c = mixtral(factor);
    const MoeRun want = train(c, "");
    for (const char* mesh : {"data=2", "fsdp=2", "tensor=2", "expert=2", "expert=2,tensor=2"}) {
      const std::string what = std::string(mesh) + " capacity factor " + std::to_string(factor);
      VirtualDevices devices(spmd::Mesh::parse(mesh).size());
      const MoeRun got = train(c, mesh);
      for (int64_t s = 0; s < kSteps; ++s)
        EXPECT_NEAR(got.losses[s], want.losses[s], 1e-5 * want.losses[s]) << what << " step " << s;
      const std::vector<Array> g = got.params.leaves(), w = want.params.leaves();
      const std::vector<std::string> paths = want.params.paths();
      for (size_t i = 0; i < g.size(); ++i) expect_close(g[i], w[i], 1e-5, what + " " + paths[i]);
    }
  }
  // The experts' weights are split over the expert axis.
  const models::Model model(mixtral(0));
  const Layout layout(spmd::Mesh::parse("expert=2"), default_axis_rules(), model.specs());
  EXPECT_EQ(layout.param("layers.0.moe.gate.w").to_string(), "P('expert')");
}

}  // namespace
}  // namespace tessera::train
