#include "tessera/data/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <iterator>

#include "tessera/base/error.h"
#include "tessera/data/bpe_tokenizer.h"
#include "tessera/data/sentencepiece_tokenizer.h"

namespace tessera::data {

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text(ids.size(), '\0');
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= 256)
      fail<ValueError>("ByteTokenizer::decode: id {} at position {} is outside the vocabulary [0, 256)", ids[i], i);
    text[i] = static_cast<char>(static_cast<unsigned char>(ids[i]));
  }
  return text;
}

namespace {

namespace fs = std::filesystem;

constexpr const char* kSpecHelp =
    "expected 'byte', 'gpt2:PATH', 'hf:PATH', 'spm:PATH', or the path of tokenizer files (tokenizer.json, "
    "vocab.json + merges.txt, encoder.json + vocab.bpe, a SentencePiece .model)";

// The kind of tokenizer files at `path` ("gpt2", "hf", "spm"), or "" when none fits.
// Whether a tokenizer.json is byte-level (the kind load_tokenizer_json reads): a
// SentencePiece model converted to tokenizer.json (Llama 2, Mistral) uses Metaspace and
// byte fallback instead, and ships its tokenizer.model beside it.
bool is_byte_level_json(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return text.find("\"ByteLevel\"") != std::string::npos;
}

std::string guess_kind(const fs::path& path) {
  if (fs::is_directory(path)) {
    if (fs::exists(path / "tokenizer.json") && fs::exists(path / "tokenizer.model") &&
        !is_byte_level_json(path / "tokenizer.json"))
      return "spm";
    if (fs::exists(path / "tokenizer.json")) return "hf";
    if ((fs::exists(path / "vocab.json") && fs::exists(path / "merges.txt")) ||
        (fs::exists(path / "encoder.json") && fs::exists(path / "vocab.bpe")))
      return "gpt2";
    if (fs::exists(path / "tokenizer.model")) return "spm";
    return "";
  }
  const std::string name = path.filename().string();
  if (name == "vocab.json" || name == "encoder.json") return "gpt2";
  if (path.extension() == ".json") return "hf";
  if (path.extension() == ".model") return "spm";
  return "";
}

}  // namespace

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& spec) {
  if (spec == "byte") return std::make_unique<ByteTokenizer>();
  std::string kind;
  fs::path path;
  if (const size_t colon = spec.find(':'); colon != std::string::npos && colon > 1) {
    kind = spec.substr(0, colon);
    path = spec.substr(colon + 1);
    if (kind != "gpt2" && kind != "hf" && kind != "spm")
      fail<ValueError>("tokenizer '{}': unknown kind '{}' ({})", spec, kind, kSpecHelp);
  } else {
    path = spec;
  }
  if (path.empty()) fail<ValueError>("tokenizer '{}': no path ({})", spec, kSpecHelp);
  if (!fs::exists(path)) fail<IOError>("tokenizer '{}': {} does not exist ({})", spec, path.string(), kSpecHelp);
  path = fs::absolute(path).lexically_normal();
  if (kind.empty()) {
    kind = guess_kind(path);
    if (kind.empty())
      fail<ValueError>("tokenizer '{}': cannot tell what tokenizer {} holds ({})", spec, path.string(), kSpecHelp);
  }
  if (kind == "gpt2") return load_gpt2_bpe(path);
  if (kind == "hf") return load_tokenizer_json(fs::is_directory(path) ? path / "tokenizer.json" : path);
  return load_sentencepiece(fs::is_directory(path) ? path / "tokenizer.model" : path);
}

}  // namespace tessera::data
