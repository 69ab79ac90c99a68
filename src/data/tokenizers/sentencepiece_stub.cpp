// Placeholder until the SentencePiece tokenizer lands (replaced by its implementation).
#include "tessera/base/error.h"
#include "tessera/data/sentencepiece_tokenizer.h"

namespace tessera::data {

std::unique_ptr<Tokenizer> load_sentencepiece(const std::filesystem::path& path) {
  fail<ValueError>("load_sentencepiece({}): not implemented yet", path.string());
}

}  // namespace tessera::data
