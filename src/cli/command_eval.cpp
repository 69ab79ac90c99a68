// `tessera eval --ckpt PATH`: validation loss and perplexity of a checkpoint.
#include <fmt/format.h>

#include <cmath>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "tessera/data/loader.h"
#include "tessera/train/restore.h"
#include "tessera/train/train_step.h"

namespace tessera::cli {
namespace {

struct EvalOptions {
  std::string checkpoint;
  std::string data;     // default: the config's data.val
  int64_t batches = 0;  // 0: the config's train.eval_batches
};

int run_eval(const EvalOptions& options) {
  train::RestoredModel restored = train::restore_model(options.checkpoint, print_warning);
  const train::TrainConfig& cfg = restored.config;
  const std::string path = options.data.empty() ? cfg.data.val : options.data;
  auto file = std::make_shared<const data::TokenFile>(path);
  file->check_vocabulary(cfg.model.vocab);
  data::DataLoader loader(file, cfg.micro_batch_size(), cfg.loop.seq, cfg.run.seed, 0, 1, /*shuffle=*/false);
  const int64_t batches = std::min<int64_t>(options.batches > 0 ? options.batches : cfg.loop.eval_batches,
                                            static_cast<int64_t>(loader.batches_per_epoch()));
  const double loss = train::evaluate(*restored.model, restored.params, loader, batches);
  fmt::print("checkpoint   {} (step {})\n", restored.checkpoint.string(), restored.step);
  fmt::print("data         {} ({} batches x {} x {} tokens)\n", path, batches, cfg.micro_batch_size(), cfg.loop.seq);
  fmt::print("loss         {:.4f} nats/token\nperplexity   {:.3f}\nbits/token   {:.4f}\n", loss, std::exp(loss),
             loss / std::log(2.0));
  return 0;
}

}  // namespace

Command add_eval_command(CLI::App& app) {
  auto options = std::make_shared<EvalOptions>();
  CLI::App* sub = app.add_subcommand("eval", "Validation loss and perplexity of a checkpoint");
  sub->add_option("--ckpt", options->checkpoint, "Checkpoint directory, or a run directory (its newest valid one)")
      ->required();
  sub->add_option("--data", options->data, "Token file to evaluate on (default: the run's validation file)");
  sub->add_option("--batches", options->batches, "Batches to evaluate (default: the config's train.eval_batches)");
  return Command{sub, [options] { return run_eval(*options); }};
}

}  // namespace tessera::cli
