// Recording: the Recorder's log lines, restarts continuing one log, threads, spans;
// the device table and the CPU calibration GEMM.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "tessera/base/error.h"
#include "tessera/goodput/calculator.h"
#include "tessera/goodput/calibration.h"
#include "tessera/goodput/devices.h"
#include "tessera/goodput/recorder.h"
#include "tessera/goodput/report.h"

namespace tessera::goodput {
namespace {

namespace fs = std::filesystem;

class TempRun {
 public:
  explicit TempRun(const std::string& name)
      : dir_(fs::temp_directory_path() / ("tessera_goodput_" + name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(dir_);
  }
  ~TempRun() { fs::remove_all(dir_); }
  const fs::path& dir() const { return dir_; }

 private:
  fs::path dir_;
};

// A clock the test advances by hand.
struct FakeClock {
  std::shared_ptr<std::atomic<double>> now = std::make_shared<std::atomic<double>>(1000.0);
  RecorderOptions options() const {
    RecorderOptions o;
    auto n = now;
    o.clock = [n] { return n->load(); };
    o.fsync = false;
    return o;
  }
  void advance(double s) { now->store(now->load() + s); }
};

TEST(GoodputRecorder, WritesVersionedLinesThatTheCalculatorReads) {
  TempRun run("lines");
  FakeClock clock;
  {
    Recorder rec(run.dir(), clock.options());
    rec.job_start("unit");
    rec.attempt_start();
    EXPECT_EQ(rec.attempt(), 0);
    {
      Span init(rec, Phase::kBackendInit);
      clock.advance(2);
    }
    {
      Span compile(rec, Phase::kCompile);
      compile.set_cache_hit(true);
      clock.advance(1);
    }
    for (int s = 0; s < 4; ++s) {
      rec.step_start(s);
      clock.advance(0.5);
      rec.step_end(s, 64, 1e6);
    }
    rec.job_end(true);
  }
  const EventLog log = read_event_log(event_log_path(run.dir()));
  EXPECT_TRUE(log.warnings.empty());
  ASSERT_EQ(log.events.size(), 1u + 1 + 2 + 2 + 8 + 1);
  for (const Event& e : log.events) {
    EXPECT_EQ(e.fields.at("v"), kSchemaVersion);
    EXPECT_EQ(e.attempt, 0);
  }
  EXPECT_EQ(log.events[0].text("job"), "unit");
  EXPECT_TRUE(log.events[5].flag("cache_hit"));
  const GoodputReport r = compute_goodput(log);
  EXPECT_NEAR(r.total_s, 5, 1e-9);
  EXPECT_NEAR(r.seconds_of(Category::kInit), 2, 1e-9);
  EXPECT_NEAR(r.seconds_of(Category::kCompile), 1, 1e-9);
  EXPECT_NEAR(r.seconds_of(Category::kProductive), 2, 1e-9);
}

TEST(GoodputRecorder, RestartContinuesTheLogWithTheNextAttempt) {
  TempRun run("restart");
  FakeClock clock;
  {
    Recorder rec(run.dir(), clock.options());
    rec.job_start("job");
    rec.attempt_start();
    rec.step_start(0);
    clock.advance(1);
    rec.failure(9, 137, "preempted");
  }
  {
    // The crash tore a half-written line; the next writer starts on a fresh line.
    std::ofstream(event_log_path(run.dir()), std::ios::app) << R"({"v":1,"t":10)";
  }
  clock.advance(5);
  Recorder rec(run.dir(), clock.options());
  rec.job_start("job");  // already in the log: not written again
  rec.attempt_start();
  EXPECT_EQ(rec.attempt(), 1);
  rec.job_end();
  const EventLog log = read_event_log(rec.path());
  int job_starts = 0;
  std::string reason;
  for (const Event& e : log.events) {
    job_starts += e.type == EventType::kJobStart;
    if (e.type == EventType::kAttemptStart && e.attempt == 1) reason = e.text("reason");
  }
  EXPECT_EQ(job_starts, 1);
  EXPECT_EQ(reason, "preempted");
  ASSERT_EQ(log.warnings.size(), 1u);
  EXPECT_NE(log.warnings[0].find("not a JSON object"), std::string::npos) << log.warnings[0];
  EXPECT_EQ(compute_goodput(log).disruptions, 1);
}

TEST(GoodputRecorder, ThreadSafeAppends) {
  TempRun run("threads");
  Recorder rec(run.dir(), RecorderOptions{.clock = {}, .fsync = false});
  rec.job_start();
  rec.attempt_start();
  constexpr int kThreads = 4, kEach = 200;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&rec, t] {
      for (int i = 0; i < kEach; ++i) rec.custom_badput_start("thread" + std::to_string(t));
    });
  for (auto& th : threads) th.join();
  const EventLog log = read_event_log(rec.path());
  EXPECT_TRUE(log.warnings.empty());
  EXPECT_EQ(log.events.size(), 2u + kThreads * kEach);
}

TEST(GoodputRecorder, SpanClosesThePhaseWhenUnwinding) {
  TempRun run("span");
  FakeClock clock;
  Recorder rec(run.dir(), clock.options());
  rec.attempt_start();
  try {
    Span eval(rec, Phase::kEval);
    clock.advance(3);
    throw ValueError("eval blew up");
  } catch (const ValueError&) {
  }
  const EventLog log = read_event_log(rec.path());
  ASSERT_EQ(log.events.size(), 3u);
  EXPECT_EQ(log.events[2].type, EventType::kEvalEnd);
  EXPECT_NEAR(log.events[2].t - log.events[1].t, 3, 1e-9);
}

TEST(GoodputRecorder, UnwritableRunDirIsAnIOError) {
  TempRun run("unwritable");
  fs::create_directories(run.dir());
  std::ofstream(run.dir() / "goodput") << "a file where the directory should be";
  EXPECT_THROW(Recorder rec(run.dir()), IOError);
}

TEST(GoodputDevices, TableHasTheDatasheetPeaks) {
  const std::vector<DeviceSpec> table = load_device_table(fs::path(TESSERA_SOURCE_DIR) / "configs/accelerators.toml");
  auto peak = [&](const char* name) {
    const auto spec = find_device(table, name);
    return spec ? spec->peak_flops : -1.0;
  };
  EXPECT_EQ(peak("NVIDIA H100 80GB HBM3"), 989e12);
  EXPECT_EQ(peak("NVIDIA H200"), 989e12);
  EXPECT_EQ(peak("NVIDIA A100-SXM4-40GB"), 312e12);
  EXPECT_EQ(peak("TPU v5e"), 197e12);
  EXPECT_EQ(peak("TPU v5p"), 459e12);
  EXPECT_EQ(peak("TPU v6e"), 918e12);
  EXPECT_EQ(peak("NVIDIA H100 PCIe"), 756e12);  // the variant is listed before its family
  EXPECT_EQ(peak("NVIDIA L40S"), 362e12);
  EXPECT_EQ(peak("NVIDIA B200"), 2250e12);
  EXPECT_FALSE(find_device(table, "AMD EPYC 7B13").has_value());
}

// The compiled-in table is the file (one table for every program), and a device it does
// not list is counted against the caller's estimate, labelled as one.
TEST(GoodputDevices, BuiltInTableIsConfigsAcceleratorsToml) {
  const std::vector<DeviceSpec> file = load_device_table(fs::path(TESSERA_SOURCE_DIR) / "configs/accelerators.toml");
  const std::vector<DeviceSpec>& built_in = builtin_device_table();
  ASSERT_EQ(built_in.size(), file.size());
  for (size_t i = 0; i < file.size(); ++i) {
    EXPECT_EQ(built_in[i].key, file[i].key);
    EXPECT_EQ(built_in[i].peak_flops, file[i].peak_flops);
    EXPECT_EQ(built_in[i].match, file[i].match);
  }
  const DeviceRecord h100 = device_peak("NVIDIA H100 80GB HBM3", 1, 1e12, "SMs x clock");
  EXPECT_EQ(h100.peak_flops_per_device, 989e12);
  EXPECT_EQ(h100.source, "configs/accelerators.toml [h100], bf16 dense");
  const DeviceRecord unknown = device_peak("NVIDIA RTX 9090", 2, 123e12, "SMs x clock");
  EXPECT_EQ(unknown.peak_flops_per_device, 123e12);
  EXPECT_EQ(unknown.count, 2);
  EXPECT_EQ(unknown.source, "estimated (SMs x clock): not in configs/accelerators.toml");
}

TEST(GoodputDevices, BadTableNamesTheLine) {
  try {
    parse_device_table("[x]\nname = \"X\"\npeak_flops = lots\n", "accelerators.toml");
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("accelerators.toml:3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_device_table("[x]\ncolour = \"red\"\n", "d"), ConfigError);
  EXPECT_THROW(parse_device_table("[x]\nname = \"X\"\n", "d"), ConfigError);  // no peak_flops, no match, ...
}

TEST(GoodputCalibration, MeasuresTheGemmRate) {
  int calls = 0;
  const int n = 32;
  // The caller's GEMM is checked here against a float64 reference on the calibration inputs.
  const Calibration c = calibrate_cpu_gemm(
      [&](int size, const float* a, const float* b, float* out) {
        ++calls;
        for (int i = 0; i < size; ++i)
          for (int j = 0; j < size; ++j) {
            double acc = 0;
            for (int k = 0; k < size; ++k) acc += static_cast<double>(a[i * size + k]) * b[k * size + j];
            out[i * size + j] = static_cast<float>(acc);
          }
      },
      "reference gemm", n, 0.01);
  EXPECT_EQ(c.method, "reference gemm");
  EXPECT_EQ(c.n, n);
  EXPECT_EQ(calls, c.repeats + 1);  // one warm-up
  EXPECT_GE(c.seconds, 0.01);
  EXPECT_GT(c.peak_flops, 0);
  EXPECT_GE(c.peak_flops, 2.0 * n * n * n * c.repeats / c.seconds * 0.999);  // the best repeat beats the mean

  const Calibration naive = calibrate_cpu_gemm({}, "", 64, 0.01);
  EXPECT_EQ(naive.method, "naive blocked gemm");
  EXPECT_GT(naive.peak_flops, 1e6);
  EXPECT_THROW(calibrate_cpu_gemm({}, "", 0), ValueError);
}

}  // namespace
}  // namespace tessera::goodput
