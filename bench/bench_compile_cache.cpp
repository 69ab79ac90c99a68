// bench_compile_cache: compile time of the trainer's step (train/TrainStep::compile:
// trace, passes, memory plan) cold (empty persistent compilation cache: compile and
// store) against warm (a new process finding the entry on disk), warm both without the
// index (TESSERA_COMPILATION_CACHE_INDEX=0: trace, key, load, deserialize) and with it
// (index key, load, deserialize: no trace). Each measurement runs in its own child
// process (this binary with --child), so nothing is shared in memory; medians of
// --repeats runs.
//
//   build/bin/bench_compile_cache [--presets tiny,small] [--repeats 3] [--batch 8] [--seq 256] [--dir D]
//
// A table goes to stdout; the last line is one JSON object.
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tessera/compiler/compilation_cache.h"
#include "tessera/models/model.h"
#include "tessera/optim/optimizer.h"
#include "tessera/tessera.h"
#include "tessera/train/train_step.h"
#include "train_bench_util.h"

namespace ts = tessera;
namespace fs = std::filesystem;

namespace {

struct Flags {
  std::vector<std::string> presets = {"tiny", "small"};
  int64_t repeats = 3, batch = 8, seq = 256;
  std::string dir;
  std::string child_preset;  // --child: compile once and print the time
};

Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const std::string value = ts::bench::flag_value("bench_compile_cache", argc, argv, i);
    auto integer = [&] { return ts::bench::flag_integer("bench_compile_cache", arg, value); };
    if (arg == "--presets") {
      f.presets.clear();
      std::stringstream s(value);
      for (std::string p; std::getline(s, p, ',');) f.presets.push_back(p);
    } else if (arg == "--repeats") {
      f.repeats = std::max<int64_t>(1, integer());
    } else if (arg == "--batch") {
      f.batch = std::max<int64_t>(1, integer());
    } else if (arg == "--seq") {
      f.seq = std::max<int64_t>(1, integer());
    } else if (arg == "--dir") {
      f.dir = value;
    } else if (arg == "--child") {
      f.child_preset = value;
    } else {
      ts::fail<ts::ValueError>(
          "bench_compile_cache: unknown flag {} (flags: --presets --repeats --batch --seq --dir --child)", arg);
    }
  }
  return f;
}

// The child: one TrainStep::compile with the cache in f.dir; prints "seconds hit
// index_hit traces".
int run_child(const Flags& f) {
  ts::compiler::set_compilation_cache(f.dir);
  ts::models::ModelConfig config = ts::models::preset(f.child_preset);
  config.context = std::max(config.context, f.seq);
  ts::models::Model model(config);
  ts::optim::OptimizerConfig adamw;
  adamw.no_decay = {ts::nn::ParamKind::Bias, ts::nn::ParamKind::Norm};
  ts::optim::Optimizer optimizer(adamw, model.specs());
  ts::Tree params = model.init(0);
  ts::Tree opt_state = optimizer.init(params);
  ts::train::TrainStep step(model, optimizer, 1);
  std::mt19937_64 gen(1);
  const ts::data::Batch batch = ts::bench::random_batch(config.vocab, f.batch, f.seq, gen);
  const auto t0 = std::chrono::steady_clock::now();
  step.compile(params, opt_state, batch, std::nullopt);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const ts::compiler::CompilationCacheStats stats = ts::compiler::compilation_cache_stats();
  fmt::print("{} {} {} {}\n", seconds, stats.hits > 0 && stats.misses == 0 ? 1 : 0,
             stats.index_hits > 0 && stats.index_misses == 0 ? 1 : 0, step.trace_count());
  return 0;
}

struct ChildResult {
  double seconds = 0;
  bool hit = false;
  bool index_hit = false;
  int traces = 0;
};

// dir "": the child compiles without a cache. `index` false: without the index.
ChildResult run_in_child(const std::string& self, const Flags& f, const std::string& preset, const std::string& dir,
                         bool index = true) {
  const std::string command =
      fmt::format("TESSERA_COMPILATION_CACHE_INDEX={} '{}' --child {} --dir '{}' --batch {} --seq {}", index ? 1 : 0,
                  self, preset, dir, f.batch, f.seq);
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) ts::fail<ts::IOError>("bench_compile_cache: cannot run {}", command);
  char line[256] = {0};
  const bool got = std::fgets(line, sizeof(line), pipe) != nullptr;
  const int status = ::pclose(pipe);
  ChildResult r;
  int hit = 0, index_hit = 0;
  if (!got || status != 0 || std::sscanf(line, "%lf %d %d %d", &r.seconds, &hit, &index_hit, &r.traces) != 4)
    ts::fail<ts::IOError>("bench_compile_cache: child `{}` failed (status {}, output '{}')", command, status, line);
  r.hit = hit != 0;
  r.index_hit = index_hit != 0;
  return r;
}

// Seconds to read, check and deserialize every entry (the part of a warm compile that
// is not tracing the step).
double load_seconds(const fs::path& dir) {
  ts::compiler::CompilationCache cache(dir);
  const auto entries = cache.entries();
  const auto t0 = std::chrono::steady_clock::now();
  for (const ts::compiler::CacheEntryInfo& e : entries) {
    if (!cache.load(e.key)) ts::fail<ts::Error>("bench_compile_cache: entry {} does not load", e.fingerprint);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

uint64_t dir_bytes(const fs::path& dir) {
  uint64_t total = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".tsxc" || e.path().extension() == ".tsxi") total += e.file_size();
  return total;
}

int run(Flags f, const std::string& self) {
  const bool own_dir = f.dir.empty();
  if (own_dir) f.dir = (fs::temp_directory_path() / fmt::format("bench_compile_cache.{}", ::getpid())).string();
  fmt::print("bench_compile_cache: TrainStep::compile, batch {} x seq {}, medians of {} (each run a new process)\n",
             f.batch, f.seq, f.repeats);
  fmt::print("{:<12} {:>11} {:>9} {:>13} {:>8} {:>13} {:>8} {:>9} {:>12}\n", "preset", "no cache s", "cold s",
             "warm traced s", "traced %", "warm index s", "index %", "load s", "entry bytes");
  std::string json = "{\"bench\": \"compile_cache\", \"results\": [";
  for (size_t p = 0; p < f.presets.size(); ++p) {
    const std::string& preset = f.presets[p];
    std::vector<double> plain, cold, traced, warm, load;
    uint64_t bytes = 0;
    for (int64_t r = 0; r < f.repeats; ++r) {
      fs::remove_all(f.dir);
      plain.push_back(run_in_child(self, f, preset, "").seconds);
      const ChildResult c = run_in_child(self, f, preset, f.dir);
      const ChildResult t = run_in_child(self, f, preset, f.dir, /*index=*/false);
      const ChildResult w = run_in_child(self, f, preset, f.dir);
      if (c.hit || !t.hit || t.traces != 1 || !w.index_hit || w.traces != 0)
        ts::fail<ts::Error>(
            "bench_compile_cache: {}: expected a cold miss, a traced warm hit, then an index hit without tracing "
            "(got hit={}; hit={} traces={}; index hit={} traces={})",
            preset, c.hit, t.hit, t.traces, w.index_hit, w.traces);
      cold.push_back(c.seconds);
      traced.push_back(t.seconds);
      warm.push_back(w.seconds);
      bytes = dir_bytes(f.dir);
      load.push_back(load_seconds(f.dir));
    }
    const double n = ts::median(plain), c = ts::median(cold), t = ts::median(traced), w = ts::median(warm),
                 l = ts::median(load);
    fmt::print("{:<12} {:>11.3f} {:>9.3f} {:>13.3f} {:>7.1f}% {:>13.4f} {:>7.1f}% {:>9.4f} {:>12}\n", preset, n, c, t,
               100 * t / c, w, 100 * w / c, l, bytes);
    json += fmt::format(
        "{}{{\"preset\": \"{}\", \"no_cache_s\": {:.4f}, \"cold_s\": {:.4f}, \"warm_traced_s\": {:.4f}, "
        "\"warm_traced_fraction\": {:.4f}, \"warm_index_s\": {:.4f}, \"warm_index_fraction\": {:.4f}, "
        "\"load_s\": {:.4f}, \"entry_bytes\": {}}}",
        p ? ", " : "", preset, n, c, t, t / c, w, w / c, l, bytes);
  }
  if (own_dir) fs::remove_all(f.dir);
  fmt::print("{}], \"batch\": {}, \"seq\": {}, \"repeats\": {}}}\n", json, f.batch, f.seq, f.repeats);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Flags f = parse_flags(argc, argv);
    if (!f.child_preset.empty()) return run_child(f);
    return run(f, fs::canonical("/proc/self/exe").string());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_compile_cache: %s\n", e.what());
    return 1;
  }
}
