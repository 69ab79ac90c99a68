#include "tessera/train/trainer.h"

#include <fmt/format.h>
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
#include "tessera/dist/runtime.h"
#include "tessera/goodput/recorder.h"
#include "tessera/goodput/report.h"
#include "tessera/models/model.h"
#include "tessera/nn/param.h"
#include "tessera/optim/optimizer.h"
#include "tessera/optim/schedule.h"
#include "tessera/train/parallel.h"
#include "tessera/train/pretrained.h"
#include "tessera/train/progress.h"
#include "tessera/train/tensorboard.h"
#include "tessera/train/train_step.h"
#include "train/checkpoint_saver.h"
#include "train/fault_injection.h"
#include "train/heartbeat.h"

namespace tessera::train {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

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

// The TensorBoard scalars of a metrics.jsonl record: val_loss -> "val/loss", every
// other number or flag -> "train/<key>"; "step" is the events' step, "final" a marker.
std::vector<std::pair<std::string, double>> tensorboard_scalars(const nlohmann::json& record) {
  std::vector<std::pair<std::string, double>> out;
  for (const auto& [key, value] : record.items()) {
    if (key == "step" || key == "final") continue;
    if (value.is_boolean())
      out.emplace_back("train/" + key, value.get<bool>() ? 1.0 : 0.0);
    else if (value.is_number())
      out.emplace_back(key == "val_loss" ? std::string("val/loss") : "train/" + key, value.get<double>());
  }
  return out;
}

// The dropout key of optimizer step `step`: a pure function of (seed, step), so a
// resumed run draws the same masks as a straight one.
Array dropout_key(uint64_t seed, int64_t step) { return nn::param_key(seed, fmt::format("dropout/{}", step)); }

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

// Loss scaling: this many skipped steps in a row stop the run (a dynamic scale has
// then backed off by 0.5^100: the gradients are not finite at any scale).
constexpr int64_t kMaxSkippedStepsInARow = 100;

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

goodput::Calibration calibrate_peak_flops(double seconds) {
  // tessera's own matmul (the kernel path training uses: OpenBLAS tiles split over
  // tessera's thread pool). The pointers calibrate_cpu_gemm passes are ignored: the
  // operands are made once here, so the timing holds no copies.
  constexpr int kN = 1024;
  const Array a = random::normal(key(1), {kN, kN}).eval();
  const Array b = random::normal(key(2), {kN, kN}).eval();
  auto gemm = [&](int n, const float*, const float*, float*) {
    if (n != kN) fail<ValueError>("calibrate_peak_flops: asked for n = {}, prepared {}", n, kN);
    matmul(a, b).eval();
  };
  return goodput::calibrate_cpu_gemm(gemm, fmt::format("tessera matmul f32 {}^3", kN), kN, seconds);
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
};

Trainer::Trainer(TrainConfig config, TrainerOptions options) : impl_(std::make_unique<Impl>()) {
  // run.init_from: the model's shape is the stored model's (its weights load in run_attempt);
  // once the run has checkpoints of its own, theirs (a resume needs no init_from).
  if (!config.run.init_from.empty()) {
    const fs::path run_dir = config.run.dir;
    const bool resuming = !ckpt::list_checkpoints(run_dir / "checkpoints").empty();
    config.model = train::init_from_model_config(config.model, resuming ? run_dir : fs::path(config.run.init_from));
  }
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
  // Under mpirun every rank trains; rank 0 alone records, prints and writes files.
  if (impl_->options.record_goodput && !already_done && dist::is_primary_process()) {
    recorder = std::make_unique<goodput::Recorder>(cfg.run.dir);
    recorder->job_start(cfg.run.dir);
    recorder->attempt_start();
  }
  StopSignalScope signals;
  try {
    TrainSummary summary = run_attempt(recorder.get());
    if (recorder) {
      if (summary.end_step >= cfg.loop.steps)
        recorder->job_end(true);
      else if (summary.stop_reason.starts_with("signal"))
        recorder->failure(g_stop_signal.load(), 0, "stopped by " + summary.stop_reason);
    }
    if (impl_->options.record_goodput && fs::exists(fs::path(cfg.run.dir) / "goodput" / "events.jsonl")) {
      const goodput::GoodputReport report = goodput::report_for_run(cfg.run.dir);
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
  const TrainConfig& cfg = impl_->config;
  const bool primary = dist::is_primary_process();
  const bool show = impl_->options.progress && primary;
  auto note = [&](const std::string& text) {
    if (show) std::fprintf(stderr, "%s\n", text.c_str());
  };
  auto span = [&](goodput::Phase phase, int64_t step = -1) {
    return recorder ? std::make_unique<goodput::Span>(*recorder, phase, std::string(), step) : nullptr;
  };
  const fs::path run_dir = cfg.run.dir;
  TrainSummary summary;

  // ---- init: threads, the calibration GEMM, data ----
  auto init_span = span(goodput::Phase::kBackendInit);
  if (cfg.run.threads > 0) set_num_threads(cfg.run.threads);
  double peak = 0;
  std::string peak_source;
  if (const compiler::DeviceSpec device = compiler::DeviceSpec::parse(cfg.run.device); device.cuda) {
    // On a GPU, MFU is against the device's dense bf16 peak from the one device table.
    const goodput::DeviceRecord record = cuda_device_peak(cuda::device_info(device.index));
    if (recorder) recorder->device(record);
    peak = record.peak_flops_per_device;
    peak_source = fmt::format("{}: {}", record.name, record.source);
  } else {
    const goodput::Calibration calibration = calibrate_peak_flops();
    if (recorder) recorder->calibration(calibration);
    peak = calibration.peak_flops;
    peak_source = "CPU calibration GEMM, " + calibration.method;
  }
  if (dist::is_multi_process()) {
    // Every rank measured its own share of the machine(s): the job's peak is their sum.
    dist::communicator().all_reduce(dist::local_devices().at(0), dist::world_group(), &peak, &peak, 1, DType::Float64);
  }
  summary.peak_flops = peak;
  summary.peak_source = peak_source;
  if (primary) {
    if (std::string prepared = ensure_data(cfg.data); !prepared.empty()) note("data: " + prepared);
  }
  if (dist::is_multi_process()) {
    // The other ranks read the data rank 0 may just have prepared.
    dist::communicator().barrier(dist::local_devices().at(0), dist::world_group());
  }
  std::unique_ptr<data::Tokenizer> tokenizer = data::make_tokenizer(cfg.data.tokenizer);
  auto train_file = std::make_shared<const data::TokenFile>(cfg.data.train);
  auto val_file = std::make_shared<const data::TokenFile>(cfg.data.val);
  for (const auto* file : {train_file.get(), val_file.get()}) {
    if (file->header().tokenizer != tokenizer->id())
      fail<ConfigError>("data: '{}' was made with tokenizer '{}', but data.tokenizer is '{}'", file->path().string(),
                        file->header().tokenizer, tokenizer->id());
  }
  if (tokenizer->vocab_size() > cfg.model.vocab)
    fail<ConfigError>("config: model.vocab = {} is smaller than the tokenizer '{}' vocabulary ({})", cfg.model.vocab,
                      tokenizer->id(), tokenizer->vocab_size());
  for (const auto* file : {train_file.get(), val_file.get()}) file->check_vocabulary(cfg.model.vocab);

  // ---- model, optimizer, state ----
  models::Model model(cfg.model);
  optim::Optimizer optimizer(cfg.optimizer_config(), model.specs());
  Tree& params = impl_->params;
  Tree& opt_state = impl_->opt_state;
  params = model.init(cfg.run.seed);
  opt_state = optimizer.init(params);
  // ---- SPMD layout (parallel.mesh) ----
  std::optional<Layout> layout;
  if (!cfg.parallel.mesh.empty()) {
    dist::Mesh mesh = dist::Mesh::parse(cfg.parallel.mesh);
    // In-process, the mesh gets its own virtual devices unless the user chose a count.
    if (!dist::is_multi_process() && dist::device_count() < mesh.size() && flags::env("TESSERA_CPU_DEVICES") == nullptr)
      dist::set_cpu_devices(mesh.size());
    dist::check_mesh(mesh);
    layout.emplace(mesh, parse_axis_rules(cfg.parallel.rules), model.specs());
    if (cfg.micro_batch_size() % layout->data_parallel_size() != 0)
      fail<ConfigError>(
          "parallel: the micro-batch of {} sequences does not split over {} data-parallel devices (mesh {})",
          cfg.micro_batch_size(), layout->data_parallel_size(), mesh.to_string());
    note(fmt::format("parallel: mesh {} on {}; batch split {} ways", mesh.to_string(), dist::runtime_description(),
                     layout->data_parallel_size()));
  }
  const Layout* layout_ptr = layout ? &*layout : nullptr;
  data::DataLoader loader(train_file, cfg.micro_batch_size(), cfg.loop.seq, cfg.run.seed);
  data::DataLoader val_loader(val_file, cfg.micro_batch_size(), cfg.loop.seq, cfg.run.seed, 0, 1, /*shuffle=*/false);
  // Checkpoint tiers, async writes, the save cadence and TESSERA_FAULT (train/checkpoint_saver.h).
  CheckpointSaver checkpoints(cfg, recorder, primary, dist::is_multi_process() ? dist::local_devices().at(0) : 0,
                              FaultPlan::from_env(), note);
  summary.parameters = model.parameter_count();
  init_span.reset();

  // ---- resume ----
  int64_t step = 0;
  double tokens_seen = 0;
  {
    auto restore_span = span(goodput::Phase::kCheckpointRestore);
    auto restored = checkpoints.restore(params, opt_state, [&](const std::string& w) { note("warning: " + w); });
    if (restored) {
      const nlohmann::json& extra = restored->state.extra;
      if (extra.contains("config")) {
        // Only the model's shape must match; other keys (steps, intervals) may change on resume.
        const TrainConfig saved = config_from_json(extra["config"]);
        if (saved.model.family != cfg.model.family || saved.model.dim != cfg.model.dim ||
            saved.model.layers != cfg.model.layers || saved.model.vocab != cfg.model.vocab)
          fail<ConfigError>("resume: the checkpoint in '{}' was trained with a different model ({}); use a new run.dir",
                            run_dir.string(), extra["config"]["model"].dump());
      }
      params = std::move(restored->state.params);
      opt_state = std::move(restored->state.opt_state);
      step = restored->state.step;
      const nlohmann::json data_position = json_field_or<nlohmann::json>(extra, "data", nlohmann::json());
      const std::optional<uint64_t> epoch = json_field<uint64_t>(data_position, "epoch");
      const std::optional<uint64_t> index = json_field<uint64_t>(data_position, "index");
      if (!epoch || !index)
        fail<IOError>("resume: checkpoint {} has no data position (manifest extra.data.epoch/index, unsigned integers)",
                      restored->path.string());
      loader.set_position({*epoch, *index});
      tokens_seen = json_field_or<double>(extra, "tokens_seen", 0.0);
      summary.last_checkpoint = restored->path;
      note(fmt::format("resumed from step {}", step));
    } else if (!cfg.run.init_from.empty()) {
      params =
          train::load_init_params(cfg.run.init_from, cfg.model, [&](const std::string& w) { note("warning: " + w); });
      opt_state = optimizer.init(params);
      note(fmt::format("initialized from {}", cfg.run.init_from));
    }
  }
  summary.start_step = step;
  checkpoints.start_at(step);
  if (layout) {
    // Checkpoints hold whole arrays, so any mesh restores any checkpoint.
    params = layout->shard_params(params);
    opt_state = layout->shard_opt_state(opt_state);
  }

  const double flops_per_token = model.flops_per_token(cfg.loop.seq);
  const double tokens_per_step = static_cast<double>(cfg.loop.batch * cfg.loop.seq);
  note(fmt::format("model {} {:.2f}M parameters | steps {} -> {} x {} tokens | peak {:.1f} GFLOP/s ({})",
                   cfg.model.family, static_cast<double>(summary.parameters) / 1e6, step, cfg.loop.steps,
                   static_cast<int64_t>(tokens_per_step), peak / 1e9, peak_source));

  std::ofstream metrics;
  if (primary) metrics.open(run_dir / "metrics.jsonl", std::ios::app);
  if (primary && !metrics)
    fail<IOError>("cannot append to '{}': {}", (run_dir / "metrics.jsonl").string(), std::strerror(errno));
  // Every metrics.jsonl record also goes to TensorBoard (a new event file per attempt).
  if (primary && cfg.run.tensorboard) impl_->tensorboard = std::make_unique<TensorBoardWriter>(run_dir / "tensorboard");
  auto write_metrics = [&](const nlohmann::json& record) {
    if (!primary) return;
    metrics << record.dump() << "\n";
    if (impl_->tensorboard)
      impl_->tensorboard->add_scalars(record.at("step").get<int64_t>(), tensorboard_scalars(record));
  };

  // final: the persistent tier too, whatever the interval; recent_step_s: for the Young/Daly interval.
  auto save = [&](int64_t at_step, bool final, double recent_step_s) {
    checkpoints.save(
        at_step,
        [&] {
          ckpt::CheckpointState state;
          state.step = at_step;
          state.params = layout ? Layout::gather(params) : params;
          state.opt_state = layout ? Layout::gather(opt_state) : opt_state;
          const data::LoaderPosition pos = loader.position();
          state.extra = {{"config", cfg.to_json()},
                         {"data", {{"epoch", pos.epoch}, {"index", pos.index}}},
                         {"rng", {{"seed", cfg.run.seed}, {"dropout_key", "param_key(seed, \"dropout/<step>\")"}}},
                         {"tokenizer", tokenizer->id()},
                         {"tokenizer_spec", tokenizer->spec()},
                         {"tokens_seen", tokens_seen}};
          return state;
        },
        recent_step_s, final);
  };
  Evaluator evaluator(model, layout_ptr, cfg.run.device);
  auto validate = [&]() {
    auto eval_span = span(goodput::Phase::kEval);
    return evaluator(params, val_loader, cfg.loop.eval_batches);
  };
  auto next_batches = [&]() {
    auto wait_span = span(goodput::Phase::kDataWait);
    std::vector<data::Batch> micro;
    for (int64_t i = 0; i < cfg.micro_batches(); ++i)
      micro.push_back(layout ? layout->next_batch(loader, cfg.micro_batch_size()) : loader.next());
    return micro;
  };
  auto key_for = [&](int64_t at_step) {
    return cfg.model.dropout > 0 ? std::optional(dropout_key(cfg.run.seed, at_step)) : std::nullopt;
  };

  TrainStep train_step(model, optimizer, cfg.micro_batches(), layout_ptr, cfg.run.device);
  {
    // Compile before the first step, with the step's argument types, so compile time
    // is its own phase. A batch of the right shape is all it needs (not the next one).
    auto compile_span = span(goodput::Phase::kCompile);
    data::DataLoader probe(val_file, cfg.micro_batch_size(), cfg.loop.seq, cfg.run.seed, 0, 1, /*shuffle=*/false);
    const data::Batch shape_batch = probe.next();
    const compiler::CompilationCacheStats cache_before = compiler::compilation_cache_stats();
    train_step.compile(params, opt_state, layout ? layout->shard_batch(shape_batch) : shape_batch, key_for(step));
    // A hit: every program came from the persistent compilation cache (none compiled).
    const compiler::CompilationCacheStats cache_after = compiler::compilation_cache_stats();
    if (compile_span)
      compile_span->set_cache_hit(cache_after.hits > cache_before.hits && cache_after.misses == cache_before.misses);
  }

  Progress progress(cfg.loop.steps, show);
  Heartbeat heartbeat = Heartbeat::from_environment();  // for `tessera launch`
  std::vector<double> step_times;
  const Clock::time_point loop_start = Clock::now();
  summary.stop_reason = "steps";
  int64_t skipped_in_a_row = 0;  // loss scaling: steps skipped for non-finite gradients
  while (step < cfg.loop.steps) {
    if (cfg.loop.time_limit_s > 0 && seconds_since(loop_start) >= cfg.loop.time_limit_s) {
      summary.stop_reason = "time limit";
      break;
    }
    if (impl_->options.stop_at_step > 0 && step >= impl_->options.stop_at_step) {
      summary.stop_reason = "stop_at_step";
      break;
    }
    if (const int signal = g_stop_signal.load(); signal != 0) {
      summary.stop_reason = fmt::format("signal {}", signal == SIGINT ? "SIGINT" : signal == SIGTERM ? "SIGTERM" : "?");
      progress.message(fmt::format("{}: saving a checkpoint at step {} and stopping", summary.stop_reason, step));
      break;
    }
    checkpoints.at_step_start(step);  // a failed background save surfaces here; TESSERA_FAULT
    const Clock::time_point t0 = Clock::now();
    const std::vector<data::Batch> micro = next_batches();
    const double lr = optim::learning_rate(cfg.schedule, step);
    if (recorder) recorder->step_start(step + 1);
    const StepStats stats = train_step.run(params, opt_state, micro, lr, key_for(step));
    ++step;
    tokens_seen += tokens_per_step;
    if (recorder) recorder->step_end(step, static_cast<int64_t>(tokens_per_step), train_step.compiled_flops());
    heartbeat.beat(step);
    const double dt = seconds_since(t0);
    step_times.push_back(dt);
    summary.last_loss = stats.loss;
    // With loss scaling a non-finite step is skipped (the scale backs off) and training
    // goes on; only a long run of them means the model itself diverged.
    skipped_in_a_row = stats.skipped ? skipped_in_a_row + 1 : 0;
    if (skipped_in_a_row >= kMaxSkippedStepsInARow)
      fail<ValueError>(
          "step {}: {} steps in a row had non-finite gradients and were skipped (loss {}, loss scale {:g}); lower "
          "optimizer.lr, raise schedule.warmup_steps or use model.compute_dtype = \"bfloat16\"",
          step, skipped_in_a_row, stats.loss, stats.loss_scale);
    if (!std::isfinite(stats.loss) && !stats.skipped)
      fail<ValueError>("step {}: the loss is {} (lr {:.3g}); lower optimizer.lr or raise schedule.warmup_steps", step,
                       stats.loss, lr);

    const double recent =
        median(std::vector<double>(step_times.end() - std::min<size_t>(step_times.size(), 20), step_times.end()));
    const double tps = tokens_per_step / recent;
    const double mfu = flops_per_token * tps / peak;
    progress.update({step, stats.loss, lr, tps, mfu, recent, cfg.loop.time_limit_s, seconds_since(loop_start)});

    nlohmann::json record = {
        {"step", step},          {"loss", stats.loss},  {"lr", lr},  {"grad_norm", stats.grad_norm}, {"step_s", dt},
        {"tokens", tokens_seen}, {"tokens_per_s", tps}, {"mfu", mfu}};
    if (optimizer.scales_loss()) {
      record["loss_scale"] = stats.loss_scale;
      record["skipped"] = stats.skipped;
    }
    const bool eval_now = cfg.loop.eval_interval > 0 && step % cfg.loop.eval_interval == 0 && step < cfg.loop.steps;
    if (eval_now) {
      const double v = validate();
      record["val_loss"] = v;
      summary.val_loss = v;
      progress.message(fmt::format("step {}: validation loss {:.4f} (perplexity {:.2f})", step, v, std::exp(v)));
    }
    if (step % cfg.loop.log_interval == 0 || eval_now || step == cfg.loop.steps) write_metrics(record);
    if (checkpoints.due(step)) {
      metrics.flush();
      save(step, /*final=*/false, recent);
    }
    if (impl_->options.after_step) impl_->options.after_step(step);
  }
  progress.finish();
  summary.end_step = step;
  summary.train_seconds = seconds_since(loop_start);
  if (!step_times.empty()) {
    summary.tokens_per_s = tokens_per_step / median(step_times);
    summary.mfu = flops_per_token * summary.tokens_per_s / peak;
  }
  if (layout) {
    std::string text = fmt::format("mesh {} ({}), batch split {} ways\n", layout->mesh().to_string(),
                                   dist::runtime_description(), layout->data_parallel_size());
    for (const auto& program : train_step.spmd_programs()) {
      const dist::CollectiveSummary& c = program->program().summary;
      text += fmt::format("  {}: {}", program->program().local.name, c.text().substr(0, c.text().find('\n') + 1));
      text += fmt::format("    peak memory per device {:.1f} MiB\n",
                          static_cast<double>(program->peak_bytes_per_device()) / (1024.0 * 1024.0));
    }
    text +=
        fmt::format("  analytic bytes per step and device {:.0f} (train/parallel.h)\n",
                    layout->analytic_step_bytes(cfg.model.layers, cfg.model.dim, cfg.micro_batch_size(), cfg.loop.seq));
    summary.parallel_summary = text;
  }
  if (summary.stop_reason.starts_with("signal")) {
    // A preemption notice leaves little time: save first, and skip the final evaluation.
    metrics.flush();
    if (!checkpoints.persisted(step)) save(step, /*final=*/true, median(step_times));
    checkpoints.finish();  // never exit with a save in flight
    if (!checkpoints.last_checkpoint().empty()) summary.last_checkpoint = checkpoints.last_checkpoint();
    return summary;
  }

  const double v = validate();
  summary.val_loss = v;
  write_metrics(nlohmann::json{{"step", step}, {"val_loss", v}, {"final", true}});
  metrics.flush();
  if (!checkpoints.persisted(step)) save(step, /*final=*/true, median(step_times));
  checkpoints.finish();
  if (!checkpoints.last_checkpoint().empty()) summary.last_checkpoint = checkpoints.last_checkpoint();
  summary.train_seconds = seconds_since(loop_start);
  return summary;
}

}  // namespace tessera::train
