#include "tessera/data/prepare.h"

#include <fcntl.h>
#include <fnmatch.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "tessera/base/error.h"
#include "tessera/base/file_io.h"
#include "tessera/base/thread_pool.h"
#include "tessera/data/token_file.h"
#include "tessera/data/tokenizer.h"

namespace fs = std::filesystem;

namespace tessera::data {
namespace {

constexpr size_t kBinaryProbeBytes = 8192;
// A file this big is encoded alone through Tokenizer::encode_parallel; smaller ones are
// encoded several at a time, in batches of at most kBatchBytes (what is held in memory
// as text besides the token stream).
constexpr uint64_t kParallelFileBytes = uint64_t{4} << 20;
constexpr uint64_t kBatchBytes = uint64_t{64} << 20;

enum class Separator { kNone, kNewline, kEos };

const char* separator_name(Separator separator) {
  switch (separator) {
    case Separator::kNone:
      return "none";
    case Separator::kNewline:
      return "newline";
    case Separator::kEos:
      return "eos";
  }
  return "?";
}

Separator choose_separator(const std::string& option, const Tokenizer& tokenizer) {
  if (option == "auto") return tokenizer.eos_id() ? Separator::kEos : Separator::kNewline;
  if (option == "newline") return Separator::kNewline;
  if (option == "none") return Separator::kNone;
  if (option == "eos") {
    if (!tokenizer.eos_id())
      fail<ValueError>(
          "data prepare: separator 'eos', but tokenizer {} has no end-of-text token (use 'newline', "
          "'none' or 'auto')",
          tokenizer.id());
    return Separator::kEos;
  }
  fail<ValueError>("data prepare: unknown separator '{}' (expected auto, eos, newline or none)", option);
}

// The id a '\n' at the end of a line becomes, or -1 when the tokenizer has no such
// single token ("a\n" must encode as "a" plus one id: a SentencePiece model with byte
// fallback gives <0x0A>, where "\n" alone would be "▁" <0x0A>).
int32_t newline_id(const Tokenizer& tokenizer) {
  const std::vector<int32_t> line = tokenizer.encode("a"), with_newline = tokenizer.encode("a\n");
  if (with_newline.size() != line.size() + 1 || !std::equal(line.begin(), line.end(), with_newline.begin())) return -1;
  return with_newline.back();
}

// "[#######.....]  1.2 / 2.6 MB  48%  35.1 MB/s" on stderr: redrawn in place on a
// terminal (at most 10 times a second), a line every 5 s otherwise (logs).
class ProgressBar {
 public:
  ProgressBar(bool enabled, uint64_t total) : enabled_(enabled), total_(total), tty_(::isatty(2) == 1) {}
  void update(uint64_t done, bool final = false) {
    if (!enabled_) return;
    const auto now = std::chrono::steady_clock::now();
    const double since_draw = std::chrono::duration<double>(now - last_draw_).count();
    if (!final && since_draw < (tty_ ? 0.1 : 5.0)) return;
    last_draw_ = now;
    const double seconds = std::max(1e-9, std::chrono::duration<double>(now - start_).count());
    const double fraction = total_ == 0 ? 1.0 : std::min(1.0, static_cast<double>(done) / static_cast<double>(total_));
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(fraction * kWidth);
    const std::string bar = std::string(static_cast<size_t>(filled), '#') + std::string(kWidth - filled, '.');
    std::fprintf(stderr, "%sprepare [%s] %.1f / %.1f MB %3.0f%% %.1f MB/s%s", tty_ ? "\r" : "", bar.c_str(),
                 static_cast<double>(done) / 1e6, static_cast<double>(total_) / 1e6, 100.0 * fraction,
                 static_cast<double>(done) / 1e6 / seconds, (final || !tty_) ? "\n" : "");
    std::fflush(stderr);
  }

 private:
  bool enabled_;
  uint64_t total_;
  bool tty_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_draw_{};
};

bool hidden(const fs::path& path) {
  const std::string name = path.filename().string();
  return name.size() > 1 && name[0] == '.' && name != "..";
}

std::string excluded_by(const fs::path& path, const std::vector<std::string>& patterns) {
  for (const std::string& pattern : patterns)
    if (::fnmatch(pattern.c_str(), path.filename().c_str(), 0) == 0 || ::fnmatch(pattern.c_str(), path.c_str(), 0) == 0)
      return pattern;
  return {};
}

std::vector<fs::path> collect_candidates(const std::vector<fs::path>& inputs) {
  std::vector<fs::path> files;
  for (const fs::path& input : inputs) {
    std::error_code ec;
    const fs::file_status status = fs::status(input, ec);
    if (ec || !fs::exists(status))
      fail<IOError>("data prepare: input {} does not exist{}", input.string(), ec ? ": " + ec.message() : "");
    if (fs::is_directory(status)) {
      fs::recursive_directory_iterator it(input, ec), end;
      if (ec) fail<IOError>("data prepare: cannot read directory {}: {}", input.string(), ec.message());
      for (; it != end; it.increment(ec)) {
        if (ec) fail<IOError>("data prepare: cannot walk {}: {}", input.string(), ec.message());
        if (hidden(it->path())) {
          if (it->is_directory(ec)) it.disable_recursion_pending();
          continue;
        }
        if (it->is_regular_file(ec)) files.push_back(it->path());
      }
      if (ec) fail<IOError>("data prepare: cannot walk {}: {}", input.string(), ec.message());
    } else if (fs::is_regular_file(status)) {
      files.push_back(input);
    } else {
      fail<IOError>("data prepare: input {} is neither a regular file nor a directory", input.string());
    }
  }
  std::sort(files.begin(), files.end());
  files.erase(std::unique(files.begin(), files.end()), files.end());
  return files;
}

std::string read_whole(const fs::path& path) {
  fileio::File file(path, O_RDONLY);
  std::string bytes(file.size(), '\0');
  bytes.resize(file.read_at(0, bytes.data(), bytes.size()));
  return bytes;
}

// One file after reading and encoding: its tokens with the separator, or why it was skipped.
struct Document {
  std::vector<int32_t> ids;
  uint64_t text_bytes = 0;  // encoded, the newline the separator added included
  std::string skip_reason;
  std::exception_ptr error;
};

Document encode_document(const fs::path& path, const Tokenizer& tokenizer, Separator separator, int threads) {
  Document doc;
  std::string text = read_whole(path);
  const size_t probe = std::min(text.size(), kBinaryProbeBytes);
  if (const size_t nul = text.find('\0'); nul < probe) {
    doc.skip_reason = fmt::format("binary (NUL byte at offset {})", nul);
    return doc;
  }
  if (text.empty()) {
    doc.skip_reason = "empty";
    return doc;
  }
  if (separator == Separator::kNewline && text.back() != '\n') text.push_back('\n');
  doc.text_bytes = text.size();
  doc.ids = threads > 1 ? tokenizer.encode_parallel(text, threads) : tokenizer.encode(text);
  if (separator == Separator::kEos) doc.ids.push_back(*tokenizer.eos_id());
  return doc;
}

// Calls fn(i) for i in [0, n) on up to `threads` lanes of the process's thread pool
// (persistent workers: the tokenizers' per-thread caches stay warm across batches),
// each lane taking the next index; an exception stays with its index (Document::error).
void for_each_index(size_t n, int threads, const std::function<void(size_t)>& fn) {
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) fn(i);
  };
  const int64_t lanes = std::min<int64_t>(threads, static_cast<int64_t>(n));
  parallel_for(lanes, 1, [&](int64_t, int64_t) { work(); });
}

// Where val.bin starts: the document boundary nearest the exact split point when the
// validation split it gives is within a factor 2 of the requested size, else the
// first line start at or after the split point inside its document, else the exact
// token.
uint64_t choose_split(const std::vector<int32_t>& tokens, const std::vector<uint64_t>& doc_starts, uint64_t want_val,
                      int32_t newline, bool* at_document) {
  const uint64_t total = tokens.size(), exact = total - want_val;
  uint64_t best = 0, best_distance = UINT64_MAX;
  for (const uint64_t start : doc_starts) {
    if (start == 0 || start >= total) continue;
    const uint64_t val = total - start;
    if (2 * val < want_val || val > 2 * want_val) continue;
    const uint64_t distance = start > exact ? start - exact : exact - start;
    if (distance < best_distance) best = start, best_distance = distance;
  }
  *at_document = best_distance != UINT64_MAX;
  if (*at_document) return best;
  if (newline >= 0) {
    const auto next_doc = std::upper_bound(doc_starts.begin(), doc_starts.end(), exact);
    const uint64_t limit = next_doc == doc_starts.end() ? total : *next_doc;
    for (uint64_t i = exact; i < limit; ++i)
      if (tokens[i - 1] == newline) return i;
  }
  return exact;
}

}  // namespace

EncodedCorpus encode_corpus(const std::vector<fs::path>& inputs, const Tokenizer& tokenizer,
                            const PrepareOptions& options) {
  if (inputs.empty()) fail<ValueError>("data prepare: no inputs (give text files or directories)");
  if (options.threads < 0)
    fail<ValueError>("data prepare: threads = {} (expected >= 0; 0: all cores)", options.threads);
  const Separator separator = choose_separator(options.separator, tokenizer);
  // Lanes of the thread pool: --threads beyond its size (TESSERA_NUM_THREADS, run.threads) add nothing.
  const int threads =
      std::max(1, std::min(options.threads > 0 ? options.threads : tessera::num_threads(), tessera::num_threads()));

  EncodedCorpus corpus;
  PrepareResult& result = corpus.result;
  std::vector<int32_t>& tokens = corpus.tokens;
  std::vector<uint64_t>& doc_starts = corpus.doc_starts;
  result.separator = separator_name(separator);
  result.threads = threads;
  std::vector<fs::path> files;
  std::vector<uint64_t> sizes;
  std::map<fs::path, fs::path> taken;  // canonical path -> the name it was taken under
  uint64_t total_bytes = 0;
  for (const fs::path& path : collect_candidates(inputs)) {
    if (std::string pattern = excluded_by(path, options.exclude); !pattern.empty()) {
      result.skipped.push_back({path, fmt::format("excluded by '{}'", pattern)});
      continue;
    }
    std::error_code ec;
    const fs::path canonical = fs::canonical(path, ec);
    if (ec) fail<IOError>("data prepare: cannot resolve {}: {}", path.string(), ec.message());
    if (auto it = taken.find(canonical); it != taken.end()) {
      result.skipped.push_back({path, fmt::format("same file as {}", it->second.string())});
      continue;
    }
    taken.emplace(canonical, path);
    files.push_back(path);
    sizes.push_back(fs::file_size(path, ec));
    total_bytes += sizes.back();
  }

  // Batches in path order: a big file alone (encode_parallel), else consecutive small
  // files encoded a file per thread. Documents join the stream in path order, so the
  // tokens do not depend on the thread count.
  const auto start = std::chrono::steady_clock::now();
  ProgressBar progress(options.progress, total_bytes);
  uint64_t done = 0;
  const std::thread::id main_thread = std::this_thread::get_id();  // the one that draws the progress bar
  for (size_t first = 0; first < files.size();) {
    size_t end = first + 1;
    uint64_t batch_bytes = sizes[first];
    const bool big = sizes[first] >= kParallelFileBytes;
    while (!big && end < files.size() && sizes[end] < kParallelFileBytes && batch_bytes + sizes[end] <= kBatchBytes)
      batch_bytes += sizes[end++];
    std::vector<Document> docs(end - first);
    std::atomic<uint64_t> batch_done{0};
    for_each_index(docs.size(), big ? 1 : threads, [&](size_t i) {
      try {
        docs[i] = encode_document(files[first + i], tokenizer, separator, big ? threads : 1);
      } catch (...) {
        docs[i].error = std::current_exception();
      }
      batch_done += sizes[first + i];
      if (std::this_thread::get_id() == main_thread) progress.update(done + batch_done);
    });
    for (size_t i = 0; i < docs.size(); ++i) {
      Document& doc = docs[i];
      if (doc.error) std::rethrow_exception(doc.error);
      const fs::path& path = files[first + i];
      if (!doc.skip_reason.empty()) {
        result.skipped.push_back({path, std::move(doc.skip_reason)});
        continue;
      }
      doc_starts.push_back(tokens.size());
      tokens.insert(tokens.end(), doc.ids.begin(), doc.ids.end());
      std::vector<int32_t>().swap(doc.ids);
      result.files.push_back(path);
      result.bytes_read += doc.text_bytes;
    }
    done += batch_bytes;
    progress.update(done);
    first = end;
  }
  progress.update(done, /*final=*/true);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.megabytes_per_second = static_cast<double>(result.bytes_read) / 1e6 / std::max(result.seconds, 1e-9);
  if (tokens.empty())
    fail<ValueError>("data prepare: no text in the inputs ({} files considered, {} skipped)", files.size(),
                     result.skipped.size());
  return corpus;
}

PrepareResult prepare_dataset(const std::vector<fs::path>& inputs, const fs::path& out_dir,
                              const PrepareOptions& options) {
  if (!(options.val_fraction >= 0.0 && options.val_fraction < 1.0))
    fail<ValueError>("data prepare: val_fraction {} out of range (expected 0 <= f < 1)", options.val_fraction);
  const std::unique_ptr<Tokenizer> tokenizer = make_tokenizer(options.tokenizer);
  EncodedCorpus corpus = encode_corpus(inputs, *tokenizer, options);
  PrepareResult& result = corpus.result;
  std::vector<int32_t>& tokens = corpus.tokens;
  const int32_t newline = newline_id(*tokenizer);

  uint64_t want_val = 0;
  if (options.val_fraction > 0) {
    if (tokens.size() < 2)
      fail<ValueError>("data prepare: {} token is too few to split into train and val (val_fraction {})", tokens.size(),
                       options.val_fraction);
    want_val = static_cast<uint64_t>(std::llround(options.val_fraction * static_cast<double>(tokens.size())));
    want_val = std::clamp<uint64_t>(want_val, 1, tokens.size() - 1);
  }
  const uint64_t split = want_val == 0
                             ? tokens.size()
                             : choose_split(tokens, corpus.doc_starts, want_val, newline, &result.split_at_document);
  result.train_tokens = split;
  result.val_tokens = tokens.size() - split;

  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) fail<IOError>("data prepare: cannot create output directory {}: {}", out_dir.string(), ec.message());
  const std::vector<int32_t> val(tokens.begin() + static_cast<ptrdiff_t>(split), tokens.end());
  tokens.resize(split);
  write_token_file(out_dir / "train.bin", tokens, tokenizer->id(), tokenizer->vocab_size());
  write_token_file(out_dir / "val.bin", val, tokenizer->id(), tokenizer->vocab_size());

  nlohmann::json meta = {{"format", "tessera-dataset"},
                         {"version", 1},
                         {"tokenizer", tokenizer->id()},
                         {"tokenizer_spec", tokenizer->spec()},
                         {"vocab_size", tokenizer->vocab_size()},
                         {"separator", result.separator},
                         {"train", {{"file", "train.bin"}, {"tokens", result.train_tokens}}},
                         {"val", {{"file", "val.bin"}, {"tokens", result.val_tokens}}},
                         {"val_fraction", options.val_fraction},
                         {"split_at_document", result.split_at_document},
                         {"bytes_read", result.bytes_read}};
  if (result.separator == "eos") meta["eos_id"] = *tokenizer->eos_id();
  meta["files"] = nlohmann::json::array();
  for (const fs::path& path : result.files) meta["files"].push_back(path.string());
  meta["skipped"] = nlohmann::json::array();
  for (const SkippedFile& s : result.skipped)
    meta["skipped"].push_back({{"path", s.path.string()}, {"reason", s.reason}});
  fileio::write_file_atomic(out_dir / "meta.json", meta.dump(2) + "\n");
  return std::move(corpus.result);
}

}  // namespace tessera::data
