// The CPU peak for MFU (train/peak_calibration.h): cached per machine and build so a
// restart measures nothing, quiet trials preferred, contended results labelled and
// never cached, a damaged cache measured over, and the load measurement sees another
// process's work.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "train/peak_calibration.h"

namespace fs = std::filesystem;

namespace tessera::train {
namespace {

class PeakCalibrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (fs::temp_directory_path() / ("tessera_calibration_" + std::to_string(::getpid()) + "_" +
                                          ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".json"))
                .string();
    fs::remove(path_);
  }
  void TearDown() override { fs::remove(path_); }

  // Trials with the given peaks; `contended` marks which had other processes busy.
  std::function<Trial()> trials(std::vector<double> peaks, std::vector<bool> contended) {
    return [this, peaks, contended] {
      const size_t i = std::min(calls_, peaks.size() - 1);
      ++calls_;
      Trial t;
      t.calibration.peak_flops = peaks[i];
      t.calibration.n = 1024;
      t.calibration.seconds = 0.15;
      t.calibration.method = "test gemm";
      t.load.wall_s = 1;
      t.load.cpus = 2;
      t.load.own_cpu_s = 2;
      t.load.machine_busy_s =
          contended[std::min(i, contended.size() - 1)] ? 3 : 2;  // contended: others used half the machine
      return t;
    };
  }

  std::string path_;
  size_t calls_ = 0;
};

TEST_F(PeakCalibrationTest, ASecondRunReadsTheCacheAndMeasuresNothing) {
  const goodput::Calibration first = machine_peak_flops(path_, trials({100e9, 120e9}, {false}));
  EXPECT_EQ(calls_, 2u);  // two quiet trials, the best kept
  EXPECT_DOUBLE_EQ(first.peak_flops, 120e9);
  EXPECT_NE(first.method.find("best of 2 quiet trial(s) of 2"), std::string::npos) << first.method;
  ASSERT_TRUE(fs::exists(path_));
  calls_ = 0;
  const goodput::Calibration again = machine_peak_flops(path_, trials({1e9}, {false}));
  EXPECT_EQ(calls_, 0u);
  EXPECT_DOUBLE_EQ(again.peak_flops, 120e9);
  EXPECT_NE(again.method.find("(cached "), std::string::npos) << again.method;
  EXPECT_EQ(again.repeats, 0);
}

TEST_F(PeakCalibrationTest, ContendedTrialsAreRetriedLabelledAndNeverCached) {
  const goodput::Calibration c = machine_peak_flops(path_, trials({50e9, 60e9, 55e9}, {true}));
  EXPECT_EQ(calls_, 3u);
  EXPECT_DOUBLE_EQ(c.peak_flops, 60e9);
  EXPECT_NE(c.method.find("contended: others used 50% of the CPUs in all 3 trials, so MFU may read high; not cached"),
            std::string::npos)
      << c.method;
  EXPECT_FALSE(fs::exists(path_));
}

TEST_F(PeakCalibrationTest, AQuietTrialBeatsAFasterContendedOne) {
  const goodput::Calibration c = machine_peak_flops(path_, trials({300e9, 100e9, 110e9}, {true, false, false}));
  EXPECT_EQ(calls_, 3u);  // stops at the second quiet trial
  EXPECT_DOUBLE_EQ(c.peak_flops, 110e9);
}

TEST_F(PeakCalibrationTest, ADamagedOrForeignCacheIsMeasuredOver) {
  std::ofstream(path_) << "{not json";
  EXPECT_DOUBLE_EQ(machine_peak_flops(path_, trials({80e9}, {false})).peak_flops, 80e9);
  EXPECT_EQ(calls_, 2u);
  // Another machine's entry, and this key with a wrong type: both ignored.
  std::ofstream(path_) << R"({"other machine": {"peak_flops": 1e15, "method": "x"}, ")" << calibration_key()
                       << R"(": {"peak_flops": "fast", "method": "x"}})";
  calls_ = 0;
  EXPECT_DOUBLE_EQ(machine_peak_flops(path_, trials({70e9}, {false})).peak_flops, 70e9);
  EXPECT_EQ(calls_, 2u);
  // An empty path: measured every time.
  calls_ = 0;
  machine_peak_flops("", trials({70e9}, {false}));
  machine_peak_flops("", trials({70e9}, {false}));
  EXPECT_EQ(calls_, 4u);
}

// Each compute dtype's GEMM has its own entry: a bf16 run is measured against the bf16
// kernel's rate, not float32's cached one (MFU read above 100% on AMX), and float32's
// key is the one it always had.
TEST_F(PeakCalibrationTest, EachGemmHasItsOwnEntry) {
  const CalibrationGemm f32, bf16{.dtype = DType::BFloat16}, int8{.dtype = DType::BFloat16, .int8 = true};
  EXPECT_EQ(calibration_key(f32), calibration_key());
  EXPECT_EQ(calibration_key().find("GEMM"), std::string::npos);
  EXPECT_NE(calibration_key(bf16), calibration_key(f32));
  EXPECT_NE(calibration_key(int8), calibration_key(bf16));
  EXPECT_EQ(bf16.name(), "bfloat16");
  EXPECT_EQ(int8.name(), "int8 (AQT, bfloat16 operands)");
  EXPECT_DOUBLE_EQ(machine_peak_flops(path_, trials({100e9}, {false}), f32).peak_flops, 100e9);
  EXPECT_DOUBLE_EQ(machine_peak_flops(path_, trials({700e9}, {false}), bf16).peak_flops, 700e9);
  EXPECT_DOUBLE_EQ(machine_peak_flops(path_, trials({1e9}, {false}), f32).peak_flops, 100e9);  // cached
  EXPECT_DOUBLE_EQ(machine_peak_flops(path_, trials({1e9}, {false}), bf16).peak_flops, 700e9);
}

// The real calibration GEMMs run and say which GEMM they timed: the faster of two sizes
// (a power-of-two leading dimension can halve a BLAS's rate).
TEST(CalibrationGemm, EveryGemmRunsAndSaysWhich) {
  const goodput::Calibration f32 = calibrate_peak_flops(0.02);
  EXPECT_GT(f32.peak_flops, 0);
  EXPECT_NE(f32.method.find("tessera matmul f32, the faster of 1024^3 and 1536^3"), std::string::npos) << f32.method;
  EXPECT_TRUE(f32.n == 1024 || f32.n == 1536) << f32.n;
  EXPECT_NE(f32.method.find(fmt::format("({}^3)", f32.n)), std::string::npos) << f32.method;
  const goodput::Calibration bf16 = calibrate_peak_flops(0.02, {.dtype = DType::BFloat16});
  EXPECT_GT(bf16.peak_flops, 0);
  EXPECT_NE(bf16.method.find("bf16"), std::string::npos) << bf16.method;
  const goodput::Calibration int8 = calibrate_peak_flops(0.02, {.dtype = DType::BFloat16, .int8 = true});
  EXPECT_GT(int8.peak_flops, 0);
  EXPECT_NE(int8.method.find("int8"), std::string::npos) << int8.method;
}

TEST(TrialLoad, SeesAnotherProcessBurningACpu) {
  const pid_t spinner = ::fork();
  ASSERT_GE(spinner, 0);
  if (spinner == 0) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    volatile double x = 0;
    while (std::chrono::steady_clock::now() < end) x = x + 1;
    ::_exit(0);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const TrialLoad load = measure_load([] { std::this_thread::sleep_for(std::chrono::milliseconds(400)); });
  ::kill(spinner, SIGKILL);
  ::waitpid(spinner, nullptr, 0);
  EXPECT_TRUE(load.contended()) << "others' share " << load.others_share() << " of " << load.cpus << " CPUs";
  EXPECT_GE(load.others_share() * load.cpus, 0.5);  // about one CPU's worth
}

TEST(TrialLoad, OthersShareIsTheMachinesBusyTimeLessOurOwn) {
  TrialLoad load{.wall_s = 2, .own_cpu_s = 3, .machine_busy_s = 3.4, .cpus = 4};
  EXPECT_NEAR(load.others_share(), 0.05, 1e-12);
  EXPECT_FALSE(load.contended());
  load.machine_busy_s = 3.5;
  EXPECT_TRUE(load.contended());
  load.machine_busy_s = 1;  // clock granularity can put the machine below us: never negative
  EXPECT_DOUBLE_EQ(load.others_share(), 0);
}

}  // namespace
}  // namespace tessera::train
