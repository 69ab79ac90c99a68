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

#include "tessera/base/error.h"
#include "tessera/base/file_io.h"
#include "tessera/base/flags.h"
#include "tessera/base/version.h"

// Header-only use of libxxhash (the core library does not link it).
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace tessera::compiler {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'T', 'S', 'X', 'C', 'A', 'C', 'H', 'E'};
constexpr char kIndexMagic[8] = {'T', 'S', 'X', 'I', 'N', 'D', 'E', 'X'};
constexpr const char* kEntrySuffix = ".tsxc";
constexpr const char* kIndexSuffix = ".tsxi";
constexpr const char* kLastMissFile = "last_miss.json";

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

// The constants' bytes in the order Graph::text() prints them (first read, then
// returned directly), so equal programs hash equal whatever their value ids.
std::string constants_digest(const Graph& g) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_128bits_reset(state);
  std::set<ValueId> seen;
  auto add = [&](ValueId v) {
    if (g.value(v).kind != ValueKind::Constant || !seen.insert(v).second) return;
    const Array& c = g.value(v).constant;
    const uint64_t n = c.nbytes();
    XXH3_128bits_update(state, &n, sizeof(n));
    XXH3_128bits_update(state, c.raw_data(), c.nbytes());
  };
  for (const Node& node : g.nodes) {
    if (node.dead) continue;
    for (ValueId in : node.inputs) add(in);
  }
  for (ValueId out : g.outputs) add(out);
  std::string digest = hex128(XXH3_128bits_digest(state));
  XXH3_freeState(state);
  return digest;
}

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

// The whole file ("" when it cannot be read): one fstat and read, no stream copies
// (an index hit reads two files, and their reading is part of every warm start).
std::string read_file(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
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

// An entry's parsed header, viewing the bytes it was parsed from; `error` says what is
// wrong with a damaged one.
struct ParsedEntry {
  std::string_view key_json;
  std::string_view payload;
  std::string error;
};

// `bytes`: the whole file, or (with_payload false) at least its header, the file being
// `file_size` bytes long.
ParsedEntry parse_entry(const std::string& bytes, uint64_t file_size, bool with_payload) {
  ParsedEntry e;
  size_t at = 0;
  uint32_t version = 0;
  uint32_t json_size = 0;
  if (bytes.size() < sizeof(kMagic) || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    e.error = "bad magic (not a tessera cache entry)";
    return e;
  }
  at = sizeof(kMagic);
  if (!read_pod(bytes, at, version) || version != kCompilationCacheFormatVersion) {
    e.error = fmt::format("entry format version {} (expected {})", version, kCompilationCacheFormatVersion);
    return e;
  }
  if (!read_pod(bytes, at, json_size) || bytes.size() - at < json_size) {
    e.error = "truncated key";
    return e;
  }
  e.key_json = std::string_view(bytes).substr(at, json_size);
  at += json_size;
  uint64_t payload_size = 0;
  uint64_t payload_hash = 0;
  if (!read_pod(bytes, at, payload_size) || !read_pod(bytes, at, payload_hash)) {
    e.error = "truncated header";
    return e;
  }
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

}  // namespace

// ---- the key ----

std::vector<std::pair<std::string, std::string>> CacheKey::parts() const {
  return {{"program", program},
          {"signature", signature},
          {"graph", graph},
          {"constants", constants},
          {"remat", remat},
          {"donation", donation},
          {"options", options},
          {"device", device},
          {"compiler_version", compiler_version},
          {"format_version", format_version}};
}

namespace {
std::string parts_fingerprint(const std::vector<std::pair<std::string, std::string>>& parts) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_128bits_reset(state);
  for (const auto& [name, value] : parts) {
    // Length-prefixed, so no two different part lists hash the same byte stream.
    for (const std::string* s : {&name, &value}) {
      const uint64_t n = s->size();
      XXH3_128bits_update(state, &n, sizeof(n));
      XXH3_128bits_update(state, s->data(), s->size());
    }
  }
  std::string fp = hex128(XXH3_128bits_digest(state));
  XXH3_freeState(state);
  return fp;
}

nlohmann::ordered_json parts_json(const std::vector<std::pair<std::string, std::string>>& parts) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& [name, value] : parts) j[name] = value;
  return j;
}
}  // namespace

std::string CacheKey::fingerprint() const { return parts_fingerprint(parts()); }
std::string CacheKey::to_json() const { return parts_json(parts()).dump(); }
std::string IndexKey::fingerprint() const { return parts_fingerprint(parts); }
std::string IndexKey::to_json() const { return parts_json(parts).dump(); }

CacheKey CacheKey::from_json(const std::string& json) {
  nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) fail<ValueError>("compilation cache: key is not a JSON object: {:.80}", json);
  auto get = [&](const char* name) {
    if (!j.contains(name) || !j[name].is_string())
      fail<ValueError>("compilation cache: key JSON has no string part \"{}\"", name);
    return j[name].get<std::string>();
  };
  CacheKey k;
  k.program = get("program");
  k.signature = get("signature");
  k.graph = get("graph");
  k.constants = get("constants");
  k.remat = get("remat");
  k.donation = get("donation");
  k.options = get("options");
  k.device = get("device");
  k.compiler_version = get("compiler_version");
  k.format_version = get("format_version");
  return k;
}

CacheKey make_cache_key(const Graph& traced, const std::vector<bool>& donated, const CompileOptions& options,
                        const std::string& device) {
  CacheKey k;
  const std::string text = traced.text();
  k.program = traced.name;
  k.signature = text.substr(0, text.find('\n'));
  k.graph = hex128(XXH3_128bits(text.data(), text.size()));
  k.constants = constants_digest(traced);
  for (const CheckpointPolicy& p : traced.remat_regions) k.remat += (k.remat.empty() ? "" : ";") + p.text();
  for (size_t i = 0; i < traced.parameters.size(); ++i) k.donation += i < donated.size() && donated[i] ? '1' : '0';
  k.options = compile_options_text(options);
  k.device = device;
  k.compiler_version = tessera::version();
  k.format_version = fmt::format("entry={},executable={}", kCompilationCacheFormatVersion, kExecutableFormatVersion);
  return k;
}

std::string compile_options_text(const CompileOptions& options) {
  const char* disabled = flags::env("TESSERA_DISABLE_PASSES");
  return fmt::format("fuse={},fold_constants={},simplify={},remat={},schedule={},disabled_passes={}", int(options.fuse),
                     int(options.fold_constants), int(options.simplify), int(options.remat), int(options.schedule),
                     disabled ? disabled : "");
}

bool compilation_index_enabled() {
  const char* env = flags::env("TESSERA_COMPILATION_CACHE_INDEX");
  return env == nullptr || std::string(env) != "0";
}

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

std::unique_ptr<Executable> CompilationCache::load_entry(const std::string& fingerprint, const std::string& key_json) {
  const fs::path path = entry_path(fingerprint);
  std::error_code ec;
  const std::string bytes = read_file(path);  // "" when there is none
  if (bytes.empty() && !fs::exists(path, ec)) return nullptr;
  ParsedEntry e = parse_entry(bytes, bytes.size(), /*with_payload=*/true);
  if (e.error.empty() && e.key_json != key_json) e.error = "its key parts do not match its name";
  std::unique_ptr<Executable> exe;
  if (e.error.empty()) {
    try {
      exe = Executable::deserialize(e.payload);
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
    std::string header(kMagic, sizeof(kMagic));
    append_pod(header, kCompilationCacheFormatVersion);
    append_pod(header, static_cast<uint32_t>(json.size()));
    header += json;
    append_pod(header, static_cast<uint64_t>(payload.size()));
    append_pod(header, static_cast<uint64_t>(XXH3_64bits(payload.data(), payload.size())));
    write_atomically(entry_path(fp), {header, payload});
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

// ---- the index ----

// Index entry body (format 2): length-prefixed strings (u64 length + bytes): the index
// key's part count (u64) and each part's name and value, the full entry's fingerprint,
// its key JSON exactly as the entry's header holds it, the output tree's structure.
// Binary rather than JSON: it is read on every warm start, and parsing 20-40 KB of JSON
// (the argument and output trees of a model) cost 0.4-0.8 ms; the key JSON is compared
// byte for byte with the entry's, never parsed.
namespace {

void append_string(std::string& out, std::string_view s) {
  append_pod(out, static_cast<uint64_t>(s.size()));
  out.append(s.data(), s.size());
}

bool read_string(std::string_view bytes, size_t& at, std::string_view& s) {
  uint64_t n = 0;
  if (bytes.size() - at < sizeof(n)) return false;
  std::memcpy(&n, bytes.data() + at, sizeof(n));
  at += sizeof(n);
  if (bytes.size() - at < n) return false;
  s = bytes.substr(at, n);
  at += n;
  return true;
}

}  // namespace

IndexEntry IndexEntry::of(const CacheKey& program_key, std::string outputs) {
  return {program_key.fingerprint(), program_key.to_json(), std::move(outputs)};
}

// The parsed index entry; nullopt with `error` empty for none, with `error` set for a
// damaged one.
std::optional<IndexEntry> CompilationCache::read_index(const IndexKey& key, std::string& error) {
  const fs::path path = index_path(key.fingerprint());
  const std::string bytes = read_file(path);  // "" when there is none
  std::error_code ec;
  if (bytes.empty() && !fs::exists(path, ec)) return std::nullopt;
  size_t at = sizeof(kIndexMagic);
  uint32_t version = 0;
  uint64_t hash = 0;
  if (bytes.size() < sizeof(kIndexMagic) || std::memcmp(bytes.data(), kIndexMagic, sizeof(kIndexMagic)) != 0) {
    error = "bad magic (not a tessera cache index entry)";
    return std::nullopt;
  }
  if (!read_pod(bytes, at, version) || version != kCompilationIndexFormatVersion) {
    error = fmt::format("index format version {} (expected {})", version, kCompilationIndexFormatVersion);
    return std::nullopt;
  }
  if (!read_pod(bytes, at, hash) || XXH3_64bits(bytes.data() + at, bytes.size() - at) != hash) {
    error = "body hash mismatch";
    return std::nullopt;
  }
  const std::string_view body = std::string_view(bytes).substr(at);
  at = 0;
  uint64_t num_parts = 0;
  bool ok = body.size() >= sizeof(num_parts);
  if (ok) {
    std::memcpy(&num_parts, body.data(), sizeof(num_parts));
    at = sizeof(num_parts);
  }
  bool same_key = ok && num_parts == key.parts.size();
  for (uint64_t i = 0; ok && i < num_parts; ++i) {
    std::string_view name, value;
    ok = read_string(body, at, name) && read_string(body, at, value);
    same_key = same_key && ok && key.parts[i].first == name && key.parts[i].second == value;
  }
  std::string_view program, program_key_json, outputs;
  ok = ok && read_string(body, at, program) && read_string(body, at, program_key_json) &&
       read_string(body, at, outputs) && at == body.size();
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
    exe = load_entry(entry->program, entry->program_key_json);
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
    std::string body;
    append_pod(body, static_cast<uint64_t>(key.parts.size()));
    for (const auto& [name, value] : key.parts) {
      append_string(body, name);
      append_string(body, value);
    }
    append_string(body, entry.program);
    append_string(body, entry.program_key_json);
    append_string(body, entry.outputs);
    std::string header(kIndexMagic, sizeof(kIndexMagic));
    append_pod(header, kCompilationIndexFormatVersion);
    append_pod(header, static_cast<uint64_t>(XXH3_64bits(body.data(), body.size())));
    write_atomically(index_path(fp), {header, body});
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
  const std::string json = read_file(dir_ / kLastMissFile);
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

// ---- the process-wide cache ----

namespace {
struct GlobalCache {
  std::mutex mutex;
  bool configured = false;  // set_compilation_cache was called
  std::string dir;
  uint64_t max_bytes = kDefaultCompilationCacheBytes;
  std::shared_ptr<CompilationCache> cache;
  std::set<std::string> warned;  // unusable directories already reported
};
GlobalCache& global_cache() {
  static GlobalCache g;
  return g;
}

uint64_t env_max_bytes() {
  const char* env = flags::env("TESSERA_COMPILATION_CACHE_MAX_MB");
  if (env == nullptr || *env == 0) return kDefaultCompilationCacheBytes;
  char* end = nullptr;
  const unsigned long long mb = std::strtoull(env, &end, 10);
  if (end == env || *end != 0)
    fail<ValueError>("TESSERA_COMPILATION_CACHE_MAX_MB={} is not a whole number of MiB", env);
  return static_cast<uint64_t>(mb) << 20;
}
}  // namespace

void set_compilation_cache(const std::string& dir, uint64_t max_bytes) {
  GlobalCache& g = global_cache();
  std::lock_guard<std::mutex> lock(g.mutex);
  g.configured = true;
  g.dir = dir;
  g.max_bytes = max_bytes;
  g.cache.reset();
}

std::shared_ptr<CompilationCache> compilation_cache() {
  GlobalCache& g = global_cache();
  std::lock_guard<std::mutex> lock(g.mutex);
  std::string dir = g.dir;
  uint64_t max_bytes = g.max_bytes;
  if (!g.configured) {
    const char* env = flags::env("TESSERA_COMPILATION_CACHE_DIR");
    dir = env != nullptr ? env : "";
    max_bytes = env_max_bytes();
  }
  if (dir.empty()) return nullptr;
  if (dir.starts_with("~/")) {
    const char* home = std::getenv("HOME");
    if (home != nullptr) dir = std::string(home) + dir.substr(1);
  }
  if (!g.cache || g.cache->dir() != fs::path(dir) || g.cache->max_bytes() != max_bytes) {
    if (g.warned.count(dir)) return nullptr;  // warned once already; no cache for this directory
    auto cache = std::make_shared<CompilationCache>(dir, max_bytes);
    if (!cache->usable()) {
      g.warned.insert(dir);
      return nullptr;
    }
    g.cache = std::move(cache);
  }
  return g.cache;
}

CompilationCacheStats compilation_cache_stats() {
  std::lock_guard<std::mutex> lock(global_mutex());
  return global_stats();
}

void note_compilation_cache_skip(const std::string& program, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(global_mutex());
    ++global_stats().skipped;
  }
  if (debug_notes()) std::fprintf(stderr, "compilation cache: %s not cached: %s\n", program.c_str(), why.c_str());
}

}  // namespace tessera::compiler
