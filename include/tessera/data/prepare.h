// `tessera data prepare`: text files -> train.bin and val.bin token files in an output
// directory (plus meta.json: tokenizer, vocab, counts, sources).
//
// Each file is one document; documents are concatenated in path order with a separator
// (PrepareOptions::separator): the tokenizer's end-of-text token after every document
// (GPT-2's <|endoftext|>, Llama's </s>) when it has one, else a '\n' added after a
// document that does not end with a newline. Documents are encoded on several threads
// (a big file through Tokenizer::encode_parallel); the output is bitwise the same for
// every thread count. Directory walks skip hidden entries
// (".git", ".cache"). A file is skipped (and listed in PrepareResult::skipped) when its
// name matches an `exclude` glob, when it is empty, when it is binary (a NUL byte in the
// first 8 KiB), or when it resolves to a file already taken (a symlink to it). On
// Debian's /usr/share/games/fortunes that takes the 43 text files once each: the *.dat
// indexes are binary and the *.u8 names are symlinks to the text files.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace tessera::data {

class Tokenizer;

struct PrepareOptions {
  std::string tokenizer = "byte";  // a make_tokenizer spec: "byte", "gpt2:PATH", "hf:PATH", "spm:PATH", PATH
  int threads = 0;                 // encoding threads; 0: tessera::num_threads()
  // Between documents: "eos" (the tokenizer's end-of-text id after every document; a
  // ValueError when it has none), "newline" ('\n' appended to a document that does not
  // end with one), "none" (documents back to back), "auto" (eos when the tokenizer has
  // one, else newline).
  std::string separator = "auto";
  double val_fraction = 0.05;        // the last fraction of the token stream (whole documents where possible)
  bool progress = true;              // a progress bar on stderr
  std::vector<std::string> exclude;  // fnmatch globs, matched against the file name and the whole path
};

struct SkippedFile {
  std::filesystem::path path;
  std::string reason;  // "binary (NUL byte at offset 12)", "empty", "excluded by '*.dat'", "same file as ..."
};

struct PrepareResult {
  uint64_t train_tokens = 0, val_tokens = 0;
  uint64_t bytes_read = 0;  // text encoded: the documents' bytes and the newlines the separator added
  std::vector<std::filesystem::path> files;
  std::vector<SkippedFile> skipped;
  // True when val.bin starts at a document (file) boundary; else at a line start, or
  // at the exact token when the document around the split point has no newline.
  bool split_at_document = false;
  std::string separator;            // the one used: "eos", "newline" or "none"
  int threads = 1;                  // encoding threads used
  double seconds = 0;               // reading and encoding the documents
  double megabytes_per_second = 0;  // bytes_read / 1e6 / seconds
};

// The documents of `inputs` encoded and joined in path order with the separator: what
// prepare_dataset splits and writes, and what a text source of a data pipeline reads
// (data/source.h). result has everything but the split (train/val tokens,
// split_at_document). No inputs, or no text in them, is a ValueError.
struct EncodedCorpus {
  std::vector<int32_t> tokens;
  std::vector<uint64_t> doc_starts;  // where each document (file) starts in tokens
  PrepareResult result;
};
EncodedCorpus encode_corpus(const std::vector<std::filesystem::path>& inputs, const Tokenizer& tokenizer,
                            const PrepareOptions& options);

// `inputs` are files or directories (directories are walked, files sorted by path so
// the result is deterministic). Binary files (a NUL byte in the first 8 KiB) are
// skipped and reported. No inputs, or no text in them, is a ValueError. val_fraction
// must be in [0, 1); a positive fraction gives val.bin at least one token.
PrepareResult prepare_dataset(const std::vector<std::filesystem::path>& inputs, const std::filesystem::path& out_dir,
                              const PrepareOptions& options);

}  // namespace tessera::data
