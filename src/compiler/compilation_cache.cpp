// The compilation cache's store: entries (one file per program: header + serialized
// Executable), loading and storing them atomically, listing, clearing, LRU eviction and
// explain (the keys of a miss against the nearest entry). Formats: cache_format.h.
#include "tessera/compiler/compilation_cache.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "compiler/cache_format.h"
#include "tessera/base/error.h"
#include "tessera/base/file_io.h"
#include "tessera/base/flags.h"
#include "tessera/base/version.h"
#include "tessera/compiler/primitive_registry.h"

namespace tessera::compiler {

using namespace cache_format;
namespace fs = std::filesystem;

// ---- the cache ----

CompilationCache::CompilationCache(fs::path dir, uint64_t max_bytes) : dir_(std::move(dir)), max_bytes_(max_bytes) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) {
    warn(fmt::format("cannot create {} ({}); compiling without the cache", dir_.string(), ec.message()));
    return;
  }
  // A directory that exists but cannot be written (permissions, a read-only file
  // system) is as good as none. Asked of the kernel rather than by writing a probe
  // file: every warm start pays for this check (a probe file cost 0.3 ms).
  if (::faccessat(AT_FDCWD, dir_.c_str(), W_OK | X_OK, AT_EACCESS) != 0) {
    warn(fmt::format("cannot write in {} ({}); compiling without the cache", dir_.string(), std::strerror(errno)));
    return;
  }
  usable_ = true;
}

fs::path CompilationCache::entry_path(const std::string& fingerprint) const {
  return dir_ / (fingerprint + kEntrySuffix);
}

fs::path CompilationCache::index_path(const std::string& fingerprint) const {
  return dir_ / (fingerprint + kIndexSuffix);
}

CompilationCacheStats CompilationCache::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CompilationCache::count(size_t CompilationCacheStats::*field) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++(stats_.*field);
  }
  std::lock_guard<std::mutex> lock(global_mutex());
  ++(global_stats().*field);
}

void CompilationCache::drop_corrupt(const fs::path& path, const std::string& why) {
  warn(fmt::format("entry {} is corrupt ({}); removed, recompiling", path.string(), why));
  std::error_code ec;
  fs::remove(path, ec);
  count(&CompilationCacheStats::corrupt);
}

void CompilationCache::record_miss(const CacheKey& key) {
  count(&CompilationCacheStats::misses);
  // Best effort: explain() reads it; a failed write loses nothing else.
  try {
    fileio::write_file_atomic(dir_ / kLastMissFile, key.to_json(), fileio::Durability::Atomic);
  } catch (const IOError&) {
  }
}

std::unique_ptr<Executable> CompilationCache::load(const CacheKey& key) {
  if (!usable_) return nullptr;
  std::unique_ptr<Executable> exe = load_entry(key.fingerprint(), key.to_json());
  if (!exe) record_miss(key);
  return exe;
}

std::unique_ptr<Executable> CompilationCache::load_entry(const std::string& fingerprint, const std::string& key_json,
                                                         std::string* unregistered_op) {
  const fs::path path = entry_path(fingerprint);
  std::error_code ec;
  const std::optional<std::string> file = read_file(path);
  if (!file) return nullptr;  // no entry (yet)
  const std::string& bytes = *file;
  ParsedEntry e = parse_entry(bytes, bytes.size(), /*with_payload=*/true);
  if (e.error.empty() && e.key_json != key_json) e.error = "its key parts do not match its name";
  std::unique_ptr<Executable> exe;
  if (e.error.empty()) {
    try {
      exe = Executable::deserialize(e.payload);
    } catch (const UnregisteredOpError& ex) {
      // Not damage: the program uses a custom op this process has not registered (yet).
      // The entry stays for processes that register it; this one compiles.
      warn(
          fmt::format("entry {} uses op '{}', which is not registered in this process (a custom op registers with "
                      "register_custom_op before the first call); compiling instead",
                      path.string(), ex.op()));
      if (unregistered_op != nullptr) *unregistered_op = ex.op();
      return nullptr;
    } catch (const std::exception& ex) {
      e.error = fmt::format("the executable does not deserialize: {}", ex.what());
    }
  }
  if (!e.error.empty()) {
    drop_corrupt(path, e.error);
    return nullptr;
  }
  fs::last_write_time(path, fs::file_time_type::clock::now(), ec);  // LRU: last use
  count(&CompilationCacheStats::hits);
  return exe;
}

void CompilationCache::write_atomically(const fs::path& path, const std::vector<std::string_view>& parts) {
  fileio::write_file_atomic(path, [&](fileio::File& file) {
    for (std::string_view part : parts) file.write_all(part.data(), part.size());
  });
}

void CompilationCache::store(const CacheKey& key, const Executable& executable) {
  if (!usable_) return;
  const std::string fp = key.fingerprint();
  try {
    const std::string payload = executable.serialize();
    const std::string json = key.to_json();
    ByteWriter header;
    header.bytes().assign(kMagic, sizeof(kMagic));
    header.pod(kCompilationCacheFormatVersion);
    header.pod(static_cast<uint32_t>(json.size()));
    header.bytes() += json;
    header.pod(static_cast<uint64_t>(payload.size()));
    header.pod(static_cast<uint64_t>(XXH3_64bits(payload.data(), payload.size())));
    write_atomically(entry_path(fp), {header.bytes(), payload});
    std::error_code ec;
    fs::last_write_time(entry_path(fp), fs::file_time_type::clock::now(), ec);
  } catch (const std::exception& ex) {
    warn(fmt::format("could not store {} ({}); the run goes on", fp, ex.what()));
    count(&CompilationCacheStats::store_failures);
    return;
  }
  count(&CompilationCacheStats::stores);
  evict_to(max_bytes_);
}

std::vector<CacheEntryInfo> CompilationCache::entries() const {
  std::vector<CacheEntryInfo> out;
  std::error_code ec;
  for (const fs::directory_entry& d : fs::directory_iterator(dir_, ec)) {
    const fs::path& p = d.path();
    if (p.extension() != kEntrySuffix || p.filename().string().starts_with(".")) continue;
    CacheEntryInfo info;
    info.fingerprint = p.stem().string();
    std::error_code e1, e2;
    info.bytes = fs::file_size(p, e1);
    info.last_used = fs::last_write_time(p, e2);
    if (e1 || e2) continue;  // removed meanwhile
    const std::string header = read_header(p);
    ParsedEntry e = parse_entry(header, info.bytes, /*with_payload=*/false);
    if (e.error.empty()) {
      try {
        info.key = CacheKey::from_json(std::string(e.key_json));
        info.program = info.key.program;
      } catch (const Error&) {
        info.program = "?";
      }
    } else {
      info.program = "? (" + e.error + ")";
    }
    out.push_back(std::move(info));
  }
  std::sort(out.begin(), out.end(), [](const CacheEntryInfo& a, const CacheEntryInfo& b) {
    return a.last_used != b.last_used ? a.last_used > b.last_used : a.fingerprint < b.fingerprint;
  });
  return out;
}

size_t CompilationCache::clear() {
  size_t removed = 0;
  std::error_code ec;
  std::vector<fs::path> victims;
  for (const fs::directory_entry& d : fs::directory_iterator(dir_, ec)) {
    const std::string name = d.path().filename().string();
    if (d.path().extension() == kEntrySuffix) ++removed;
    if (d.path().extension() == kEntrySuffix || d.path().extension() == kIndexSuffix || name == kLastMissFile ||
        name.find(".tmp-") != std::string::npos)
      victims.push_back(d.path());
  }
  for (const fs::path& p : victims) fs::remove(p, ec);
  return removed;
}

void CompilationCache::evict_to(uint64_t max_bytes) {
  std::vector<CacheEntryInfo> all = entries();  // most recent first
  uint64_t total = 0;
  for (const CacheEntryInfo& e : all) total += e.bytes;
  std::error_code ec;
  while (total > max_bytes && !all.empty()) {
    const CacheEntryInfo& oldest = all.back();
    if (fs::remove(entry_path(oldest.fingerprint), ec)) count(&CompilationCacheStats::evictions);
    total -= oldest.bytes;
    all.pop_back();
  }
}

std::string CompilationCache::explain() const {
  const std::string json = read_file(dir_ / kLastMissFile).value_or("");
  if (json.empty()) return fmt::format("no miss recorded in {}\n", dir_.string());
  const CacheKey miss = CacheKey::from_json(json);
  const std::string miss_fp = miss.fingerprint();
  std::string out = fmt::format("last miss: program {} key {}\n", miss.program, miss_fp);
  std::string nearest_fp;
  CacheKey nearest;
  std::vector<std::string> nearest_diff;
  for (const CacheEntryInfo& info : entries()) {
    if (info.fingerprint == miss_fp) continue;  // the entry stored after the miss itself
    const CacheKey& other = info.key;           // empty parts for a damaged entry
    if (other.program != miss.program) continue;
    std::vector<std::string> diff;
    const auto a = miss.parts();
    const auto b = other.parts();
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i].second != b[i].second) diff.push_back(a[i].first);
    }
    if (nearest_fp.empty() || diff.size() < nearest_diff.size()) {
      nearest_fp = info.fingerprint;
      nearest = other;
      nearest_diff = diff;
    }
  }
  if (nearest_fp.empty()) {
    return out + fmt::format("no other entry of program {}: its first compile with this cache\n", miss.program);
  }
  out += fmt::format("nearest entry {} differs in: {}\n", nearest_fp, fmt::join(nearest_diff, ", "));
  const auto a = miss.parts();
  const auto b = nearest.parts();
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].second == b[i].second) continue;
    // Long parts (the signature) are shown from a little before their first difference.
    const std::string& x = a[i].second;
    const std::string& y = b[i].second;
    size_t first = 0;
    while (first < x.size() && first < y.size() && x[first] == y[first]) ++first;
    const size_t from = first > 60 ? first - 40 : 0;
    const char* dots = from > 0 ? "..." : "";
    out += fmt::format("  {} (from character {}):\n    miss:  {}{:.160}\n    entry: {}{:.160}\n", a[i].first, from,
                       dots, x.substr(std::min(from, x.size())), dots, y.substr(std::min(from, y.size())));
  }
  return out;
}

}  // namespace tessera::compiler
