// The trainer on a device mesh (parallel.mesh): it trains like one device, resumes
// bitwise on the same mesh, and a checkpoint written under one mesh resumes under
// another; the same for a mesh with a pipeline axis (train/pipeline_step.h).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <string>

#include "spmd_test_util.h"
#include "tessera/data/token_file.h"
#include "tessera/train/trainer.h"
#include "train/tiny_corpus.h"

namespace tessera::train {
namespace {

namespace fs = std::filesystem;
using testing::expect_close;
using testing::VirtualDevices;

class ParallelTrainer : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::fresh_test_dir("tessera_parallel_");
    test::write_tiny_corpus(dir_, 20000, 18000);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // eps = 1e-3: see test_parallel_train.cpp (the key bias's gradient is rounding noise).
  TrainConfig config(const std::string& run, const std::string& mesh, int64_t steps) const {
    std::vector<std::string> overrides = {"model.family=\"gpt2\"",
                                          "model.vocab=256",
                                          "model.dim=32",
                                          "model.layers=2",
                                          "model.heads=2",
                                          "model.context=32",
                                          "train.seq=32",
                                          "train.batch=4",
                                          "train.eval_batches=2",
                                          "train.steps=" + std::to_string(steps),
                                          "checkpoint.interval=2",
                                          "optimizer.lr=3e-3",
                                          "optimizer.eps=1e-3",
                                          "run.seed=11",
                                          "parallel.mesh=\"" + mesh + "\"",
                                          "data.train=\"" + (dir_ / "data/train.bin").string() + "\"",
                                          "data.val=\"" + (dir_ / "data/val.bin").string() + "\"",
                                          "run.dir=\"" + (dir_ / run).string() + "\""};
    return parse_config("", "test", overrides);
  }
  static TrainerOptions quiet(int64_t stop_at = 0) { return test::quiet_trainer(stop_at); }
  static void expect_trees_close(const Tree& a, const Tree& b, double rtol) {
    std::vector<Array> x = a.leaves(), y = b.leaves();
    std::vector<std::string> paths = a.paths();
    ASSERT_EQ(x.size(), y.size());
    for (size_t i = 0; i < x.size(); ++i) expect_close(x[i], y[i], rtol, paths[i]);
  }
  static void expect_bitwise(const Tree& a, const Tree& b) {
    std::vector<Array> x = a.leaves(), y = b.leaves();
    std::vector<std::string> paths = a.paths();
    for (size_t i = 0; i < x.size(); ++i) {
      Array gx = spmd::gather(x[i]), gy = spmd::gather(y[i]);
      ASSERT_EQ(gx.nbytes(), gy.nbytes());
      EXPECT_EQ(std::memcmp(gx.raw_data(), gy.raw_data(), gx.nbytes()), 0) << paths[i] << " differs";
    }
  }
  fs::path dir_;
};

TEST_F(ParallelTrainer, FsdpTensorRunMatchesOneDevice) {
  VirtualDevices devices(4);
  Trainer one(config("one", "", 6), quiet());
  one.run();
  Trainer sharded(config("sharded", "fsdp=2,tensor=2", 6), quiet());
  const TrainSummary s = sharded.run();
  EXPECT_EQ(s.end_step, 6);
  EXPECT_NE(s.parallel_summary.find("mesh (fsdp=2, tensor=2)"), std::string::npos) << s.parallel_summary;
  ASSERT_NE(spmd::sharding_of(sharded.params().at("wte").leaf()), nullptr);
  expect_trees_close(sharded.params(), one.params(), 1e-5);
}

TEST_F(ParallelTrainer, ResumeOnTheSameMeshIsBitwise) {
  VirtualDevices devices(2);
  Trainer straight(config("straight", "data=2", 6), quiet());
  straight.run();
  Trainer first(config("resumed", "data=2", 6), quiet(/*stop_at=*/3));
  EXPECT_EQ(first.run().end_step, 3);
  Trainer second(config("resumed", "data=2", 6), quiet());
  const TrainSummary b = second.run();
  EXPECT_EQ(b.start_step, 3);
  expect_bitwise(straight.params(), second.params());
  expect_bitwise(straight.opt_state(), second.opt_state());
}

TEST_F(ParallelTrainer, CheckpointFromOneMeshResumesOnAnother) {
  VirtualDevices devices(4);
  Trainer one(config("one", "", 6), quiet());
  one.run();
  Trainer first(config("moved", "fsdp=4", 6), quiet(/*stop_at=*/4));
  EXPECT_EQ(first.run().end_step, 4);
  Trainer second(config("moved", "data=2,tensor=2", 6), quiet());
  const TrainSummary b = second.run();
  EXPECT_EQ(b.start_step, 4);
  EXPECT_EQ(b.end_step, 6);
  EXPECT_EQ(spmd::sharding_of(second.params().at("layers").at(0).at("mlp").at("fc").at("w").leaf())->to_string(),
            "P(None, 'tensor')");
  expect_trees_close(second.params(), one.params(), 1e-5);
}

TEST_F(ParallelTrainer, PipelineRunMatchesOneDevice) {
  Trainer one(config("one", "", 6), quiet());
  const TrainSummary o = one.run();
  Trainer piped(config("piped", "pipeline=2,data=2", 6), quiet());
  const TrainSummary s = piped.run();
  EXPECT_EQ(s.end_step, 6);
  EXPECT_NE(s.parallel_summary.find("pipeline 2 x data 2 (4 device threads"), std::string::npos) << s.parallel_summary;
  EXPECT_NE(s.parallel_summary.find("stage 0 (device 0): layers 0-0; stage 1 (device 1): layers 1-1"),
            std::string::npos)
      << s.parallel_summary;
  ASSERT_TRUE(s.pipeline_bubble.has_value());
  EXPECT_GT(*s.pipeline_bubble, 0);
  EXPECT_LT(*s.pipeline_bubble, 1);
  EXPECT_NEAR(*s.pipeline_bubble_analytic, 1.0 / 3.0, 1e-12);  // 1f1b, p = 2, m = 2: (p-1)/(m+p-1)
  expect_trees_close(piped.params(), one.params(), 1e-5);
  ASSERT_TRUE(s.val_loss.has_value() && o.val_loss.has_value());
  EXPECT_NEAR(*s.val_loss, *o.val_loss, 1e-5 * *o.val_loss);
}

TEST_F(ParallelTrainer, PartitionedPipelineRunMatchesOneDeviceAndResumes) {
  VirtualDevices devices(4);
  Trainer one(config("one", "", 6), quiet());
  const TrainSummary o = one.run();
  // Tensor parallelism inside each of the 2 stages (4 devices), stopped after 3 steps and
  // resumed: the same parameters as one device.
  Trainer first(config("piped", "pipeline=2,tensor=2", 6), quiet(/*stop_at=*/3));
  EXPECT_EQ(first.run().end_step, 3);
  Trainer second(config("piped", "pipeline=2,tensor=2", 6), quiet());
  const TrainSummary s = second.run();
  EXPECT_EQ(s.start_step, 3);
  EXPECT_EQ(s.end_step, 6);
  EXPECT_NE(s.parallel_summary.find("pipeline 2 x (tensor=2) inside each stage (4 device threads"), std::string::npos)
      << s.parallel_summary;
  EXPECT_NE(s.parallel_summary.find("collectives inside the stages:"), std::string::npos) << s.parallel_summary;
  expect_trees_close(second.params(), one.params(), 1e-5);
  ASSERT_TRUE(s.val_loss.has_value() && o.val_loss.has_value());
  EXPECT_NEAR(*s.val_loss, *o.val_loss, 1e-5 * *o.val_loss);
}

TEST_F(ParallelTrainer, PipelineResumesBitwiseAndMovesToOtherMeshes) {
  VirtualDevices devices(2);
  Trainer straight(config("straight", "pipeline=2", 6), quiet());
  straight.run();
  Trainer first(config("resumed", "pipeline=2", 6), quiet(/*stop_at=*/3));
  EXPECT_EQ(first.run().end_step, 3);
  Trainer second(config("resumed", "pipeline=2", 6), quiet());
  EXPECT_EQ(second.run().start_step, 3);
  expect_bitwise(straight.params(), second.params());
  expect_bitwise(straight.opt_state(), second.opt_state());
  // A pipeline's checkpoint resumes on an FSDP mesh, and an FSDP one on a pipeline.
  Trainer one(config("one", "", 6), quiet());
  one.run();
  Trainer to_fsdp(config("to_fsdp", "pipeline=2", 6), quiet(/*stop_at=*/2));
  to_fsdp.run();
  Trainer fsdp(config("to_fsdp", "fsdp=2", 6), quiet());
  EXPECT_EQ(fsdp.run().start_step, 2);
  expect_trees_close(fsdp.params(), one.params(), 1e-5);
  Trainer to_pipeline(config("to_pipeline", "fsdp=2", 6), quiet(/*stop_at=*/4));
  to_pipeline.run();
  TrainConfig gpipe = config("to_pipeline", "pipeline=2", 6);
  gpipe.parallel.pipeline_schedule = "gpipe";
  Trainer piped(gpipe, quiet());
  const TrainSummary s = piped.run();
  EXPECT_EQ(s.start_step, 4);
  EXPECT_NE(s.parallel_summary.find("schedule gpipe"), std::string::npos) << s.parallel_summary;
  expect_trees_close(piped.params(), one.params(), 1e-5);
}

}  // namespace
}  // namespace tessera::train
