// A GPT training step under data parallel, FSDP, tensor parallel and their
// combinations gives the loss and parameters of one device (3 AdamW steps), keeps
// every layout, and sends the bytes the layouts imply.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <iostream>
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
using testing::VirtualDevices;

struct TrainRun {
  std::vector<double> losses;
  Tree params;
  double summary_bytes = 0, measured_bytes = 0;
};

constexpr int64_t kBatch = testing::kTrainBatch, kSeq = testing::kTrainSeq, kSteps = testing::kTrainSteps;

TrainRun train(const std::string& mesh_text, int64_t micro_batches = 1, const std::string& rules = "") {
  models::Model model(testing::tiny_gpt());
  optim::OptimizerConfig oc = testing::test_adamw();
  optim::Optimizer optimizer(oc, model.specs());
  Tree params = model.init(7);
  Tree opt = optimizer.init(params);
  std::optional<Layout> layout;
  if (!mesh_text.empty()) {
    layout.emplace(spmd::Mesh::parse(mesh_text), parse_axis_rules(rules), model.specs());
    params = layout->shard_params(params);
    opt = layout->shard_opt_state(opt);
  }
  TrainStep step(model, optimizer, micro_batches, layout ? &*layout : nullptr);
  TrainRun run;
  for (int64_t s = 0; s < kSteps; ++s) {
    std::vector<data::Batch> micro;
    for (int64_t m = 0; m < micro_batches; ++m) {
      data::Batch b = testing::random_batch(kBatch / micro_batches, kSeq, 64, static_cast<uint64_t>(100 * s + m));
      micro.push_back(layout ? layout->shard_batch(b) : b);
    }
    run.losses.push_back(step.run(params, opt, micro, 1e-2, std::nullopt).loss);
  }
  if (layout) {
    if (std::getenv("TESSERA_TEST_VERBOSE"))
      for (const auto& p : step.spmd_programs()) std::cout << p->program().summary.text();
    for (const auto& p : step.spmd_programs()) {
      run.summary_bytes += p->program().summary.per_device.total_bytes();
      run.measured_bytes += p->last_comm_stats().at(0).total_bytes();
    }
    std::vector<Array> leaves = params.leaves();
    std::vector<std::string> paths = params.paths();
    for (size_t i = 0; i < leaves.size(); ++i) {
      const spmd::Sharding* s = spmd::sharding_of(leaves[i]);
      EXPECT_TRUE(s != nullptr && *s == layout->param(paths[i])) << paths[i] << " lost its layout";
    }
  }
  run.params = params;
  return run;
}

const TrainRun& single_device() {
  static const TrainRun run = train("");
  return run;
}

class ParallelTrain : public ::testing::TestWithParam<const char*> {};

TEST_P(ParallelTrain, MatchesOneDeviceAndSendsTheAnalyticBytes) {
  spmd::Mesh mesh = spmd::Mesh::parse(GetParam());
  const TrainRun& want = single_device();
  VirtualDevices devices(mesh.size());
  TrainRun got = train(GetParam());
  for (int64_t s = 0; s < kSteps; ++s)
    EXPECT_NEAR(got.losses[static_cast<size_t>(s)], want.losses[static_cast<size_t>(s)],
                1e-5 * std::abs(want.losses[static_cast<size_t>(s)]))
        << "step " << s;
  std::vector<Array> g = got.params.leaves(), w = want.params.leaves();
  std::vector<std::string> paths = want.params.paths();
  for (size_t i = 0; i < g.size(); ++i) expect_close(g[i], w[i], 1e-5, paths[i]);

  models::Model model(testing::tiny_gpt());
  Layout layout(mesh, default_axis_rules(), model.specs());
  double analytic = layout.analytic_step_bytes(testing::tiny_gpt().layers, testing::tiny_gpt().dim, kBatch, kSeq);
  // Scalar reductions (loss, token count, gradient norm) are not in the analytic count.
  EXPECT_GE(got.summary_bytes, analytic);
  EXPECT_LE(got.summary_bytes, analytic + 256) << "analytic " << analytic;
  EXPECT_DOUBLE_EQ(got.measured_bytes, got.summary_bytes);
}

INSTANTIATE_TEST_SUITE_P(Layouts, ParallelTrain,
                         ::testing::Values("data=4", "fsdp=4", "data=2,tensor=2", "fsdp=2,tensor=2", "tensor=4",
                                           "data=2,fsdp=2,tensor=2"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string name = info.param;
                           for (char& ch : name)
                             if (ch == '=' || ch == ',') ch = '_';
                           return name;
                         });

TEST(ParallelTrain, VocabularyReplicatedTensorParallelMatchesOneDevice) {
  // vocab= (not split): the tied embedding, the head and the loss run whole on every
  // tensor-parallel device; the default (vocab=tensor) is covered by the layouts above.
  const TrainRun& want = single_device();
  VirtualDevices devices(4);
  TrainRun got = train("data=2,tensor=2", 1, "vocab=");
  for (int64_t s = 0; s < kSteps; ++s)
    EXPECT_NEAR(got.losses[static_cast<size_t>(s)], want.losses[static_cast<size_t>(s)],
                1e-5 * std::abs(want.losses[static_cast<size_t>(s)]));
  std::vector<Array> g = got.params.leaves(), w = want.params.leaves();
  std::vector<std::string> paths = want.params.paths();
  for (size_t i = 0; i < g.size(); ++i) expect_close(g[i], w[i], 1e-5, paths[i]);
  EXPECT_EQ(spmd::sharding_of(got.params.at("wte").leaf())->to_string(), "replicated");
  models::Model model(testing::tiny_gpt());
  Layout layout(spmd::Mesh::parse("data=2,tensor=2"), parse_axis_rules("vocab="), model.specs());
  double analytic = layout.analytic_step_bytes(testing::tiny_gpt().layers, testing::tiny_gpt().dim, kBatch, kSeq);
  EXPECT_GE(got.summary_bytes, analytic);
  EXPECT_LE(got.summary_bytes, analytic + 256) << "analytic " << analytic;
}

// One device is a 1-device mesh: the trainer's layout for it (Layout::one_device)
// places nothing and compiles the plain program. Partitioning the same step onto that
// mesh (arguments placed on it, so jit runs the partitioner and the SPMD executable)
// must give bitwise the same losses and parameters: the identity placement is exactly
// what the partitioner would do.
TEST(ParallelTrain, OneDeviceLayoutIsThePartitionedProgramOnAOneDeviceMeshBitwise) {
  models::Model model(testing::tiny_gpt());
  optim::Optimizer optimizer(testing::test_adamw(), model.specs());
  const Layout one = Layout::one_device(model.specs());
  ASSERT_TRUE(one.splits_nothing());
  const spmd::Mesh mesh = one.mesh();
  ASSERT_EQ(mesh.size(), 1);
  auto place = [&](const Array& a) { return spmd::device_put(a, spmd::Sharding::replicated(mesh, a.ndim()), "test"); };
  struct Run {
    std::vector<double> losses;
    Tree params;
    size_t spmd_programs = 0;
  };
  auto run = [&](bool partitioned, int64_t micro_batches) {
    Tree params = model.init(7), opt = optimizer.init(params);
    params = partitioned ? params.map(place) : one.shard_params(params);
    opt = partitioned ? opt.map(place) : one.shard_opt_state(opt);
    TrainStep step(model, optimizer, micro_batches, &one);
    Run r;
    for (int64_t s = 0; s < kSteps; ++s) {
      std::vector<data::Batch> micro;
      for (int64_t m = 0; m < micro_batches; ++m) {
        data::Batch b = testing::random_batch(kBatch / micro_batches, kSeq, 64, static_cast<uint64_t>(100 * s + m));
        micro.push_back(partitioned ? data::Batch{place(b.tokens), place(b.targets)} : one.shard_batch(b));
      }
      r.losses.push_back(step.run(params, opt, micro, 1e-2, std::nullopt).loss);
    }
    r.params = Layout::gather(params);
    r.spmd_programs = step.spmd_programs().size();
    return r;
  };
  for (int64_t micro_batches : {1, 2}) {
    SCOPED_TRACE("micro_batches " + std::to_string(micro_batches));
    const Run plain = run(false, micro_batches), partitioned = run(true, micro_batches);
    EXPECT_EQ(plain.spmd_programs, 0u) << "the 1-device layout must compile the plain program";
    EXPECT_GT(partitioned.spmd_programs, 0u) << "arguments placed on the mesh must go through the partitioner";
    for (size_t s = 0; s < plain.losses.size(); ++s) EXPECT_EQ(plain.losses[s], partitioned.losses[s]) << "step " << s;
    std::vector<Array> p = plain.params.leaves(), q = partitioned.params.leaves();
    std::vector<std::string> paths = plain.params.paths();
    ASSERT_EQ(p.size(), q.size());
    for (size_t i = 0; i < p.size(); ++i) {
      EXPECT_EQ(spmd::sharding_of(p[i]), nullptr) << paths[i] << ": the 1-device layout placed a shard";
      const std::vector<float> a = p[i].to_vector<float>(), b = q[i].to_vector<float>();
      ASSERT_EQ(a.size(), b.size()) << paths[i];
      EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << paths[i] << " differs";
    }
  }
}

TEST(ParallelTrain, GradientAccumulationKeepsFsdpLayouts) {
  VirtualDevices devices(4);
  // Two micro-batches of 4 are not the single-device run's one batch of 8 (different
  // random batches), so compare against an unsharded run with the same micro-batches.
  TrainRun got = train("fsdp=4", 2);
  TrainRun ref = train("", 2);
  for (int64_t s = 0; s < kSteps; ++s)
    EXPECT_NEAR(got.losses[static_cast<size_t>(s)], ref.losses[static_cast<size_t>(s)],
                1e-5 * std::abs(ref.losses[static_cast<size_t>(s)]));
  std::vector<Array> g = got.params.leaves(), w = ref.params.leaves();
  for (size_t i = 0; i < g.size(); ++i) expect_close(g[i], w[i], 1e-5, "param");
}

}  // namespace
}  // namespace tessera::train
