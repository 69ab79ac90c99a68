// The BPE model: each pre-tokenized piece (raw bytes) starts as one token per byte, and
// the adjacent pair with the lowest merge rank is merged, leftmost first on ties, until
// no pair has a merge (Hugging Face's BPE, and tiktoken when ranks are merge order).
// Results are cached per piece: a lock-free per-thread cache of short pieces in front of
// a sharded cache shared by threads.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tessera::data::bpe {

// Hash of a byte string usable for heterogeneous lookup (string_view keys).
struct BytesHash {
  using is_transparent = void;
  size_t operator()(std::string_view bytes) const;
};
using BytesToId = std::unordered_map<std::string, int32_t, BytesHash, std::equal_to<>>;

// Token ids index tables (id -> bytes), so they must be dense enough that a file cannot
// make a table far larger than itself: the largest id may be at most twice the number of
// tokens plus kIdSlack (real vocabularies are dense, with a few reserved gaps; added
// tokens follow them). A single id of 2^31 - 2 in a two-token file would otherwise ask
// for gigabytes.
inline constexpr int64_t kIdSlack = 65536;
inline bool ids_are_dense_enough(int64_t largest_id, int64_t token_count) {
  return largest_id < 2 * token_count + kIdSlack;
}

class PieceCache;

class BpeModel {
 public:
  // `vocab`: token text (in the byte-level alphabet) and id, `merges`: token text pairs in
  // rank order; `vocab_where(token)` / `merge_where(index)` say where an entry is written
  // ("vocab.json: key 'x'", "merges.txt:12") for IOErrors about bad entries.
  // `ignore_merges`: a piece that is itself a token is that token (Llama 3).
  BpeModel(const std::vector<std::pair<std::string, int64_t>>& vocab,
           const std::function<std::string(const std::string&)>& vocab_where,
           const std::vector<std::pair<std::string, std::string>>& merges,
           const std::function<std::string(size_t)>& merge_where, bool ignore_merges);
  ~BpeModel();
  BpeModel(const BpeModel&) = delete;
  BpeModel& operator=(const BpeModel&) = delete;

  // Appends the ids of one piece.
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;

  // The bytes of each id (index = id); `has_id[id]` false for ids not in the vocabulary.
  const std::vector<std::string>& id_bytes() const { return id_bytes_; }
  const std::vector<bool>& has_id() const { return has_id_; }
  // The id of a token given as raw bytes, or -1.
  int32_t find(std::string_view bytes) const;
  // Merges in rank order (left id, right id), for the tokenizer's fingerprint.
  const std::vector<std::pair<int32_t, int32_t>>& merge_ids() const { return merge_ids_; }
  bool ignore_merges() const { return ignore_merges_; }

 private:
  struct MergeSlot {
    uint64_t key = ~uint64_t{0};  // left << 32 | right; all ones when empty
    int32_t rank = 0;
    int32_t result = 0;
  };
  // The slot of the merge of (left, right), or nullptr.
  const MergeSlot* merge_of(int32_t left, int32_t right) const;
  void merge_short(std::vector<int32_t>& ids) const;
  void merge_long(std::vector<int32_t>& ids) const;

  std::array<int32_t, 256> byte_id_{};
  std::vector<MergeSlot> merge_table_;  // open addressing, power-of-two size
  std::vector<std::pair<int32_t, int32_t>> merge_ids_;
  std::vector<std::string> id_bytes_;
  std::vector<bool> has_id_;
  BytesToId bytes_to_id_;
  bool ignore_merges_ = false;
  uint64_t serial_ = 0;  // names this model to the per-thread front caches
  std::unique_ptr<PieceCache> cache_;
};

}  // namespace tessera::data::bpe
