// SentencePiece models through Debian's libsentencepiece (0.1.97): the library does the
// normalization, the dummy prefix, BPE/unigram segmentation and byte fallback; this
// file loads the model, fingerprints it and checks ids before the library sees them.
#include "tessera/data/sentencepiece_tokenizer.h"

#include <fcntl.h>
#include <sentencepiece_processor.h>
#include <xxhash.h>

#include "tessera/base/error.h"
#include "tessera/base/file_io.h"

namespace tessera::data {
namespace {

namespace fs = std::filesystem;

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(const fs::path& path, std::string model_bytes) : path_(fs::absolute(path).lexically_normal()) {
    const sentencepiece::util::Status status = processor_.LoadFromSerializedProto(model_bytes);
    if (!status.ok())
      fail<IOError>("SentencePiece model {}: not a model the library can load ({})", path_.string(), status.ToString());
    vocab_size_ = processor_.GetPieceSize();
    if (vocab_size_ <= 0) fail<IOError>("SentencePiece model {}: the vocabulary is empty", path_.string());
    id_ = "spm-" + fileio::hex64(XXH3_64bits(model_bytes.data(), model_bytes.size()));
  }

  std::string id() const override { return id_; }
  std::string spec() const override { return "spm:" + path_.string(); }
  int64_t vocab_size() const override { return vocab_size_; }

  std::optional<int32_t> eos_id() const override {
    const int eos = processor_.eos_id();
    if (eos < 0) return std::nullopt;
    return eos;
  }

  // Without BOS/EOS: the processor's default (no extra options set).
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int> ids;
    const sentencepiece::util::Status status = processor_.Encode(text, &ids);
    if (!status.ok())
      fail<ValueError>("SentencePiece {}: cannot encode {} bytes of text ({})", path_.string(), text.size(),
                       status.ToString());
    return {ids.begin(), ids.end()};
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    // The library would abort or skip on ids it does not know: check them first.
    for (size_t i = 0; i < ids.size(); ++i)
      if (ids[i] < 0 || ids[i] >= vocab_size_)
        fail<ValueError>("SentencePiece {}: id {} at position {} is outside the vocabulary [0, {})", path_.string(),
                         ids[i], i, vocab_size_);
    std::string text;
    const sentencepiece::util::Status status = processor_.Decode(std::vector<int>(ids.begin(), ids.end()), &text);
    if (!status.ok())
      fail<ValueError>("SentencePiece {}: cannot decode {} ids ({})", path_.string(), ids.size(), status.ToString());
    return text;
  }

  // encode_parallel stays the inherited encode(text). Splitting is not provably safe:
  // every Encode call adds the dummy prefix ("b" alone becomes "▁b", but after "a\n" in
  // the whole text it stays "b"), and BPE merges are limited only by which pieces the
  // vocabulary holds (whitespace-only and multi-word pieces exist in real models), so no
  // split point gives the same ids for every model. `data prepare` still encodes
  // several documents at once.

 private:
  fs::path path_;
  sentencepiece::SentencePieceProcessor processor_;
  int64_t vocab_size_ = 0;
  std::string id_;
};

std::string read_model_file(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    fail<IOError>("SentencePiece model {}: {}", path.string(),
                  fs::exists(path, ec) ? "not a regular file" : "no such file (expected a .model file)");
  fileio::File file(path, O_RDONLY);
  std::string bytes(file.size(), '\0');
  bytes.resize(file.read_at(0, bytes.data(), bytes.size()));
  return bytes;
}

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece(const fs::path& path) {
  return std::make_unique<SentencePieceTokenizer>(path, read_model_file(path));
}

}  // namespace tessera::data
