#include "tessera/train/trainer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "tessera/backend/cuda.h"
#include "tessera/base/error.h"
#include "tessera/base/flags.h"
#include "tessera/base/json_field.h"
#include "tessera/base/statistics.h"
#include "tessera/base/thread_pool.h"
#include "tessera/ckpt/checkpoint.h"
#include "tessera/compiler/compilation_cache.h"
#include "tessera/compiler/device_program.h"
#include "tessera/core/ops.h"
#include "tessera/core/random.h"
#include "tessera/data/loader.h"
#include "tessera/data/prepare.h"
#include "tessera/data/tokenizer.h"
#include "tessera/goodput/rank_log.h"
#include "tessera/goodput/recorder.h"
#include "tessera/goodput/report.h"
#include "tessera/models/model.h"
#include "tessera/nn/param.h"
#include "tessera/optim/optimizer.h"
#include "tessera/optim/schedule.h"
#include "tessera/spmd/runtime.h"
#include "tessera/train/parallel.h"
#include "tessera/train/pretrained.h"
#include "tessera/train/progress.h"
#include "tessera/train/tensorboard.h"
#include "tessera/train/train_step.h"
#include "train/checkpoint_saver.h"
#include "train/config_checks.h"
#include "train/fault_injection.h"
#include "train/heartbeat.h"
#include "train/train_loop.h"

namespace tessera::train {

namespace fs = std::filesystem;

namespace {

// The run directory must exist and take writes before any work is done: a run that
// trains for an hour and then cannot save is the worst outcome.
void check_writable(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail<IOError>("run directory '{}' cannot be created: {}", dir.string(), ec.message());
  const fs::path probe = dir / fmt::format(".write-probe-{}", ::getpid());
  std::FILE* f = std::fopen(probe.c_str(), "w");
  if (!f) fail<IOError>("run directory '{}' cannot be written: {}", dir.string(), std::strerror(errno));
  std::fclose(f);
  fs::remove(probe, ec);
}

// SIGINT/SIGTERM (a preemption notice, Ctrl-C): the loop finishes its step, saves a
// checkpoint and returns, so the next attempt loses nothing.
std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int signal) { g_stop_signal.store(signal); }

class StopSignalScope {
 public:
  StopSignalScope() {
    g_stop_signal.store(0);
    struct sigaction action {};
    action.sa_handler = on_stop_signal;
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, &old_int_);
    sigaction(SIGTERM, &action, &old_term_);
  }
  ~StopSignalScope() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }

 private:
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
};

}  // namespace

std::string ensure_data(const DataConfig& data) {
  if (fs::exists(data.train) && fs::exists(data.val)) return "";
  auto existing = [](const std::vector<std::string>& paths) {
    std::vector<fs::path> found;
    for (const std::string& p : paths)
      if (fs::exists(p)) found.emplace_back(p);
    return found;
  };
  std::vector<fs::path> inputs = existing(data.sources);
  std::string which = "data.sources";
  if (inputs.empty()) {
    inputs = existing(data.fallback_sources);
    which = "data.fallback_sources";
  }
  if (inputs.empty())
    fail<ConfigError>(
        "data: '{}' or '{}' does not exist and there is nothing to prepare it from (data.sources and "
        "data.fallback_sources list no existing path); run `tessera data prepare` or set data.sources",
        data.train, data.val);
  const fs::path out_dir = fs::path(data.train).parent_path();
  if (fs::path(data.val).parent_path() != out_dir || fs::path(data.train).filename() != "train.bin" ||
      fs::path(data.val).filename() != "val.bin")
    fail<ConfigError>(
        "data: preparing from {} writes <dir>/train.bin and <dir>/val.bin; data.train '{}' and data.val "
        "'{}' must name those two files of one directory",
        which, data.train, data.val);
  data::PrepareOptions options;
  options.tokenizer = data.tokenizer;
  options.val_fraction = data.val_fraction;
  data::PrepareResult result = data::prepare_dataset(inputs, out_dir, options);
  return fmt::format("prepared {} from {} ({} files, {} train + {} validation tokens)", out_dir.string(), which,
                     result.files.size(), result.train_tokens, result.val_tokens);
}

std::string CalibrationGemm::name() const {
  return int8 ? fmt::format("int8 (AQT, {} operands)", tessera::name(dtype)) : std::string(tessera::name(dtype));
}

goodput::Calibration calibrate_peak_flops(double seconds, const CalibrationGemm& gemm) {
  // tessera's own matmul (the kernel path training uses: the packed f32 / AMX / AVX-512
  // kernels split over tessera's thread pool). The pointers calibrate_cpu_gemm passes are
  // ignored: the operands are made once here, so the timing holds no copies. Two sizes,
  // the faster counts: a power-of-two leading dimension (1024 floats, 4 KiB rows) can
  // halve a BLAS's rate through cache-set conflicts (the AVX2 EPYC machines: 89 against
  // 182 GFLOP/s at 1536^3), which would make the peak lower than the model's own GEMMs.
  goodput::Calibration best;
  std::vector<std::string> sizes;
  for (const int n : {1024, 1536}) {
    const Array a = astype(random::normal(key(1), {n, n}), gemm.dtype).eval();
    const Array b = astype(random::normal(key(2), {n, n}), gemm.dtype).eval();
    auto run = [&](int asked, const float*, const float*, float*) {
      if (asked != n) fail<ValueError>("calibrate_peak_flops: asked for n = {}, prepared {}", asked, n);
      (gemm.int8 ? quantized_matmul(a, b) : matmul(a, b)).eval();
    };
    const goodput::Calibration c = goodput::calibrate_cpu_gemm(run, "", n, seconds / 2);
    sizes.push_back(fmt::format("{}^3", n));
    if (c.peak_flops > best.peak_flops) {
      const int repeats = best.repeats + c.repeats;
      const double spent = best.seconds + c.seconds;
      best = c;
      best.repeats = repeats;
      best.seconds = spent;
    } else {
      best.repeats += c.repeats;
      best.seconds += c.seconds;
    }
  }
  const std::string kind = gemm.int8 ? fmt::format("tessera int8 GEMM (AQT, {} operands)", name(gemm.dtype))
                                     : fmt::format("tessera matmul {}", short_name(gemm.dtype));
  best.method = fmt::format("{}, the faster of {} ({}^3)", kind, fmt::join(sizes, " and "), best.n);
  return best;
}

goodput::DeviceRecord cuda_device_peak(const cuda::DeviceInfo& info) {
  return goodput::device_peak(info.name, 1, info.estimated_peak_bf16_flops, "SMs x clock x bf16 FLOP per SM-clock");
}

struct Trainer::Impl {
  TrainConfig config;
  TrainerOptions options;
  Tree params, opt_state;
  bool ran = false;
  std::unique_ptr<TensorBoardWriter> tensorboard;  // primary process with run.tensorboard
  std::unique_ptr<goodput::RankRecorder> rank_recorder;
};

namespace {

// Where the goodput logs go: the launcher's run directory (TESSERA_GOODPUT_DIR, which
// `tessera launch` sets, so tasks that train in directories of their own still record
// into one job), else run.dir.
fs::path goodput_dir(const TrainConfig& cfg) {
  const char* dir = flags::env("TESSERA_GOODPUT_DIR");
  return dir != nullptr && *dir != '\0' ? fs::path(dir) : fs::path(cfg.run.dir);
}

// The attempt a rank other than 0 records under: the one the launcher opened, or -1
// (the reader places its steps by time).
int launcher_attempt() {
  const char* attempt = flags::env("TESSERA_GOODPUT_ATTEMPT");
  if (attempt == nullptr || *attempt == '\0') return -1;
  char* end = nullptr;
  const long n = std::strtol(attempt, &end, 10);
  return *end == '\0' && n >= 0 && n < (1L << 30) ? static_cast<int>(n) : -1;
}

}  // namespace

Trainer::Trainer(TrainConfig config, TrainerOptions options) : impl_(std::make_unique<Impl>()) {
  // run.init_from: the model's shape is the stored model's (its weights load in run_attempt);
  // once the run has checkpoints of its own, theirs (a resume needs no init_from).
  if (!config.run.init_from.empty()) {
    const fs::path run_dir = config.run.dir;
    const bool resuming = !ckpt::list_checkpoints(run_dir / "checkpoints").empty();
    config.model = train::init_from_model_config(config.model, resuming ? run_dir : fs::path(config.run.init_from));
  }
  config.model.compute_dtype = detail::resolve_compute_dtype(config.model.compute_dtype, config.run.device);
  detail::resolve_quant_mode(config, "config");
  config.validate();
  impl_->config = std::move(config);
  impl_->options = options;
}

Trainer::~Trainer() = default;

const Tree& Trainer::params() const { return impl_->params; }
const Tree& Trainer::opt_state() const { return impl_->opt_state; }
const TrainConfig& Trainer::config() const { return impl_->config; }

TrainSummary Trainer::run() {
  if (impl_->ran) fail<ValueError>("Trainer::run: a Trainer runs once; make a new one to train again");
  impl_->ran = true;
  const TrainConfig& cfg = impl_->config;
  // The run directory is checked before anything is recorded in it.
  check_writable(cfg.run.dir);
  // The persistent compilation cache: a restarted job loads its programs from disk.
  if (cfg.run.compilation_cache == "auto") {
    if (flags::env("TESSERA_COMPILATION_CACHE_DIR") == nullptr)
      compiler::set_compilation_cache((fs::path(cfg.run.dir) / "compilation_cache").string());
  } else {
    compiler::set_compilation_cache(cfg.run.compilation_cache);
  }
  // A job whose last checkpoint already reached train.steps has nothing left to do:
  // rerunning it only reports, and is not a new attempt in the goodput log.
  const std::vector<ckpt::CheckpointInfo> existing = ckpt::list_checkpoints(fs::path(cfg.run.dir) / "checkpoints");
  const bool already_done = !existing.empty() && existing.back().step >= cfg.loop.steps;
  std::unique_ptr<goodput::Recorder> recorder;
  // Under mpirun every rank trains; rank 0 alone records the job's log, prints and writes
  // files. Workers of `tessera launch` without MPI (fork, srun tasks) share the launcher's
  // goodput directory: there too rank 0 alone writes the job's log; a trainer on its own
  // writes its own. Every rank records its own steps (stragglers: goodput/rank_log.h).
  const goodput::RankIdentity rank = job_rank();
  const fs::path goodput_run_dir = goodput_dir(cfg);
  const bool under_launcher = flags::env("TESSERA_GOODPUT_DIR") != nullptr;
  const bool writes_job_log = spmd::is_primary_process() && (!under_launcher || rank.rank == 0);
  if (impl_->options.record_goodput && !already_done && writes_job_log) {
    recorder = std::make_unique<goodput::Recorder>(goodput_run_dir);
    recorder->job_start(cfg.run.dir);
    recorder->attempt_start();
  }
  if (impl_->options.record_goodput && !already_done)
    impl_->rank_recorder = std::make_unique<goodput::RankRecorder>(goodput_run_dir, rank,
                                                                   recorder ? recorder->attempt() : launcher_attempt());
  StopSignalScope signals;
  try {
    TrainSummary summary = run_attempt(recorder.get());
    if (recorder) {
      if (summary.end_step >= cfg.loop.steps)
        recorder->job_end(true);
      else if (summary.stop_reason.starts_with("signal"))
        recorder->failure(g_stop_signal.load(), 0, "stopped by " + summary.stop_reason);
    }
    if (impl_->options.record_goodput && writes_job_log && fs::exists(goodput::event_log_path(goodput_run_dir))) {
      const goodput::GoodputReport report = goodput::report_for_run(goodput_run_dir);
      summary.goodput_table = goodput::format_table(report);
      if (impl_->tensorboard)
        impl_->tensorboard->add_scalars(summary.end_step, {{"goodput/goodput", report.goodput},
                                                           {"goodput/runtime_goodput", report.runtime_goodput}});
    }
    if (impl_->tensorboard) {
      impl_->tensorboard->close();
      impl_->tensorboard.reset();
    }
    return summary;
  } catch (const std::exception& e) {
    if (recorder) recorder->failure(0, 1, e.what());
    impl_->tensorboard.reset();  // flushed and fsynced; a close error is not the one to report
    throw;
  }
}

TrainSummary Trainer::run_attempt(goodput::Recorder* recorder) {
  return TrainLoop(impl_->config, impl_->options, recorder, impl_->rank_recorder.get(), impl_->params, impl_->opt_state,
                   impl_->tensorboard, g_stop_signal)
      .run();
}

}  // namespace tessera::train
