// Added (special) tokens such as <|endoftext|>: found in the raw text before
// pre-tokenization, leftmost first and the longest at a position (Hugging Face's
// AddedVocabulary, tiktoken with allowed_special="all"); the text between matches is
// pre-tokenized and BPE-encoded as usual.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::data::bpe {

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool lstrip = false;  // the match also takes the whitespace on its left
  bool rstrip = false;  // ... and on its right
  bool special = true;
};

struct AddedMatch {
  size_t start = 0, end = 0;  // bytes of the text the token replaces (with stripped whitespace)
  int32_t id = 0;
};

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  explicit AddedTokenMatcher(const std::vector<AddedToken>& tokens);

  bool empty() const { return nodes_.size() <= 1; }
  // Every match in `text`, in order, not overlapping.
  void find_all(std::string_view text, std::vector<AddedMatch>& out) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;  // sorted by byte
    int32_t token = -1;                                       // index into tokens_ when a token ends here
  };
  int32_t child(int32_t node, unsigned char byte) const;

  std::vector<Node> nodes_{Node{}};
  std::vector<AddedToken> tokens_;
  std::array<bool, 256> first_byte_{};
};

}  // namespace tessera::data::bpe
