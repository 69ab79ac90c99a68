// `tessera data prepare INPUT... --out DIR`: text files or directories -> train.bin,
// val.bin and meta.json (data/prepare.h), then a short summary of what was taken.
// `tessera data stats --config FILE`: the sources of a config's data.mixture (tokens,
// documents, rows) and the mixture its run will realize against the one asked.
#include <fmt/format.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "tessera/base/error.h"
#include "tessera/base/thread_pool.h"
#include "tessera/data/pipeline.h"
#include "tessera/data/prepare.h"
#include "tessera/data/tokenizer.h"
#include "tessera/train/config.h"

namespace tessera::cli {
namespace {

struct DataPrepareArgs {
  std::vector<std::string> inputs;
  std::string out;
  data::PrepareOptions options;
  bool no_progress = false;
  bool verbose = false;
};

// "binary (NUL byte at offset 12)" -> "binary": the kinds counted in the summary.
std::string reason_kind(const std::string& reason) {
  if (reason.starts_with("same file as")) return "duplicate (symlink)";
  if (reason.starts_with("excluded")) return "excluded";
  return reason.substr(0, reason.find(' '));
}

int run_prepare(DataPrepareArgs& args) {
  args.options.progress = !args.no_progress;
  // The encoding runs on the process's thread pool: --threads N sizes it.
  if (args.options.threads > 0) set_num_threads(args.options.threads);
  const std::vector<std::filesystem::path> inputs(args.inputs.begin(), args.inputs.end());
  const data::PrepareResult result = data::prepare_dataset(inputs, args.out, args.options);

  std::map<std::string, int> kinds;
  for (const data::SkippedFile& skipped : result.skipped) ++kinds[reason_kind(skipped.reason)];
  std::string skipped_summary;
  for (const auto& [kind, count] : kinds)
    skipped_summary += fmt::format("{}{} {}", skipped_summary.empty() ? "" : ", ", count, kind);
  const double total = static_cast<double>(result.train_tokens + result.val_tokens);
  fmt::print("prepared {} (tokenizer {}, separator {})\n", args.out, args.options.tokenizer, result.separator);
  fmt::print("  files  {} read, {:.2f} MB", result.files.size(), static_cast<double>(result.bytes_read) / 1e6);
  if (!result.skipped.empty())
    fmt::print("; {} skipped ({}){}", result.skipped.size(), skipped_summary,
               args.verbose ? "" : " [--verbose lists them]");
  fmt::print("\n  encode {:.2f} s, {:.1f} MB/s on {} thread{}\n", result.seconds, result.megabytes_per_second,
             result.threads, result.threads == 1 ? "" : "s");
  fmt::print("  train  {} tokens -> train.bin\n", result.train_tokens);
  fmt::print("  val    {} tokens -> val.bin ({:.1f}%, {})\n", result.val_tokens,
             total > 0 ? 100.0 * static_cast<double>(result.val_tokens) / total : 0.0,
             result.val_tokens == 0     ? "no validation split"
             : result.split_at_document ? "split at a file boundary"
                                        : "split inside the last file, at a line start");
  if (args.verbose) {
    for (const auto& file : result.files) fmt::print("  took     {}\n", file.string());
    for (const data::SkippedFile& skipped : result.skipped)
      fmt::print("  skipped  {}: {}\n", skipped.path.string(), skipped.reason);
  }
  return 0;
}

struct DataStatsArgs {
  std::string config;
  std::vector<std::string> overrides;
  int64_t rows = 0;
  bool json = false;
};

int run_stats(const DataStatsArgs& args) {
  const train::TrainConfig cfg = train::load_config(args.config, args.overrides);
  if (!cfg.data.uses_pipeline())
    fail<ConfigError>("{}: no data.mixture ([[data.mixture]] sources); the run reads the one file data.train = {}",
                      args.config, cfg.data.train);
  const std::unique_ptr<data::Tokenizer> tokenizer = data::make_tokenizer(cfg.data.tokenizer);
  data::PipelineSpec spec = cfg.data.resolved_pipeline();
  spec.workers = 0;
  const data::Pipeline pipeline(spec, *tokenizer, cfg.loop.batch, cfg.loop.seq, cfg.run.seed, 0, 1, cfg.model.vocab);
  const uint64_t rows = args.rows > 0 ? static_cast<uint64_t>(args.rows)
                                      : static_cast<uint64_t>(cfg.loop.steps) * static_cast<uint64_t>(cfg.loop.batch);
  const std::vector<data::SourceStats> stats = pipeline.planned_stats(rows);
  nlohmann::json out = {{"config", args.config},
                        {"packing", spec.packing},
                        {"seq", cfg.loop.seq},
                        {"rows", rows},
                        {"tokens", rows * static_cast<uint64_t>(cfg.loop.seq)},
                        {"sources", nlohmann::json::array()}};
  fmt::print("data stats: {} ({} source{}, packing {}, shuffle buffer {} rows)\n", args.config, stats.size(),
             stats.size() == 1 ? "" : "s", spec.packing, spec.shuffle_buffer);
  fmt::print("over {} rows of {} tokens ({} tokens{}):\n", rows, cfg.loop.seq,
             rows * static_cast<uint64_t>(cfg.loop.seq),
             args.rows > 0 ? "" : fmt::format(", the run: {} steps x {} rows", cfg.loop.steps, cfg.loop.batch));
  fmt::print("  {:<16} {:<6} {:>6} {:>12} {:>10} {:>9} {:>8} {:>9} {:>12} {:>7}\n", "source", "kind", "shards",
             "tokens", "documents", "rows", "asked", "realized", "drawn", "epochs");
  for (const data::SourceStats& s : stats) {
    const uint64_t documents = pipeline.sources()[&s - stats.data()]->documents();
    const double realized = rows > 0 ? static_cast<double>(s.rows) / static_cast<double>(rows) : 0.0;
    const double epochs = static_cast<double>(s.rows) / static_cast<double>(s.source_rows);
    fmt::print("  {:<16} {:<6} {:>6} {:>12} {:>10} {:>9} {:>8.4f} {:>9.4f} {:>12} {:>7.2f}\n", s.name, s.kind, s.shards,
               s.source_tokens, documents, s.source_rows, s.weight, realized, s.tokens, epochs);
    out["sources"].push_back({{"name", s.name},
                              {"kind", s.kind},
                              {"shards", s.shards},
                              {"tokens", s.source_tokens},
                              {"documents", documents},
                              {"rows", s.source_rows},
                              {"weight_asked", s.weight},
                              {"weight_realized", realized},
                              {"rows_drawn", s.rows},
                              {"tokens_drawn", s.tokens},
                              {"epochs", epochs}});
  }
  if (args.json) fmt::print("{}\n", out.dump());
  return 0;
}

}  // namespace

Command add_data_command(CLI::App& app) {
  CLI::App* data =
      app.add_subcommand("data", "Prepare datasets (text files -> token files) and inspect a data mixture");
  data->require_subcommand(1);
  auto args = std::make_shared<DataPrepareArgs>();
  CLI::App* prepare = data->add_subcommand(
      "prepare",
      "Tokenize text files (directories are walked; binary files, hidden entries and symlinks to files already taken "
      "are skipped) into DIR/train.bin, DIR/val.bin and DIR/meta.json");
  prepare->add_option("inputs", args->inputs, "Text files or directories")->required();
  prepare->add_option("--out,-o", args->out, "Output directory")->required();
  prepare
      ->add_option("--val-fraction", args->options.val_fraction,
                   "The last fraction of the token stream that becomes val.bin (at a file boundary when possible)")
      ->check(CLI::Range(0.0, 0.999999))
      ->capture_default_str();
  prepare
      ->add_option("--tokenizer", args->options.tokenizer,
                   "Tokenizer spec: byte, gpt2:PATH (vocab.json + merges.txt), hf:PATH (tokenizer.json), spm:PATH "
                   "(SentencePiece .model), or a path whose kind is guessed")
      ->capture_default_str();
  prepare
      ->add_option("--separator", args->options.separator,
                   "Between documents: eos (the tokenizer's end-of-text token), newline (a '\\n' after a document "
                   "without one), none, or auto (eos when the tokenizer has one, else newline)")
      ->check(CLI::IsMember({"auto", "eos", "newline", "none"}))
      ->capture_default_str();
  prepare->add_option("--threads", args->options.threads, "Encoding threads (0: all cores)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  prepare->add_option("--exclude", args->options.exclude,
                      "Skip files whose name or path matches this glob (repeatable)");
  prepare->add_flag("--no-progress", args->no_progress, "No progress bar on stderr");
  prepare->add_flag("--verbose,-v", args->verbose, "List every file taken or skipped");

  auto stats_args = std::make_shared<DataStatsArgs>();
  CLI::App* stats = data->add_subcommand(
      "stats", "The sources of a config's data.mixture (tokens, documents, rows) and the mixture its run realizes");
  stats->add_option("--config,-c", stats_args->config, "Training config (TOML) with [[data.mixture]] sources")
      ->required();
  stats->add_option("--set", stats_args->overrides, "Override a config key: section.key=value (repeatable)");
  stats->add_option("--rows", stats_args->rows, "Rows to plan (default: the run's train.steps x train.batch)")
      ->check(CLI::PositiveNumber);
  stats->add_flag("--json", stats_args->json, "Also print the figures as one JSON line");
  return Command{data,
                 [args, stats_args, stats] { return stats->parsed() ? run_stats(*stats_args) : run_prepare(*args); }};
}

}  // namespace tessera::cli
