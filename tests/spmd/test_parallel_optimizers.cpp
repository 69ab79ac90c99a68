// Lion, Adafactor and Muon under FSDP and tensor parallelism equal one device: the
// optimizer state shaped like a parameter follows its layout, Adafactor's factored rows
// and columns and Muon's Newton-Schulz matrices are computed on sharded values (the
// partitioner inserts the collectives), and the result matches the unsharded run.
#include <gtest/gtest.h>

#include <cmath>

#include "spmd/parallel_train_util.h"
#include "spmd/spmd_test_util.h"
#include "tessera/spmd/api.h"
#include "tessera/train/parallel.h"
#include "tessera/train/train_step.h"

namespace tessera::train {
namespace {

using testing::VirtualDevices;

struct OptimizerRun {
  std::vector<double> losses;
  Tree params, opt;
};

// A Llama-family model: no attention biases. GPT-2's key bias has a gradient that is
// zero up to rounding (softmax ignores a constant shift), and Lion's sign and Adafactor's
// normalization by the gradient's own RMS turn that rounding noise into full-size steps
// that differ with the summation order: a comparison of noise, not of the math.
models::ModelConfig tiny_llama() {
  models::ModelConfig c = testing::tiny_gpt();
  c.family = "llama";
  c.kv_heads = 2;
  return c;
}

optim::OptimizerConfig config_for(const std::string& name) {
  optim::OptimizerConfig oc = testing::test_adamw();
  oc.name = name;
  oc.adafactor_min_dim_to_factor = 16;  // the tiny GPT's matrices factored
  return oc;
}

OptimizerRun run(const std::string& name, const std::string& mesh_text) {
  models::Model model(tiny_llama());
  optim::Optimizer optimizer(config_for(name), model.specs());
  Tree params = model.init(7), opt = optimizer.init(params);
  const std::optional<Layout> layout = testing::place_on_mesh(mesh_text, model, params, opt);
  TrainStep step(model, optimizer, 1, layout ? &*layout : nullptr);
  OptimizerRun r;
  for (int64_t s = 0; s < testing::kTrainSteps; ++s) {
    data::Batch b = testing::random_batch(testing::kTrainBatch, testing::kTrainSeq, 64, static_cast<uint64_t>(100 * s));
    r.losses.push_back(step.run(params, opt, {layout ? layout->shard_batch(b) : b}, 1e-3, std::nullopt).loss);
  }
  r.params = params;
  r.opt = opt;
  return r;
}

class ParallelOptimizers : public ::testing::TestWithParam<std::tuple<const char*, const char*>> {};

TEST_P(ParallelOptimizers, MatchOneDevice) {
  const std::string name = std::get<0>(GetParam()), mesh_text = std::get<1>(GetParam());
  const OptimizerRun want = run(name, "");
  VirtualDevices devices(spmd::Mesh::parse(mesh_text).size());
  const OptimizerRun got = run(name, mesh_text);
  for (size_t s = 0; s < want.losses.size(); ++s)
    EXPECT_NEAR(got.losses[s], want.losses[s], 1e-5 * std::abs(want.losses[s])) << "step " << s;
  std::vector<Array> g = got.params.leaves(), w = want.params.leaves();
  std::vector<std::string> paths = want.params.paths();
  const double rtol = 1e-5;
  for (size_t i = 0; i < g.size(); ++i) testing::expect_close(g[i], w[i], rtol, paths[i]);
  std::vector<Array> go = got.opt.leaves(), wo = want.opt.leaves();
  std::vector<std::string> opaths = want.opt.paths();
  for (size_t i = 0; i < go.size(); ++i)
    if (is_floating(wo[i].dtype())) testing::expect_close(go[i], wo[i], 1e-4, opaths[i]);
}

INSTANTIATE_TEST_SUITE_P(Meshes, ParallelOptimizers,
                         ::testing::Combine(::testing::Values("lion", "adafactor", "muon"),
                                            ::testing::Values("fsdp=4", "data=2,tensor=2")),
                         [](const auto& info) {
                           std::string text = std::string(std::get<0>(info.param)) + "_" + std::get<1>(info.param);
                           for (char& ch : text)
                             if (ch == '=' || ch == ',') ch = '_';
                           return text;
                         });

}  // namespace
}  // namespace tessera::train
