// The worker's heartbeat file: step beats throttled, other phases written at once, and
// the first step beat after another phase written at once too (so the step after an
// eval or save is judged by the step limit).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "train/heartbeat.h"
#include "train/tiny_corpus.h"

namespace tessera::train {
namespace {

namespace fs = std::filesystem;

std::string read_line(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(Heartbeat, StepBeatsAreThrottledButLeavingAnotherPhaseIsNot) {
  const fs::path dir = test::fresh_test_dir("tessera_heartbeat_");
  fs::create_directories(dir);
  Heartbeat beat((dir / "rank-0.json").string());
  beat.beat(1);
  EXPECT_NE(read_line(dir / "rank-0.json").find(R"("step":1,"phase":"step")"), std::string::npos);
  beat.beat(2);  // within kMinInterval of the last write: skipped
  EXPECT_NE(read_line(dir / "rank-0.json").find(R"("step":1,)"), std::string::npos);
  beat.enter("save", 2, 0.5);
  const std::string save = read_line(dir / "rank-0.json");
  EXPECT_NE(save.find(R"("step":2,"phase":"save")"), std::string::npos) << save;
  EXPECT_NE(save.find(R"("expect_s":0.500)"), std::string::npos) << save;
  EXPECT_NE(save.find("\"pid\":" + std::to_string(::getpid())), std::string::npos) << save;
  beat.beat(2);  // the save ended: at once, whatever the throttle
  EXPECT_NE(read_line(dir / "rank-0.json").find(R"("step":2,"phase":"step")"), std::string::npos);
  beat.beat(3);  // stepping again: throttled
  EXPECT_NE(read_line(dir / "rank-0.json").find(R"("step":2,)"), std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessera::train
