// The byte-level BPE tokenizer assembled by the file loaders (gpt2_files.cpp,
// tokenizer_json.cpp): added tokens, a pre-tokenizer, a BPE model.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "added_tokens.h"
#include "bpe_model.h"
#include "pretokenizer.h"
#include "tessera/data/tokenizer.h"

namespace tessera::data::bpe {

struct BpeTokenizerParts {
  std::unique_ptr<BpeModel> model;
  std::vector<PreTokenizerStep> pre_tokenizer;
  std::vector<AddedToken> added_tokens;
  std::string spec;  // "gpt2:/abs/dir" or "hf:/abs/tokenizer.json"
};

std::unique_ptr<Tokenizer> make_bpe_tokenizer(BpeTokenizerParts parts);

}  // namespace tessera::data::bpe
