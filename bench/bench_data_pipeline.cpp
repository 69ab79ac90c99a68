// bench_data_pipeline: how fast the data pipeline (data/pipeline.h) delivers training
// rows, against how fast the trainer consumes them, on the shape of `make train`'s job
// (configs/fortunes.toml: batch 8 x 256 tokens, the tiny GPT) in the same run.
//
//   build/bin/bench_data_pipeline [--batches 3000] [--rounds 3] [--train-steps 30] [--tokens 2400000]
//
// The sources are synthetic, so the benchmark runs anywhere: a token file of --tokens
// byte tokens with a document end (a newline) every 40-400 tokens, mixed 3:1 with a
// directory of text files tokenized when the pipeline opens. Each case (packing
// documents or concat; 0, 1, 2, 4 workers) consumes --batches batches; rounds are
// interleaved and the median is reported. The trainer's rate is `tessera train` on the
// same rows (median step, after compile). A table goes to stdout; the last line is JSON
// with pipeline_tokens_per_s (documents packing, 2 workers: make train's setting) and
// trainer_tokens_per_s.
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "tessera/base/error.h"
#include "tessera/base/statistics.h"
#include "tessera/data/pipeline.h"
#include "tessera/data/token_file.h"
#include "tessera/data/tokenizer.h"
#include "tessera/train/config.h"
#include "tessera/train/trainer.h"
#include "train_bench_util.h"

namespace ts = tessera;
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  int64_t batches = 3000, rounds = 3, train_steps = 30, tokens = 2'400'000;
};

Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const std::string value = ts::bench::flag_value("bench_data_pipeline", argc, argv, i);
    const int64_t n = std::max<int64_t>(1, ts::bench::flag_integer("bench_data_pipeline", arg, value));
    if (arg == "--batches")
      f.batches = n;
    else if (arg == "--rounds")
      f.rounds = n;
    else if (arg == "--train-steps")
      f.train_steps = n;
    else if (arg == "--tokens")
      f.tokens = n;
    else
      ts::fail<ts::ValueError>(
          "bench_data_pipeline: unknown flag {} (flags: --batches --rounds --train-steps --tokens)", arg);
  }
  return f;
}

// Byte tokens with a newline (10) ending a document every 40-400 tokens.
std::vector<int32_t> synthetic_tokens(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  int64_t next_end = 40 + static_cast<int64_t>(rng() % 360);
  for (int64_t i = 0; i < n; ++i) {
    if (i == next_end) {
      tokens[static_cast<size_t>(i)] = 10;
      next_end = i + 40 + static_cast<int64_t>(rng() % 360);
    } else {
      tokens[static_cast<size_t>(i)] = 32 + static_cast<int32_t>(rng() % 95);
    }
  }
  return tokens;
}

struct Case {
  std::string packing;
  int workers;
};

}  // namespace

int main(int argc, char** argv) {
  try {
    const Flags flags = parse_flags(argc, argv);
    const fs::path dir = fs::temp_directory_path() / fmt::format("tessera-bench-data-{}", ::getpid());
    fs::create_directories(dir / "notes");
    ts::data::write_token_file(dir / "web.bin", synthetic_tokens(flags.tokens, 1), "byte", 256);
    ts::data::write_token_file(dir / "val.bin", synthetic_tokens(65536, 2), "byte", 256);
    for (int i = 0; i < 8; ++i) {
      std::ofstream note(dir / "notes" / fmt::format("{}.txt", i));
      for (int line = 0; line < 2000; ++line) note << "note " << i << ", line " << line << ": a line of text.\n";
    }
    const int64_t batch = 8, seq = 256;
    const std::unique_ptr<ts::data::Tokenizer> tokenizer = ts::data::make_tokenizer("byte");
    auto spec_for = [&](const Case& c) {
      ts::data::PipelineSpec spec;
      spec.sources = {{"web", (dir / "web.bin").string(), 3.0, "tokens", "10"},
                      {"notes", (dir / "notes").string(), 1.0, "text", "auto"}};
      spec.packing = c.packing;
      spec.workers = c.workers;
      return spec;
    };
    const std::vector<Case> cases = {{"documents", 0}, {"documents", 1}, {"documents", 2},
                                     {"documents", 4}, {"concat", 0},    {"concat", 2}};
    std::map<size_t, std::vector<double>> seconds;
    double open_s = 0;
    for (int64_t round = 0; round < flags.rounds; ++round) {
      for (size_t k = 0; k < cases.size(); ++k) {
        const auto t0 = Clock::now();
        ts::data::Pipeline pipeline(spec_for(cases[k]), *tokenizer, batch, seq, 1234);
        const auto t1 = Clock::now();
        open_s = std::chrono::duration<double>(t1 - t0).count();
        for (int64_t b = 0; b < flags.batches; ++b) pipeline.next_batch();
        seconds[k].push_back(std::chrono::duration<double>(Clock::now() - t1).count());
      }
    }
    const double tokens = static_cast<double>(flags.batches * batch * seq);

    // The trainer on the same pipeline: tokens per second of its median step.
    const std::vector<std::string> overrides = {"model.preset=\"tiny\"",
                                                "train.batch=8",
                                                "train.seq=256",
                                                fmt::format("train.steps={}", flags.train_steps),
                                                "train.eval_batches=1",
                                                "train.log_interval=1000",
                                                "checkpoint.interval=0",
                                                "run.tensorboard=false",
                                                "data.val=\"" + (dir / "val.bin").string() + "\"",
                                                "data.train=\"" + (dir / "web.bin").string() + "\"",
                                                "data.mixture=[{path = \"" + (dir / "web.bin").string() +
                                                    "\", weight = 3, documents = 10}, {name = \"notes\", "
                                                    "path = \"" +
                                                    (dir / "notes").string() + "\"}]",
                                                "run.dir=\"" + (dir / "run").string() + "\""};
    ts::train::TrainerOptions options;
    options.progress = false;
    ts::train::Trainer trainer(ts::train::parse_config("", "bench_data_pipeline", overrides), options);
    const ts::train::TrainSummary summary = trainer.run();
    fs::remove_all(dir);

    fmt::print(
        "data pipeline: batch {} x {} tokens, sources web (token file, {} tokens) 3 : notes (8 text files) 1; "
        "median of {} rounds of {} batches (open: {:.3f} s)\n",
        batch, seq, flags.tokens, flags.rounds, flags.batches, open_s);
    fmt::print("  {:<10} {:>8} {:>14} {:>16}\n", "packing", "workers", "tokens/s", "x trainer");
    nlohmann::json cases_json = nlohmann::json::array();
    double headline = 0;
    for (size_t k = 0; k < cases.size(); ++k) {
      const double rate = tokens / ts::median(seconds[k]);
      fmt::print("  {:<10} {:>8} {:>14.3g} {:>15.0f}x\n", cases[k].packing, cases[k].workers, rate,
                 rate / summary.tokens_per_s);
      cases_json.push_back({{"packing", cases[k].packing}, {"workers", cases[k].workers}, {"tokens_per_s", rate}});
      if (cases[k].packing == "documents" && cases[k].workers == 2) headline = rate;
    }
    fmt::print("  trainer (tiny GPT, median step of {} steps): {:.3g} tokens/s\n", flags.train_steps,
               summary.tokens_per_s);
    fmt::print("{}\n", nlohmann::json{{"bench", "data_pipeline"},
                                      {"batch", batch},
                                      {"seq", seq},
                                      {"pipeline_tokens_per_s", headline},
                                      {"trainer_tokens_per_s", summary.tokens_per_s},
                                      {"ratio", headline / summary.tokens_per_s},
                                      {"cases", cases_json}}
                           .dump());
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_data_pipeline: {}\n", e.what());
    return 1;
  }
}
