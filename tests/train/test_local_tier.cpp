// Where checkpoint.local_dir = "auto" puts the local tier: /dev/shm, else the temporary
// directory, else off with the reason; never in multi-process jobs; one directory per
// run directory, owner-only.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "train/local_tier.h"
#include "train/tiny_corpus.h"

namespace tessera::train {
namespace {

namespace fs = std::filesystem;

class LocalTierTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = test::fresh_test_dir("tessera_local_tier_"); }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

CheckpointConfig with_dir(const std::string& local_dir) {
  CheckpointConfig c;
  c.local_dir = local_dir;
  return c;
}

TEST_F(LocalTierTest, AutoTakesTheFirstCandidateWithRoomInAnOwnerOnlyDirectory) {
  fs::create_directories(dir_ / "shm");
  const LocalTier tier = resolve_local_tier(with_dir("auto"), dir_ / "runs/a", 1000, false, {dir_ / "shm", dir_});
  ASSERT_FALSE(tier.dir.empty()) << tier.why;
  EXPECT_TRUE(tier.automatic);
  const fs::path user_dir = dir_ / "shm" / ("tessera-" + std::to_string(::getuid()));
  EXPECT_EQ(tier.dir.parent_path(), user_dir);
  EXPECT_EQ(tier.dir.filename().string().rfind("a-", 0), 0u) << tier.dir;
  EXPECT_EQ(fs::status(user_dir).permissions() & fs::perms::all, fs::perms::owner_all);
  EXPECT_NE(tier.why.find(tier.dir.string()), std::string::npos) << tier.why;
  // The same run directory (however spelled) gets the same tier; another run another one.
  fs::create_directories(dir_ / "runs");
  EXPECT_EQ(resolve_local_tier(with_dir("auto"), dir_ / "runs/../runs/a", 1000, false, {dir_ / "shm"}).dir, tier.dir);
  EXPECT_NE(resolve_local_tier(with_dir("auto"), dir_ / "elsewhere/a", 1000, false, {dir_ / "shm"}).dir, tier.dir);
}

TEST_F(LocalTierTest, AutoFallsBackWhenTheFirstCandidateIsMissingOrFull) {
  const LocalTier fallback =
      resolve_local_tier(with_dir("auto"), dir_ / "run", 1000, false, {dir_ / "no-shm", dir_ / "tmp"});
  EXPECT_TRUE(fallback.dir.empty()) << "neither exists";
  fs::create_directories(dir_ / "tmp");
  const LocalTier tier =
      resolve_local_tier(with_dir("auto"), dir_ / "run", 1000, false, {dir_ / "no-shm", dir_ / "tmp"});
  ASSERT_FALSE(tier.dir.empty()) << tier.why;
  EXPECT_EQ(tier.dir.parent_path().parent_path(), dir_ / "tmp");
  EXPECT_NE(tier.why.find("no-shm does not exist"), std::string::npos) << tier.why;
  // No candidate can hold keep_last + 1 checkpoints of 2^62 bytes: off, saying so.
  const LocalTier off = resolve_local_tier(with_dir("auto"), dir_ / "run", uint64_t{1} << 62, false, {dir_ / "tmp"});
  EXPECT_TRUE(off.dir.empty());
  EXPECT_NE(off.why.find("local tier off: no room"), std::string::npos) << off.why;
  EXPECT_NE(off.why.find("2 checkpoints of"), std::string::npos) << off.why;
}

TEST_F(LocalTierTest, ExplicitEmptyAndMultiProcess) {
  const LocalTier explicit_dir = resolve_local_tier(with_dir((dir_ / "mine").string()), dir_ / "run", 1000, true);
  EXPECT_EQ(explicit_dir.dir, dir_ / "mine");
  EXPECT_FALSE(explicit_dir.automatic) << "a directory the user named is not removed";
  const LocalTier off = resolve_local_tier(with_dir(""), dir_ / "run", 1000, false);
  EXPECT_TRUE(off.dir.empty());
  EXPECT_NE(off.why.find("off"), std::string::npos);
  CheckpointConfig no_interval = with_dir("auto");
  no_interval.local_interval = 0;  // what checkpoints written before "auto" hold
  EXPECT_TRUE(resolve_local_tier(no_interval, dir_ / "run", 1000, false, {dir_}).dir.empty());
  const LocalTier multi = resolve_local_tier(with_dir("auto"), dir_ / "run", 1000, true, {dir_});
  EXPECT_TRUE(multi.dir.empty());
  EXPECT_NE(multi.why.find("multi-process"), std::string::npos) << multi.why;
}

}  // namespace
}  // namespace tessera::train
