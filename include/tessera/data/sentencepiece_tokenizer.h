// SentencePiece models (Llama 2, T5, ...) through Debian's libsentencepiece.
#pragma once

#include <filesystem>
#include <memory>

#include "tessera/data/tokenizer.h"

namespace tessera::data {

// A SentencePiece .model file. Encoding never adds BOS/EOS (data prepare adds EOS
// between documents); ids and pieces are the library's. A file that is not a model is
// an IOError naming it.
std::unique_ptr<Tokenizer> load_sentencepiece(const std::filesystem::path& path);

}  // namespace tessera::data
