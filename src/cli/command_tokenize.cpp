// `tessera tokenize --tokenizer SPEC [--decode] [FILE|-]`: text -> token ids (one line
// of space-separated ids per input line, or the whole input as one sequence) and ids ->
// text, to look at what a tokenizer does and to check round trips from the shell.
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "tessera/base/error.h"
#include "tessera/base/thread_pool.h"
#include "tessera/data/tokenizer.h"

namespace tessera::cli {
namespace {

struct TokenizeArgs {
  std::string tokenizer = "byte";
  std::string input = "-";
  bool decode = false;
  bool whole = false;
  bool stats = false;
  bool info = false;
  int threads = 0;
};

// Bytes and tokens that went through the tokenizer, and the time it took.
struct Totals {
  uint64_t bytes = 0, tokens = 0;
  double seconds = 0;
};

class Stopwatch {
 public:
  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

void write_out(const std::string& text) {
  if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size()) fail<IOError>("tokenize: cannot write stdout");
}

std::string join_ids(const std::vector<int32_t>& ids) {
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) fmt::format_to(std::back_inserter(line), "{}{}", i == 0 ? "" : " ", ids[i]);
  line.push_back('\n');
  return line;
}

// "12 7 -3" -> ids; a token that is not an integer, or an id outside the vocabulary,
// is a ValueError naming the line and the token.
std::vector<int32_t> parse_ids(const std::string& line, uint64_t line_number, int64_t vocab_size) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (true) {
    pos = line.find_first_not_of(" \t\r", pos);
    if (pos == std::string::npos) break;
    const size_t end = std::min(line.find_first_of(" \t\r", pos), line.size());
    const std::string token = line.substr(pos, end - pos);
    int64_t id = 0;
    const auto [ptr, ec] = std::from_chars(token.data(), token.data() + token.size(), id);
    if (ec != std::errc() || ptr != token.data() + token.size())
      fail<ValueError>("line {}: token {} '{}' is not an integer id", line_number, ids.size() + 1, token);
    if (id < 0 || id >= vocab_size)
      fail<ValueError>("line {}: token {} '{}' is outside the vocabulary [0, {})", line_number, ids.size() + 1, token,
                       vocab_size);
    ids.push_back(static_cast<int32_t>(id));
    pos = end;
  }
  return ids;
}

void print_info(const data::Tokenizer& tokenizer) {
  const std::optional<int32_t> eos = tokenizer.eos_id();
  fmt::print("id          {}\n", tokenizer.id());
  fmt::print("spec        {}\n", tokenizer.spec());
  fmt::print("vocab_size  {}\n", tokenizer.vocab_size());
  fmt::print("eos_id      {}\n", eos ? std::to_string(*eos) : "none");
}

void run_lines(std::istream& in, const data::Tokenizer& tokenizer, const TokenizeArgs& args, Totals& totals) {
  std::string line;
  uint64_t line_number = 0;
  while (std::getline(in, line)) {
    ++line_number;
    Stopwatch watch;
    std::string out;
    if (args.decode) {
      const std::vector<int32_t> ids = parse_ids(line, line_number, tokenizer.vocab_size());
      out = tokenizer.decode(ids) + "\n";
      totals.tokens += ids.size();
      totals.bytes += out.size() - 1;
    } else {
      const std::vector<int32_t> ids = tokenizer.encode(line);
      out = join_ids(ids);
      totals.tokens += ids.size();
      totals.bytes += line.size();
    }
    totals.seconds += watch.seconds();
    write_out(out);
  }
  if (in.bad()) fail<IOError>("tokenize: cannot read {} (after line {})", args.input, line_number);
}

void run_whole(std::istream& in, const data::Tokenizer& tokenizer, const TokenizeArgs& args, Totals& totals) {
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) fail<IOError>("tokenize: cannot read {}", args.input);
  const std::string text = buffer.str();
  Stopwatch watch;
  const std::vector<int32_t> ids = tokenizer.encode_parallel(text, std::max(1, tessera::num_threads()));
  totals.seconds = watch.seconds();
  totals.bytes = text.size();
  totals.tokens = ids.size();
  write_out(join_ids(ids));
}

int run_tokenize(const TokenizeArgs& args) {
  if (args.threads > 0) set_num_threads(args.threads);  // --whole encodes on the process's thread pool
  const std::unique_ptr<data::Tokenizer> tokenizer = data::make_tokenizer(args.tokenizer);
  if (args.info) {
    print_info(*tokenizer);
    return 0;
  }
  if (args.whole && args.decode) fail<ValueError>("tokenize: --whole encodes; it does not go with --decode");
  std::ifstream file;
  if (args.input != "-") {
    file.open(args.input, std::ios::binary);
    if (!file) fail<IOError>("tokenize: cannot open {}: {}", args.input, std::strerror(errno));
  }
  std::istream& in = args.input == "-" ? std::cin : file;
  Totals totals;
  if (args.whole)
    run_whole(in, *tokenizer, args, totals);
  else
    run_lines(in, *tokenizer, args, totals);
  std::fflush(stdout);
  if (args.stats) {
    const double bytes = static_cast<double>(totals.bytes);
    fmt::print(stderr, "{} bytes, {} tokens, {:.3f} bytes/token, {:.2f} MB/s ({} {})\n", totals.bytes, totals.tokens,
               totals.tokens > 0 ? bytes / static_cast<double>(totals.tokens) : 0.0,
               bytes / 1e6 / std::max(totals.seconds, 1e-9), args.decode ? "decode" : "encode", tokenizer->id());
  }
  return 0;
}

}  // namespace

Command add_tokenize_command(CLI::App& app) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* sub = app.add_subcommand(
      "tokenize", "Text -> token ids (a line of space-separated ids per input line) or, with --decode, ids -> text");
  sub->add_option("input", args->input, "Input file ('-': stdin)")->capture_default_str();
  sub->add_option("--tokenizer", args->tokenizer,
                  "Tokenizer spec: byte, gpt2:PATH, hf:PATH, spm:PATH, or a path whose kind is guessed")
      ->capture_default_str();
  sub->add_flag("--decode,-d", args->decode, "Read lines of space-separated ids and print the text of each");
  sub->add_flag("--whole", args->whole, "Encode the whole input as one sequence (one output line)");
  sub->add_flag("--stats", args->stats, "Print bytes, tokens, bytes/token and MB/s on stderr");
  sub->add_flag("--info", args->info, "Print the tokenizer's id, spec, vocabulary size and end-of-text id");
  sub->add_option("--threads", args->threads, "Threads for --whole (0: all cores)")->check(CLI::NonNegativeNumber);
  return Command{sub, [args] { return run_tokenize(*args); }};
}

}  // namespace tessera::cli
