// Training on packed documents (data::Batch with segments and positions): under a
// 2-device data-parallel mesh the step gives the one-device losses and parameters (the
// segment ids and positions are split along the batch like the tokens), for GPT-2 and
// llama, fused and with gradient accumulation. The packing reaches the loss (a plain
// batch of the same tokens trains differently), and a step fixed to packed batches
// refuses a plain one.
#include <gtest/gtest.h>

#include <random>

#include "parallel_train_util.h"
#include "spmd_test_util.h"
#include "tessera/models/model.h"
#include "tessera/optim/optimizer.h"
#include "tessera/train/parallel.h"
#include "tessera/train/train_step.h"

namespace tessera::train {
namespace {

using testing::expect_close;
using testing::packed_batch;
using testing::VirtualDevices;

constexpr int64_t kBatch = testing::kTrainBatch, kSeq = testing::kTrainSeq, kSteps = 3;

models::ModelConfig tiny(const std::string& family) {
  models::ModelConfig c = testing::tiny_gpt();
  if (family == "llama") {
    c.family = "llama";
    c.kv_heads = 2;
    c.mlp_dim = 48;
  }
  return c;
}

struct PackedRun {
  std::vector<double> losses;
  Tree params;
};

// kSteps AdamW steps on packed batches (plain ones when `plain`: the same tokens and
// targets without segments and positions).
PackedRun train(const std::string& family, const std::string& mesh_text, int64_t micro_batches, bool plain = false) {
  models::Model model(tiny(family));
  optim::Optimizer optimizer(testing::test_adamw(), model.specs());
  Tree params = model.init(7);
  Tree opt = optimizer.init(params);
  std::optional<Layout> layout;
  if (!mesh_text.empty()) {
    layout.emplace(spmd::Mesh::parse(mesh_text), default_axis_rules(), model.specs());
    params = layout->shard_params(params);
    opt = layout->shard_opt_state(opt);
  }
  TrainStep step(model, optimizer, micro_batches, layout ? &*layout : nullptr);
  PackedRun run;
  for (int64_t s = 0; s < kSteps; ++s) {
    std::vector<data::Batch> micro;
    for (int64_t m = 0; m < micro_batches; ++m) {
      data::Batch b = packed_batch(kBatch / micro_batches, kSeq, 64, static_cast<uint64_t>(100 * s + m));
      if (plain) {
        b.segments.reset();
        b.positions.reset();
      }
      micro.push_back(layout ? layout->shard_batch(b) : b);
    }
    run.losses.push_back(step.run(params, opt, micro, 1e-2, std::nullopt).loss);
  }
  if (layout) {
    const data::Batch placed = layout->shard_batch(packed_batch(kBatch, kSeq, 64, 1));
    for (const Array* a : {&*placed.segments, &*placed.positions}) {
      const spmd::Sharding* s = spmd::sharding_of(*a);
      EXPECT_TRUE(s != nullptr && *s == layout->batch(2)) << "packing arrays are split like the tokens";
    }
  }
  run.params = params;
  return run;
}

void expect_same(const PackedRun& got, const PackedRun& want, const std::string& what) {
  for (size_t s = 0; s < want.losses.size(); ++s)
    EXPECT_NEAR(got.losses[s], want.losses[s], 1e-5 * std::abs(want.losses[s])) << what << " step " << s;
  std::vector<Array> g = got.params.leaves(), w = want.params.leaves();
  std::vector<std::string> paths = want.params.paths();
  for (size_t i = 0; i < g.size(); ++i) expect_close(g[i], w[i], 1e-5, what + " " + paths[i]);
}

TEST(ParallelTrainPacked, DataParallelMatchesOneDevice) {
  for (const std::string family : {"gpt2", "llama"}) {
    for (int64_t micro : {1, 2}) {
      const std::string what = family + " micro_batches " + std::to_string(micro);
      const PackedRun want = train(family, "", micro);
      VirtualDevices devices(2);
      expect_same(train(family, "data=2", micro), want, what);
    }
  }
}

TEST(ParallelTrainPacked, PackingReachesTheLoss) {
  const PackedRun packed = train("llama", "", 1), plain = train("llama", "", 1, /*plain=*/true);
  EXPECT_GT(std::abs(packed.losses[0] - plain.losses[0]), 1e-4 * std::abs(plain.losses[0]));
}

TEST(ParallelTrainPacked, RefusesAPlainBatchAfterPackedOnes) {
  models::Model model(tiny("gpt2"));
  optim::Optimizer optimizer(testing::test_adamw(), model.specs());
  Tree params = model.init(7), opt = optimizer.init(params);
  TrainStep step(model, optimizer, 1);
  data::Batch packed = packed_batch(kBatch, kSeq, 64, 3);
  step.run(params, opt, {packed}, 1e-2, std::nullopt);
  data::Batch plain = packed;
  plain.segments.reset();
  plain.positions.reset();
  EXPECT_THROW(step.run(params, opt, {plain}, 1e-2, std::nullopt), ValueError);
  data::Batch half = packed;
  half.positions.reset();
  EXPECT_THROW(step.run(params, opt, {half}, 1e-2, std::nullopt), ValueError);
}

}  // namespace
}  // namespace tessera::train
