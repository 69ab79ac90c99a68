#include "bpe_model.h"

#include <xxhash.h>

#include <atomic>
#include <cstring>
#include <limits>
#include <mutex>
#include <queue>

#include "byte_level.h"
#include "tessera/base/error.h"

namespace tessera::data::bpe {

size_t BytesHash::operator()(std::string_view bytes) const { return XXH3_64bits(bytes.data(), bytes.size()); }

// Piece -> ids, sharded by hash so that threads rarely wait on the same lock. A shard
// that grows past its cap is cleared (a text with millions of distinct pieces stays bounded).
class PieceCache {
 public:
  bool find(std::string_view piece, size_t hash, std::vector<int32_t>& out) {
    Shard& shard = shards_[hash % kShards];
    std::lock_guard lock(shard.mutex);
    const auto it = shard.map.find(piece);
    if (it == shard.map.end()) return false;
    out.insert(out.end(), it->second.begin(), it->second.end());
    return true;
  }
  void insert(std::string_view piece, size_t hash, const int32_t* ids, size_t count) {
    Shard& shard = shards_[hash % kShards];
    std::lock_guard lock(shard.mutex);
    if (shard.map.size() >= kShardCap) shard.map.clear();
    shard.map.try_emplace(std::string(piece), ids, ids + count);
  }

 private:
  static constexpr size_t kShards = 64;
  static constexpr size_t kShardCap = 16384;
  struct Shard {
    std::mutex mutex;
    std::unordered_map<std::string, std::vector<int32_t>, BytesHash, std::equal_to<>> map;
  };
  std::array<Shard, kShards> shards_;
};

namespace {

// The per-thread cache in front of the shared one: direct-mapped, one 64-byte entry (a
// cache line) per slot holding a short piece and its ids, so a hit costs the hash and
// one line, with no lock. Most pieces (a word with its leading space) fit. A collision
// overwrites the slot; the table belongs to one BpeModel at a time (by serial number,
// so a new model at a freed model's address never sees stale entries).
struct FrontEntry {
  uint64_t hash = 0;
  uint8_t size = 0;  // 0: empty (pieces of one byte never reach the cache)
  uint8_t count = 0;
  char bytes[22] = {};
  int32_t ids[8] = {};
};
static_assert(sizeof(FrontEntry) == 64);
constexpr size_t kFrontSlots = size_t{1} << 16;  // 4 MiB per thread

struct FrontCache {
  uint64_t owner = 0;
  std::vector<FrontEntry> entries;
  FrontEntry& slot(uint64_t model_serial, size_t hash) {
    if (owner != model_serial) {
      entries.assign(kFrontSlots, FrontEntry{});
      owner = model_serial;
    }
    return entries[hash & (kFrontSlots - 1)];
  }
};
thread_local FrontCache front_cache;
std::atomic<uint64_t> next_model_serial{1};

bool front_hit(const FrontEntry& e, std::string_view piece, size_t hash) {
  return e.hash == hash && e.size == piece.size() && std::memcmp(e.bytes, piece.data(), piece.size()) == 0;
}

void front_fill(FrontEntry& e, std::string_view piece, size_t hash, const int32_t* ids, size_t count) {
  if (count > std::size(e.ids)) return;
  e.hash = hash;
  e.size = static_cast<uint8_t>(piece.size());
  e.count = static_cast<uint8_t>(count);
  std::memcpy(e.bytes, piece.data(), piece.size());
  std::memcpy(e.ids, ids, count * sizeof(int32_t));
}

uint64_t merge_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

size_t slot_of(uint64_t key, size_t mask) { return static_cast<size_t>(XXH3_64bits(&key, sizeof key)) & mask; }

constexpr int32_t kNoMerge = std::numeric_limits<int32_t>::max();
constexpr size_t kLongPiece = 96;   // longer pieces merge with a heap (n log n)
constexpr size_t kMaxCached = 256;  // longer pieces are not cached

}  // namespace

BpeModel::BpeModel(const std::vector<std::pair<std::string, int64_t>>& vocab,
                   const std::function<std::string(const std::string&)>& vocab_where,
                   const std::vector<std::pair<std::string, std::string>>& merges,
                   const std::function<std::string(size_t)>& merge_where, bool ignore_merges)
    : ignore_merges_(ignore_merges), serial_(next_model_serial++), cache_(std::make_unique<PieceCache>()) {
  std::unordered_map<std::string, int32_t> text_to_id;
  std::vector<const std::string*> id_text;
  for (const auto& [text, id] : vocab) {
    if (id < 0 || id >= std::numeric_limits<int32_t>::max())
      fail<IOError>("{}: id {} is outside [0, 2^31 - 1)", vocab_where(text), id);
    if (!ids_are_dense_enough(id, static_cast<int64_t>(vocab.size())))
      fail<IOError>(
          "{}: id {} is far past the {} tokens of the vocabulary (ids must be dense: at most 2 x tokens + {})",
          vocab_where(text), id, vocab.size(), kIdSlack);
    const auto index = static_cast<size_t>(id);
    if (index >= id_text.size()) id_text.resize(index + 1, nullptr);
    if (id_text[index] != nullptr)
      fail<IOError>("{}: id {} is also the id of '{}' (each id must name one token)", vocab_where(text), id,
                    *id_text[index]);
    id_text[index] = &text;
    text_to_id.emplace(text, static_cast<int32_t>(id));
  }
  id_bytes_.resize(id_text.size());
  has_id_.resize(id_text.size(), false);
  for (size_t id = 0; id < id_text.size(); ++id) {
    if (id_text[id] == nullptr) continue;
    has_id_[id] = true;
    // A token outside the byte-level alphabet decodes to its own UTF-8 text (as HF's
    // ByteLevel decoder does); BPE never produces it.
    if (std::optional<std::string> bytes = byte_level_decode(*id_text[id])) {
      id_bytes_[id] = *bytes;
      bytes_to_id_.emplace(*bytes, static_cast<int32_t>(id));
    } else {
      id_bytes_[id] = *id_text[id];
    }
  }
  for (int b = 0; b < 256; ++b) {
    const std::string token = byte_level_encode(std::string(1, static_cast<char>(b)));
    const auto it = text_to_id.find(token);
    if (it == text_to_id.end())
      fail<IOError>("{}: the vocabulary has no token '{}' for byte 0x{:02x} (a byte-level BPE needs all 256)",
                    vocab_where(token), token, b);
    byte_id_[static_cast<size_t>(b)] = it->second;
  }
  size_t size = 16;
  while (size < merges.size() * 2) size *= 2;
  merge_table_.resize(size);
  merge_ids_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    // Named references, not a structured binding: clang before 16 cannot capture those.
    const std::string& left = merges[rank].first;
    const std::string& right = merges[rank].second;
    auto id_of = [&](const std::string& text) {
      const auto it = text_to_id.find(text);
      if (it == text_to_id.end())
        fail<IOError>("{}: merge '{} {}': '{}' is not in the vocabulary", merge_where(rank), left, right, text);
      return it->second;
    };
    const int32_t l = id_of(left), r = id_of(right), result = id_of(left + right);
    merge_ids_.emplace_back(l, r);
    const uint64_t key = merge_key(l, r);
    size_t slot = slot_of(key, size - 1);
    while (merge_table_[slot].key != ~uint64_t{0} && merge_table_[slot].key != key) slot = (slot + 1) & (size - 1);
    if (merge_table_[slot].key == key) continue;  // a repeated merge keeps its first (lowest) rank
    merge_table_[slot] = {key, static_cast<int32_t>(rank), result};
  }
}

BpeModel::~BpeModel() = default;

int32_t BpeModel::find(std::string_view bytes) const {
  const auto it = bytes_to_id_.find(bytes);
  return it == bytes_to_id_.end() ? -1 : it->second;
}

const BpeModel::MergeSlot* BpeModel::merge_of(int32_t left, int32_t right) const {
  const uint64_t key = merge_key(left, right);
  const size_t mask = merge_table_.size() - 1;
  for (size_t slot = slot_of(key, mask);; slot = (slot + 1) & mask) {
    const MergeSlot& s = merge_table_[slot];
    if (s.key == key) return &s;
    if (s.key == ~uint64_t{0}) return nullptr;
  }
}

// Quadratic in the worst case but with one hash lookup per pair created: the ranks of
// adjacent pairs sit in an array, and a merge updates only its two neighbours' ranks.
void BpeModel::merge_short(std::vector<int32_t>& ids) const {
  auto rank_of = [&](size_t k) {
    const MergeSlot* m = merge_of(ids[k], ids[k + 1]);
    return m ? m->rank : kNoMerge;
  };
  std::vector<int32_t> ranks(ids.size() - 1);
  for (size_t k = 0; k + 1 < ids.size(); ++k) ranks[k] = rank_of(k);
  while (!ranks.empty()) {
    size_t best = 0;
    for (size_t k = 1; k < ranks.size(); ++k)
      if (ranks[k] < ranks[best]) best = k;
    if (ranks[best] == kNoMerge) break;
    ids[best] = merge_of(ids[best], ids[best + 1])->result;
    ids.erase(ids.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    ranks.erase(ranks.begin() + static_cast<std::ptrdiff_t>(best));
    if (best < ranks.size()) ranks[best] = rank_of(best);
    if (best > 0) ranks[best - 1] = rank_of(best - 1);
  }
}

// O(n log n) for long pieces (digit, space or emoji runs): a min-heap of candidate
// merges (rank, position) over a linked list of symbols. A popped candidate whose
// symbols changed since it was pushed is stale and skipped: a symbol's id changes only
// by growing, so comparing both ids detects that.
void BpeModel::merge_long(std::vector<int32_t>& ids) const {
  const auto n = static_cast<int32_t>(ids.size());
  std::vector<int32_t> next(static_cast<size_t>(n)), prev(static_cast<size_t>(n));
  for (int32_t k = 0; k < n; ++k) next[static_cast<size_t>(k)] = k + 1, prev[static_cast<size_t>(k)] = k - 1;
  struct Candidate {
    int32_t rank, pos, left, right;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push = [&](int32_t pos) {
    if (pos < 0) return;
    const int32_t after = next[static_cast<size_t>(pos)];
    if (after >= n) return;
    if (const MergeSlot* m = merge_of(ids[static_cast<size_t>(pos)], ids[static_cast<size_t>(after)]))
      heap.push({m->rank, pos, ids[static_cast<size_t>(pos)], ids[static_cast<size_t>(after)]});
  };
  std::vector<bool> alive(static_cast<size_t>(n), true);
  for (int32_t k = 0; k + 1 < n; ++k) push(k);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const auto pos = static_cast<size_t>(c.pos);
    const int32_t after = next[pos];
    if (!alive[pos] || after >= n || ids[pos] != c.left || ids[static_cast<size_t>(after)] != c.right) continue;
    ids[pos] = merge_of(c.left, c.right)->result;
    alive[static_cast<size_t>(after)] = false;
    next[pos] = next[static_cast<size_t>(after)];
    if (next[pos] < n) prev[static_cast<size_t>(next[pos])] = c.pos;
    push(prev[pos]);
    push(c.pos);
  }
  size_t out = 0;
  for (int32_t k = 0; k < n; k = next[static_cast<size_t>(k)]) ids[out++] = ids[static_cast<size_t>(k)];
  ids.resize(out);
}

void BpeModel::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() == 1) {
    out.push_back(byte_id_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  const bool cached = piece.size() <= kMaxCached;
  const size_t hash = cached ? BytesHash{}(piece) : 0;
  FrontEntry* front = nullptr;
  if (piece.size() <= sizeof(FrontEntry::bytes)) {
    front = &front_cache.slot(serial_, hash);
    if (front_hit(*front, piece, hash)) {
      out.insert(out.end(), front->ids, front->ids + front->count);
      return;
    }
  }
  const size_t start = out.size();
  auto remember = [&] {
    if (front != nullptr) front_fill(*front, piece, hash, out.data() + start, out.size() - start);
  };
  if (ignore_merges_) {
    if (const int32_t id = find(piece); id >= 0) {
      out.push_back(id);
      remember();
      return;
    }
  }
  if (cached && cache_->find(piece, hash, out)) {
    remember();
    return;
  }
  std::vector<int32_t> ids(piece.size());
  for (size_t k = 0; k < piece.size(); ++k) ids[k] = byte_id_[static_cast<unsigned char>(piece[k])];
  if (piece.size() > kLongPiece)
    merge_long(ids);
  else
    merge_short(ids);
  if (cached) cache_->insert(piece, hash, ids.data(), ids.size());
  out.insert(out.end(), ids.begin(), ids.end());
  remember();
}

}  // namespace tessera::data::bpe
