// bench_tokenizer: encode and decode speed of tessera's byte-level BPE (the gpt2_style
// fixture: GPT-2's pre-tokenizer regex, a 1500-token vocab trained on the fortunes) on
// the fortunes corpus or --file, next to tiktoken and Hugging Face tokenizers on the same
// text and tokenizer (bench/peers/tokenizer_peers.py, run with the oracle venv's python
// when it exists).
//
//   build/bin/bench_tokenizer [--file TEXT] [--fixture DIR] [--runs 5] [--threads 4] [--no-peers]
//
// Run from the repository root. MB/s = input bytes / median time over --runs after one
// untimed run (which fills the piece cache; "encode, cold cache" times a fresh tokenizer's
// first call). A table goes to stdout; the last line is one JSON object.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessera/base/error.h"
#include "tessera/data/bpe_tokenizer.h"
#include "train_bench_util.h"

namespace ts = tessera;
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  std::string file;
  std::string fixture = "tests/data/fixtures/tokenizers/gpt2_style";
  int64_t runs = 5;
  int threads = 4;
  bool peers = true;
};

Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--no-peers") {
      f.peers = false;
      continue;
    }
    const std::string value = ts::bench::flag_value("bench_tokenizer", argc, argv, i);
    if (arg == "--file")
      f.file = value;
    else if (arg == "--fixture")
      f.fixture = value;
    else if (arg == "--runs")
      f.runs = std::max<int64_t>(1, ts::bench::flag_integer("bench_tokenizer", arg, value));
    else if (arg == "--threads")
      f.threads = static_cast<int>(std::max<int64_t>(1, ts::bench::flag_integer("bench_tokenizer", arg, value)));
    else
      ts::fail<ts::ValueError>("bench_tokenizer: unknown flag {} (--file, --fixture, --runs, --threads, --no-peers)",
                               arg);
  }
  return f;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) ts::fail<ts::IOError>("bench_tokenizer: cannot read {}", path.string());
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The fortunes text files, sorted by name (as the oracle trains on them), in one file.
std::string fortunes_corpus(const fs::path& out) {
  const fs::path dir = "/usr/share/games/fortunes";
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.is_regular_file() && !entry.is_symlink() && entry.path().extension() != ".dat")
      files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  std::string text;
  for (const auto& file : files) text += read_file(file);
  std::ofstream(out, std::ios::binary).write(text.data(), static_cast<std::streamsize>(text.size()));
  return text;
}

double seconds(const std::function<void()>& fn) {
  const auto t0 = Clock::now();
  fn();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median_mb_s(size_t bytes, int64_t runs, const std::function<void()>& fn) {
  fn();
  std::vector<double> times;
  for (int64_t r = 0; r < runs; ++r) times.push_back(seconds(fn));
  return static_cast<double>(bytes) / 1e6 / ts::median(times);
}

nlohmann::json run_peers(const Flags& f, const std::string& file) {
  const std::string python = ".venv-oracles/bin/python";
  if (!f.peers || !fs::exists(python) || !fs::exists("bench/peers/tokenizer_peers.py")) return nullptr;
  const std::string command = fmt::format(
      "{} bench/peers/tokenizer_peers.py --file '{}' --fixture '{}' --runs {} "
      "--threads {}",
      python, file, f.fixture, f.runs, f.threads);
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return nullptr;
  std::string output;
  char buffer[4096];
  while (size_t n = std::fread(buffer, 1, sizeof buffer, pipe)) output.append(buffer, n);
  if (::pclose(pipe) != 0) {
    fmt::print("peers failed: {}\n", command);
    return nullptr;
  }
  // The peer's last line is its JSON.
  while (!output.empty() && output.back() == '\n') output.pop_back();
  const size_t line = output.rfind('\n');
  return nlohmann::json::parse(output.substr(line == std::string::npos ? 0 : line + 1));
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Flags f = parse_flags(argc, argv);
    std::string file = f.file;
    std::string text;
    if (file.empty()) {
      file = (fs::temp_directory_path() / "bench_tokenizer_fortunes.txt").string();
      text = fortunes_corpus(file);
    } else {
      text = read_file(file);
    }
    const auto cold = ts::data::load_tokenizer_json(fs::path(f.fixture) / "tokenizer.json");
    const double cold_s = seconds([&] { (void)cold->encode(text); });
    const auto tokenizer = ts::data::load_tokenizer_json(fs::path(f.fixture) / "tokenizer.json");
    std::vector<int32_t> ids = tokenizer->encode(text);
    if (tokenizer->encode_parallel(text, f.threads) != ids)
      ts::fail<ts::ValueError>("bench_tokenizer: encode_parallel differs from encode");
    const double mb = static_cast<double>(text.size()) / 1e6;
    const double encode = median_mb_s(text.size(), f.runs, [&] { ids = tokenizer->encode(text); });
    const double parallel =
        median_mb_s(text.size(), f.runs, [&] { (void)tokenizer->encode_parallel(text, f.threads); });
    std::string decoded;
    const double decode = median_mb_s(text.size(), f.runs, [&] { decoded = tokenizer->decode(ids); });
    if (decoded != text) ts::fail<ts::ValueError>("bench_tokenizer: decode(encode(text)) != text");
    const nlohmann::json peers = run_peers(f, file);

    fmt::print("bench_tokenizer: {} ({:.2f} MB, {} tokens), {} ({}), {} runs, {} threads\n", file, mb, ids.size(),
               f.fixture, tokenizer->id(), f.runs, f.threads);
    fmt::print("| MB/s | tessera | tiktoken | HF tokenizers | tessera / tiktoken | tessera / HF |\n");
    fmt::print("| --- | --- | --- | --- | --- | --- |\n");
    auto row = [&](const char* name, double ours, const char* key) {
      const bool have = !peers.is_null() && !peers.empty() && key != nullptr;
      const double tk = have ? peers["tiktoken"][key].get<double>() : 0,
                   hf = have ? peers["tokenizers"][key].get<double>() : 0;
      if (have)
        fmt::print("| {} | {:.1f} | {:.1f} | {:.1f} | {:.2f} | {:.2f} |\n", name, ours, tk, hf, ours / tk, ours / hf);
      else
        fmt::print("| {} | {:.1f} | - | - | - | - |\n", name, ours);
    };
    row("encode, cold cache", mb / cold_s, nullptr);
    row("encode (1 thread)", encode, "encode_mb_s");
    row(fmt::format("encode_parallel ({} threads)", f.threads).c_str(), parallel, "encode_parallel_mb_s");
    row("decode", decode, "decode_mb_s");
    nlohmann::json out = {{"bench", "tokenizer"},
                          {"file", file},
                          {"bytes", text.size()},
                          {"tokens", ids.size()},
                          {"threads", f.threads},
                          {"runs", f.runs},
                          {"encode_cold_mb_s", mb / cold_s},
                          {"encode_mb_s", encode},
                          {"encode_parallel_mb_s", parallel},
                          {"decode_mb_s", decode},
                          {"peers", peers}};
    fmt::print("{}\n", out.dump());
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}\n", e.what());
    return 1;
  }
  return 0;
}
