// TESSERA_FAULT: the ';'-separated fault list and its errors, the "fires only in an
// attempt that started before its step" and "once per run directory" rules per item,
// and the SIGKILLs in the middle of a checkpoint save (also on the async writer thread)
// and of a restore, in death tests whose children really die: what they leave behind
// is then restored from (the partial save is reported and skipped, the previous
// checkpoint comes back bitwise; the restore after a killed one succeeds).
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "data/temp_dir.h"
#include "tessera/base/error.h"
#include "tessera/ckpt/async_checkpointer.h"
#include "tessera/ckpt/checkpoint.h"
#include "tessera/ckpt/tiered_restore.h"
#include "train/fault_injection.h"
#include "train/tiny_corpus.h"

namespace tessera::train {
namespace {

namespace fs = std::filesystem;
using tessera::testing::read_bytes;
using tessera::testing::TempDir;

TEST(FaultPlan, ParsesEveryFaultAndTheRankFilter) {
  const Fault kill = FaultPlan::parse("kill@step=7").faults.at(0);
  EXPECT_EQ(kill.kind, Fault::Kind::kKill);
  EXPECT_EQ(kill.at, 7);
  EXPECT_EQ(kill.rank, -1);
  const Fault hang = FaultPlan::parse("hang@step=5,rank=1").faults.at(0);
  EXPECT_EQ(hang.kind, Fault::Kind::kHang);
  EXPECT_EQ(hang.rank, 1);
  EXPECT_EQ(FaultPlan::parse("corrupt_newest").faults.at(0).kind, Fault::Kind::kCorruptNewest);
  EXPECT_EQ(FaultPlan::parse("fail_write@step=4").faults.at(0).kind, Fault::Kind::kFailWrite);
  EXPECT_EQ(FaultPlan::parse("kill@save=2").faults.at(0).kind, Fault::Kind::kKillInSave);
  EXPECT_EQ(FaultPlan::parse("kill@restore=1,rank=0").faults.at(0).kind, Fault::Kind::kKillInRestore);
  EXPECT_TRUE(FaultPlan::parse("").empty());
}

TEST(FaultPlan, ParsesAListInOrderWithEachItemsTextAndRank) {
  const FaultPlan plan =
      FaultPlan::parse("kill@step=5;kill@save=2; kill@restore=1, rank=1 ;hang@step=12;corrupt_newest;");
  ASSERT_EQ(plan.faults.size(), 5u) << "a trailing ';' adds nothing";
  const std::vector<Fault::Kind> kinds = {Fault::Kind::kKill, Fault::Kind::kKillInSave, Fault::Kind::kKillInRestore,
                                          Fault::Kind::kHang, Fault::Kind::kCorruptNewest};
  const std::vector<int64_t> at = {5, 2, 1, 12, -1};
  for (size_t i = 0; i < plan.faults.size(); ++i) {
    EXPECT_EQ(plan.faults[i].kind, kinds[i]) << i;
    EXPECT_EQ(plan.faults[i].at, at[i]) << i;
    EXPECT_EQ(plan.faults[i].index, i);
  }
  EXPECT_EQ(plan.faults[2].text, "kill@restore=1, rank=1") << "without the blanks around it";
  EXPECT_EQ(plan.faults[2].rank, 1);
  EXPECT_EQ(plan.faults[1].rank, -1) << "a rank filter belongs to its own item";
}

TEST(FaultPlan, BadSpecsNameTheSpecTheItemAndTheGrammar) {
  struct Bad {
    const char* spec;
    const char* item;  // the item the message must name
  };
  for (const Bad& bad : std::vector<Bad>{{"explode@step=3", "explode@step=3"},
                                         {"kill@step=x", "kill@step=x"},
                                         {"kill@step=-1", "kill@step=-1"},
                                         {"kill", "kill"},
                                         {"kill@step=1,hang@step=2", "kill@step=1,hang@step=2"},
                                         {"rank=1", "rank=1"},
                                         {"kill@step=2,rank=one", "kill@step=2,rank=one"},
                                         {"kill@step=5;kill@sav=2", "kill@sav=2"},
                                         {"kill@step=5;kill@save=0", "kill@save=0"},
                                         {"kill@restore=;corrupt_newest", "kill@restore="},
                                         {"corrupt_newest=3", "corrupt_newest=3"},
                                         {"kill@save=1,,rank=0", "kill@save=1,,rank=0"},
                                         {"kill@save=1,rank=0,rank=1", "kill@save=1,rank=0,rank=1"}}) {
    try {
      FaultPlan::parse(bad.spec);
      ADD_FAILURE() << bad.spec << ": no error";
    } catch (const ValueError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(bad.spec), std::string::npos) << message;
      EXPECT_NE(message.find(fmt::format("'{}':", bad.item)), std::string::npos) << message;
      EXPECT_NE(message.find("kill@save=N, kill@restore=N"), std::string::npos) << "the grammar: " << message;
    }
  }
}

TEST(FaultInjector, FiresOnceInAnAttemptThatStartedBeforeTheStepAndOnTheRightRank) {
  TempDir dir;
  const FaultPlan fail_write = FaultPlan::parse("fail_write@step=4");
  // Resumed at (or past) the step: the fault is off.
  EXPECT_FALSE(FaultInjector(fail_write, 0, 4, dir.path()).active());
  EXPECT_TRUE(FaultInjector(fail_write, 0, 3, dir.path()).active());
  FaultInjector fresh(fail_write, 0, /*start_step=*/0, dir.path());
  EXPECT_FALSE(fresh.fail_this_write(2));
  EXPECT_TRUE(fresh.fail_this_write(4));
  EXPECT_FALSE(fresh.fail_this_write(6)) << "one write fails";
  EXPECT_TRUE(fs::exists(dir / ".fault_fired.0.fail_write@step=4.rank0"));
  // A restarted job (another attempt, same spec) makes progress: the marker keeps it off.
  EXPECT_FALSE(FaultInjector(fail_write, 0, 0, dir.path()).active());
  EXPECT_TRUE(FaultInjector(fail_write, 1, 0, dir.path()).active()) << "markers are per rank";
  const FaultPlan on_rank_1 = FaultPlan::parse("kill@step=3,rank=1");
  EXPECT_FALSE(FaultInjector(on_rank_1, 0, 0, dir.path()).active());
  EXPECT_TRUE(FaultInjector(on_rank_1, 1, 0, dir.path()).active());
  // An inactive kill at its step does nothing (this process survives the call).
  FaultInjector(on_rank_1, 0, 0, dir.path()).at_step_start(3);
}

// slow@step: a straggler for the per-rank goodput records (the step goes on, late).
TEST(FaultInjector, SlowSleepsAtItsStepOnItsRankOnce) {
  const Fault slow = FaultPlan::parse("slow@step=2,ms=150,rank=1").faults.at(0);
  EXPECT_EQ(slow.kind, Fault::Kind::kSlow);
  EXPECT_EQ(slow.at, 2);
  EXPECT_EQ(slow.ms, 150);
  EXPECT_EQ(slow.rank, 1);
  for (const char* bad : {"slow@step=2", "kill@step=2,ms=5", "slow@step=2,ms=1,ms=2", "slow@step=2,ms=-1"}) {
    try {
      FaultPlan::parse(bad);
      ADD_FAILURE() << bad << ": no error";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("slow@step=N,ms=M"), std::string::npos) << "the grammar: " << e.what();
    }
  }
  TempDir dir;
  const FaultPlan plan = FaultPlan::parse("slow@step=2,ms=150,rank=1");
  const auto seconds_of = [](const std::function<void()>& fn) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  EXPECT_FALSE(FaultInjector(plan, 0, 0, dir.path()).active()) << "another rank";
  EXPECT_FALSE(FaultInjector(plan, 1, 2, dir.path()).active()) << "resumed at its step";
  FaultInjector injector(plan, 1, 0, dir.path());
  EXPECT_LT(seconds_of([&] { injector.at_step_start(1); }), 0.1);
  EXPECT_GE(seconds_of([&] { injector.at_step_start(2); }), 0.15);
  EXPECT_LT(seconds_of([&] { injector.at_step_start(2); }), 0.1) << "once";
  EXPECT_TRUE(fs::exists(dir / ".fault_fired.0.slow@step=2_ms=150_rank=1.rank1"));
}

TEST(FaultInjector, EachItemOfAListFiresOnceWithItsOwnMarker) {
  TempDir dir;
  // The same fault twice is two faults: the second fires in the next attempt.
  const FaultPlan plan = FaultPlan::parse("fail_write@step=2;fail_write@step=2;fail_write@step=6");
  FaultInjector first(plan, 0, 0, dir.path());
  EXPECT_TRUE(first.fail_this_write(2));
  EXPECT_TRUE(first.fail_this_write(2)) << "the second item";
  EXPECT_FALSE(first.fail_this_write(4));
  EXPECT_TRUE(first.fail_this_write(6));
  EXPECT_FALSE(first.active());
  for (const char* marker : {".fault_fired.0.fail_write@step=2.rank0", ".fault_fired.1.fail_write@step=2.rank0",
                             ".fault_fired.2.fail_write@step=6.rank0"})
    EXPECT_TRUE(fs::exists(dir / marker)) << marker;
  EXPECT_FALSE(FaultInjector(plan, 0, 0, dir.path()).active()) << "a restart finds every item fired";
  // Markers are keyed by index and text: a different list in the same run dir is armed again.
  EXPECT_TRUE(FaultInjector(FaultPlan::parse("fail_write@step=6"), 0, 0, dir.path()).active());
}

TEST(FaultInjector, CorruptNewestFlipsTheNewestParamsOncePerRunDirectory) {
  TempDir dir;
  FaultInjector nothing_yet(FaultPlan::parse("corrupt_newest"), 0, 0, dir.path());
  EXPECT_TRUE(nothing_yet.corrupt_newest({dir / "checkpoints"}).empty());
  EXPECT_TRUE(nothing_yet.active()) << "with no checkpoint to corrupt it waits for a later start";
  for (const char* step : {"step_00000002", "step_00000004"})
    tessera::testing::write_bytes(dir / "checkpoints" / step / "params.safetensors", std::string(64, 'a'));
  FaultInjector injector(FaultPlan::parse("corrupt_newest"), 0, 0, dir.path());
  const fs::path file = injector.corrupt_newest({dir / "checkpoints"});
  EXPECT_EQ(file, dir / "checkpoints/step_00000004/params.safetensors");
  const std::string bytes = read_bytes(file);
  EXPECT_EQ(bytes.substr(0, 32), std::string(32, 'a'));
  EXPECT_EQ(bytes.substr(32, 16), std::string(16, 'a' ^ 0x5a));
  EXPECT_EQ(read_bytes(dir / "checkpoints/step_00000002/params.safetensors"), std::string(64, 'a'));
  EXPECT_TRUE(injector.corrupt_newest({dir / "checkpoints"}).empty()) << "once";
  FaultInjector restarted(FaultPlan::parse("corrupt_newest"), 0, 0, dir.path());
  EXPECT_TRUE(restarted.corrupt_newest({dir / "checkpoints"}).empty()) << "once per run directory";
}

TEST(FaultInjector, KillInSaveNamesTheNthWriteOfThisProcessOnItsRank) {
  TempDir dir;
  FaultInjector injector(FaultPlan::parse("kill@save=2;kill@save=3,rank=1"), 0, /*start_step=*/10, dir.path());
  EXPECT_TRUE(injector.active()) << "save faults do not depend on the start step";
  EXPECT_FALSE(injector.begin_save(12)) << "write 1";
  EXPECT_TRUE(injector.begin_save(14)) << "write 2";
  EXPECT_FALSE(injector.begin_save(16)) << "write 3 is rank 1's";
  EXPECT_FALSE(injector.active());
  EXPECT_TRUE(FaultInjector(FaultPlan::parse("kill@save=2"), 0, 0, dir.path()).active())
      << "no marker was written: the hook never ran";
  FaultInjector rank1(FaultPlan::parse("kill@save=2;kill@save=3,rank=1"), 1, 0, dir.path());
  EXPECT_FALSE(rank1.begin_save(2));
  EXPECT_TRUE(rank1.begin_save(4)) << "kill@save=2 is every rank's";
  EXPECT_TRUE(rank1.begin_save(6)) << "kill@save=3,rank=1 is rank 1's";
}

// A small state with distinct values per step (the checkpoint's contents do not matter here).
ckpt::CheckpointState make_state(int64_t step) {
  std::vector<float> weights(256), moments(256);
  for (size_t i = 0; i < weights.size(); ++i) {
    weights[i] = static_cast<float>(step) + 0.25f * static_cast<float>(i);
    moments[i] = -weights[i];
  }
  ckpt::CheckpointState state;
  state.step = step;
  state.params = Tree{{"w", Array::from_vector<float>(weights, {16, 16})}};
  state.opt_state = Tree{{"m", Array::from_vector<float>(moments, {16, 16})}};
  return state;
}

// The partial save a SIGKILL left: the temporary directory with the params file only.
fs::path only_partial_save(const fs::path& checkpoints_dir) {
  const std::vector<fs::path> partial = ckpt::list_partial_saves(checkpoints_dir);
  EXPECT_EQ(partial.size(), 1u);
  if (partial.empty()) return {};
  EXPECT_TRUE(fs::exists(partial[0] / "params.safetensors"));
  EXPECT_FALSE(fs::exists(partial[0] / "opt_state.safetensors"));
  EXPECT_FALSE(fs::exists(partial[0] / "manifest.json"));
  return partial[0];
}

// After a kill in the save of step 4: restoring reports the partial save, skips it and
// returns step 2 bitwise; the next save removes the leftover.
void expect_recovery_from_a_killed_save(const fs::path& run_dir) {
  ckpt::CheckpointManager manager(run_dir);
  const fs::path partial = only_partial_save(manager.directory());
  EXPECT_EQ(partial.filename().string().rfind("step_00000004.tmp-", 0), 0u) << partial;
  ASSERT_EQ(manager.list().size(), 1u) << "only step 2 is committed";
  const ckpt::CheckpointState like = make_state(0);
  std::vector<std::string> warnings;
  const auto restored = ckpt::restore_newest({manager.directory()}, like.params, like.opt_state,
                                             [&](const std::string& w) { warnings.push_back(w); });
  ASSERT_TRUE(restored);
  EXPECT_EQ(restored->state.step, 2);
  test::expect_bitwise_equal(restored->state.params, make_state(2).params);
  test::expect_bitwise_equal(restored->state.opt_state, make_state(2).opt_state);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find(partial.string() + " is a partial save"), std::string::npos) << warnings[0];
  manager.save(make_state(4));
  EXPECT_TRUE(ckpt::list_partial_saves(manager.directory()).empty()) << "the next save removed the leftover";
  EXPECT_TRUE(ckpt::CheckpointManager::verify(manager.directory() / "step_00000004").ok);
}

TEST(FaultInjectorDeathTest, KillInASynchronousSaveLeavesAPartialSaveThatRestoreSkips) {
  TempDir dir;
  const FaultPlan plan = FaultPlan::parse("kill@save=2");
  EXPECT_EXIT(
      {
        ckpt::CheckpointManager manager(dir.path());
        FaultInjector injector(plan, 0, 0, dir.path());
        manager.save(make_state(2), injector.begin_save(2));
        manager.save(make_state(4), injector.begin_save(4));
        std::exit(0);  // not reached
      },
      ::testing::KilledBySignal(SIGKILL), "item 1 'kill@save=2': SIGKILL in checkpoint write 2 \\(step 4\\)");
  EXPECT_TRUE(fs::exists(dir / ".fault_fired.0.kill@save=2.rank0")) << "written before the kill";
  EXPECT_FALSE(FaultInjector(plan, 0, 0, dir.path()).active()) << "the restarted process is not killed again";
  expect_recovery_from_a_killed_save(dir.path());
}

TEST(FaultInjectorDeathTest, KillInAnAsynchronousSaveHappensOnTheWriterThread) {
  TempDir dir;
  EXPECT_EXIT(
      {
        ckpt::CheckpointManager manager(dir.path());
        FaultInjector injector(FaultPlan::parse("kill@save=2"), 0, 0, dir.path());
        ckpt::AsyncCheckpointer async([&](const ckpt::CheckpointState& s) { return manager.save(s); },
                                      manager.directory());
        for (int64_t step : {2, 4}) {
          std::function<void(const fs::path&)> hook = injector.begin_save(step);
          const std::thread::id caller = std::this_thread::get_id();
          async.save(make_state(step), [&manager, hook, caller](const ckpt::CheckpointState& s) {
            if (std::this_thread::get_id() == caller) std::exit(3);  // the hook must run in the background
            return manager.save(s, hook);
          });
        }
        async.wait();
        std::exit(0);  // not reached
      },
      ::testing::KilledBySignal(SIGKILL), "SIGKILL in checkpoint write 2 \\(step 4\\)");
  expect_recovery_from_a_killed_save(dir.path());
}

TEST(FaultInjectorDeathTest, KillInARestoreCountsRestoresOfTheRunDirectoryAndTheNextOneSucceeds) {
  TempDir dir;
  ckpt::CheckpointManager manager(dir.path());
  manager.save(make_state(2));
  manager.save(make_state(4));
  const FaultPlan plan = FaultPlan::parse("kill@restore=2");
  const ckpt::CheckpointState like = make_state(0);
  auto restore = [&] {
    FaultInjector injector(plan, 0, std::numeric_limits<int64_t>::max(), dir.path());
    return ckpt::restore_newest({manager.directory()}, like.params, like.opt_state, nullptr, injector.restore_hook());
  };
  ASSERT_TRUE(restore()) << "restore 1 is not the one";
  EXPECT_EQ(read_bytes(dir / ".fault_restores.rank0"), "1\n");
  EXPECT_EXIT(
      {
        restore();
        std::exit(0);  // not reached
      },
      ::testing::KilledBySignal(SIGKILL), "SIGKILL in restore 2 of this run directory, .*step_00000004 read");
  EXPECT_EQ(read_bytes(dir / ".fault_restores.rank0"), "2\n");
  const auto third = restore();
  ASSERT_TRUE(third) << "the restore after the killed one succeeds";
  EXPECT_EQ(third->state.step, 4);
  test::expect_bitwise_equal(third->state.params, make_state(4).params);
  test::expect_bitwise_equal(third->state.opt_state, make_state(4).opt_state);
  EXPECT_TRUE(ckpt::list_partial_saves(manager.directory()).empty()) << "a restore writes nothing in checkpoints/";
}

}  // namespace
}  // namespace tessera::train
