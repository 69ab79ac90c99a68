// Tokenizers turn text into token ids and back. The interface is what the data
// pipeline, the sampler and checkpoints (by id()) depend on; the byte-level tokenizer
// is the default, GPT-2 BPE and SentencePiece arrive with the Interop issue.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Stable identifier stored in token files and checkpoints ("byte").
  virtual std::string id() const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // Ids outside [0, vocab_size) are a ValueError naming the id and its position.
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
};

// Each byte of UTF-8 text is one token (vocab 256); decoding is exact.
class ByteTokenizer final : public Tokenizer {
 public:
  std::string id() const override { return "byte"; }
  int64_t vocab_size() const override { return 256; }
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
};

// The tokenizer with this id; unknown ids are a ValueError listing the known ones.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& id);

}  // namespace tessera::data
