// `tessera train --config configs/x.toml [--set key=value ...]`: runs (or resumes) a
// training job and prints its summary, a few samples and where the time went.
#include <fmt/format.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/mesh_auto.h"
#include "tessera/data/tokenizer.h"
#include "tessera/models/sample.h"
#include "tessera/spmd/runtime.h"
#include "tessera/train/config.h"
#include "tessera/train/parallel.h"
#include "tessera/train/progress.h"
#include "tessera/train/trainer.h"

namespace tessera::cli {
namespace {

struct TrainOptions {
  std::string config;
  std::vector<std::string> overrides;
  std::string mesh;
  std::string device;
  std::string init_from;
  bool list_keys = false;
  bool print_config = false;
  bool quiet = false;
  int samples = 0;
  int sample_tokens = 200;
};

void print_samples(const train::TrainConfig& cfg, const Tree& params, int count, int tokens) {
  models::Model model(cfg.model);
  std::unique_ptr<data::Tokenizer> tokenizer = data::make_tokenizer(cfg.data.tokenizer);
  // Each sample starts from a newline: for a corpus of short texts that is the start of a new one.
  const std::vector<int32_t> prompt = tokenizer->encode("\n");
  for (int i = 0; i < count; ++i) {
    models::SampleOptions options;
    options.max_tokens = tokens;
    options.temperature = 0.8;
    options.top_k = 40;
    options.seed = static_cast<uint64_t>(i) + 1;
    const models::SampleResult result = models::sample(model, params, prompt, options);
    fmt::print("--- sample {} (temperature 0.8, top-k 40, seed {}) ---\n{}\n", i + 1, options.seed,
               tokenizer->decode(result.tokens));
  }
}

int run_train(const TrainOptions& options) {
  if (options.list_keys) {
    fmt::print("{}", train::describe_config_keys());
    return 0;
  }
  if (options.config.empty()) {
    fmt::print(stderr, "tessera train: --config FILE is required (configs/ has examples)\n");
    return 2;
  }
  std::vector<std::string> overrides = options.overrides;
  const bool mesh_auto = options.mesh == "auto";
  if (!options.mesh.empty() && !mesh_auto) overrides.push_back("parallel.mesh=\"" + options.mesh + "\"");
  if (!options.device.empty()) overrides.push_back("run.device=\"" + options.device + "\"");
  if (!options.init_from.empty()) overrides.push_back("run.init_from=\"" + options.init_from + "\"");
  train::TrainConfig config = train::load_config(options.config, overrides);
  if (mesh_auto) {
    apply_mesh_auto(choose_mesh_auto(config), config);
    config.validate();
  }
  if (options.print_config) {
    fmt::print("{}\n", config.to_json().dump(2));
    return 0;
  }
  train::TrainerOptions trainer_options;
  trainer_options.progress = !options.quiet;
  train::Trainer trainer(config, trainer_options);
  const train::TrainSummary s = trainer.run();
  // Sampling reads whole parameters: under mpirun every rank takes part in gathering them
  // (in-process, sharded arrays are assembled when read).
  const Tree params =
      options.samples > 0 && spmd::is_multi_process() ? train::Layout::gather(trainer.params()) : trainer.params();
  if (!spmd::is_primary_process()) return 0;  // under mpirun rank 0 reports

  fmt::print("\n== run summary ({}) ==\n", config.run.dir);
  fmt::print("  steps            {} -> {} ({}){}\n", s.start_step, s.end_step, s.stop_reason,
             s.start_step > 0 ? ", resumed" : "");
  fmt::print("  parameters       {:.2f}M\n", static_cast<double>(s.parameters) / 1e6);
  fmt::print("  optimizer        {}, state {} ({:.2f} bytes per parameter)\n", s.optimizer,
             human_bytes(s.optimizer_state_bytes),
             static_cast<double>(s.optimizer_state_bytes) / static_cast<double>(std::max<int64_t>(s.parameters, 1)));
  if (!s.quant_summary.empty()) fmt::print("  quant            {}\n", s.quant_summary);
  fmt::print("  training time    {} ({:.1f} s)\n", train::format_duration(s.train_seconds), s.train_seconds);
  if (s.end_step > s.start_step) {
    fmt::print("  throughput       {:.0f} tokens/s (median step), MFU {:.1f}% of {:.1f} GFLOP/s ({})\n", s.tokens_per_s,
               100 * s.mfu, s.peak_flops / 1e9, s.peak_source);
    fmt::print("  last train loss  {:.4f}\n", s.last_loss);
  } else {
    fmt::print("  (no steps left: train.steps = {} was already reached; raise it or use a new run.dir)\n",
               config.loop.steps);
  }
  if (s.val_loss)
    fmt::print("  validation loss  {:.4f} nats/token (perplexity {:.2f}, {:.3f} bits/token)\n", *s.val_loss,
               std::exp(*s.val_loss), *s.val_loss / std::log(2.0));
  fmt::print("  checkpoint       {}\n", s.last_checkpoint.string());
  if (!s.parallel_summary.empty()) fmt::print("\n== parallel ==\n{}", s.parallel_summary);
  if (s.pipeline_bubble)
    fmt::print("  pipeline bubble  {:.1f}% of the devices' step time idle (median over steps; analytic {:.1f}%)\n",
               100 * *s.pipeline_bubble, 100 * s.pipeline_bubble_analytic.value_or(0));
  if (!s.goodput_table.empty())
    fmt::print("\n== goodput (tessera goodput {} for the detail, --html for charts) ==\n{}", config.run.dir,
               s.goodput_table);
  if (options.samples > 0) print_samples(trainer.config(), params, options.samples, options.sample_tokens);
  return 0;
}

}  // namespace

Command add_train_command(CLI::App& app) {
  auto options = std::make_shared<TrainOptions>();
  CLI::App* sub = app.add_subcommand("train", "Train a model from a TOML config (resumes from the run directory)");
  sub->add_option("--config,-c", options->config, "TOML config file (see configs/)");
  sub->add_option("--set", options->overrides, "Override a key: --set optimizer.lr=3e-4 (repeatable)");
  sub->add_option("--mesh", options->mesh,
                  "Train SPMD over a device mesh, e.g. data=2,fsdp=2,tensor=2 or pipeline=4,data=2 (= --set "
                  "parallel.mesh=...; the pipeline's keys are parallel.pipeline_*); "
                  "in-process it uses that many virtual CPU devices, under mpirun one per rank. 'auto': the "
                  "planner picks the layout of the devices present (TESSERA_CPU_DEVICES in-process, the ranks "
                  "under mpirun) and says why; a resumed run keeps its choice");
  sub->add_option("--device", options->device,
                  "Where the step runs: cpu, cuda or cuda:N (= --set run.device=...); on a GPU use "
                  "--set model.compute_dtype=bfloat16 for mixed precision");
  sub->add_option("--init-from", options->init_from,
                  "Start from pretrained weights: a Hugging Face directory (GPT-2/Llama safetensors), a checkpoint "
                  "or a run; the model shape comes from there (= --set run.init_from=...)");
  sub->add_flag("--list-keys", options->list_keys, "List every config key with its type and default");
  sub->add_flag("--print-config", options->print_config, "Print the resolved config as JSON and exit");
  sub->add_flag("--quiet,-q", options->quiet, "No progress line");
  sub->add_option("--samples", options->samples, "Print this many samples from the trained model at the end");
  sub->add_option("--sample-tokens", options->sample_tokens, "Tokens per sample");
  return Command{sub, [options] { return run_train(*options); }};
}

}  // namespace tessera::cli
