// Internal to the compilation cache: the on-disk formats its files share (entry and
// index magic numbers and suffixes, POD and length-prefixed string encoding, whole-file
// and header reads, the entry header parser) and the process-wide counters.
//   compilation_cache.cpp  the store: entries, listing, eviction, explain
//   cache_key.cpp          what a key is made of, its fingerprint and JSON
//   cache_index.cpp        the second level keyed on the call (a hit skips tracing)
//   compilation_cache_global.cpp  the process-wide cache jit uses
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <string_view>

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

template <typename T>
void append_pod(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

template <typename T>
bool read_pod(const std::string& bytes, size_t& at, T& v) {
  if (at > bytes.size() || bytes.size() - at < sizeof(T)) return false;
  std::memcpy(&v, bytes.data() + at, sizeof(T));
  at += sizeof(T);
  return true;
}

// u64 length + bytes.
void append_string(std::string& out, std::string_view s);
bool read_string(std::string_view bytes, size_t& at, std::string_view& s);

// The whole file ("" when it cannot be read): one fstat and read, no stream copies
// (an index hit reads two files, and their reading is part of every warm start).
std::string read_file(const std::filesystem::path& path);

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
