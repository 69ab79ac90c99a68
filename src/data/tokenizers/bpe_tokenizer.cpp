// encode: added tokens are found in the raw text first; the text between them is
// pre-tokenized and each piece BPE-encoded. The tokenizer.json post_processor (BOS/EOS
// templates) is not applied: encode returns the text's tokens only, and `data prepare`
// puts eos_id() between documents itself.
#include "bpe_tokenizer.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <deque>

#include "tessera/base/error.h"
#include "tessera/base/thread_pool.h"

namespace tessera::data::bpe {

namespace {

class ByteLevelBpeTokenizer final : public Tokenizer {
 public:
  explicit ByteLevelBpeTokenizer(BpeTokenizerParts parts)
      : model_(std::move(parts.model)),
        pre_(std::move(parts.pre_tokenizer)),
        added_(parts.added_tokens),
        matcher_(parts.added_tokens),
        spec_(std::move(parts.spec)) {
    id_bytes_ = model_->id_bytes();
    std::vector<bool> has_id = model_->has_id();
    const auto token_count = static_cast<int64_t>(id_bytes_.size() + added_.size());
    for (const AddedToken& token : added_) {
      if (token.id < 0 || !ids_are_dense_enough(token.id, token_count))
        fail<IOError>("tokenizer {}: added token '{}' has id {}, outside [0, 2 x {} tokens + {}) (ids must be dense)",
                      spec_, token.content, token.id, token_count, kIdSlack);
      const auto id = static_cast<size_t>(token.id);
      if (id >= id_bytes_.size()) id_bytes_.resize(id + 1), has_id.resize(id + 1, false);
      id_bytes_[id] = token.content;  // decodes to its text verbatim, as it was matched
      has_id[id] = true;
    }
    has_id_ = std::move(has_id);
    for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"}) {
      const auto it =
          std::find_if(added_.begin(), added_.end(), [&](const AddedToken& t) { return t.content == name; });
      if (it != added_.end()) {
        eos_ = it->id;
        break;
      }
    }
    id_ = fingerprint();
  }

  std::string id() const override { return id_; }
  std::string spec() const override { return spec_; }
  int64_t vocab_size() const override { return static_cast<int64_t>(id_bytes_.size()); }
  std::optional<int32_t> eos_id() const override { return eos_; }

  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    ids.reserve(text.size() / 3);
    std::vector<AddedMatch> matches;
    matcher_.find_all(text, matches);
    size_t done = 0;
    for (const AddedMatch& m : matches) {
      encode_chunk(text.substr(done, m.start - done), true, ids);
      ids.push_back(m.id);
      done = m.end;
    }
    encode_chunk(text.substr(done), true, ids);
    return ids;
  }

  std::vector<int32_t> encode_parallel(std::string_view text, int threads) const override {
    constexpr size_t kMinChunk = size_t{1} << 16;
    if (threads <= 1 || text.size() < 2 * kMinChunk || !pre_.can_cut()) return encode(text);
    // Work items in text order: chunks of the text between added tokens, cut only where
    // the pre-tokenizer's pieces cannot change (PreTokenizer::next_safe_cut), and the
    // added tokens' ids.
    struct Item {
      std::string_view text;
      bool segment_start = true;
      int32_t added_id = -1;
    };
    const size_t chunk = std::max(kMinChunk, text.size() / (static_cast<size_t>(threads) * 8));
    std::vector<Item> items;
    auto add_segment = [&](std::string_view segment) {
      size_t start = 0;
      while (segment.size() - start > chunk) {
        const size_t cut = pre_.next_safe_cut(segment, start + chunk);
        if (cut == std::string_view::npos) break;
        items.push_back({segment.substr(start, cut - start), start == 0});
        start = cut;
      }
      items.push_back({segment.substr(start), start == 0});
    };
    std::vector<AddedMatch> matches;
    matcher_.find_all(text, matches);
    size_t done = 0;
    for (const AddedMatch& m : matches) {
      add_segment(text.substr(done, m.start - done));
      items.push_back({{}, true, m.id});
      done = m.end;
    }
    add_segment(text.substr(done));

    std::vector<std::vector<int32_t>> results(items.size());
    std::atomic<size_t> next{0};
    auto work = [&] {
      for (size_t i; (i = next.fetch_add(1)) < items.size();) {
        if (items[i].added_id >= 0)
          results[i].push_back(items[i].added_id);
        else
          encode_chunk(items[i].text, items[i].segment_start, results[i]);
      }
    };
    // `threads` lanes on the process's thread pool: its workers persist, so their
    // per-thread piece caches stay warm from one call to the next.
    const int64_t lanes = std::min<int64_t>(threads, static_cast<int64_t>(items.size()));
    parallel_for(lanes, 1, [&](int64_t, int64_t) { work(); });
    size_t total = 0;
    for (const auto& r : results) total += r.size();
    std::vector<int32_t> ids;
    ids.reserve(total);
    for (const auto& r : results) ids.insert(ids.end(), r.begin(), r.end());
    return ids;
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    size_t bytes = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      const int32_t id = ids[i];
      if (id < 0 || static_cast<size_t>(id) >= id_bytes_.size() || !has_id_[static_cast<size_t>(id)])
        fail<ValueError>("BPE tokenizer {}: decode: id {} at position {} is not in the vocabulary (ids in [0, {}))",
                         id_, id, i, id_bytes_.size());
      bytes += id_bytes_[static_cast<size_t>(id)].size();
    }
    std::string text;
    text.reserve(bytes);
    for (const int32_t id : ids) text += id_bytes_[static_cast<size_t>(id)];
    return text;
  }

 private:
  void encode_chunk(std::string_view chunk, bool segment_start, std::vector<int32_t>& ids) const {
    if (chunk.empty()) return;
    std::deque<std::string> arena;
    std::vector<std::string_view> pieces;
    pre_.pieces(chunk, segment_start, arena, pieces);
    for (const std::string_view piece : pieces) model_->encode_piece(piece, ids);
  }

  // "bpe-" + XXH3-64 of what decides the ids: vocabulary, merges, added tokens, pre-tokenizer.
  std::string fingerprint() const {
    XXH3_state_t* state = XXH3_createState();
    XXH3_64bits_reset(state);
    auto put = [&](std::string_view bytes) {
      const uint64_t size = bytes.size();
      XXH3_64bits_update(state, &size, sizeof size);
      XXH3_64bits_update(state, bytes.data(), bytes.size());
    };
    auto put_int = [&](int64_t v) { XXH3_64bits_update(state, &v, sizeof v); };
    put("tessera byte-level bpe v1");
    const auto& model_bytes = model_->id_bytes();
    for (size_t id = 0; id < model_bytes.size(); ++id)
      if (model_->has_id()[id]) put_int(static_cast<int64_t>(id)), put(model_bytes[id]);
    put("merges");
    for (const auto& [l, r] : model_->merge_ids()) put_int(l), put_int(r);
    put_int(model_->ignore_merges());
    put("added");
    for (const AddedToken& t : added_) put_int(t.id), put(t.content), put_int(t.lstrip * 2 + t.rstrip);
    put(pre_.description());
    const uint64_t hash = XXH3_64bits_digest(state);
    XXH3_freeState(state);
    return fmt::format("bpe-{:016x}", hash);
  }

  std::unique_ptr<BpeModel> model_;
  PreTokenizer pre_;
  std::vector<AddedToken> added_;
  AddedTokenMatcher matcher_;
  std::string spec_;
  std::vector<std::string> id_bytes_;
  std::vector<bool> has_id_;
  std::optional<int32_t> eos_;
  std::string id_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_bpe_tokenizer(BpeTokenizerParts parts) {
  return std::make_unique<ByteLevelBpeTokenizer>(std::move(parts));
}

}  // namespace tessera::data::bpe
