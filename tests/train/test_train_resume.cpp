// The trainer end to end on a tiny model: loss falls; N steps, a stop, and M more
// from the checkpoint give bitwise the weights of N+M straight (with micro-batches
// and dropout too); a corrupt newest checkpoint is reported and the previous one
// used; a run directory that cannot be written fails before any work.
#include <gtest/gtest.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>

#include "tessera/base/error.h"
#include "tessera/data/token_file.h"
#include "tessera/train/trainer.h"
#include "train/tiny_corpus.h"

namespace tessera::train {
namespace {

namespace fs = std::filesystem;

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::fresh_test_dir("tessera_trainer_");
    // A learnable stream: short repeated phrases with random choices between them.
    test::write_tiny_corpus(dir_, 40000, 36000);
  }
  void TearDown() override { fs::remove_all(dir_); }

  TrainConfig config(const std::string& run, const std::vector<std::string>& extra = {}) const {
    std::vector<std::string> overrides = {"model.family=\"gpt2\"",
                                          "model.vocab=256",
                                          "model.dim=32",
                                          "model.layers=2",
                                          "model.heads=2",
                                          "model.context=32",
                                          "train.seq=32",
                                          "train.batch=4",
                                          "train.eval_batches=2",
                                          "train.log_interval=1",
                                          "schedule.warmup_steps=2",
                                          "optimizer.lr=3e-3",
                                          "run.threads=2",
                                          "run.seed=11",
                                          "data.train=\"" + (dir_ / "data/train.bin").string() + "\"",
                                          "data.val=\"" + (dir_ / "data/val.bin").string() + "\"",
                                          "run.dir=\"" + (dir_ / run).string() + "\""};
    overrides.insert(overrides.end(), extra.begin(), extra.end());
    return parse_config("", "test", overrides);
  }

  static TrainerOptions quiet(int64_t stop_at = 0) { return test::quiet_trainer(stop_at); }

  static void expect_bitwise_equal(const Tree& a, const Tree& b) { test::expect_bitwise_equal(a, b); }

  fs::path dir_;
};

TEST_F(TrainerTest, LossFalls) {
  Trainer trainer(config("run", {"train.steps=40", "train.eval_interval=20"}), quiet());
  const TrainSummary s = trainer.run();
  EXPECT_EQ(s.end_step, 40);
  ASSERT_TRUE(s.val_loss.has_value());
  EXPECT_LT(*s.val_loss, 0.6 * std::log(256.0)) << "validation loss after 40 steps";
  EXPECT_TRUE(fs::exists(dir_ / "run/metrics.jsonl"));
  EXPECT_FALSE(s.last_checkpoint.empty());
  EXPECT_GT(s.tokens_per_s, 0);
}

TEST_F(TrainerTest, ResumeIsBitwiseIdenticalToAStraightRun) {
  const std::vector<std::string> extra = {"train.steps=6", "checkpoint.interval=2"};
  Trainer straight(config("straight", extra), quiet());
  straight.run();

  Trainer first(config("resumed", extra), quiet(/*stop_at=*/3));
  const TrainSummary a = first.run();
  EXPECT_EQ(a.end_step, 3);
  Trainer second(config("resumed", extra), quiet());
  const TrainSummary b = second.run();
  EXPECT_EQ(b.start_step, 3);
  EXPECT_EQ(b.end_step, 6);
  expect_bitwise_equal(straight.params(), second.params());
  expect_bitwise_equal(straight.opt_state(), second.opt_state());
}

// Every optimizer's state goes through the checkpoint: a resumed run equals a straight one
// bit for bit (Adafactor with its factored moments: every matrix of the tiny GPT factored).
TEST_F(TrainerTest, ResumeIsBitwiseForEveryOptimizer) {
  for (const std::string name : {"sgd", "lion", "adafactor", "muon"}) {
    SCOPED_TRACE(name);
    const std::vector<std::string> extra = {"train.steps=4", "checkpoint.interval=2", "optimizer.name=\"" + name + "\"",
                                            "optimizer.adafactor_min_dim_to_factor=16"};
    Trainer straight(config("straight_" + name, extra), quiet());
    const TrainSummary s = straight.run();
    EXPECT_TRUE(std::isfinite(s.last_loss));
    Trainer first(config("resumed_" + name, extra), quiet(/*stop_at=*/2));
    first.run();
    Trainer second(config("resumed_" + name, extra), quiet());
    EXPECT_EQ(second.run().start_step, 2);
    expect_bitwise_equal(straight.params(), second.params());
    expect_bitwise_equal(straight.opt_state(), second.opt_state());
  }
}

// Training from the data pipeline: a token file and a text directory mixed 2:1, packed
// with document boundaries, prefetched by workers. A stop and a resume (with another
// worker count) give bitwise the straight run; the position is in the checkpoint.
TEST_F(TrainerTest, ResumeFromTheDataPipelineIsBitwiseForAnyWorkerCount) {
  fs::create_directories(dir_ / "notes");
  for (int i = 0; i < 3; ++i) {
    std::ofstream note(dir_ / ("notes/" + std::to_string(i) + ".txt"));
    for (int line = 0; line < 40; ++line) note << "note " << i << " line " << line << ": the cat sat on the mat.\n";
  }
  auto with_pipeline = [&](int workers) {
    return std::vector<std::string>{
        "train.steps=6", "checkpoint.interval=2", "data.workers=" + std::to_string(workers), "data.prefetch=2",
        "data.mixture=[{path = \"" + (dir_ / "data/train.bin").string() + "\", weight = 2, documents = 10}, " +
            "{name = \"notes\", path = \"" + (dir_ / "notes").string() + "\"}]"};
  };
  Trainer straight(config("straight", with_pipeline(2)), quiet());
  const TrainSummary s = straight.run();
  EXPECT_TRUE(std::isfinite(s.last_loss));
  Trainer first(config("resumed", with_pipeline(2)), quiet(/*stop_at=*/3));
  first.run();
  Trainer second(config("resumed", with_pipeline(0)), quiet());
  EXPECT_EQ(second.run().start_step, 3);
  expect_bitwise_equal(straight.params(), second.params());
  expect_bitwise_equal(straight.opt_state(), second.opt_state());
  // A checkpoint of the pipeline does not resume a run reading data.train alone.
  Trainer other(config("resumed", {"train.steps=8"}), quiet());
  EXPECT_THROW(other.run(), IOError);
}

TEST_F(TrainerTest, ResumeWithMicroBatchesAndDropoutIsBitwiseIdentical) {
  const std::vector<std::string> extra = {"train.steps=5", "train.micro_batch=2", "model.dropout=0.1"};
  Trainer straight(config("straight", extra), quiet());
  straight.run();
  Trainer first(config("resumed", extra), quiet(/*stop_at=*/2));
  first.run();
  Trainer second(config("resumed", extra), quiet());
  EXPECT_EQ(second.run().start_step, 2);
  expect_bitwise_equal(straight.params(), second.params());
  expect_bitwise_equal(straight.opt_state(), second.opt_state());
}

TEST_F(TrainerTest, CorruptNewestCheckpointFallsBackToThePreviousOne) {
  const std::vector<std::string> extra = {"train.steps=4", "checkpoint.interval=2"};
  Trainer first(config("run", extra), quiet());
  first.run();
  // Flip one byte in the middle of step 4's parameters.
  const fs::path params = dir_ / "run/checkpoints/step_00000004/params.safetensors";
  ASSERT_TRUE(fs::exists(params));
  {
    std::fstream f(params, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(fs::file_size(params) / 2));
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x10);
    f.seekp(static_cast<std::streamoff>(fs::file_size(params) / 2));
    f.write(&c, 1);
  }
  Trainer second(config("run", extra), quiet());
  const TrainSummary s = second.run();
  EXPECT_EQ(s.start_step, 2) << "resumed from the last valid checkpoint";
  EXPECT_EQ(s.end_step, 4);
}

TEST_F(TrainerTest, SigtermFinishesTheStepSavesAndResumesExactly) {
  const std::vector<std::string> extra = {"train.steps=6", "checkpoint.interval=0"};
  Trainer straight(config("straight", extra), quiet());
  straight.run();

  TrainerOptions preempted = quiet();
  preempted.after_step = [](int64_t step) {
    if (step == 3) std::raise(SIGTERM);  // a preemption notice arriving during step 3
  };
  Trainer first(config("resumed", extra), preempted);
  const TrainSummary a = first.run();
  EXPECT_EQ(a.stop_reason, "signal SIGTERM");
  EXPECT_EQ(a.end_step, 3);
  EXPECT_TRUE(fs::exists(dir_ / "resumed/checkpoints/step_00000003")) << "a checkpoint is saved before stopping";
  EXPECT_FALSE(a.val_loss.has_value()) << "no final evaluation after a preemption notice";
  // The failure is in the goodput log, and the next attempt resumes where it stopped.
  std::ifstream events(dir_ / "resumed/goodput/events.jsonl");
  const std::string log((std::istreambuf_iterator<char>(events)), std::istreambuf_iterator<char>());
  EXPECT_NE(log.find("stopped by signal SIGTERM"), std::string::npos);
  Trainer second(config("resumed", extra), quiet());
  EXPECT_EQ(second.run().start_step, 3);
  expect_bitwise_equal(straight.params(), second.params());
}

TEST_F(TrainerTest, RerunOfAFinishedJobOnlyReports) {
  const std::vector<std::string> extra = {"train.steps=2"};
  Trainer(config("run", extra), quiet()).run();
  Trainer again(config("run", extra), quiet());
  const TrainSummary s = again.run();
  EXPECT_EQ(s.start_step, 2);
  EXPECT_EQ(s.end_step, 2);
  EXPECT_EQ(s.last_checkpoint.filename(), "step_00000002");
  EXPECT_FALSE(s.goodput_table.empty());
  // Not a new attempt: the goodput log still holds exactly one.
  std::ifstream events(dir_ / "run/goodput/events.jsonl");
  int attempts = 0;
  for (std::string line; std::getline(events, line);) attempts += line.find("\"attempt_start\"") != std::string::npos;
  EXPECT_EQ(attempts, 1);
}

TEST_F(TrainerTest, UnwritableRunDirectoryFailsUpFront) {
  std::ofstream(dir_ / "a_file") << "not a directory";
  try {
    Trainer trainer(config("a_file/run", {"train.steps=2"}), quiet());
    trainer.run();
    FAIL() << "no error";
  } catch (const IOError& e) {
    EXPECT_NE(std::string(e.what()).find("a_file/run"), std::string::npos) << e.what();
  }
}

TEST_F(TrainerTest, MissingDataWithNothingToPrepareIsAConfigError) {
  try {
    Trainer trainer(config("run", {"data.train=\"/nonexistent/train.bin\"", "train.steps=2"}), quiet());
    trainer.run();
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/train.bin"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera::train
