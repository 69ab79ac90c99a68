// `tessera data prepare INPUT... --out DIR`: text files or directories -> train.bin,
// val.bin and meta.json (data/prepare.h), then a short summary of what was taken.
#include <fmt/format.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "tessera/base/thread_pool.h"
#include "tessera/data/prepare.h"

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

}  // namespace

Command add_data_command(CLI::App& app) {
  CLI::App* data = app.add_subcommand("data", "Prepare datasets: text files -> token files");
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
  return Command{data, [args] { return run_prepare(*args); }};
}

}  // namespace tessera::cli
