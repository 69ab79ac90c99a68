// Pre-tokenization: the text between added tokens is cut into pieces by a regex (each
// piece is then BPE-encoded on its own). GPT-2's and Llama 3's patterns have hand-coded
// matchers (pattern_matchers.cpp) that give the pieces the regex engines give; any other
// Split regex of a tokenizer.json runs on ICU's regex engine (icu_regex_split.cpp).
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::data::bpe {

// GPT-2 (also what a ByteLevel pre-tokenizer with use_regex=true applies).
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Llama 3 (tokenizer.json's Split regex).
inline constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// tiktoken's cl100k_base: the same pieces as Llama 3's pattern (possessive quantifiers
// cannot change the result there, and \s*[\r\n] ends where \s*[\r\n]+ does).
inline constexpr std::string_view kCl100kPattern =
    R"('(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)";

enum class KnownPattern { kNone, kGpt2, kLlama3 };

// A regex that cuts text into pieces: its matches and the text between them (HF's
// "Isolated" behaviour), in order, none empty, covering the text exactly.
class SplitPattern {
 public:
  virtual ~SplitPattern() = default;
  virtual void split(std::string_view text, std::vector<std::string_view>& pieces) const = 0;
  virtual KnownPattern known() const { return KnownPattern::kNone; }
  virtual const std::string& pattern() const = 0;
};

// The hand-coded matcher when `regex` is one of the known patterns, else ICU's engine
// (an IOError naming `where` when ICU rejects the pattern).
std::shared_ptr<const SplitPattern> make_split_pattern(const std::string& regex, const std::string& where);
std::shared_ptr<const SplitPattern> make_hand_coded_split(KnownPattern which);
std::shared_ptr<const SplitPattern> make_icu_split(const std::string& regex, const std::string& where);

// The end of the piece that the known pattern matches at s[i] (i < n).
size_t match_gpt2(const char* s, size_t n, size_t i);
size_t match_llama3(const char* s, size_t n, size_t i);

// The first position p >= from (0 < p < text.size()) where the text can be cut into
// text[:p] and text[p:] that split into exactly the pieces of the whole text, or npos.
size_t next_safe_cut(KnownPattern which, std::string_view text, size_t from);

// The steps of a tokenizer's pre-tokenizer, in order.
struct PreTokenizerStep {
  bool prefix_space = false;                  // ByteLevel add_prefix_space: " " before each piece not starting with one
  std::shared_ptr<const SplitPattern> split;  // else: cut each piece with this pattern
};

class PreTokenizer {
 public:
  explicit PreTokenizer(std::vector<PreTokenizerStep> steps);

  // The pieces of `text` (a part of the text between added tokens; `segment_start`
  // when it begins that segment). Pieces point into `text` or into strings kept in `arena`.
  void pieces(std::string_view text, bool segment_start, std::deque<std::string>& arena,
              std::vector<std::string_view>& out) const;

  // Whether the text between added tokens can be cut for encode_parallel (the first
  // Split is a known pattern), and where (next_safe_cut of that pattern).
  bool can_cut() const { return cut_pattern_ != KnownPattern::kNone; }
  size_t next_safe_cut(std::string_view text, size_t from) const;

  // A canonical text of the steps, hashed into the tokenizer's id.
  std::string description() const;

 private:
  std::vector<PreTokenizerStep> steps_;
  KnownPattern cut_pattern_ = KnownPattern::kNone;
};

}  // namespace tessera::data::bpe
