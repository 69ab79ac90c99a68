// Async and two-tier checkpoints in the trainer on a tiny model: async and sync runs
// write byte-identical checkpoint files and resume bitwise; a crash restores from the
// newest valid checkpoint of either tier; SIGTERM during a background save leaves a
// valid newest checkpoint; TESSERA_FAULT corrupt_newest and fail_write.
#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "data/temp_dir.h"
#include "tessera/base/error.h"
#include "tessera/ckpt/checkpoint.h"
#include "tessera/train/trainer.h"
#include "train/checkpoint_interval.h"
#include "train/local_tier.h"
#include "train/tiny_corpus.h"

namespace tessera::train {
namespace {

namespace fs = std::filesystem;
using tessera::testing::read_bytes;

class AsyncCheckpointTraining : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::fresh_test_dir("tessera_async_ckpt_");
    test::write_tiny_corpus(dir_, 20000, 18000);
  }
  void TearDown() override {
    ::unsetenv("TESSERA_FAULT");
    fs::remove_all(dir_);
  }

  TrainConfig config(const std::string& run, const std::vector<std::string>& extra = {}) const {
    std::vector<std::string> overrides = {"model.family=\"gpt2\"",
                                          "model.vocab=256",
                                          "model.dim=32",
                                          "model.layers=1",
                                          "model.heads=2",
                                          "model.context=16",
                                          "train.seq=16",
                                          "train.batch=2",
                                          "train.eval_batches=1",
                                          "train.log_interval=1",
                                          "run.threads=2",
                                          "run.seed=5",
                                          "run.tensorboard=false",
                                          "data.train=\"" + (dir_ / "data/train.bin").string() + "\"",
                                          "data.val=\"" + (dir_ / "data/val.bin").string() + "\"",
                                          "run.dir=\"" + (dir_ / run).string() + "\""};
    overrides.insert(overrides.end(), extra.begin(), extra.end());
    return parse_config("", "test", overrides);
  }
  static TrainerOptions quiet(int64_t stop_at = 0) { return test::quiet_trainer(stop_at); }

  static void expect_bitwise_equal(const Tree& a, const Tree& b) { test::expect_bitwise_equal(a, b); }
  fs::path checkpoint(const std::string& run, const char* step) const { return dir_ / run / "checkpoints" / step; }

  fs::path dir_;
};

TEST_F(AsyncCheckpointTraining, AsyncAndSyncWriteIdenticalFilesAndResumeBitwise) {
  Trainer sync(config("sync", {"train.steps=4", "checkpoint.interval=2", "checkpoint.async=false"}), quiet());
  sync.run();
  Trainer async(config("async", {"train.steps=4", "checkpoint.interval=2", "checkpoint.async=true"}), quiet());
  async.run();
  for (const char* step : {"step_00000002", "step_00000004"})
    for (const char* file : {"params.safetensors", "opt_state.safetensors"}) {
      ASSERT_TRUE(fs::exists(checkpoint("async", step) / file)) << step << "/" << file;
      EXPECT_EQ(read_bytes(checkpoint("sync", step) / file), read_bytes(checkpoint("async", step) / file))
          << step << "/" << file;
    }
  // 3 async steps, a stop, 1 more == 4 straight synchronous steps.
  Trainer first(config("resumed", {"train.steps=4", "checkpoint.interval=2"}), quiet(/*stop_at=*/3));
  first.run();
  Trainer second(config("resumed", {"train.steps=4", "checkpoint.interval=2"}), quiet());
  EXPECT_EQ(second.run().start_step, 3);
  expect_bitwise_equal(sync.params(), second.params());
  expect_bitwise_equal(sync.opt_state(), second.opt_state());
}

TEST_F(AsyncCheckpointTraining, ACrashResumesFromTheNewestCheckpointOfEitherTier) {
  Trainer straight(config("straight", {"train.steps=5"}), quiet());
  straight.run();
  const std::string local = (dir_ / "shm/run").string();
  const std::vector<std::string> tiers = {"train.steps=5", "checkpoint.interval=2",
                                          "checkpoint.local_dir=\"" + local + "\"", "checkpoint.local_interval=1"};
  TrainerOptions crashing = quiet();
  crashing.after_step = [](int64_t step) {
    if (step == 3) throw std::runtime_error("simulated crash after step 3");
  };
  Trainer crashed(config("run", tiers), crashing);
  EXPECT_THROW(crashed.run(), std::runtime_error);
  // Persistent: step 2; local (keeps 1): step 3.
  EXPECT_TRUE(fs::exists(checkpoint("run", "step_00000002")));
  EXPECT_FALSE(fs::exists(checkpoint("run", "step_00000003")));
  EXPECT_TRUE(fs::exists(fs::path(local) / "checkpoints/step_00000003"));
  Trainer resumed(config("run", tiers), quiet());
  const TrainSummary s = resumed.run();
  EXPECT_EQ(s.start_step, 3) << "the local tier's step 3 is newer than the persistent step 2";
  expect_bitwise_equal(straight.params(), resumed.params());
  EXPECT_EQ(s.last_checkpoint, checkpoint("run", "step_00000005")) << "the final save goes to the persistent tier";
}

TEST_F(AsyncCheckpointTraining, SigtermDuringABackgroundSaveLeavesAValidNewestCheckpoint) {
  TrainerOptions preempted = quiet();
  preempted.after_step = [](int64_t step) {
    if (step == 2) std::raise(SIGTERM);  // step 2's save was just handed to the background thread
  };
  Trainer first(config("run", {"train.steps=6", "checkpoint.interval=2"}), preempted);
  const TrainSummary a = first.run();
  EXPECT_EQ(a.stop_reason, "signal SIGTERM");
  EXPECT_EQ(a.end_step, 2);
  const std::vector<ckpt::CheckpointInfo> saved = ckpt::list_checkpoints(dir_ / "run/checkpoints");
  ASSERT_FALSE(saved.empty());
  EXPECT_EQ(saved.back().step, 2);
  EXPECT_TRUE(ckpt::CheckpointManager::verify(saved.back().path).ok) << "the run waited for the save to commit";
  EXPECT_EQ(a.last_checkpoint, saved.back().path);
}

TEST_F(AsyncCheckpointTraining, InjectedCorruptionOfTheNewestIsSkipped) {
  Trainer(config("run", {"train.steps=4", "checkpoint.interval=2"}), quiet()).run();
  ::setenv("TESSERA_FAULT", "corrupt_newest", 1);
  Trainer again(config("run", {"train.steps=6", "checkpoint.interval=2"}), quiet());
  const TrainSummary s = again.run();
  EXPECT_EQ(s.start_step, 2) << "step 4 was corrupted; step 2 is the newest that verifies";
  EXPECT_EQ(s.end_step, 6);
  EXPECT_TRUE(ckpt::CheckpointManager::verify(dir_ / "run/checkpoints/step_00000006").ok);
  Trainer rerun(config("run", {"train.steps=8", "checkpoint.interval=2"}), quiet());
  EXPECT_EQ(rerun.run().start_step, 6) << "corrupt_newest fires once per run directory";
}

TEST_F(AsyncCheckpointTraining, InjectedWriteFailureIsAClearErrorAndKeepsThePreviousCheckpoint) {
  for (const char* async : {"true", "false"}) {
    SCOPED_TRACE(std::string("checkpoint.async=") + async);
    const std::string run = std::string("run_") + async;
    ::setenv("TESSERA_FAULT", "fail_write@step=4", 1);
    Trainer trainer(config(run, {"train.steps=6", "checkpoint.interval=2", std::string("checkpoint.async=") + async}),
                    quiet());
    try {
      trainer.run();
      ADD_FAILURE() << "no error";
    } catch (const IOError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("injected fault"), std::string::npos) << what;
      EXPECT_NE(what.find((dir_ / run / "checkpoints").string()), std::string::npos) << what;
      EXPECT_NE(what.find("Input/output error"), std::string::npos) << what;
    }
    const std::vector<ckpt::CheckpointInfo> saved = ckpt::list_checkpoints(dir_ / run / "checkpoints");
    ASSERT_EQ(saved.size(), 1u);
    EXPECT_EQ(saved[0].step, 2);
    EXPECT_TRUE(ckpt::CheckpointManager::verify(saved[0].path).ok);
    // The same command again resumes from step 2 and finishes: the fault fired once here.
    Trainer rerun(config(run, {"train.steps=6", "checkpoint.interval=2", std::string("checkpoint.async=") + async}),
                  quiet());
    EXPECT_EQ(rerun.run().end_step, 6);
  }
}

TEST_F(AsyncCheckpointTraining, AutoIntervalSavesAtTheYoungDalyInterval) {
  // "auto" is the default. A huge MTBF makes the interval longer than the run: only the
  // first (measuring) save, kFirstAutoSaveStep steps in, and the final one.
  Trainer trainer(config("run", {"train.steps=14", "checkpoint.mtbf_s=1e12", "checkpoint.keep_last=20",
                                 "checkpoint.local_dir=\"\""}),
                  quiet());
  EXPECT_EQ(trainer.config().checkpoint.interval, kAutoInterval);
  trainer.run();
  std::vector<int64_t> steps;
  for (const ckpt::CheckpointInfo& info : ckpt::list_checkpoints(dir_ / "run/checkpoints")) steps.push_back(info.step);
  EXPECT_EQ(steps, (std::vector<int64_t>{kFirstAutoSaveStep, 14}));
  // A tiny MTBF: after the first save, every step. (Synchronous: an async save also waits
  // for the previous write, which takes several of this tiny model's steps.)
  Trainer often(config("often", {"train.steps=18", "checkpoint.interval=\"auto\"", "checkpoint.mtbf_s=1e-9",
                                 "checkpoint.keep_last=20", "checkpoint.local_dir=\"\"", "checkpoint.async=false"}),
                quiet());
  often.run();
  EXPECT_EQ(ckpt::list_checkpoints(dir_ / "often/checkpoints").size(), 9u) << "steps 10, 11, ... 18";
}

TEST_F(AsyncCheckpointTraining, TheLocalTierIsOnByDefaultAndACrashLosesFewSteps) {
  EXPECT_EQ(config("run").checkpoint.local_dir, "auto");
  EXPECT_EQ(config("run").checkpoint.local_interval, kAutoInterval);
  // The default tier at a fixed interval (the "auto" one depends on this machine's speed):
  // local saves at 4, 8, ... 36; the persistent tier only at step 10 (a huge MTBF).
  const TrainConfig cfg = config("run", {"train.steps=40", "checkpoint.local_interval=4", "checkpoint.mtbf_s=1e12"});
  const LocalTier tier = resolve_local_tier(cfg.checkpoint, cfg.run.dir, 1 << 20, /*multi_process=*/false);
  ASSERT_FALSE(tier.dir.empty()) << tier.why;
  EXPECT_TRUE(tier.automatic);
  fs::remove_all(tier.dir);
  Trainer straight(config("straight", {"train.steps=40"}), quiet());
  straight.run();
  TrainerOptions crashing = quiet();
  crashing.after_step = [&](int64_t step) {
    if (step == 37) throw std::runtime_error("simulated crash after step 37");
  };
  Trainer crashed(cfg, crashing);
  EXPECT_THROW(crashed.run(), std::runtime_error);
  EXPECT_TRUE(fs::exists(tier.dir / "checkpoints/step_00000036")) << "a failed run keeps its local tier";
  EXPECT_EQ(ckpt::list_checkpoints(dir_ / "run/checkpoints").back().step, kFirstAutoSaveStep);
  Trainer resumed(cfg, quiet());
  const TrainSummary s = resumed.run();
  EXPECT_EQ(s.start_step, 36) << "the local tier's step 36, not the persistent step 10";
  expect_bitwise_equal(straight.params(), resumed.params());
  expect_bitwise_equal(straight.opt_state(), resumed.opt_state());
  EXPECT_FALSE(fs::exists(tier.dir)) << "a run that finished removes its automatic local tier";
  EXPECT_EQ(s.last_checkpoint, checkpoint("run", "step_00000040"));
}

TEST_F(AsyncCheckpointTraining, AfterASaveOrEvalTheHeartbeatIsBackToStepping) {
  // A save or an evaluation every step; after each, the heartbeat says "step" again, so a
  // hang in the next step is judged by the step limit, not the save's or eval's.
  const fs::path beats = dir_ / "beat.json";
  ::setenv("TESSERA_HEARTBEAT_FILE", beats.c_str(), 1);
  TrainerOptions options = quiet();
  std::vector<std::string> phases;
  options.after_step = [&](int64_t) {
    std::ifstream in(beats);
    std::string line;
    std::getline(in, line);
    phases.push_back(line.substr(line.find("\"phase\""), 14));
  };
  Trainer trainer(config("run", {"train.steps=4", "checkpoint.interval=1", "train.eval_interval=1"}), options);
  trainer.run();
  ::unsetenv("TESSERA_HEARTBEAT_FILE");
  EXPECT_EQ(phases, std::vector<std::string>(4, "\"phase\":\"step\""));
}

TEST_F(AsyncCheckpointTraining, CheckpointIntervalsTakeAutoOrSteps) {
  EXPECT_THROW(config("run", {"checkpoint.local_interval=-3"}), ConfigError);
  EXPECT_THROW(config("run", {"checkpoint.mtbf_s=0"}).validate(), ConfigError);
  EXPECT_THROW(config("run", {"checkpoint.interval=-2"}), ConfigError);
  EXPECT_NO_THROW(config("run", {"checkpoint.local_dir=\"/tmp/x\"", "checkpoint.local_interval=5"}).validate());
  try {
    config("run", {"checkpoint.interval=\"often\""});
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("expected \"auto\" or a number of steps"), std::string::npos) << e.what();
  }
  TrainConfig fixed = config("run", {"checkpoint.interval=7"});
  EXPECT_EQ(fixed.checkpoint.interval, 7);
  EXPECT_EQ(fixed.to_json()["checkpoint"]["interval"], 7);
  EXPECT_EQ(config("run").to_json()["checkpoint"]["interval"], "auto");
  // A checkpoint's config round-trips, and one written before "auto" existed still reads.
  EXPECT_EQ(config_from_json(config("run").to_json()).checkpoint.interval, kAutoInterval);
  nlohmann::json legacy = fixed.to_json();
  legacy["checkpoint"]["auto_interval"] = true;
  EXPECT_EQ(config_from_json(legacy).checkpoint.interval, kAutoInterval);
}

}  // namespace
}  // namespace tessera::train
