// The training job's configuration: a TOML file (configs/*.toml) plus `--set
// key=value` overrides. Every key is declared once in a schema (name, type, default,
// help), so an unknown or mistyped key is an error that names the file:line and
// suggests the nearest valid key, and `tessera train --print-config` can show them all.
//
//   [model]      preset, family, vocab, dim, layers, heads, kv_heads, mlp_dim, context, dropout, ...,
//                compute_dtype (float32 | bfloat16 | float16; parameters stay float32)
//   [data]       train, val, sources, fallback_sources, tokenizer, val_fraction
//   [optimizer]  name, lr, beta1, beta2, eps, weight_decay, momentum, nesterov, clip_norm, no_decay,
//                loss_scale ("auto" | "dynamic" | "none" | a number), loss_scale_init,
//                loss_scale_growth_interval, loss_scale_growth_factor, loss_scale_backoff_factor
//   [schedule]   decay, warmup_steps, min_lr_ratio
//   [train]      steps, batch, micro_batch, seq, time_limit_s, log_interval, eval_interval, eval_batches
//   [checkpoint] interval ("auto" | steps), keep_last, keep_every, async, local_dir ("auto" | path | ""),
//                local_interval ("auto" | steps), local_keep_last, mtbf_s
//   [run]        dir, seed, threads, device, tensorboard, init_from, compilation_cache
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessera/data/pipeline_spec.h"
#include "tessera/models/model.h"
#include "tessera/optim/optimizer.h"
#include "tessera/optim/schedule.h"

namespace tessera::train {

struct DataConfig {
  std::string train = "data/train.bin";
  std::string val = "data/val.bin";
  // When train/val do not exist, they are prepared from these files or directories
  // (the first list that exists; fallback_sources when none of `sources` does).
  std::vector<std::string> sources;
  std::vector<std::string> fallback_sources;
  // A make_tokenizer spec: "byte", "gpt2:PATH", "hf:PATH", "spm:PATH" or a path; like
  // train/val, a relative path is taken from the current directory.
  std::string tokenizer = "byte";
  double val_fraction = 0.05;
  // With sources in pipeline.sources ([[data.mixture]]), training batches come from the
  // data pipeline (data/pipeline.h); a source without a path reads data.train (so
  // `--set data.train=...` still chooses the training file); validation always reads
  // data.val.
  data::PipelineSpec pipeline;
  bool uses_pipeline() const { return !pipeline.sources.empty(); }
  // pipeline with every path-less source given data.train.
  data::PipelineSpec resolved_pipeline() const {
    data::PipelineSpec spec = pipeline;
    for (data::SourceSpec& source : spec.sources)
      if (source.path.empty()) source.path = train;
    return spec;
  }
};

struct LoopConfig {
  int64_t steps = 1000;       // optimizer steps (the schedule's total)
  int64_t batch = 8;          // sequences per optimizer step (all micro-batches)
  int64_t micro_batch = 0;    // sequences per forward/backward (0: = batch; must divide batch)
  int64_t seq = 256;          // tokens per sequence (<= model.context)
  double time_limit_s = 0;    // stop (with a checkpoint) after this much training time; 0: none
  int64_t log_interval = 10;  // steps between progress lines and metrics.jsonl records
  int64_t eval_interval = 0;  // steps between validation passes (0: only at the end)
  int64_t eval_batches = 16;  // validation batches per pass
};

// An integer checkpoint setting written "auto" in the config: chosen from measured costs.
inline constexpr int64_t kAutoInterval = -1;

struct CheckpointConfig {
  // Steps between checkpoints of the persistent tier (the run directory); 0: only at the
  // end; kAutoInterval ("auto", the default): Young/Daly, sqrt(2 * save cost * mtbf_s)
  // seconds of training, recomputed from the measured cost after every save (the first
  // save comes after kFirstAutoSaveStep steps, train/checkpoint_interval.h).
  int64_t interval = kAutoInterval;
  int keep_last = 3;
  int keep_every = 0;
  bool async = true;  // write in a background thread; the step blocks only for a host copy
  // A second, fast tier that a restart on the same machine resumes from: "auto" (the
  // default) is /dev/shm/tessera-<uid>/<run>-<hash> with a fallback to the temporary
  // directory (train/local_tier.h), off in multi-process jobs; a path; "" off. Saved every
  // local_interval steps ("auto": as often as keeps its measured cost under 1% of the
  // step time; 0: no local tier), keeping local_keep_last; restore takes the newest valid one of both
  // tiers. Removed once a run ends with its final step in the persistent tier.
  std::string local_dir = "auto";
  int64_t local_interval = kAutoInterval;
  int local_keep_last = 1;  // the tier is RAM: one kept, plus the one being written
  double mtbf_s = 3600;     // assumed mean time between failures for the Young/Daly interval
};

struct RunConfig {
  std::string dir = "runs/default";
  uint64_t seed = 1234;
  int threads = 0;             // 0: all cores
  std::string device = "cpu";  // where the step runs: "cpu", "cuda" or "cuda:N"
  bool tensorboard = true;     // RUN_DIR/tensorboard/ event files of the metrics.jsonl scalars
  // Start from pretrained weights: a Hugging Face directory, a checkpoint or a run. The
  // model's shape comes from there (compute_dtype and dropout stay), the optimizer state
  // is fresh and the step 0; a checkpoint of the run itself takes precedence (resume).
  std::string init_from;
  // Persistent compilation cache (compiler/compilation_cache.h): "auto" =
  // RUN_DIR/compilation_cache unless TESSERA_COMPILATION_CACHE_DIR names one, "" = off,
  // else the directory (shareable between runs). A restart compiles from disk.
  std::string compilation_cache = "auto";
};

// SPMD training over a device mesh (train/parallel.h). An empty mesh: one device.
struct ParallelConfig {
  std::string mesh;   // "data=2,fsdp=2,tensor=2" (MaxText axis names)
  std::string rules;  // logical axis rules overriding the defaults: "embed=fsdp,heads=tensor"
  // With a `pipeline` mesh axis (train/pipeline_step.h; resolved by pipeline_options()):
  std::string pipeline_schedule = "1f1b";  // gpipe | 1f1b | interleaved
  int64_t pipeline_micro_batches = 0;      // per replica and accumulation step; 0: auto
  int64_t virtual_stages = 0;              // stages per device (interleaved); 0: 2 interleaved, else 1
  std::string pipeline_stages;             // layer ranges per stage, "0-3,4-7"; "": balanced by cost
  // A stage's backward recomputes its forward (true) or starts from the activations its
  // forward kept (false: faster, more memory; PipelineOptions::recompute).
  bool pipeline_recompute = true;
};

struct TrainConfig {
  models::ModelConfig model;
  std::string model_preset;  // the preset the model section started from ("" = none)
  // [quant] mode: "on" runs model.quant_targets in int8 wherever the job runs; "auto" only
  // on a CPU with int8 matrix units (AMX-INT8: `tessera info`'s "int8 GEMM" line), and
  // elsewhere drops the targets (those matmuls stay in the compute dtype). Resolved when
  // the config is read.
  std::string quant_mode = "on";
  DataConfig data;
  // optimizer.loss_scale defaults to Auto: dynamic loss scaling for float16 compute,
  // none for float32 and bfloat16 (optimizer_config() resolves it).
  optim::OptimizerConfig optimizer{.loss_scale = {.mode = optim::LossScaling::Auto}};
  optim::ScheduleConfig schedule;  // schedule.total_steps = train.steps, peak_lr = optimizer lr
  LoopConfig loop;
  CheckpointConfig checkpoint;
  RunConfig run;
  ParallelConfig parallel;

  int64_t micro_batches() const { return loop.batch / (loop.micro_batch > 0 ? loop.micro_batch : loop.batch); }
  int64_t micro_batch_size() const { return loop.micro_batch > 0 ? loop.micro_batch : loop.batch; }
  // `optimizer` with loss_scale Auto resolved against model.compute_dtype (what the
  // trainer builds its Optimizer from).
  optim::OptimizerConfig optimizer_config() const;

  // Every key as JSON {"model": {...}, ...} (stored in checkpoint manifests).
  nlohmann::json to_json() const;
  // Cross-field checks (batch % micro_batch, seq <= context, ...): ConfigError.
  void validate() const;
};

// Loads `path` (TOML), then applies overrides "section.key=value" (the value in TOML
// syntax: 3e-4, "text", true, ["a", "b"]; a bare word is taken as a string). Errors
// are ConfigErrors: "configs/x.toml:12: unknown key 'optimizer.lrr' (did you mean
// 'optimizer.lr'?)", "--set train.steps=abc: expected an integer".
TrainConfig load_config(const std::filesystem::path& path, const std::vector<std::string>& overrides = {});
// The same from TOML text (`origin` names it in errors).
TrainConfig parse_config(const std::string& toml_text, const std::string& origin,
                         const std::vector<std::string>& overrides = {});
// Rebuilds a config from to_json() output (checkpoint manifests).
TrainConfig config_from_json(const nlohmann::json& json);

// Every valid key with its type and default, one per line ("optimizer.lr = 0.001  # float").
std::string describe_config_keys();

// Levenshtein distance (for "did you mean").
size_t edit_distance(const std::string& a, const std::string& b);

}  // namespace tessera::train
