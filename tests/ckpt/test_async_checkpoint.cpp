// AsyncCheckpointer: byte-identical files to a synchronous save, the step blocking only
// for the snapshot (a slow writer), at most one save in flight, staging buffers reused
// and independent of the live state, a background failure rethrown at the next call
// with the path and the OS error; restore_newest across two tiers.
#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <thread>

#include "data/temp_dir.h"
#include "tessera/base/error.h"
#include "tessera/base/file_io.h"
#include "tessera/ckpt/async_checkpointer.h"
#include "tessera/ckpt/tiered_restore.h"

namespace tessera::ckpt {
namespace {

using tessera::testing::flip_bit;
using tessera::testing::read_bytes;
using tessera::testing::TempDir;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

Array ramp(const Shape& shape, double start) {
  std::vector<float> values(static_cast<size_t>(numel(shape)));
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(start + 0.37 * static_cast<double>(i));
  return Array::from_vector<float>(values, shape);
}

CheckpointState make_state(int64_t step) {
  const double s = static_cast<double>(step);
  CheckpointState state;
  state.step = step;
  state.params = Tree{{"embed", ramp({64, 16}, s)}, {"head", Tree{{"w", ramp({16, 8}, s + 1)}}}};
  state.opt_state = Tree{{"m", ramp({64, 16}, -s)}, {"count", Array::from_vector<int64_t>({step}, {1})}};
  state.extra = {{"data", {{"index", step * 3}}}};
  return state;
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

TEST(AsyncCheckpointer, WritesTheSameFilesAsASynchronousSave) {
  TempDir dir;
  CheckpointManager sync(dir / "sync"), async_manager(dir / "async");
  const fs::path expected = sync.save(make_state(7));
  AsyncCheckpointer async([&](const CheckpointState& s) { return async_manager.save(s); }, async_manager.directory());
  async.save(make_state(7));
  async.wait();
  ASSERT_EQ(async.last_committed(), async_manager.directory() / "step_00000007");
  for (const char* file : {"params.safetensors", "opt_state.safetensors"})
    EXPECT_EQ(read_bytes(expected / file), read_bytes(async.last_committed() / file)) << file;
  nlohmann::json a = read_manifest(expected), b = read_manifest(async.last_committed());
  a.erase("created");
  b.erase("created");
  EXPECT_EQ(a, b);
  EXPECT_TRUE(CheckpointManager::verify(async.last_committed()).ok);
}

TEST(AsyncCheckpointer, TheCallerBlocksOnlyForTheSnapshot) {
  TempDir dir;
  CheckpointManager manager(dir.path());
  constexpr double kWriteSeconds = 0.4;
  std::atomic<int> writing{0}, most_at_once{0};
  auto slow_writer = [&](const CheckpointState& s) {
    const int now = ++writing;
    most_at_once = std::max(most_at_once.load(), now);
    std::this_thread::sleep_for(std::chrono::duration<double>(kWriteSeconds));
    const fs::path path = manager.save(s);
    --writing;
    return path;
  };
  AsyncCheckpointer async(slow_writer, manager.directory());
  const Clock::time_point start = Clock::now();
  const SaveTiming first = async.save(make_state(1));
  EXPECT_LT(seconds_since(start), kWriteSeconds / 4) << "save() waited for the write";
  EXPECT_LT(first.wait_s, kWriteSeconds / 4);
  EXPECT_TRUE(async.in_flight());
  // A second save waits for the first: at most one in flight, and the wait is reported.
  const SaveTiming second = async.save(make_state(2));
  EXPECT_GT(second.wait_s, kWriteSeconds / 2);
  EXPECT_GE(second.blocking_s(), second.wait_s);
  async.wait();
  EXPECT_FALSE(async.in_flight());
  EXPECT_EQ(most_at_once.load(), 1);
  EXPECT_EQ(manager.list().size(), 2u);
}

TEST(AsyncCheckpointer, StagingIsReusedAndIndependentOfTheLiveState) {
  TempDir dir;
  CheckpointManager manager(dir.path());
  std::atomic<bool> release{false};
  AsyncCheckpointer async(
      [&](const CheckpointState& s) {
        while (!release) std::this_thread::yield();
        return manager.save(s);
      },
      manager.directory());
  CheckpointState live = make_state(3);
  const std::vector<float> before = live.params.leaves()[0].to_vector<float>();
  async.save(live);
  // Training goes on and updates the parameters in place while the write is pending.
  float* embed = live.params.leaves()[0].mutable_data<float>();
  for (int i = 0; i < 64 * 16; ++i) embed[i] = -1.0f;
  release = true;
  async.wait();
  const CheckpointState loaded = CheckpointManager::load(async.last_committed(), live.params, live.opt_state);
  EXPECT_EQ(loaded.params.leaves()[0].to_vector<float>(), before) << "the snapshot must be a copy";
  for (int64_t step = 4; step < 8; ++step) async.save(make_state(step));
  async.wait();
  EXPECT_EQ(async.staging_allocations(), 1) << "staging buffers are allocated once and reused";
  // A state of another shape gets new buffers.
  CheckpointState other = make_state(9);
  other.params = Tree{{"embed", ramp({2, 2}, 0)}};
  async.save(other);
  async.wait();
  EXPECT_EQ(async.staging_allocations(), 2);
}

TEST(AsyncCheckpointer, ABackgroundFailureSurfacesAtTheNextCallWithThePathAndOsError) {
  TempDir dir;
  CheckpointManager manager(dir.path());
  bool fail_next = true;
  AsyncCheckpointer async(
      [&](const CheckpointState& s) -> fs::path {
        if (fail_next) {
          fail_next = false;
          fileio::fail_errno("cannot write", manager.directory() / "step_00000005.tmp-1/params.safetensors", ENOSPC);
        }
        return manager.save(s);
      },
      manager.directory());
  async.save(make_state(5));  // returns: the failure happens in the background
  while (async.in_flight()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  try {
    async.check();
    FAIL() << "no error";
  } catch (const IOError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("step 5"), std::string::npos) << what;
    EXPECT_NE(what.find(manager.directory().string()), std::string::npos) << what;
    EXPECT_NE(what.find("No space left on device"), std::string::npos) << what;
  }
  EXPECT_NO_THROW(async.check()) << "an error is reported once";
  async.save(make_state(6));
  EXPECT_NO_THROW(async.wait());
  ASSERT_EQ(manager.list().size(), 1u);
  EXPECT_EQ(manager.list()[0].step, 6);
}

TEST(AsyncCheckpointer, AFailureIsRethrownBySaveAndWaitToo) {
  TempDir dir;
  AsyncCheckpointer async(
      [&](const CheckpointState&) -> fs::path { fileio::fail_errno("cannot write", dir / "x", EIO); },
      dir / "checkpoints");
  async.save(make_state(1));
  EXPECT_THROW(async.save(make_state(2)), IOError);  // the first one's failure; step 2 is not staged
  EXPECT_FALSE(async.in_flight());
  async.save(make_state(3));
  try {
    async.wait();  // step 3's failure
    FAIL() << "no error";
  } catch (const IOError& e) {
    EXPECT_NE(std::string(e.what()).find("Input/output error"), std::string::npos) << e.what();
  }
}

class TieredRestore : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int64_t step : {2, 4}) persistent_.save(make_state(step));
    for (int64_t step : {3, 5, 6}) local_.save(make_state(step));
  }
  std::optional<RestoredCheckpoint> restore(std::vector<std::string>* warnings) {
    const CheckpointState like = make_state(0);
    return restore_newest({persistent_.directory(), local_.directory()}, like.params, like.opt_state,
                          [&](const std::string& w) { warnings->push_back(w); });
  }
  TempDir dir_;
  CheckpointManager persistent_{dir_ / "persistent", {.keep_last = 5}};
  CheckpointManager local_{dir_ / "local", {.keep_last = 5}};
};

TEST_F(TieredRestore, TheNewestOfEitherTierWins) {
  std::vector<std::string> warnings;
  const auto restored = restore(&warnings);
  ASSERT_TRUE(restored);
  EXPECT_EQ(restored->state.step, 6);
  EXPECT_EQ(restored->path, local_.directory() / "step_00000006");
  EXPECT_TRUE(warnings.empty());
  const std::vector<float> expected = make_state(6).params.leaves()[0].to_vector<float>();
  EXPECT_EQ(restored->state.params.leaves()[0].to_vector<float>(), expected);
}

TEST_F(TieredRestore, CorruptNewestCheckpointsAreSkippedWithAWarning) {
  flip_bit(local_.directory() / "step_00000006/params.safetensors", -5);
  flip_bit(local_.directory() / "step_00000005/opt_state.safetensors", -5);
  std::vector<std::string> warnings;
  const auto restored = restore(&warnings);
  ASSERT_TRUE(restored);
  EXPECT_EQ(restored->state.step, 4) << "step 4 (persistent) is newer than local step 3";
  EXPECT_EQ(restored->path, persistent_.directory() / "step_00000004");
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_NE(warnings[0].find("step_00000006"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("checksum mismatch"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[1].find("step_00000005"), std::string::npos) << warnings[1];
}

TEST_F(TieredRestore, ATieGoesToTheFirstTierAndNothingValidGivesNone) {
  local_.save(make_state(4));
  std::vector<std::string> warnings;
  EXPECT_EQ(restore(&warnings)->path, local_.directory() / "step_00000006");
  fs::remove_all(local_.directory() / "step_00000006");
  fs::remove_all(local_.directory() / "step_00000005");
  EXPECT_EQ(restore(&warnings)->path, persistent_.directory() / "step_00000004");
  TempDir empty;
  const CheckpointState like = make_state(0);
  EXPECT_FALSE(restore_newest({empty / "a/checkpoints", empty / "b/checkpoints"}, like.params, like.opt_state, {}));
}

}  // namespace
}  // namespace tessera::ckpt
