// Placeholder until the BPE tokenizers land (replaced by their implementation).
#include "tessera/base/error.h"
#include "tessera/data/bpe_tokenizer.h"

namespace tessera::data {

std::unique_ptr<Tokenizer> load_gpt2_bpe(const std::filesystem::path& path) {
  fail<ValueError>("load_gpt2_bpe({}): not implemented yet", path.string());
}

std::unique_ptr<Tokenizer> load_tokenizer_json(const std::filesystem::path& path) {
  fail<ValueError>("load_tokenizer_json({}): not implemented yet", path.string());
}

}  // namespace tessera::data
