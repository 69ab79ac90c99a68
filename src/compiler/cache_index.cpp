#include <fmt/format.h>

#include <filesystem>

#include "compiler/cache_format.h"
#include "tessera/base/error.h"
#include "tessera/compiler/compilation_cache.h"

namespace tessera::compiler {

using namespace cache_format;
namespace fs = std::filesystem;

// ---- the index ----

// Index entry body (format 2): length-prefixed strings (u64 length + bytes): the index
// key's part count (u64) and each part's name and value, the full entry's fingerprint,
// its key JSON exactly as the entry's header holds it, the output tree's structure.
// Binary rather than JSON: it is read on every warm start, and parsing 20-40 KB of JSON
// (the argument and output trees of a model) cost 0.4-0.8 ms; the key JSON is compared
// byte for byte with the entry's, never parsed.

IndexEntry IndexEntry::of(const CacheKey& program_key, std::string outputs) {
  return {program_key.fingerprint(), program_key.to_json(), std::move(outputs)};
}

// The parsed index entry; nullopt with `error` empty for none, with `error` set for a
// damaged one.
std::optional<IndexEntry> CompilationCache::read_index(const IndexKey& key, std::string& error) {
  const fs::path path = index_path(key.fingerprint());
  const std::optional<std::string> file = read_file(path);
  if (!file) return std::nullopt;  // no index entry (yet)
  const std::string& bytes = *file;
  uint32_t version = 0;
  uint64_t hash = 0;
  if (bytes.size() < sizeof(kIndexMagic) || std::memcmp(bytes.data(), kIndexMagic, sizeof(kIndexMagic)) != 0) {
    error = "bad magic (not a tessera cache index entry)";
    return std::nullopt;
  }
  ByteReader header(std::string_view(bytes).substr(sizeof(kIndexMagic)), "compilation cache index");
  if (!header.try_pod(version) || version != kCompilationIndexFormatVersion) {
    error = fmt::format("index format version {} (expected {})", version, kCompilationIndexFormatVersion);
    return std::nullopt;
  }
  if (!header.try_pod(hash) || XXH3_64bits(header.rest().data(), header.rest().size()) != hash) {
    error = "body hash mismatch";
    return std::nullopt;
  }
  ByteReader body(header.rest(), "compilation cache index");
  uint64_t num_parts = 0;
  bool ok = body.try_pod(num_parts);
  bool same_key = ok && num_parts == key.parts.size();
  for (uint64_t i = 0; ok && i < num_parts; ++i) {
    std::string_view name, value;
    ok = body.try_blob(name) && body.try_blob(value);
    same_key = same_key && ok && key.parts[i].first == name && key.parts[i].second == value;
  }
  std::string_view program, program_key_json, outputs;
  ok = ok && body.try_blob(program) && body.try_blob(program_key_json) && body.try_blob(outputs) && body.done();
  // The fingerprint names a file: 32 hex digits and nothing else.
  ok = ok && program.size() == 32 && program.find_first_not_of("0123456789abcdef") == std::string_view::npos;
  if (!ok) {
    error = "its body is not an index entry";
    return std::nullopt;
  }
  if (!same_key) {
    error = "its key parts do not match its name";
    return std::nullopt;
  }
  return IndexEntry{std::string(program), std::string(program_key_json), std::string(outputs)};
}

std::optional<CompilationCache::IndexHit> CompilationCache::load_indexed(const IndexKey& key, const IndexCheck& check) {
  if (!usable_) return std::nullopt;
  std::string error;
  std::optional<IndexEntry> entry = read_index(key, error);
  std::unique_ptr<Executable> exe;
  if (entry) {
    std::string unregistered;
    exe = load_entry(entry->program, entry->program_key_json, &unregistered);
    if (!exe && !unregistered.empty()) {
      // Kept: the index entry is right for a process that registers the op.
      count(&CompilationCacheStats::index_misses);
      return std::nullopt;
    }
    if (!exe) {
      error = fmt::format("its program entry {} is missing or damaged", entry->program);
    } else {
      error = check(*exe, *entry);
    }
  }
  if (!error.empty()) drop_index(key, error);
  if (!error.empty() || !entry) {
    count(&CompilationCacheStats::index_misses);
    return std::nullopt;
  }
  count(&CompilationCacheStats::index_hits);
  return IndexHit{std::move(exe), std::move(*entry)};
}

void CompilationCache::store_index(const IndexKey& key, const IndexEntry& entry) {
  if (!usable_) return;
  const std::string fp = key.fingerprint();
  try {
    ByteWriter body;
    body.pod(static_cast<uint64_t>(key.parts.size()));
    for (const auto& [name, value] : key.parts) {
      body.str(name);
      body.str(value);
    }
    body.str(entry.program);
    body.str(entry.program_key_json);
    body.str(entry.outputs);
    ByteWriter header;
    header.bytes().assign(kIndexMagic, sizeof(kIndexMagic));
    header.pod(kCompilationIndexFormatVersion);
    header.pod(static_cast<uint64_t>(XXH3_64bits(body.bytes().data(), body.bytes().size())));
    write_atomically(index_path(fp), {header.bytes(), body.bytes()});
  } catch (const std::exception& ex) {
    warn(fmt::format("could not store index entry {} ({}); the run goes on", fp, ex.what()));
    count(&CompilationCacheStats::store_failures);
  }
}

void CompilationCache::drop_index(const IndexKey& key, const std::string& why) {
  const fs::path path = index_path(key.fingerprint());
  warn(fmt::format("index entry {} is unusable ({}); removed, tracing", path.string(), why));
  std::error_code ec;
  fs::remove(path, ec);
  count(&CompilationCacheStats::index_corrupt);
}

}  // namespace tessera::compiler
