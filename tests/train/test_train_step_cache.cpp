// TrainStep and the compilation cache's index: a second process compiling the same
// step (same model, optimizer, micro-batches, argument types) skips tracing every
// program and trains bitwise like the first; another optimizer setting traces anew.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/test_util.h"
#include "tessera/compiler/compilation_cache.h"
#include "tessera/train/train_step.h"
#include "train/tiny_corpus.h"

namespace tessera::train {
namespace {

namespace fs = std::filesystem;

data::Batch batch_of(uint32_t seed) {
  auto ids = [&](uint32_t s) {
    std::vector<int64_t> v = test::random_ints(2 * 16, s, 0, 63);
    return Array::from_vector(std::vector<int32_t>(v.begin(), v.end()), {2, 16});
  };
  return {ids(seed), ids(seed + 1)};
}

struct StepResult {
  Tree params, state;
  double loss = 0;
  int traces = 0;  // after compile()
};

// Two steps of a fresh TrainStep (as a new process builds it) with the cache in `dir`.
StepResult train_two_steps(const fs::path& dir, int64_t micro_batches, double weight_decay) {
  compiler::set_compilation_cache(dir.string());
  models::Model model(test::tiny_gpt_config());
  optim::OptimizerConfig oc;
  oc.weight_decay = weight_decay;
  optim::Optimizer optimizer(oc, model.specs());
  StepResult r;
  r.params = model.init(5);
  r.state = optimizer.init(r.params);
  TrainStep step(model, optimizer, micro_batches);
  std::vector<data::Batch> micro;
  for (int64_t i = 0; i < micro_batches; ++i) micro.push_back(batch_of(30 + static_cast<uint32_t>(i)));
  step.compile(r.params, r.state, micro[0], std::nullopt);
  r.traces = step.trace_count();
  for (int i = 0; i < 2; ++i) r.loss = step.run(r.params, r.state, micro, 1e-3, std::nullopt).loss;
  eval(r.params.leaves());
  eval(r.state.leaves());
  return r;
}

class TrainStepCacheTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = test::fresh_test_dir("tessera_step_cache"); }
  void TearDown() override {
    compiler::set_compilation_cache("");
    fs::remove_all(dir_);
  }
  fs::path dir_;
};

TEST_F(TrainStepCacheTest, WarmStepSkipsTracingAndTrainsBitwiseTheSame) {
  for (int64_t micro_batches : {1, 2}) {
    SCOPED_TRACE("micro_batches " + std::to_string(micro_batches));
    const int programs = micro_batches == 1 ? 1 : 3;
    const StepResult cold = train_two_steps(dir_, micro_batches, 0.1);
    EXPECT_EQ(cold.traces, programs);
    const auto before = compiler::compilation_cache_stats();
    const StepResult warm = train_two_steps(dir_, micro_batches, 0.1);
    const auto after = compiler::compilation_cache_stats();
    EXPECT_EQ(warm.traces, 0) << "every program comes from the index";
    EXPECT_EQ(after.index_hits - before.index_hits, static_cast<size_t>(programs));
    EXPECT_EQ(warm.loss, cold.loss);
    test::expect_bitwise_equal(warm.params, cold.params);
    test::expect_bitwise_equal(warm.state, cold.state);
  }
}

TEST_F(TrainStepCacheTest, AnotherOptimizerSettingTraces) {
  const StepResult cold = train_two_steps(dir_, 1, 0.1);
  ASSERT_EQ(cold.traces, 1);
  const StepResult other = train_two_steps(dir_, 1, 0.0);
  EXPECT_EQ(other.traces, 1) << "weight decay is part of the step's cache identity";
  EXPECT_EQ(train_two_steps(dir_, 1, 0.0).traces, 0);
}

}  // namespace
}  // namespace tessera::train
