// The cached, quiet CPU peak (see peak_calibration.h).
#include "train/peak_calibration.h"

#include <fmt/format.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "tessera/base/error.h"
#include "tessera/base/file_io.h"
#include "tessera/base/flags.h"
#include "tessera/base/json_field.h"
#include "tessera/base/thread_pool.h"
#include "tessera/base/version.h"
#include "tessera/compiler/compilation_cache.h"
#include "tessera/train/trainer.h"

namespace fs = std::filesystem;

namespace tessera::train {
namespace {

constexpr int kMaxTrials = 3;
constexpr int kQuietTrialsWanted = 2;
constexpr double kTrialSeconds = 0.1;
constexpr size_t kMaxCacheEntries = 16;

// Non-idle seconds of all CPUs so far (the "cpu" line of /proc/stat), or nullopt.
std::optional<double> machine_busy_seconds() {
  std::ifstream in("/proc/stat");
  std::string label;
  if (!(in >> label) || label != "cpu") return std::nullopt;
  // user nice system idle iowait irq softirq steal
  double v[8] = {};
  for (double& x : v)
    if (!(in >> x)) return std::nullopt;
  const double busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
  return busy / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

double process_cpu_seconds() {
  timespec t{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

Trial gemm_trial(const CalibrationGemm& gemm) {
  Trial trial;
  trial.load = measure_load([&] { trial.calibration = calibrate_peak_flops(kTrialSeconds, gemm); });
  return trial;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.starts_with("model name")) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  return "unknown CPU";
}

std::string today() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  return fmt::format("{:04d}-{:02d}-{:02d}", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday);
}

nlohmann::json read_cache(const std::string& path) {
  std::ifstream in(path);
  if (!in) return nlohmann::json::object();
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  return j.is_object() ? j : nlohmann::json::object();  // damaged: start over
}

std::optional<goodput::Calibration> cached(const nlohmann::json& cache, const std::string& key) {
  const std::optional<nlohmann::json> entry = json_field<nlohmann::json>(cache, key);
  if (!entry) return std::nullopt;
  const std::optional<double> peak = json_field<double>(*entry, "peak_flops");
  const std::optional<std::string> method = json_field<std::string>(*entry, "method");
  if (!peak || !(*peak > 0) || !method) return std::nullopt;
  goodput::Calibration c;
  c.peak_flops = *peak;
  c.n = json_field_or<int>(*entry, "n", 0);
  c.repeats = 0;  // nothing was timed in this run
  c.seconds = 0;
  c.method = fmt::format("{} (cached {}; {})", *method, json_field_or<std::string>(*entry, "date", "?"),
                         "TESSERA_CALIBRATION_CACHE");
  return c;
}

}  // namespace

TrialLoad measure_load(const std::function<void()>& work) {
  const std::optional<double> busy0 = machine_busy_seconds();
  const double cpu0 = process_cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  work();
  TrialLoad load;
  load.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  load.own_cpu_s = process_cpu_seconds() - cpu0;
  const std::optional<double> busy1 = machine_busy_seconds();
  // Without /proc/stat nothing can be said: the trial counts as quiet.
  load.machine_busy_s = busy0 && busy1 ? *busy1 - *busy0 : load.own_cpu_s;
  load.cpus = static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
  return load;
}

double TrialLoad::others_share() const {
  if (!(wall_s > 0) || cpus < 1) return 0;
  return std::max(0.0, machine_busy_s - own_cpu_s) / (wall_s * static_cast<double>(cpus));
}

std::string calibration_key(const CalibrationGemm& gemm) {
  std::string key =
      fmt::format("{} | {} cpus | {} threads | tessera {} build {}", cpu_model(),
                  std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)), num_threads(), version(), compiler::build_identity());
  if (gemm.int8 || gemm.dtype != DType::Float32) key += " | " + gemm.name() + " GEMM";
  return key;
}

std::string calibration_cache_path() {
  const char* value = flags::env("TESSERA_CALIBRATION_CACHE");
  const std::string path = fileio::expand_home(value != nullptr ? value : "~/.cache/tessera/calibration.json");
  return path.starts_with("~/") ? std::string() : path;  // no HOME: measure every run
}

goodput::Calibration machine_peak_flops(const std::string& cache_path, const std::function<Trial()>& trial,
                                        const CalibrationGemm& gemm) {
  const std::string key = calibration_key(gemm);
  nlohmann::json cache = cache_path.empty() ? nlohmann::json::object() : read_cache(cache_path);
  if (std::optional<goodput::Calibration> hit = cached(cache, key)) return *hit;

  const std::function<Trial()> run = trial ? trial : std::function<Trial()>([&gemm] { return gemm_trial(gemm); });
  std::optional<Trial> best_quiet, best_any;
  int quiet = 0, trials = 0;
  double seconds = 0;
  while (trials < kMaxTrials && quiet < kQuietTrialsWanted) {
    Trial t = run();
    ++trials;
    seconds += t.calibration.seconds;
    if (!best_any || t.calibration.peak_flops > best_any->calibration.peak_flops) best_any = t;
    if (!t.load.contended()) {
      ++quiet;
      if (!best_quiet || t.calibration.peak_flops > best_quiet->calibration.peak_flops) best_quiet = t;
    }
  }
  goodput::Calibration result = (best_quiet ? best_quiet : best_any)->calibration;
  result.seconds = seconds;
  if (!best_quiet) {
    result.method += fmt::format(
        ", contended: others used {:.0f}% of the CPUs in all {} trials, so MFU may read high; "
        "not cached",
        100 * best_any->load.others_share(), trials);
    return result;
  }
  result.method += fmt::format(", best of {} quiet trial(s) of {}", quiet, trials);
  if (!cache_path.empty()) {
    // Every rebuild is a new key: keep the file small.
    while (cache.size() >= kMaxCacheEntries) cache.erase(cache.begin());
    cache[key] = {{"peak_flops", result.peak_flops}, {"n", result.n}, {"method", result.method}, {"date", today()}};
    try {
      fs::create_directories(fs::path(cache_path).parent_path());
      fileio::write_file_atomic(cache_path, cache.dump(2) + "\n", fileio::Durability::Atomic);
    } catch (const std::exception& e) {
      // A read-only home costs a measurement per run, nothing else.
      std::fprintf(stderr, "warning: cannot cache the CPU calibration in %s: %s\n", cache_path.c_str(), e.what());
    }
  }
  return result;
}

}  // namespace tessera::train
