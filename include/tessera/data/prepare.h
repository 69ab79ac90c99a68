// `tessera data prepare`: text files -> train.bin and val.bin token files in an output
// directory (plus meta.json: tokenizer, vocab, counts, sources).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace tessera::data {

struct PrepareOptions {
  std::string tokenizer = "byte";
  double val_fraction = 0.05;  // the last fraction of the token stream (whole documents where possible)
  bool progress = true;        // a progress bar on stderr
};

struct PrepareResult {
  uint64_t train_tokens = 0, val_tokens = 0;
  uint64_t bytes_read = 0;
  std::vector<std::filesystem::path> files;
};

// `inputs` are files or directories (directories are walked, files sorted by path so
// the result is deterministic). Binary files (a NUL byte in the first 8 KiB) are
// skipped and reported. No inputs, or no text in them, is a ValueError.
PrepareResult prepare_dataset(const std::vector<std::filesystem::path>& inputs, const std::filesystem::path& out_dir,
                              const PrepareOptions& options);

}  // namespace tessera::data
