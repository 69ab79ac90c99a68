// Byte-level BPE tokenizers (GPT-2, GPT-3/4 style, Llama 3): text is split by a
// pre-tokenizer regex, each piece's UTF-8 bytes are mapped to GPT-2's printable
// byte<->unicode alphabet, and merges are applied by rank. Added (special) tokens
// such as <|endoftext|> are matched in the text before pre-tokenization.
#pragma once

#include <filesystem>
#include <memory>

#include "tessera/data/tokenizer.h"

namespace tessera::data {

// GPT-2's files: `path` is a directory holding vocab.json + merges.txt (Hugging Face
// names) or encoder.json + vocab.bpe (OpenAI names), or the vocab/encoder JSON file
// itself (the merges file next to it). GPT-2's pre-tokenizer regex; ids equal
// tiktoken's "gpt2" encoding. <|endoftext|>, when in the vocabulary, is special.
// Malformed files are IOErrors naming the file and the line or key.
std::unique_ptr<Tokenizer> load_gpt2_bpe(const std::filesystem::path& path);

// A Hugging Face tokenizer.json whose model is BPE with a ByteLevel pre-tokenizer
// (GPT-2 style) or a Split(regex) + ByteLevel sequence (Llama 3 style), a ByteLevel
// decoder, and added tokens. Other models or pre-tokenizers are IOErrors naming the
// key and what is supported.
std::unique_ptr<Tokenizer> load_tokenizer_json(const std::filesystem::path& path);

}  // namespace tessera::data
