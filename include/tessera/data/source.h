// One source of a data pipeline: its shards (token files, or text tokenized when the
// source opens), the rows cut from them and where their documents end.
//
// Rows: shard k of n_k tokens gives floor((n_k - 1) / seq) rows; row r is tokens
// [r * seq, r * seq + seq] of the shard (seq + 1 tokens: inputs are the first seq,
// targets the last seq). Rows never cross shards, so a row's tokens are one read. The
// last (n_k - 1) % seq tokens of a shard are not used (at most seq - 1 per shard).
//
// Documents: a token file's documents end after every separator id (SourceSpec::documents);
// a text source's documents are its files (the tokenizer's end-of-text id after each when
// it has one, as `data prepare` does). A shard boundary always ends a document.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessera/data/pipeline_spec.h"
#include "tessera/data/token_file.h"
#include "tessera/data/tokenizer.h"

namespace tessera::data {

// A row of one source: shard index and row index inside the shard.
struct RowRef {
  uint32_t source = 0;
  uint32_t shard = 0;
  uint64_t row = 0;
  bool operator==(const RowRef&) const = default;
};

class Source {
 public:
  // Opens every shard and checks it: a token file made with another tokenizer, an id
  // outside [0, vocab), a missing path, a directory without shards, a source too short
  // for one row are errors naming the source (and the shard). vocab 0: the tokenizer's.
  Source(const SourceSpec& spec, const Tokenizer& tokenizer, int64_t seq, int64_t vocab);

  const std::string& name() const { return name_; }
  const std::string& kind() const { return kind_; }  // "tokens" or "text"
  size_t shards() const { return shards_.size(); }
  const std::string& shard_name(size_t shard) const { return shards_[shard].name; }
  uint64_t shard_rows(size_t shard) const { return shards_[shard].rows; }
  uint64_t rows() const { return rows_; }      // all shards
  uint64_t tokens() const { return tokens_; }  // all shards
  uint64_t documents() const;                  // documents in all shards (counted once, on first use)
  std::optional<int32_t> separator() const { return separator_; }

  // Row `row` of shard `shard`: seq + 1 tokens into `window`, and into `starts` (seq + 1
  // flags) whether a new document starts at each token.
  void read_row(uint32_t shard, uint64_t row, int32_t* window, uint8_t* starts) const;

 private:
  struct Shard {
    std::string name;
    std::shared_ptr<const TokenFile> file;  // a token shard, or
    std::vector<int32_t> tokens;            // a text shard's ids
    std::vector<uint64_t> doc_starts;       // a text shard's document starts (sorted)
    uint64_t size = 0, rows = 0;
  };
  std::string name_, kind_;
  int64_t seq_;
  std::optional<int32_t> separator_;  // token shards: the id that ends a document
  std::vector<Shard> shards_;
  uint64_t rows_ = 0, tokens_ = 0;
  mutable std::optional<uint64_t> documents_;
  void open_token_shards(const SourceSpec& spec, const Tokenizer& tokenizer, int64_t vocab);
  void open_text(const SourceSpec& spec, const Tokenizer& tokenizer);
};

}  // namespace tessera::data
