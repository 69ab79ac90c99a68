#include "train/train_loop.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>

#include "backend/cpu/kernels/matmul.h"
#include "backend/cpu/kernels/matmul_int8.h"
#include "tessera/backend/cuda.h"
#include "tessera/base/allocator.h"
#include "tessera/base/error.h"
#include "tessera/base/flags.h"
#include "tessera/base/json_field.h"
#include "tessera/base/stack_dump.h"
#include "tessera/base/statistics.h"
#include "tessera/base/thread_pool.h"
#include "tessera/compiler/compilation_cache.h"
#include "tessera/compiler/device_program.h"
#include "tessera/core/ops.h"
#include "tessera/data/pipeline.h"
#include "tessera/data/token_file.h"
#include "tessera/nn/param.h"
#include "tessera/optim/schedule.h"
#include "tessera/spmd/runtime.h"
#include "tessera/train/pretrained.h"
#include "train/peak_calibration.h"

namespace tessera::train {

namespace fs = std::filesystem;

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
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

double unix_now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

// Seconds this process has spent inside collectives with other processes (0 in-process,
// where the devices are threads of one rank).
double collective_seconds() {
  if (!spmd::is_multi_process()) return 0;
  return spmd::communicator().stats(spmd::local_devices().at(0)).seconds;
}

// Loss scaling: this many skipped steps in a row stop the run (a dynamic scale has
// then backed off by 0.5^100: the gradients are not finite at any scale).
constexpr int64_t kMaxSkippedStepsInARow = 100;

// "data: pipeline, 2 sources, packing documents, ...": what the run reads, in one note.
std::string pipeline_description(const data::Pipeline& pipeline) {
  const data::PipelineSpec& spec = pipeline.spec();
  std::string text = fmt::format("data: pipeline of {} source(s), packing {}, shuffle buffer {} rows, {} worker(s)",
                                 pipeline.sources().size(), spec.packing, spec.shuffle_buffer, spec.workers);
  for (const data::SourceStats& s : pipeline.stats())
    text += fmt::format("\n  {:<16} weight {:.3f}  {} {} shard(s), {} tokens, {} rows", s.name, s.weight, s.shards,
                        s.kind, s.source_tokens, s.source_rows);
  return text;
}

}  // namespace

goodput::RankIdentity job_rank() {
  if (!spmd::is_multi_process()) return goodput::rank_from_environment();
  return {spmd::local_devices().at(0), spmd::device_count()};
}

TrainLoop::TrainLoop(const TrainConfig& config, const TrainerOptions& options, goodput::Recorder* recorder,
                     goodput::RankRecorder* rank_recorder, Tree& params, Tree& opt_state,
                     std::unique_ptr<TensorBoardWriter>& tensorboard, const std::atomic<int>& stop_signal)
    : cfg_(config),
      options_(options),
      recorder_(recorder),
      rank_recorder_(rank_recorder),
      params_(params),
      opt_state_(opt_state),
      tensorboard_(tensorboard),
      stop_signal_(stop_signal),
      primary_(spmd::is_primary_process()),
      show_(options.progress && primary_),
      run_dir_(config.run.dir) {}

void TrainLoop::note(const std::string& text) const {
  if (show_) std::fprintf(stderr, "%s\n", text.c_str());
}

std::unique_ptr<goodput::Span> TrainLoop::span(goodput::Phase phase) {
  switch (phase) {
    case goodput::Phase::kBackendInit:
      heartbeat_->enter("startup", step_);
      break;
    case goodput::Phase::kCompile:
      heartbeat_->enter("compile", step_);
      break;
    case goodput::Phase::kCheckpointRestore:
      heartbeat_->enter("restore", step_);
      break;
    case goodput::Phase::kEval: {
      // An evaluation batch costs about a micro-batch's forward, less than a step's
      // share: the step time is a generous estimate.
      const double expect = step_times_.empty() ? -1
                                                : median(step_times_) / static_cast<double>(cfg_.micro_batches()) *
                                                      static_cast<double>(cfg_.loop.eval_batches);
      heartbeat_->enter("eval", step_, expect);
      break;
    }
    default:
      break;  // data waits are part of a step
  }
  return recorder_ ? std::make_unique<goodput::Span>(*recorder_, phase, std::string(), -1) : nullptr;
}

TrainSummary TrainLoop::run() {
  heartbeat_.emplace(Heartbeat::from_environment());  // for `tessera launch`
  // SIGUSR1: every thread's stack to the log (launch asks a hung rank for it).
  install_stack_dump(SIGUSR1, heartbeat_->enabled() ? heartbeat_->path() + ".stacks" : std::string());
  // ... and the same from a supervisor on another host (train/stack_request.h).
  stack_requests_.emplace(heartbeat_->enabled() ? heartbeat_->path() + ".stacks-request" : std::string());
  setup();
  restore();
  open_metrics();
  compile();
  progress_.emplace(cfg_.loop.steps, show_);
  if (cfg_.model.remat != "none" && train_step_) {
    constexpr double kMiB = 1024.0 * 1024.0;
    std::string offload;
    if (train_step_->offloaded_bytes() > 0)
      offload = fmt::format(", {:.1f} MiB of activations wait in host memory (host arena {:.1f} MiB)",
                            static_cast<double>(train_step_->offloaded_bytes()) / kMiB,
                            static_cast<double>(train_step_->host_bytes()) / kMiB);
    progress_->message(fmt::format("model.remat = {}: planned device peak {:.1f} MiB{}", cfg_.model.remat,
                                   static_cast<double>(train_step_->peak_bytes()) / kMiB, offload));
  }
  loop_start_ = Clock::now();
  summary_.stop_reason = "steps";
  while (step_ < cfg_.loop.steps) {
    if (std::string reason = stop_reason(); !reason.empty()) {
      summary_.stop_reason = reason;
      break;
    }
    step_once();
  }
  return finish();
}

// ---- setup: threads, the peak for MFU, data, model, optimizer, layout, checkpoints ----

void TrainLoop::setup() {
  auto init_span = span(goodput::Phase::kBackendInit);
  if (cfg_.run.threads > 0) set_num_threads(cfg_.run.threads);
  measure_peak();
  open_data();
  model_.emplace(cfg_.model);
  optimizer_.emplace(cfg_.optimizer_config(), model_->specs());
  build_layout();
  if (pipeline_step_ && spmd::is_multi_process()) {
    // A pipeline process builds only the parameters its stages read, and their moments.
    params_ = model_->init(cfg_.run.seed, [this](const std::string& path) { return pipeline_step_->holds(path); });
    opt_state_ = pipeline_step_->init_state(params_);
  } else {
    params_ = model_->init(cfg_.run.seed);
    opt_state_ = optimizer_->init(params_);
  }
  if (cfg_.data.uses_pipeline()) {
    auto pipeline =
        std::make_unique<data::Pipeline>(cfg_.data.resolved_pipeline(), *tokenizer_, cfg_.micro_batch_size(),
                                         cfg_.loop.seq, cfg_.run.seed, 0, 1, cfg_.model.vocab);
    note(pipeline_description(*pipeline));
    loader_ = std::move(pipeline);
  } else {
    loader_ = std::make_unique<data::DataLoader>(train_file_, cfg_.micro_batch_size(), cfg_.loop.seq, cfg_.run.seed);
  }
  val_loader_.emplace(val_file_, cfg_.micro_batch_size(), cfg_.loop.seq, cfg_.run.seed, 0, 1, /*shuffle=*/false);
  // Checkpoint tiers, async writes, the save cadence and TESSERA_FAULT (train/checkpoint_saver.h).
  uint64_t state_bytes = 0;
  for (const Tree* tree : {&params_, &opt_state_})
    for (const Array& leaf : tree->leaves()) state_bytes += leaf.nbytes();
  checkpoints_.emplace(
      cfg_, recorder_, primary_, job_rank().rank, FaultPlan::from_env(),
      [this](const std::string& text) { note(text); }, state_bytes, spmd::is_multi_process());
  summary_.parameters = model_->parameter_count();
  summary_.optimizer = cfg_.optimizer.name;
  for (const Array& leaf : opt_state_.leaves()) summary_.optimizer_state_bytes += leaf.nbytes();
}

void TrainLoop::measure_peak() {
  if (const compiler::DeviceSpec device = compiler::DeviceSpec::parse(cfg_.run.device); device.cuda) {
    // On a GPU, MFU is against the device's dense bf16 peak from the one device table.
    const goodput::DeviceRecord record = cuda_device_peak(cuda::device_info(device.index));
    if (recorder_) recorder_->device(record);
    peak_ = record.peak_flops_per_device;
    peak_source_ = fmt::format("{}: {}", record.name, record.source);
  } else {
    // The compute dtype's GEMM: a bf16 run against the bf16 kernel's rate (against
    // float32's, MFU read above 100% on AMX). int8 GEMMs adjust it in compile().
    const CalibrationGemm gemm{.dtype = cfg_.model.compute()};
    const goodput::Calibration calibration = machine_peak_flops(calibration_cache_path(), {}, gemm);
    if (recorder_) recorder_->calibration(calibration);
    peak_ = local_peak_ = calibration.peak_flops;
    peak_source_ = fmt::format("CPU calibration GEMM ({}), {}", gemm.name(), calibration.method);
  }
  if (spmd::is_multi_process()) {
    // Every rank measured its own share of the machine(s): the job's peak is their sum.
    spmd::communicator().all_reduce(spmd::local_devices().at(0), spmd::world_group(), &peak_, &peak_, 1,
                                    DType::Float64);
  }
  summary_.peak_flops = peak_;
  summary_.peak_source = peak_source_;
}

void TrainLoop::open_data() {
  if (primary_) {
    if (std::string prepared = ensure_data(cfg_.data); !prepared.empty()) note("data: " + prepared);
  }
  if (spmd::is_multi_process()) {
    // The other ranks read the data rank 0 may just have prepared.
    spmd::communicator().barrier(spmd::local_devices().at(0), spmd::world_group());
  }
  tokenizer_ = data::make_tokenizer(cfg_.data.tokenizer);
  // With data.mixture the pipeline opens (and checks) its own sources.
  if (!cfg_.data.uses_pipeline()) train_file_ = std::make_shared<const data::TokenFile>(cfg_.data.train);
  val_file_ = std::make_shared<const data::TokenFile>(cfg_.data.val);
  for (const auto* file : {train_file_.get(), val_file_.get()}) {
    if (!file) continue;
    if (file->header().tokenizer != tokenizer_->id())
      fail<ConfigError>("data: '{}' was made with tokenizer '{}', but data.tokenizer is '{}'", file->path().string(),
                        file->header().tokenizer, tokenizer_->id());
  }
  if (tokenizer_->vocab_size() > cfg_.model.vocab)
    fail<ConfigError>("config: model.vocab = {} is smaller than the tokenizer '{}' vocabulary ({})", cfg_.model.vocab,
                      tokenizer_->id(), tokenizer_->vocab_size());
  for (const auto* file : {train_file_.get(), val_file_.get()})
    if (file) file->check_vocabulary(cfg_.model.vocab);
}

// parallel.mesh: the SPMD layout of parameters, optimizer state and batches. Without
// one the run is on a 1-device mesh, whose placement is the identity.
void TrainLoop::build_layout() {
  pipeline_plan_ = pipeline_plan(cfg_);
  if (pipeline_plan_) {
    // Every pipeline device thread reads its stages' slices of the whole parameters; a
    // process under mpirun or in a TCP job holds only its stages' parameters and optimizer
    // state (train/pipeline_step.h). Checkpoints hold the whole trees: the layout is the
    // 1-device one.
    const spmd::Mesh& mesh = pipeline_plan_->mesh;
    if (spmd::is_multi_process() && mesh.size() != spmd::device_count())
      fail<ConfigError>("parallel: mesh {} has {} devices, but the job has {} processes ({}); start one per device",
                        mesh.to_string(), mesh.size(), spmd::device_count(), spmd::runtime_description());
    // Stages partitioned over the mesh run a thread per mesh device under the SPMD
    // runtime: in-process the mesh gets its virtual devices unless the user chose a count.
    if (pipeline_plan_->options.mesh.ndim() > 0) {
      if (!spmd::is_multi_process() && spmd::device_count() < mesh.size() &&
          flags::env("TESSERA_CPU_DEVICES") == nullptr)
        spmd::set_cpu_devices(mesh.size());
      spmd::check_mesh(mesh);
    }
    layout_.emplace(Layout::one_device(model_->specs()));
    pipeline_step_.emplace(*model_, *optimizer_, cfg_.micro_batches(), pipeline_plan_->options,
                           pipeline_plan_->replicas, cfg_.loop.seq, &pipeline_plan_->mesh);
    const PipelineOptions& o = pipeline_plan_->options;
    note(fmt::format("parallel: mesh {} as {} of {} stages on {} {}; schedule {}, {} micro-batches", cfg_.parallel.mesh,
                     o.mesh.ndim() > 0 ? std::string("one pipeline, each stage partitioned over the other axes,")
                                       : fmt::format("{} pipeline replica(s)", pipeline_plan_->replicas),
                     o.devices * o.virtual_stages, mesh.size(),
                     spmd::is_multi_process() ? "processes (" + spmd::runtime_description() + ")" : "device threads",
                     to_string(o.kind), o.micro_batches));
    return;
  }
  if (cfg_.parallel.mesh.empty()) {
    layout_.emplace(Layout::one_device(model_->specs()));
    return;
  }
  spmd::Mesh mesh = spmd::Mesh::parse(cfg_.parallel.mesh);
  // In-process, the mesh gets its own virtual devices unless the user chose a count.
  if (!spmd::is_multi_process() && spmd::device_count() < mesh.size() && flags::env("TESSERA_CPU_DEVICES") == nullptr)
    spmd::set_cpu_devices(mesh.size());
  spmd::check_mesh(mesh);
  layout_.emplace(mesh, parse_axis_rules(cfg_.parallel.rules), model_->specs());
  if (cfg_.micro_batch_size() % layout_->data_parallel_size() != 0)
    fail<ConfigError>(
        "parallel: the micro-batch of {} sequences does not split over {} data-parallel devices (mesh {})",
        cfg_.micro_batch_size(), layout_->data_parallel_size(), mesh.to_string());
  note(fmt::format("parallel: mesh {} on {}; batch split {} ways", mesh.to_string(), spmd::runtime_description(),
                   layout_->data_parallel_size()));
}

// ---- restore: the newest valid checkpoint, or run.init_from ----

void TrainLoop::restore() {
  {
    auto restore_span = span(goodput::Phase::kCheckpointRestore);
    auto warn = [this](const std::string& w) { note("warning: " + w); };
    // A pipeline process built only the leaves it holds (placeholders for the rest): it
    // reads only those.
    const bool stage_local = pipeline_step_ && spmd::is_multi_process();
    auto restored = checkpoints_->restore(params_, opt_state_, warn,
                                          stage_local ? ckpt::Placeholders::kNotHeld : ckpt::Placeholders::kStructure);
    if (restored) {
      const nlohmann::json& extra = restored->state.extra;
      if (extra.contains("config")) {
        // Only the model's shape must match; other keys (steps, intervals) may change on resume.
        const TrainConfig saved = config_from_json(extra["config"]);
        if (saved.model.family != cfg_.model.family || saved.model.dim != cfg_.model.dim ||
            saved.model.layers != cfg_.model.layers || saved.model.vocab != cfg_.model.vocab ||
            saved.model.padded_vocab() != cfg_.model.padded_vocab())
          fail<ConfigError>("resume: the checkpoint in '{}' was trained with a different model ({}); use a new run.dir",
                            run_dir_.string(), extra["config"]["model"].dump());
      }
      params_ = std::move(restored->state.params);
      opt_state_ = std::move(restored->state.opt_state);
      step_ = restored->state.step;
      loader_->restore_position(json_field_or<nlohmann::json>(extra, "data", nlohmann::json()),
                                restored->path.string());
      tokens_seen_ = json_field_or<double>(extra, "tokens_seen", 0.0);
      summary_.last_checkpoint = restored->path;
      note(fmt::format("resumed from step {}", step_));
    } else if (!cfg_.run.init_from.empty()) {
      params_ = train::load_init_params(cfg_.run.init_from, cfg_.model, warn);
      opt_state_ = optimizer_->init(params_);
      note(fmt::format("initialized from {}", cfg_.run.init_from));
    }
  }
  summary_.start_step = step_;
  checkpoints_->start_at(step_);
  // Checkpoints hold whole arrays, so any mesh restores any checkpoint.
  params_ = layout_->shard_params(params_);
  opt_state_ = layout_->shard_opt_state(opt_state_);
  // Several pipeline processes: each keeps what its stages read.
  if (pipeline_step_) pipeline_step_->place(params_, opt_state_);
  flops_per_token_ = model_->flops_per_token(cfg_.loop.seq);
  tokens_per_step_ = static_cast<double>(cfg_.loop.batch * cfg_.loop.seq);
  note(fmt::format("model {} {:.2f}M parameters | steps {} -> {} x {} tokens | peak {:.1f} GFLOP/s ({})",
                   cfg_.model.family, static_cast<double>(summary_.parameters) / 1e6, step_, cfg_.loop.steps,
                   static_cast<int64_t>(tokens_per_step_), peak_ / 1e9, peak_source_));
}

void TrainLoop::open_metrics() {
  if (primary_) metrics_.open(run_dir_ / "metrics.jsonl", std::ios::app);
  if (primary_ && !metrics_)
    fail<IOError>("cannot append to '{}': {}", (run_dir_ / "metrics.jsonl").string(), std::strerror(errno));
  // Every metrics.jsonl record also goes to TensorBoard (a new event file per attempt).
  if (primary_ && cfg_.run.tensorboard) tensorboard_ = std::make_unique<TensorBoardWriter>(run_dir_ / "tensorboard");
}

void TrainLoop::write_metrics(const nlohmann::json& record) {
  if (!primary_) return;
  metrics_ << record.dump() << "\n";
  if (tensorboard_) tensorboard_->add_scalars(record.at("step").get<int64_t>(), tensorboard_scalars(record));
}

// ---- compile: before the first step, with the step's argument types ----

namespace {

// The int8 GEMMs' share of the step's matmul FLOPs.
double int8_share(const std::map<std::string, double>& flops) {
  auto at = [&](const char* op) { return flops.count(op) ? flops.at(op) : 0.0; };
  const double int8 = at("quantized_matmul") + at("matmul_epilogue[int8]");
  const double all = int8 + at("matmul") + at("matmul_epilogue");
  return all > 0 ? int8 / all : 0.0;
}

// Which matmuls run in int8, their share of the compiled step's matmul FLOPs (measured
// from the programs, not assumed), and the GEMM path they take.
std::string quant_report(const models::ModelConfig& c, const std::map<std::string, double>& flops) {
  return fmt::format(
      "int8 GEMMs (AQT) for {}, backward {}: {:.1f}% of the step's matmul FLOPs; {}", fmt::join(c.quant_targets, ", "),
      c.quant_backward == "int8" ? "int8 (gradients rounded stochastically)" : "float (straight-through)",
      100 * int8_share(flops), cpu::int8_gemm_path().description);
}

}  // namespace

void TrainLoop::mix_int8_peak(const std::map<std::string, double>& flops) {
  // The machine's best time for this step's matmul FLOPs is share s at the int8 GEMM's
  // rate and the rest at the compute dtype's: peak = 1 / (s / p_int8 + (1 - s) / p).
  // Against the compute dtype's rate alone, an int8 run's MFU could read above 100%.
  const double s = int8_share(flops);
  if (!(s > 0)) return;
  const CalibrationGemm gemm{.dtype = cfg_.model.compute(), .int8 = true};
  const goodput::Calibration int8 = machine_peak_flops(calibration_cache_path(), {}, gemm);
  if (!(int8.peak_flops > 0)) return;
  // peak_ may be the sum over ranks (measure_peak): scale it by this machine's ratio.
  const double local = local_peak_;
  if (!(local > 0)) return;
  const double mixed = 1.0 / (s / int8.peak_flops + (1.0 - s) / local);
  peak_ *= mixed / local;
  peak_source_ += fmt::format("; mixed with the {} GEMM ({:.0f} GFLOP/s) for the {:.1f}% of matmul FLOPs in int8",
                              gemm.name(), int8.peak_flops / 1e9, 100 * s);
  // The goodput report's MFU takes the last calibration record: the same mixed peak.
  if (recorder_) {
    goodput::Calibration record = int8;
    record.peak_flops = mixed;
    record.method = peak_source_;
    recorder_->calibration(record);
  }
  summary_.peak_flops = peak_;
  summary_.peak_source = peak_source_;
  note(fmt::format("peak for MFU: {:.1f} GFLOP/s ({})", peak_ / 1e9, peak_source_));
}

void TrainLoop::compile() {
  // A pipeline evaluates through its stages' forwards (PipelineTrainStep::evaluate).
  if (!pipeline_step_) {
    evaluator_.emplace(*model_, &*layout_, cfg_.run.device);
    train_step_.emplace(*model_, *optimizer_, cfg_.micro_batches(), &*layout_, cfg_.run.device);
  }
  // Compile time is its own phase. A batch of the right shape is all it needs (not the next one).
  auto compile_span = span(goodput::Phase::kCompile);
  data::DataLoader probe(val_file_, cfg_.micro_batch_size(), cfg_.loop.seq, cfg_.run.seed, 0, 1, /*shuffle=*/false);
  data::Batch shape_batch = probe.next();
  if (cfg_.data.uses_pipeline() && cfg_.data.pipeline.packing == "documents") {
    // The step is compiled for packed batches: segment ids and positions of the same shape.
    shape_batch.segments = zeros(shape_batch.tokens.shape(), DType::Int32);
    shape_batch.positions = zeros(shape_batch.tokens.shape(), DType::Int32);
  }
  const compiler::CompilationCacheStats cache_before = compiler::compilation_cache_stats();
  if (pipeline_step_)
    pipeline_step_->compile(params_, opt_state_, shape_batch);
  else
    train_step_->compile(params_, opt_state_, layout_->shard_batch(shape_batch), dropout_key_for(step_));
  // A hit: every program came from the persistent compilation cache (none compiled).
  const compiler::CompilationCacheStats cache_after = compiler::compilation_cache_stats();
  if (compile_span)
    compile_span->set_cache_hit(cache_after.hits > cache_before.hits && cache_after.misses == cache_before.misses);
  if (!cfg_.model.quant_targets.empty() && train_step_) {
    summary_.quant_summary = quant_report(cfg_.model, train_step_->flops_by_op());
    note("quant: " + summary_.quant_summary);
    if (!compiler::DeviceSpec::parse(cfg_.run.device).cuda) mix_int8_peak(train_step_->flops_by_op());
    if (!cpu::int8_gemm_path().native)
      note(
          "warning: this CPU has no int8 units (AMX-INT8, AVX512-VNNI): the int8 GEMMs are multiplied in float64 "
          "(exact, but slower than bfloat16); leave [quant] out for speed");
  }
  if (cfg_.run.device == "cpu" && cfg_.model.compute_dtype == "bfloat16" && !cpu::bf16_gemm_path().native)
    note(
        "warning: model.compute_dtype = \"bfloat16\" on a CPU without bf16 units (AMX-BF16, AVX512-BF16): its "
        "GEMMs widen to float32 (no faster than float32); \"auto\" picks float32 here");
  else if (cfg_.run.device == "cpu" && cfg_.model.compute_dtype == "bfloat16" &&
           !cpu::bf16_gemm_path().faster_than_float32)
    note(
        "note: model.compute_dtype = \"bfloat16\" on an Intel CPU whose bf16 GEMMs run on AVX512-BF16 (no AMX): "
        "measured slower than float32 sgemm there; \"auto\" picks float32 here");
}

// ---- step ----

std::string TrainLoop::stop_reason() {
  enum Reason { kTimeLimit, kStopAtStep, kSigint, kSigterm, kReasons };
  std::array<int32_t, kReasons> here{}, anywhere{};
  here[kTimeLimit] = cfg_.loop.time_limit_s > 0 && seconds_since(loop_start_) >= cfg_.loop.time_limit_s;
  here[kStopAtStep] = options_.stop_at_step > 0 && step_ >= options_.stop_at_step;
  const int signal = stop_signal_.load();
  here[kSigint] = signal == SIGINT;
  here[kSigterm] = signal == SIGTERM;
  anywhere = here;
  // Ranks of several processes must stop before the same step: one that went on would
  // wait forever in that step's collectives for the one that stopped (a signal reaches
  // the hosts at different moments; each rank reads its own clock). So the ranks add
  // their reasons and all stop when any of them would.
  if (spmd::is_multi_process())
    spmd::communicator().all_reduce(spmd::local_devices().at(0), spmd::world_group(), here.data(), anywhere.data(),
                                    kReasons, DType::Int32);
  constexpr std::array<const char*, kReasons> kNames = {"time limit", "stop_at_step", "signal SIGINT",
                                                        "signal SIGTERM"};
  for (int r = 0; r < kReasons; ++r) {
    if (anywhere[r] == 0) continue;
    std::string reason = kNames[r];
    if (here[r] == 0) reason += " (on another rank)";
    if (r == kSigint || r == kSigterm)
      progress_->message(fmt::format("{}: saving a checkpoint at step {} and stopping", reason, step_));
    return reason;
  }
  return "";
}

std::vector<data::Batch> TrainLoop::next_batches() {
  auto wait_span = span(goodput::Phase::kDataWait);
  std::vector<data::Batch> micro;
  for (int64_t i = 0; i < cfg_.micro_batches(); ++i)
    micro.push_back(layout_->next_batch(*loader_, cfg_.micro_batch_size()));
  return micro;
}

// The random key of optimizer step `at_step` (dropout masks, int8 stochastic rounding):
// a pure function of (seed, step), so a resumed run draws the same masks and rounding
// as a straight one.
std::optional<Array> TrainLoop::dropout_key_for(int64_t at_step) const {
  if (!cfg_.model.needs_step_key()) return std::nullopt;
  return nn::param_key(cfg_.run.seed, fmt::format("dropout/{}", at_step));
}

double TrainLoop::validate() {
  double loss = 0;
  {
    auto eval_span = span(goodput::Phase::kEval);
    loss = pipeline_step_ ? pipeline_step_->evaluate(params_, *val_loader_, cfg_.loop.eval_batches)
                          : (*evaluator_)(params_, *val_loader_, cfg_.loop.eval_batches);
  }
  heartbeat_->beat(step_);  // back to stepping: the next step runs under the step limit
  return loss;
}

void TrainLoop::step_once() {
  // This rank's step record spans the whole step, injected faults and data wait included.
  const double wall_start = unix_now(), collectives_before = collective_seconds();
  checkpoints_->at_step_start(step_);  // a failed background save surfaces here; TESSERA_FAULT
  const Clock::time_point t0 = Clock::now();
  const std::vector<data::Batch> micro = next_batches();
  const double data_wait_s = seconds_since(t0);
  const double lr = optim::learning_rate(cfg_.schedule, step_);
  if (recorder_) recorder_->step_start(step_ + 1);
  reset_peak_bytes_in_use();
  const StepStats stats = pipeline_step_ ? pipeline_step_->run(params_, opt_state_, micro, lr, dropout_key_for(step_))
                                         : train_step_->run(params_, opt_state_, micro, lr, dropout_key_for(step_));
  const int64_t step_peak_bytes = allocator_stats().peak_bytes_in_use;
  ++step_;
  tokens_seen_ += tokens_per_step_;
  // Model FLOPs (the model's forward and backward per token), as the run summary's MFU
  // counts them: not the compiled program's, which also holds the optimizer's update
  // (Muon's Newton-Schulz iterations) and any recomputed forward (remat, pipeline stages).
  const double step_flops = flops_per_token_ * tokens_per_step_;
  if (recorder_)
    recorder_->step_end(step_, static_cast<int64_t>(tokens_per_step_), step_flops,
                        pipeline_step_ ? pipeline_step_->last_bubble_fraction() : -1);
  if (rank_recorder_)
    rank_recorder_->step(step_, wall_start, unix_now(), data_wait_s, collective_seconds() - collectives_before);
  heartbeat_->beat(step_);
  const double dt = seconds_since(t0);
  step_times_.push_back(dt);
  summary_.last_loss = stats.loss;
  // With loss scaling a non-finite step is skipped (the scale backs off) and training
  // goes on; only a long run of them means the model itself diverged.
  skipped_in_a_row_ = stats.skipped ? skipped_in_a_row_ + 1 : 0;
  if (skipped_in_a_row_ >= kMaxSkippedStepsInARow)
    fail<ValueError>(
        "step {}: {} steps in a row had non-finite gradients and were skipped (loss {}, loss scale {:g}); lower "
        "optimizer.lr, raise schedule.warmup_steps or use model.compute_dtype = \"bfloat16\"",
        step_, skipped_in_a_row_, stats.loss, stats.loss_scale);
  if (!std::isfinite(stats.loss) && !stats.skipped)
    fail<ValueError>("step {}: the loss is {} (lr {:.3g}); lower optimizer.lr or raise schedule.warmup_steps", step_,
                     stats.loss, lr);

  const double recent =
      median(std::vector<double>(step_times_.end() - std::min<size_t>(step_times_.size(), 20), step_times_.end()));
  const double tps = tokens_per_step_ / recent;
  const double mfu = flops_per_token_ * tps / peak_;
  progress_->update({step_, stats.loss, lr, tps, mfu, recent, cfg_.loop.time_limit_s, seconds_since(loop_start_)});

  nlohmann::json record = {
      {"step", step_},          {"loss", stats.loss},  {"lr", lr},  {"grad_norm", stats.grad_norm}, {"step_s", dt},
      {"tokens", tokens_seen_}, {"tokens_per_s", tps}, {"mfu", mfu}};
  // The allocator's high-water mark during the step: on a CPU the memory the step held
  // (every device of this process), what tessera plan's memory prediction is checked on.
  if (cfg_.run.device == "cpu") record["peak_bytes"] = step_peak_bytes;
  if (pipeline_step_) {
    pipeline_bubbles_.push_back(pipeline_step_->last_bubble_fraction());
    record["pipeline_bubble"] = pipeline_step_->last_bubble_fraction();
  }
  if (optimizer_->scales_loss()) {
    record["loss_scale"] = stats.loss_scale;
    record["skipped"] = stats.skipped;
  }
  const bool eval_now = cfg_.loop.eval_interval > 0 && step_ % cfg_.loop.eval_interval == 0 && step_ < cfg_.loop.steps;
  if (eval_now) {
    const double v = validate();
    record["val_loss"] = v;
    summary_.val_loss = v;
    progress_->message(fmt::format("step {}: validation loss {:.4f} (perplexity {:.2f})", step_, v, std::exp(v)));
  }
  if (step_ % cfg_.loop.log_interval == 0 || eval_now || step_ == cfg_.loop.steps) write_metrics(record);
  if (checkpoints_->due(step_, recent)) {
    metrics_.flush();
    save(step_, /*final=*/false);
  }
  if (options_.after_step) options_.after_step(step_);
}

// ---- checkpoint ----

void TrainLoop::save(int64_t at_step, bool final) {
  const double last = checkpoints_->last_blocking_s();
  heartbeat_->enter("save", at_step, last > 0 ? last : -1);
  checkpoints_->save(
      at_step,
      [&] {
        ckpt::CheckpointState state;
        state.step = at_step;
        // Whole arrays (a collective): any mesh or pipeline size restores them. A pipeline's
        // processes send the leaves the writer (rank 0) lacks to it alone.
        state.params = pipeline_step_ ? pipeline_step_->gathered(params_, 0) : Layout::gather(params_);
        state.opt_state = pipeline_step_ ? pipeline_step_->gathered(opt_state_, 0) : Layout::gather(opt_state_);
        state.extra = {{"config", cfg_.to_json()},
                       {"data", loader_->position_json()},
                       {"rng", {{"seed", cfg_.run.seed}, {"dropout_key", "param_key(seed, \"dropout/<step>\")"}}},
                       {"tokenizer", tokenizer_->id()},
                       {"tokenizer_spec", tokenizer_->spec()},
                       {"tokens_seen", tokens_seen_}};
        return state;
      },
      final);
  heartbeat_->beat(step_);  // back to stepping: the next step runs under the step limit
}

// ---- finish ----

std::string TrainLoop::parallel_summary() const {
  if (pipeline_step_) return pipeline_step_->describe();
  std::string text = fmt::format("mesh {} ({}), batch split {} ways\n", layout_->mesh().to_string(),
                                 spmd::runtime_description(), layout_->data_parallel_size());
  for (const auto& program : train_step_->spmd_programs()) {
    const spmd::CollectiveSummary& c = program->program().summary;
    text += fmt::format("  {}: {}", program->program().local.name, c.text().substr(0, c.text().find('\n') + 1));
    text += fmt::format("    peak memory per device {:.1f} MiB\n",
                        static_cast<double>(program->peak_bytes_per_device()) / (1024.0 * 1024.0));
  }
  text += fmt::format(
      "  analytic bytes per step and device {:.0f} (train/parallel.h)\n",
      layout_->analytic_step_bytes(cfg_.model.layers, cfg_.model.dim, cfg_.micro_batch_size(), cfg_.loop.seq));
  return text;
}

TrainSummary TrainLoop::finish() {
  const TrainSummary summary = finish_run();
  // The trainer's parameters and optimizer state are whole after a run (stage-local
  // pipeline processes gather them: a collective).
  if (pipeline_step_) {
    params_ = pipeline_step_->gathered(params_);
    opt_state_ = pipeline_step_->gathered(opt_state_);
  }
  return summary;
}

TrainSummary TrainLoop::finish_run() {
  progress_->finish();
  summary_.end_step = step_;
  summary_.train_seconds = seconds_since(loop_start_);
  if (!step_times_.empty()) {
    summary_.tokens_per_s = tokens_per_step_ / median(step_times_);
    summary_.mfu = flops_per_token_ * summary_.tokens_per_s / peak_;
  }
  if (!cfg_.parallel.mesh.empty()) summary_.parallel_summary = parallel_summary();
  if (pipeline_step_) {
    summary_.pipeline_bubble_analytic = analytic_bubble_fraction(pipeline_step_->schedule());
    if (!pipeline_bubbles_.empty()) summary_.pipeline_bubble = median(pipeline_bubbles_);
  }
  if (summary_.stop_reason.starts_with("signal")) {
    // A preemption notice leaves little time: save first, and skip the final evaluation.
    metrics_.flush();
    if (!checkpoints_->persisted(step_)) save(step_, /*final=*/true);
    checkpoints_->finish();  // never exit with a save in flight
    if (!checkpoints_->last_checkpoint().empty()) summary_.last_checkpoint = checkpoints_->last_checkpoint();
    return summary_;
  }
  const double v = validate();
  summary_.val_loss = v;
  write_metrics(nlohmann::json{{"step", step_}, {"val_loss", v}, {"final", true}});
  metrics_.flush();
  if (!checkpoints_->persisted(step_)) save(step_, /*final=*/true);
  checkpoints_->finish();
  if (!checkpoints_->last_checkpoint().empty()) summary_.last_checkpoint = checkpoints_->last_checkpoint();
  checkpoints_->discard_local_tier();  // the persistent tier holds the last step
  summary_.train_seconds = seconds_since(loop_start_);
  return summary_;
}

}  // namespace tessera::train
