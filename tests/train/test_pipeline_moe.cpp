// Mixture-of-experts models (nn/moe.h) in pipeline stages (train/pipeline.h): the stages
// hand on the routing figures the load-balancing loss averages over every layer, so
//   - with one micro-batch the stages compose to Model::loss and its gradients;
//   - with m micro-batches the step is one device's with m accumulation steps over the
//     same rows (each micro-batch has its own load-balancing term, as accumulation does);
// for every schedule, dropless and with a capacity, alone, with replicas and gradient
// accumulation, with kept activations, and with the stages partitioned over expert,
// tensor and FSDP axes (keeping their activations too); three AdamW steps to 1e-5,
// repeated bitwise. Evaluation's whole-
// batch term is in test_pipeline_eval.cpp, the multi-process runs in
// tests/spmd/multiprocess/train_main.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/test_util.h"
#include "spmd/parallel_train_util.h"
#include "spmd/spmd_test_util.h"
#include "tessera/models/model.h"
#include "tessera/optim/optimizer.h"
#include "tessera/tessera.h"
#include "tessera/train/pipeline.h"
#include "tessera/train/pipeline_step.h"
#include "tessera/train/train_step.h"
#include "train/pipeline_test_util.h"

namespace tessera::train {
namespace {

constexpr int64_t kBatch = testing::kPipelineBatch, kSeq = testing::kPipelineSeq, kSteps = 3;

// The pipeline tests' Llama with 4 SwiGLU experts per layer, each token routed to 2.
models::ModelConfig moe_config(double capacity_factor = 0) {
  models::ModelConfig c = testing::pipeline_test_model("llama");
  c.moe_experts = 4;
  c.moe_top_k = 2;
  c.moe_capacity_factor = capacity_factor;
  c.moe_aux_loss_coef = 0.05;  // large enough that a wrong term shows
  return c;
}

using testing::expect_trees_close;
Array random_ids(uint32_t seed) { return testing::random_pipeline_ids(seed); }

// One device's loss and gradients with the batch in `parts` accumulation steps of
// consecutive rows: the mean of each part's Model::loss and gradients.
std::pair<double, Tree> accumulated(const models::Model& model, const Tree& params, const Array& tokens,
                                    const Array& targets, int64_t parts) {
  const int64_t rows = tokens.shape(0) / parts;
  double loss = 0;
  Tree sum;
  for (int64_t i = 0; i < parts; ++i) {
    const Array t = slice_axis(tokens, 0, i * rows, (i + 1) * rows),
                y = slice_axis(targets, 0, i * rows, (i + 1) * rows);
    const auto [value, grads] = value_and_grad([&](const Tree& p) { return model.loss(p, t, y); })(params);
    loss += value.item<double>() / static_cast<double>(parts);
    std::vector<Array> leaves = grads.leaves();
    const std::vector<Array> before = i == 0 ? std::vector<Array>{} : sum.leaves();
    for (size_t j = 0; j < leaves.size(); ++j) {
      leaves[j] = leaves[j] / static_cast<double>(parts);
      leaves[j] = (i == 0 ? leaves[j] : before[j] + leaves[j]).eval();
    }
    sum = grads.with_leaves(leaves);
  }
  return {loss, sum};
}

struct Case {
  PipelineKind kind;
  int devices, micro_batches, virtual_stages;
  bool recompute = true;
};

TEST(PipelineMoE, StagesGiveOneDevicesGradientsWithAsManyAccumulationSteps) {
  for (const double factor : {0.0, 1.0}) {
    const models::Model model(moe_config(factor));
    const Tree params = model.init(5);
    const Array tokens = random_ids(1), targets = random_ids(2);
    for (const Case& c :
         {Case{PipelineKind::kOneFOneB, 2, 1, 1}, Case{PipelineKind::kOneFOneB, 4, 1, 1},
          Case{PipelineKind::kGPipe, 2, 4, 1}, Case{PipelineKind::kOneFOneB, 2, 4, 1},
          Case{PipelineKind::kOneFOneB, 4, 2, 1}, Case{PipelineKind::kInterleaved, 2, 2, 2},
          Case{PipelineKind::kOneFOneB, 2, 1, 1, false}, Case{PipelineKind::kOneFOneB, 2, 4, 1, false}}) {
      PipelineOptions o = testing::pipeline_options(c.kind, c.devices, c.micro_batches, c.virtual_stages);
      o.recompute = c.recompute;
      const std::string what = fmt::format("capacity {} {} p={} m={} v={}{}", factor, to_string(c.kind), c.devices,
                                           c.micro_batches, c.virtual_stages, c.recompute ? "" : " kept");
      const PipelineResult got = pipeline_value_and_grad(model, params, tokens, targets, o);
      const auto [want_loss, want_grads] = accumulated(model, params, tokens, targets, c.micro_batches);
      const double error = std::abs(got.loss - want_loss) / want_loss;
      std::printf("%-36s loss %.7f (one device, %d accumulation steps: %.7f) rel err %.1e\n", what.c_str(), got.loss,
                  c.micro_batches, want_loss, error);
      EXPECT_LT(error, 1e-6) << what;
      expect_trees_close(got.grads, want_grads, 1e-5, what);
      // The load-balancing term is in: without it the router's gradient is another.
      if (c.micro_batches == 1 && c.devices == 2 && factor == 0) {
        models::ModelConfig plain = moe_config(factor);
        plain.moe_aux_loss_coef = 0;
        const models::Model without(plain);
        const PipelineResult other = pipeline_value_and_grad(without, params, tokens, targets, o);
        EXPECT_GT(got.loss - other.loss, 1e-3) << what;
        const Array& router = got.grads.at("layers").elements()[0].at("moe").at("router").at("w").leaf();
        const Array& router_without = other.grads.at("layers").elements()[0].at("moe").at("router").at("w").leaf();
        EXPECT_GT(max(abs(router - router_without)).item<double>(), 1e-6) << what;
      }
    }
  }
}

optim::OptimizerConfig adamw() {
  optim::OptimizerConfig o = testing::test_adamw();
  o.clip_norm = 0.5;
  return o;
}

struct TrainedRun {
  std::vector<double> losses, norms;
  Tree params;
};

// Rows [first, first + n) of a batch.
data::Batch rows(const data::Batch& b, int64_t first, int64_t n) {
  data::Batch out = b;
  out.tokens = slice_axis(b.tokens, 0, first, first + n).eval();
  out.targets = slice_axis(b.targets, 0, first, first + n).eval();
  return out;
}

// kSteps steps on fixed batches of kBatch rows, each in `accumulation` steps, and each of
// those split `split` ways more (consecutive rows) when `split` > 1: one device's
// accumulation over the pipeline's micro-batches.
TrainedRun train(const models::Model& model, const optim::Optimizer& optimizer, int64_t accumulation, int64_t split,
                 const std::function<StepStats(Tree&, Tree&, const std::vector<data::Batch>&)>& step) {
  TrainedRun run;
  Tree params = model.init(3), state = optimizer.init(params);
  for (int64_t s = 0; s < kSteps; ++s) {
    std::vector<data::Batch> micro;
    const int64_t rows_each = kBatch / accumulation;
    for (int64_t i = 0; i < accumulation; ++i) {
      const data::Batch b = testing::random_batch(rows_each, kSeq, 64, static_cast<uint64_t>(100 * s + i));
      for (int64_t k = 0; k < split; ++k)
        micro.push_back(split == 1 ? b : rows(b, k * rows_each / split, rows_each / split));
    }
    const StepStats stats = step(params, state, micro);
    run.losses.push_back(stats.loss);
    run.norms.push_back(stats.grad_norm);
  }
  run.params = params;
  return run;
}

struct StepCase {
  std::string mesh;  // "": threads, no partitioned stages
  PipelineKind kind;
  int micro_batches, virtual_stages, replicas;
  int64_t accumulation;
  bool recompute = true;
};

TEST(PipelineMoE, EveryLayoutTrainsAsOneDeviceWithAsManyAccumulationSteps) {
  testing::VirtualDevices devices(8);
  const models::Model model(moe_config());
  const optim::Optimizer optimizer(adamw(), model.specs());
  for (const StepCase& c :
       {StepCase{"", PipelineKind::kOneFOneB, 2, 1, 1, 1}, StepCase{"", PipelineKind::kGPipe, 2, 1, 2, 1},
        StepCase{"", PipelineKind::kInterleaved, 2, 2, 1, 2},
        StepCase{"", PipelineKind::kOneFOneB, 2, 1, 1, 1, /*recompute=*/false},
        StepCase{"pipeline=2,expert=2", PipelineKind::kOneFOneB, 2, 1, 1, 1},
        StepCase{"pipeline=2,tensor=2", PipelineKind::kGPipe, 2, 1, 1, 1},
        StepCase{"pipeline=2,fsdp=2,expert=2", PipelineKind::kOneFOneB, 1, 1, 1, 2},
        StepCase{"pipeline=2,expert=2", PipelineKind::kGPipe, 2, 1, 1, 1, /*recompute=*/false},
        StepCase{"pipeline=2,fsdp=2,expert=2", PipelineKind::kOneFOneB, 1, 1, 1, 2, /*recompute=*/false}}) {
    const std::string what = fmt::format(
        "{} {} m={} v={} data={} accumulation={}{}", c.mesh.empty() ? "threads" : c.mesh, to_string(c.kind),
        c.micro_batches, c.virtual_stages, c.replicas, c.accumulation, c.recompute ? "" : " kept activations");
    // One device accumulates over every pipeline micro-batch of every replica.
    const int64_t split = int64_t{c.replicas} * c.micro_batches;
    TrainStep one(model, optimizer, c.accumulation * split);
    const TrainedRun want = train(model, optimizer, c.accumulation, split, [&](Tree& p, Tree& s, const auto& micro) {
      return one.run(p, s, micro, 1e-2, std::nullopt);
    });
    PipelineOptions o = testing::pipeline_options(c.kind, 2, c.micro_batches, c.virtual_stages, c.mesh);
    o.recompute = c.recompute;
    PipelineTrainStep pipe(model, optimizer, c.accumulation, o, c.replicas, kSeq);
    auto pipelined = [&](Tree& p, Tree& s, const auto& micro) { return pipe.run(p, s, micro, 1e-2); };
    const TrainedRun got = train(model, optimizer, c.accumulation, 1, pipelined);
    for (int64_t s = 0; s < kSteps; ++s) {
      std::printf("%-60s step %lld loss %.7f (one device %.7f) norm %.6f (%.6f)\n", what.c_str(),
                  static_cast<long long>(s), got.losses[s], want.losses[s], got.norms[s], want.norms[s]);
      EXPECT_LT(std::abs(got.losses[s] - want.losses[s]) / want.losses[s], 1e-5) << what << " step " << s;
      EXPECT_LT(std::abs(got.norms[s] - want.norms[s]) / want.norms[s], 1e-5) << what << " step " << s;
    }
    expect_trees_close(got.params, want.params, 1e-5, what);
    const TrainedRun again = train(model, optimizer, c.accumulation, 1, pipelined);
    EXPECT_EQ(again.losses, got.losses) << what;
    const std::vector<Array> x = got.params.leaves(), z = again.params.leaves();
    for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(z[i].to_vector<float>(), x[i].to_vector<float>()) << what;
    if (c.mesh.find("expert") != std::string::npos) {  // the experts' dispatch crossed devices
      EXPECT_NE(pipe.describe().find("all_to_all"), std::string::npos) << pipe.describe();
    }
  }
}

TEST(PipelineMoE, RoutingFiguresAreCheckedAndHandedOn) {
  const models::Model model(moe_config());
  const Tree params = model.init(1);
  const Array tokens = random_ids(1), targets = random_ids(2);
  Tree first = Tree::dict(), rest = Tree::dict();
  const std::vector<Tree>& layers = params.at("layers").elements();
  first["layers"] = Tree::list({layers[0], layers[1]});
  first["wte"] = params.at("wte");
  rest["layers"] = Tree::list({layers[2], layers[3]});
  rest["lnf"] = params.at("lnf");
  rest["head"] = params.at("head");
  const models::Model::StageOutput a = model.stage_forward(first, tokens, 0, true, std::nullopt);
  ASSERT_TRUE(a.routing.valid());
  EXPECT_EQ(a.routing.shape(), (Shape{3, 4}));  // top_k + 1 rows of the 4 experts
  // Each layer's choice shares of a choice sum to 1 over the experts; P sums to 1 too.
  for (const float row : sum(a.routing, {1}).to_vector<float>()) EXPECT_NEAR(row, 2.0, 1e-5);
  const models::Model::StageOutput b =
      model.stage_forward(rest, a.out, 2, false, targets, std::nullopt, std::nullopt, a.routing);
  // The two parts compose to loss() times the counted targets.
  const double whole = model.loss(params, tokens, targets).item<double>() * static_cast<double>(kBatch * kSeq);
  EXPECT_NEAR(b.out.item<double>(), whole, 1e-5 * whole);
  EXPECT_LT(b.cross_entropy.item<double>(), b.out.item<double>());
  // Bad figures are named.
  auto error = [&](const std::function<void()>& f) { return testing::error_of<ValueError>(f); };
  EXPECT_NE(error([&] {
              model.stage_forward(rest, a.out, 2, false, targets);
            }).find("needs the routing figures of the layers before it"),
            std::string::npos);
  EXPECT_NE(
      error([&] {
        model.stage_forward(rest, a.out, 2, false, targets, std::nullopt, std::nullopt, zeros({2, 4}, DType::Float32));
      }).find("routing figures f32[2, 4] (expected f32[3, 4]"),
      std::string::npos);
  EXPECT_NE(error([&] {
              model.stage_forward(first, tokens, 0, true, std::nullopt, std::nullopt, std::nullopt, a.routing);
            }).find("into the first part (it takes none)"),
            std::string::npos);
}

}  // namespace
}  // namespace tessera::train
