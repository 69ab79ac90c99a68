// Shared by the fuzz targets (fuzz/fuzz_*.cpp, docs/fuzzing.md): bytes as text, a
// per-process scratch directory for the readers that take a path, and the rule every
// target follows: tessera's documented errors (base/error.h) are the expected answer to
// bad bytes; any other exception escapes to libFuzzer, which reports it as a crash.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/base/error.h"

namespace tessera::fuzz {

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// The input cut at each '\0': several fields (a file and its overrides, two files) from
// one input, so the fuzzer mutates them together.
inline std::vector<std::string> split_fields(std::string_view text) {
  std::vector<std::string> fields;
  size_t start = 0;
  for (size_t end; (end = text.find('\0', start)) != std::string_view::npos; start = end + 1)
    fields.emplace_back(text.substr(start, end - start));
  fields.emplace_back(text.substr(start));
  return fields;
}

// A directory of this process under the temp dir, emptied on each call (libFuzzer runs
// inputs one after another in a process; -fork and -jobs give each worker its own pid).
// Removed again when the process exits (libFuzzer ends a run with exit()).
inline std::filesystem::path scratch_dir() {
  struct Scratch {
    std::filesystem::path dir = std::filesystem::temp_directory_path() / ("tessera-fuzz-" + std::to_string(::getpid()));
    ~Scratch() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  };
  static const Scratch scratch;
  std::filesystem::remove_all(scratch.dir);
  std::filesystem::create_directories(scratch.dir);
  return scratch.dir;
}

inline void write_file(const std::filesystem::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Runs `body`, swallowing tessera's errors (a refused input): everything else escapes.
template <class F>
void expect_errors(F&& body) {
  try {
    body();
  } catch (const Error&) {
  }
}

}  // namespace tessera::fuzz
