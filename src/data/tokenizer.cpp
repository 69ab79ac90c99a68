#include "tessera/data/tokenizer.h"

#include "tessera/base/error.h"

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

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& id) {
  if (id == "byte") return std::make_unique<ByteTokenizer>();
  fail<ValueError>("unknown tokenizer '{}' (known: byte)", id);
}

}  // namespace tessera::data
