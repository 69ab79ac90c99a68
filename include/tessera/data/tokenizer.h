// Tokenizers turn text into token ids and back. The interface is what the data
// pipeline, the sampler and checkpoints depend on: token files and checkpoints store
// id() (a content fingerprint) and spec() (how to load it again). The byte-level
// tokenizer is the default; GPT-2 byte-level BPE (vocab.json + merges.txt or
// encoder.json + vocab.bpe), Hugging Face tokenizer.json and SentencePiece models are
// loaded from files (bpe_tokenizer.h, sentencepiece_tokenizer.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Stable identifier stored in token files and checkpoints, at most 32 bytes: "byte",
  // or the kind and a fingerprint of the files' content ("bpe-1f2e3d4c5b6a7988").
  virtual std::string id() const = 0;
  // What make_tokenizer takes to load this tokenizer again ("byte",
  // "gpt2:/abs/dir", "hf:/abs/tokenizer.json", "spm:/abs/tokenizer.model").
  virtual std::string spec() const { return id(); }
  virtual int64_t vocab_size() const = 0;
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // Ids outside [0, vocab_size) are a ValueError naming the id and its position.
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  // The end-of-text token put between documents by `data prepare`, when the
  // tokenizer has one (GPT-2's <|endoftext|>, Llama's </s> or <|end_of_text|>).
  virtual std::optional<int32_t> eos_id() const { return std::nullopt; }
  // encode(text) computed with up to `threads` threads; the ids are identical to
  // encode(text) (tokenizers split only where the result cannot change).
  virtual std::vector<int32_t> encode_parallel(std::string_view text, int threads) const {
    (void)threads;
    return encode(text);
  }
};

// Each byte of UTF-8 text is one token (vocab 256); decoding is exact.
class ByteTokenizer final : public Tokenizer {
 public:
  std::string id() const override { return "byte"; }
  int64_t vocab_size() const override { return 256; }
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
};

// The tokenizer a spec names:
//   "byte"                 ByteTokenizer
//   "gpt2:PATH"            GPT-2 BPE files: a directory with vocab.json + merges.txt (or
//                          encoder.json + vocab.bpe), or the vocab.json file itself
//   "hf:PATH"              a Hugging Face tokenizer.json (or a directory holding one)
//   "spm:PATH"             a SentencePiece .model (or a directory with tokenizer.model)
//   PATH                   the kind guessed from the files: tokenizer.json, vocab.json +
//                          merges.txt, encoder.json + vocab.bpe, *.model / tokenizer.model
//                          (a directory with both tokenizer.json and tokenizer.model
//                          takes the SentencePiece model unless the JSON is byte-level)
// Unknown specs and missing files are ValueErrors/IOErrors saying what was expected.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& spec);

}  // namespace tessera::data
