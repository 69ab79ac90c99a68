#include "tessera/data/source.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "tessera/base/error.h"
#include "tessera/data/prepare.h"

namespace fs = std::filesystem;

namespace tessera::data {
namespace {

bool is_token_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[8] = {};
  in.read(magic, sizeof magic);
  return in.gcount() == 8 && std::memcmp(magic, "TSRTOKS\0", 8) == 0;
}

bool hidden(const fs::path& path) {
  const std::string name = path.filename().string();
  return name.size() > 1 && name[0] == '.';
}

// Every *.bin under `dir` (hidden entries skipped), sorted by path.
std::vector<fs::path> token_shards_under(const fs::path& dir) {
  std::vector<fs::path> shards;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    if (hidden(it->path())) {
      if (it->is_directory(ec)) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file(ec) && it->path().extension() == ".bin") shards.push_back(it->path());
  }
  if (ec) fail<IOError>("cannot walk {}: {}", dir.string(), ec.message());
  std::sort(shards.begin(), shards.end());
  return shards;
}

std::string resolve_kind(const SourceSpec& spec, const std::string& where) {
  if (spec.kind == "tokens" || spec.kind == "text") return spec.kind;
  if (spec.kind != "auto")
    fail<ConfigError>("{}: kind '{}' is unknown (expected auto, tokens or text)", where, spec.kind);
  std::error_code ec;
  if (fs::is_directory(spec.path, ec)) return token_shards_under(spec.path).empty() ? "text" : "tokens";
  return is_token_file(spec.path) ? "tokens" : "text";
}

std::optional<int32_t> resolve_separator(const SourceSpec& spec, const Tokenizer& tokenizer, const std::string& where) {
  if (spec.documents == "auto") return tokenizer.eos_id();
  if (spec.documents == "none") return std::nullopt;
  if (spec.documents == "eos") {
    if (!tokenizer.eos_id())
      fail<ConfigError>(
          "{}: documents = \"eos\", but tokenizer '{}' has no end-of-text id (use \"none\" or a token id)", where,
          tokenizer.id());
    return tokenizer.eos_id();
  }
  int32_t id = -1;
  const char* first = spec.documents.data();
  const char* last = first + spec.documents.size();
  const auto [ptr, error] = std::from_chars(first, last, id);
  if (error != std::errc() || ptr != last || id < 0)
    fail<ConfigError>("{}: documents = \"{}\" is unknown (expected auto, eos, none or a token id)", where,
                      spec.documents);
  return id;
}

}  // namespace

Source::Source(const SourceSpec& spec, const Tokenizer& tokenizer, int64_t seq, int64_t vocab) : seq_(seq) {
  name_ = spec.name;
  if (name_.empty()) {
    const fs::path p = fs::path(spec.path).lexically_normal();
    name_ = (p.has_filename() ? p : p.parent_path()).filename().string();
    if (fs::path(name_).extension() == ".bin") name_ = fs::path(name_).stem().string();
  }
  const std::string where = fmt::format("data source '{}' ({})", name_, spec.path);
  if (seq <= 0) fail<ValueError>("{}: seq {} must be positive", where, seq);
  std::error_code ec;
  if (spec.path.empty()) fail<ConfigError>("data source '{}': no path", name_);
  if (!fs::exists(spec.path, ec)) fail<IOError>("{}: the path does not exist", where);
  kind_ = resolve_kind(spec, where);
  if (kind_ == "tokens") {
    separator_ = resolve_separator(spec, tokenizer, where);
    open_token_shards(spec, tokenizer, vocab > 0 ? vocab : tokenizer.vocab_size());
  } else {
    if (spec.documents != "auto")
      fail<ConfigError>("{}: documents = \"{}\" applies to token files; a text source's documents are its files", where,
                        spec.documents);
    open_text(spec, tokenizer);
  }
  for (Shard& shard : shards_) {
    shard.rows = shard.size == 0 ? 0 : (shard.size - 1) / static_cast<uint64_t>(seq);
    rows_ += shard.rows;
    tokens_ += shard.size;
  }
  if (tokens_ == 0) fail<ValueError>("{}: the source is empty (no tokens in {} shard(s))", where, shards_.size());
  if (rows_ == 0)
    fail<ValueError>("{}: {} tokens, too few for one row of {} tokens (seq {} + 1) in any shard", where, tokens_,
                     seq + 1, seq);
}

void Source::open_token_shards(const SourceSpec& spec, const Tokenizer& tokenizer, int64_t vocab) {
  const std::string where = fmt::format("data source '{}' ({})", name_, spec.path);
  std::vector<fs::path> paths;
  std::error_code ec;
  if (fs::is_directory(spec.path, ec)) {
    paths = token_shards_under(spec.path);
    if (paths.empty()) fail<ValueError>("{}: the directory holds no token files (*.bin)", where);
  } else {
    paths.push_back(spec.path);
  }
  for (const fs::path& path : paths) {
    Shard shard;
    shard.name = path.string();
    try {
      shard.file = std::make_shared<const TokenFile>(path);
      shard.file->check_vocabulary(vocab);
    } catch (const IOError& e) {
      fail<IOError>("{}: {}", where, e.what());
    } catch (const ValueError& e) {
      fail<ValueError>("{}: {}", where, e.what());
    }
    if (shard.file->header().tokenizer != tokenizer.id())
      fail<ConfigError>("{}: shard {} was made with tokenizer '{}', but the run's tokenizer is '{}'", where, shard.name,
                        shard.file->header().tokenizer, tokenizer.id());
    shard.size = shard.file->size();
    shards_.push_back(std::move(shard));
  }
}

void Source::open_text(const SourceSpec& spec, const Tokenizer& tokenizer) {
  PrepareOptions options;
  options.separator = "auto";
  options.progress = false;
  EncodedCorpus corpus;
  try {
    corpus = encode_corpus({spec.path}, tokenizer, options);
  } catch (const Error& e) {
    fail<ValueError>("data source '{}' ({}): {}", name_, spec.path, e.what());
  }
  Shard shard;
  shard.name = spec.path;
  shard.size = corpus.tokens.size();
  shard.tokens = std::move(corpus.tokens);
  shard.doc_starts = std::move(corpus.doc_starts);
  shards_.push_back(std::move(shard));
}

uint64_t Source::documents() const {
  if (documents_) return *documents_;
  uint64_t count = 0;
  std::vector<int32_t> chunk;
  for (const Shard& shard : shards_) {
    if (!shard.file) {
      count += shard.doc_starts.size();
      continue;
    }
    if (!separator_) {
      count += shard.size > 0;
      continue;
    }
    // A document ends after every separator; a shard's unterminated tail is one more.
    constexpr uint64_t kChunk = uint64_t{1} << 20;
    int32_t last = *separator_;
    for (uint64_t start = 0; start < shard.size; start += kChunk) {
      const uint64_t n = std::min(kChunk, shard.size - start);
      chunk.resize(n);
      shard.file->read(start, n, chunk.data());
      count += static_cast<uint64_t>(std::count(chunk.begin(), chunk.end(), *separator_));
      last = chunk.back();
    }
    count += shard.size > 0 && last != *separator_;
  }
  documents_ = count;
  return count;
}

void Source::read_row(uint32_t shard_index, uint64_t row, int32_t* window, uint8_t* starts) const {
  const Shard& shard = shards_.at(shard_index);
  if (row >= shard.rows)
    fail<ValueError>("data source '{}': row {} out of range ({} rows in shard {})", name_, row, shard.rows, shard.name);
  const uint64_t n = static_cast<uint64_t>(seq_) + 1, start = row * static_cast<uint64_t>(seq_);
  if (shard.file) {
    shard.file->read(start, n, window);
  } else {
    std::copy_n(shard.tokens.begin() + static_cast<ptrdiff_t>(start), n, window);
  }
  starts[0] = 1;  // a row starts a segment: a document cut by the row boundary continues as a new one
  if (shard.file) {
    for (uint64_t i = 1; i < n; ++i) starts[i] = separator_ && window[i - 1] == *separator_;
  } else {
    std::fill(starts + 1, starts + n, uint8_t{0});
    auto it = std::upper_bound(shard.doc_starts.begin(), shard.doc_starts.end(), start);
    for (; it != shard.doc_starts.end() && *it < start + n; ++it) starts[*it - start] = 1;
  }
}

}  // namespace tessera::data
