// Pipeline-parallel gradients (train/pipeline.h) on device threads against one device:
// GPT-2 (tied embedding) and Llama (untied head), every schedule on 2 and 4 pipeline
// devices, the loss and every parameter gradient within 1e-5 relative of
// value_and_grad(Model::loss), and three AdamW steps ending at the same parameters;
// the same result on every run; the stage balance the runner picks; the errors.
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
#include "train/pipeline_test_util.h"

namespace tessera::train {
namespace {

constexpr int64_t kBatch = testing::kPipelineBatch, kSeq = testing::kPipelineSeq;

models::ModelConfig config(const std::string& family) { return testing::pipeline_test_model(family); }

using testing::expect_trees_close;
Array random_ids(uint32_t seed) { return testing::random_pipeline_ids(seed); }

struct Case {
  PipelineKind kind;
  int devices, micro_batches, virtual_stages;
};

TEST(Pipeline, EverySchedulesGradientsAreTheOneDeviceGradients) {
  for (const std::string family : {"gpt2", "llama"}) {
    const models::Model model(config(family));
    const Tree params = model.init(5);
    const Array tokens = random_ids(1), targets = random_ids(2);
    const auto [want_loss, want_grads] =
        value_and_grad([&](const Tree& p) { return model.loss(p, tokens, targets); })(params);
    for (const Case& c : {Case{PipelineKind::kGPipe, 2, 4, 1}, Case{PipelineKind::kOneFOneB, 2, 4, 1},
                          Case{PipelineKind::kOneFOneB, 4, 8, 1}, Case{PipelineKind::kGPipe, 4, 2, 1},
                          Case{PipelineKind::kInterleaved, 2, 4, 2}}) {
      PipelineOptions o;
      o.kind = c.kind;
      o.devices = c.devices;
      o.micro_batches = c.micro_batches;
      o.virtual_stages = c.virtual_stages;
      const PipelineResult got = pipeline_value_and_grad(model, params, tokens, targets, o);
      const std::string what =
          fmt::format("{} {} p={} m={} v={}", family, to_string(c.kind), c.devices, c.micro_batches, c.virtual_stages);
      const double loss_error = std::abs(got.loss - want_loss.item<double>()) / std::abs(want_loss.item<double>());
      std::printf("%-28s loss %.7f (one device %.7f)  rel err %.1e  measured bubble %.2f\n", what.c_str(), got.loss,
                  want_loss.item<double>(), loss_error, got.measured.bubble_fraction);
      EXPECT_LT(loss_error, 1e-5) << what;
      expect_trees_close(got.grads, want_grads, 1e-5, what);
      EXPECT_EQ(got.stage_layers.size(), static_cast<size_t>(c.devices * c.virtual_stages)) << what;
      // Every op ran once, on its stage's device, in schedule order.
      for (int d = 0; d < c.devices; ++d) {
        ASSERT_EQ(got.measured.devices[d].size(), got.schedule.ops[d].size()) << what;
        for (size_t i = 0; i < got.schedule.ops[d].size(); ++i)
          EXPECT_EQ(got.measured.devices[d][i].op.stage, got.schedule.ops[d][i].stage) << what;
      }
    }
  }
}

TEST(Pipeline, ThreeAdamWStepsEndAtTheOneDeviceParametersAndRepeatBitwise) {
  const models::Model model(config("gpt2"));
  // AdamW as the SPMD tests run it (eps 1e-3: the attention key bias's gradient is
  // rounding noise, which a tiny eps would turn into full-size updates).
  const optim::Optimizer optimizer(testing::test_adamw(), model.specs());
  const Array lr = full(Shape{}, 1e-2, DType::Float32);
  PipelineOptions o;
  o.kind = PipelineKind::kOneFOneB;
  o.devices = 2;
  o.micro_batches = 4;
  auto train = [&](bool pipelined) {
    Tree params = model.init(7), state = optimizer.init(params);
    std::vector<double> losses;
    for (int step = 0; step < 3; ++step) {
      const Array tokens = random_ids(10 + step), targets = random_ids(20 + step);
      Tree grads;
      if (pipelined) {
        const PipelineResult r = pipeline_value_and_grad(model, params, tokens, targets, o);
        grads = r.grads;
        losses.push_back(r.loss);
      } else {
        const auto [loss, g] = value_and_grad([&](const Tree& p) { return model.loss(p, tokens, targets); })(params);
        grads = g;
        losses.push_back(loss.item<double>());
      }
      optim::Optimizer::Update u = optimizer.apply(params, grads, state, lr);
      params = u.params;
      state = u.state;
      for (const Array& leaf : params.leaves()) leaf.eval();
    }
    return std::make_pair(params, losses);
  };
  const auto [want, want_losses] = train(false);
  const auto [got, got_losses] = train(true);
  const auto [again, again_losses] = train(true);
  for (int step = 0; step < 3; ++step)
    EXPECT_LT(std::abs(got_losses[step] - want_losses[step]) / want_losses[step], 1e-5) << "step " << step;
  expect_trees_close(got, want, 1e-5, "after 3 AdamW steps");
  // Deterministic: the stages add their micro-batches' gradients in a fixed order.
  EXPECT_EQ(got_losses, again_losses);
  const std::vector<Array> a = got.leaves(), b = again.leaves();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].to_vector<float>(), b[i].to_vector<float>()) << "leaf " << i;
}

// Stages partitioned over the mesh's other axes (PipelineOptions::mesh): the same loss
// and gradients; their programs show the collectives the partitioner put in them.
TEST(Pipeline, PartitionedStagesGiveTheOneDeviceGradientsAndShowTheirPrograms) {
  testing::VirtualDevices devices(4);
  const models::Model model(config("llama"));
  const Tree params = model.init(5);
  const Array tokens = random_ids(1), targets = random_ids(2);
  const auto [want_loss, want_grads] =
      value_and_grad([&](const Tree& p) { return model.loss(p, tokens, targets); })(params);
  const double counted = static_cast<double>(kBatch * kSeq);
  for (const std::string mesh : {"pipeline=2,tensor=2", "fsdp=2,pipeline=2"}) {
    PipelineOptions o;
    o.kind = PipelineKind::kOneFOneB;
    o.micro_batches = 2;
    o.mesh = spmd::Mesh::parse(mesh);
    PipelineExecutor executor(model, o, kSeq);
    EXPECT_EQ(executor.devices_per_stage(), 2);
    EXPECT_NE(executor.text().find("not compiled yet"), std::string::npos);
    const PipelineResult got = executor.run(params, tokens, targets, 1.0 / counted);
    EXPECT_LT(std::abs(got.loss - want_loss.item<double>()) / want_loss.item<double>(), 1e-5) << mesh;
    expect_trees_close(got.grads, want_grads, 1e-5, mesh);
    EXPECT_GT(got.stage_collective_bytes, 0) << mesh;
    const std::string text = executor.text();
    for (const std::string& part :
         {std::string("each stage on 2 devices of mesh"), std::string("== stage 1 (pipeline device 1): layers 2-3 =="),
          std::string("-- backward --"),
          mesh.starts_with("fsdp") ? std::string("reduce_scatter") : std::string("all_reduce")})
      EXPECT_NE(text.find(part), std::string::npos) << mesh << ": no '" << part << "' in\n" << text;
    EXPECT_NE(executor.stage_summary().find("stage 1 backward: "), std::string::npos) << executor.stage_summary();
  }
  // Unpartitioned stages show their traced programs.
  PipelineExecutor plain(model, PipelineOptions{}, kSeq);
  plain.compile(params, tokens.shape());
  EXPECT_NE(plain.text().find("== stage 0 (pipeline device 0): layers 0-1 =="), std::string::npos) << plain.text();
  EXPECT_EQ(plain.stage_summary(), "");
  // Bad meshes.
  PipelineOptions o;
  o.mesh = spmd::Mesh::parse("tensor=2");
  EXPECT_NE(testing::error_of<ValueError>([&] {
              PipelineExecutor(model, o, kSeq);
            }).find("the mesh (tensor=2) needs a pipeline axis of the 2 pipeline devices"),
            std::string::npos);
  o.mesh = spmd::Mesh::parse("pipeline=4,fsdp=2");  // 8 devices, 4 present
  o.devices = 4;
  EXPECT_NE(testing::error_of<ValueError>([&] {
              PipelineExecutor(model, o, kSeq).run(params, tokens, targets, 1.0);
            }).find("needs 8 devices but 4 are present"),
            std::string::npos);
  o.devices = 2;
  o.mesh = spmd::Mesh::parse("pipeline=2,fsdp=2");
  o.micro_batches = 8;  // 1 row per pipeline micro-batch: it cannot split over fsdp=2
  EXPECT_NE(testing::error_of<ValueError>([&] {
              PipelineExecutor(model, o, kSeq).compile(params, tokens.shape());
            }).find("a pipeline micro-batch of 1 rows does not split over the 2 devices of the batch axes"),
            std::string::npos);
}

TEST(Pipeline, BadShapesAreClearErrors) {
  const models::Model model(config("gpt2"));
  const Tree params = model.init(1);
  const Array tokens = random_ids(1), targets = random_ids(2);
  auto message = [&](const PipelineOptions& o) {
    return testing::error_of<ValueError>([&] { pipeline_value_and_grad(model, params, tokens, targets, o); });
  };
  PipelineOptions o;
  o.micro_batches = 3;
  EXPECT_NE(message(o).find("the batch of 8 rows does not split into 3 equal micro-batches"), std::string::npos);
  o = {};
  o.devices = 8;  // 8 stages, 4 layers
  EXPECT_NE(message(o).find("4 layers cannot fill 8 stages"), std::string::npos);
  o = {};
  o.stage_layers = {{0, 1}, {2, 4}};
  EXPECT_NE(message(o).find("stage 1 has layers [2, 4); expected a non-empty range starting at layer 1"),
            std::string::npos);
  o.stage_layers = {{0, 1}, {1, 3}};
  EXPECT_NE(message(o).find("the stages end at layer 3; the model has 4 layers"), std::string::npos);
  // Packing whose shape is not the tokens'.
  o = {};
  const models::Packing short_packing{zeros({kBatch, kSeq - 1}, DType::Int32), zeros({kBatch, kSeq}, DType::Int32)};
  EXPECT_NE(testing::error_of<ShapeError>([&] {
              PipelineExecutor(model, o, kSeq).run(params, tokens, targets, 1.0, short_packing);
            }).find("packing segments [8, 15] and positions [8, 16] must have the tokens' shape [8, 16]"),
            std::string::npos);
  EXPECT_NE(testing::error_of<ShapeError>([&] {
              model.stage_forward(params, tokens, 0, true, std::nullopt, short_packing);
            }).find("Model::stage_forward: packing segments are [8, 15] (expected the batch [8, 16])"),
            std::string::npos);
  o = {};
  o.kind = PipelineKind::kInterleaved;
  o.virtual_stages = 2;
  o.micro_batches = 4;
  o.devices = 4;
  EXPECT_NE(message(o).find("4 layers cannot fill 8 stages"), std::string::npos);
}

}  // namespace
}  // namespace tessera::train
