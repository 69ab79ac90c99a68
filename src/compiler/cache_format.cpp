#include "compiler/cache_format.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "tessera/base/flags.h"

namespace tessera::compiler::cache_format {

namespace fs = std::filesystem;

std::string hex128(XXH128_hash_t h) { return fmt::format("{:016x}{:016x}", h.high64, h.low64); }

void warn(const std::string& text) { std::fprintf(stderr, "warning: compilation cache: %s\n", text.c_str()); }

bool debug_notes() {
  const char* env = flags::env("TESSERA_COMPILATION_CACHE_DEBUG");
  return env != nullptr && *env != 0 && std::string(env) != "0";
}

// Counters of every cache of the process (compilation_cache_stats()).
std::mutex& global_mutex() {
  static std::mutex m;
  return m;
}
CompilationCacheStats& global_stats() {
  static CompilationCacheStats s;
  return s;
}

// The whole file ("" when it cannot be read): one fstat and read, no stream copies
// (an index hit reads two files, and their reading is part of every warm start).
std::optional<std::string> read_file(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  struct stat st {};
  std::string bytes;
  if (::fstat(fd, &st) == 0 && st.st_size > 0) {
    bytes.resize(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (got < bytes.size()) {
      const ssize_t n = ::read(fd, bytes.data() + got, bytes.size() - got);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    bytes.resize(got);
  }
  ::close(fd);
  return bytes;
}

// An entry's header only (magic through the payload hash), so listing a large cache
// does not read the executables.
std::string read_header(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::string bytes(sizeof(kMagic) + 2 * sizeof(uint32_t), '\0');
  if (!in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()))) return {};
  uint32_t json_size = 0;
  std::memcpy(&json_size, bytes.data() + sizeof(kMagic) + sizeof(uint32_t), sizeof(json_size));
  std::string rest(std::min<size_t>(json_size, 1u << 24) + 2 * sizeof(uint64_t), '\0');
  in.read(rest.data(), static_cast<std::streamsize>(rest.size()));
  rest.resize(static_cast<size_t>(in.gcount()));
  return bytes + rest;
}

// `bytes`: the whole file, or (with_payload false) at least its header, the file being
// `file_size` bytes long.
ParsedEntry parse_entry(const std::string& bytes, uint64_t file_size, bool with_payload) {
  ParsedEntry e;
  uint32_t version = 0;
  uint32_t json_size = 0;
  if (bytes.size() < sizeof(kMagic) || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    e.error = "bad magic (not a tessera cache entry)";
    return e;
  }
  ByteReader r(std::string_view(bytes).substr(sizeof(kMagic)), "compilation cache entry");
  if (!r.try_pod(version) || version != kCompilationCacheFormatVersion) {
    e.error = fmt::format("entry format version {} (expected {})", version, kCompilationCacheFormatVersion);
    return e;
  }
  if (!r.try_pod(json_size) || !r.try_bytes(json_size, e.key_json)) {
    e.error = "truncated key";
    return e;
  }
  uint64_t payload_size = 0;
  uint64_t payload_hash = 0;
  if (!r.try_pod(payload_size) || !r.try_pod(payload_hash)) {
    e.error = "truncated header";
    return e;
  }
  const size_t at = sizeof(kMagic) + r.position();
  if (file_size - at != payload_size) {
    e.error = fmt::format("payload is {} bytes (header says {})", file_size - at, payload_size);
    return e;
  }
  if (!with_payload) return e;
  if (XXH3_64bits(bytes.data() + at, payload_size) != payload_hash) {
    e.error = "payload hash mismatch";
    return e;
  }
  e.payload = std::string_view(bytes).substr(at);
  return e;
}

}  // namespace tessera::compiler::cache_format
