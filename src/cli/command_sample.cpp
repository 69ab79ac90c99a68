// `tessera sample --ckpt PATH --prompt TEXT`: text from a trained model (KV cache,
// temperature, top-k, top-p).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "tessera/base/error.h"
#include "tessera/data/tokenizer.h"
#include "tessera/models/sample.h"
#include "tessera/train/restore.h"

namespace tessera::cli {
namespace {

struct SampleCliOptions {
  std::string checkpoint;
  std::string prompt = "\n";
  models::SampleOptions sample;
  int count = 1;
  bool no_cache = false;
  bool no_stop = false;
  std::string tokenizer;  // --tokenizer: a spec used instead of the checkpoint's
};

int run_sample(SampleCliOptions options) {
  train::RestoredModel restored = train::restore_model(options.checkpoint, print_warning);
  const bool override_tokenizer = !options.tokenizer.empty();
  if (!override_tokenizer && restored.tokenizer_spec.empty())
    fail<ValueError>(
        "{}: no tokenizer is recorded for this model (a Hugging Face directory without tokenizer.json, vocab.json + "
        "merges.txt or tokenizer.model, or an import of one); pass --tokenizer SPEC",
        restored.checkpoint.string());
  std::unique_ptr<data::Tokenizer> tokenizer =
      data::make_tokenizer(override_tokenizer ? options.tokenizer : restored.tokenizer_spec);
  const int64_t model_vocab = restored.config.model.vocab;
  if (override_tokenizer && tokenizer->vocab_size() > model_vocab)
    fail<ValueError>("--tokenizer {}: its vocabulary ({} tokens) does not fit the model's ({} tokens)",
                     options.tokenizer, tokenizer->vocab_size(), model_vocab);
  if (tokenizer->id() != restored.tokenizer) {
    if (!override_tokenizer)
      fail<ValueError>("{}: the checkpoint was trained with tokenizer {} ({}), but those files now give {}",
                       restored.checkpoint.string(), restored.tokenizer, restored.tokenizer_spec, tokenizer->id());
    if (!restored.tokenizer.empty())
      print_warning(fmt::format("--tokenizer {} is {}, but {} was trained with {}; sampling with it anyway",
                                options.tokenizer, tokenizer->id(), restored.checkpoint.string(), restored.tokenizer));
  }
  const std::vector<int32_t> prompt = tokenizer->encode(options.prompt);
  options.sample.use_cache = !options.no_cache;
  // Ids past the tokenizer's vocabulary (a padded embedding table) cannot be decoded.
  options.sample.vocab_limit = std::min(tokenizer->vocab_size(), model_vocab);
  if (!options.no_stop && tokenizer->eos_id()) options.sample.stop_token = *tokenizer->eos_id();
  fmt::print(stderr, "{} (step {}), prompt {} tokens\n", restored.checkpoint.string(), restored.step, prompt.size());
  for (int i = 0; i < options.count; ++i) {
    const auto start = std::chrono::steady_clock::now();
    const models::SampleResult result = models::sample(*restored.model, restored.params, prompt, options.sample);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    fmt::print("{}{}\n", options.prompt, tokenizer->decode(result.tokens));
    fmt::print(stderr, "[{} tokens in {:.2f} s, {:.0f} tokens/s{}]\n", result.tokens.size(), seconds,
               static_cast<double>(result.tokens.size()) / seconds,
               result.hit_context ? "; stopped at the model's context length"
               : result.hit_stop  ? "; stopped at the end-of-text token"
                                  : "");
    options.sample.seed += 1;
  }
  return 0;
}

}  // namespace

Command add_sample_command(CLI::App& app) {
  auto options = std::make_shared<SampleCliOptions>();
  CLI::App* sub = app.add_subcommand("sample", "Generate text from a checkpoint");
  sub->add_option("--ckpt", options->checkpoint, "Checkpoint directory, or a run directory (its newest valid one)")
      ->required();
  sub->add_option("--prompt", options->prompt, "Text to continue (default: a newline)");
  sub->add_option("--max-tokens", options->sample.max_tokens, "New tokens to generate");
  sub->add_option("--temperature", options->sample.temperature, "Sampling temperature (0: greedy)");
  sub->add_option("--top-k", options->sample.top_k, "Keep the k most likely tokens (0: off)");
  sub->add_option("--top-p", options->sample.top_p, "Nucleus sampling threshold (1: off)");
  sub->add_option("--seed", options->sample.seed, "Sampling seed");
  sub->add_option("--count", options->count, "Number of samples");
  sub->add_flag("--no-stop", options->no_stop, "Keep going past the tokenizer's end-of-text token");
  sub->add_flag("--no-cache", options->no_cache, "Recompute the whole prefix for every token (no KV cache)");
  sub->add_option("--tokenizer", options->tokenizer,
                  "Tokenizer spec (byte, gpt2:PATH, hf:PATH, spm:PATH, or a path) instead of the checkpoint's; "
                  "another tokenizer than the one it was trained with is a warning when its vocabulary fits the model");
  return Command{sub, [options] { return run_sample(*options); }};
}

}  // namespace tessera::cli
