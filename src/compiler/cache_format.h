// Internal to the compilation cache: the on-disk formats its files share (entry and
// index magic numbers and suffixes, whole-file and header reads, the entry header
// parser; values are encoded with base/bytes.h) and the process-wide counters.
//   compilation_cache.cpp  the store: entries, listing, eviction, explain
//   cache_key.cpp          what a key is made of, its fingerprint and JSON
//   cache_index.cpp        the second level keyed on the call (a hit skips tracing)
//   compilation_cache_global.cpp  the process-wide cache jit uses
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "tessera/base/bytes.h"
#include "tessera/compiler/compilation_cache.h"

// Header-only use of libxxhash.
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace tessera::compiler::cache_format {

inline constexpr char kMagic[8] = {'T', 'S', 'X', 'C', 'A', 'C', 'H', 'E'};
inline constexpr char kIndexMagic[8] = {'T', 'S', 'X', 'I', 'N', 'D', 'E', 'X'};
inline constexpr const char* kEntrySuffix = ".tsxc";
inline constexpr const char* kIndexSuffix = ".tsxi";
inline constexpr const char* kLastMissFile = "last_miss.json";

// 32 lower-case hex digits.
std::string hex128(XXH128_hash_t h);

// "warning: compilation cache: <text>" on stderr.
void warn(const std::string& text);
// TESSERA_COMPILATION_CACHE_DEBUG: note each program the cache cannot store.
bool debug_notes();

// Counters of every cache of the process (compilation_cache_stats()).
std::mutex& global_mutex();
CompilationCacheStats& global_stats();

// The whole file: one fstat and read, no stream copies (an index hit reads two files,
// and their reading is part of every warm start). nullopt when it cannot be opened
// (there is none yet): the caller must not ask the file system again, since a writer
// may rename the file into place in between and an empty read would look corrupt.
std::optional<std::string> read_file(const std::filesystem::path& path);

// An entry's header only (magic through the payload hash), so listing a large cache
// does not read the executables.
std::string read_header(const std::filesystem::path& path);

// An entry's parsed header, viewing the bytes it was parsed from; `error` says what is
// wrong with a damaged one.
struct ParsedEntry {
  std::string_view key_json;
  std::string_view payload;
  std::string error;
};

// `bytes`: the whole file, or (with_payload false) at least its header, the file being
// `file_size` bytes long.
ParsedEntry parse_entry(const std::string& bytes, uint64_t file_size, bool with_payload);

}  // namespace tessera::compiler::cache_format
