// The persistent compilation cache: Executable::serialize() bytes on disk, one file
// per key, so a second run of the same program (a restarted job, a sweep) skips the
// pass pipeline and memory planning (jax's persistent compilation cache).
//
// The key is a fingerprint (XXH3-128, hex) of everything the compiled result depends
// on: the traced graph's canonical text (before any pass) and its constants' bytes,
// the checkpoint policies, the donated parameters, the compile options (and
// TESSERA_DISABLE_PASSES), the device, the tessera version and the entry and
// Executable format versions. The parts are kept beside the payload as JSON, so
// `tessera cache explain` can say which part made a lookup miss.
//
// Entry file <fingerprint>.tsxc: magic "TSXCACHE", u32 format version, u32 JSON length,
// the key parts as JSON, u64 payload length, u64 XXH3-64 of the payload, the payload.
// Written to a temporary name in the same directory, fsynced and renamed, so readers
// and concurrent writers of one key never see half a file. A corrupt entry (bad magic,
// wrong length or hash, a payload that does not deserialize) is removed, counted and
// recompiled. Size-bounded: least recently used entries (file mtime, refreshed on
// every hit) are removed once the directory holds more than the bound.
//
// The index (second level): jit calls that name a JitOptions::cache_identity also look
// up <index fingerprint>.tsxi before tracing. Its key hashes what the call knows
// without tracing: the jit name, the caller's identity, the argument tree's structure
// and leaf types, static arguments, donation, compile options, device, tessera version
// and the running binary's build identity (build_identity()), so a rebuilt tessera
// never trusts an index written by another build. An index entry holds the full
// entry's key and the output tree's structure; a hit loads that entry and skips
// tracing. Index file: magic "TSXINDEX", u32 format version, u64 XXH3-64 of the body,
// the body (length-prefixed binary strings: the key parts, the entry's fingerprint and
// key JSON, the output tree), written atomically like the entries. A damaged index entry, or one
// whose full entry is gone (evicted) or does not fit the call, is removed with a
// warning and the call traces; it never runs another program.
// TESSERA_COMPILATION_CACHE_INDEX=0 turns the index off.
//
// Which cache jit uses: set_compilation_cache(dir), else TESSERA_COMPILATION_CACHE_DIR;
// neither (or "") disables it; TESSERA_COMPILATION_CACHE_MAX_MB bounds its size (default
// 2 GiB). A directory that cannot be created or written gives one warning and the program
// compiles as if there were no cache; the cache never fails a run. Not cached (yet): SPMD
// programs (collectives are not in the parser's registry) and GPU programs (their device
// programs are not serializable); TESSERA_COMPILATION_CACHE_DEBUG=1 notes each on stderr.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/compiler/executable.h"
#include "tessera/compiler/graph.h"
#include "tessera/compiler/pass.h"

namespace tessera::compiler {

inline constexpr uint32_t kCompilationCacheFormatVersion = 1;
inline constexpr uint32_t kCompilationIndexFormatVersion = 2;                 // 2: binary body (1: JSON)
inline constexpr uint64_t kDefaultCompilationCacheBytes = uint64_t{2} << 30;  // 2 GiB

// The parts of a key, in the order the fingerprint hashes them.
struct CacheKey {
  std::string program;    // the traced graph's name (jit's JitOptions::name)
  std::string signature;  // the graph text's first line: parameter and result types
  std::string graph;      // XXH3-128 of the traced text (small constants print their values)
  std::string constants;  // XXH3-128 of every constant's bytes, in print order
  std::string remat;      // the checkpoint policies of the graph's regions
  std::string donation;   // one 0/1 per parameter
  std::string options;    // CompileOptions and TESSERA_DISABLE_PASSES
  std::string device;     // "cpu", "cuda:0"
  std::string compiler_version;
  std::string format_version;  // cache entry and Executable formats

  // The names and values above, in hash order.
  std::vector<std::pair<std::string, std::string>> parts() const;
  std::string fingerprint() const;  // 32 hex digits
  std::string to_json() const;
  // ValueError naming the missing part for JSON that is not a key.
  static CacheKey from_json(const std::string& json);
};

// The key of compiling `traced` (the graph jit traced, before optimization).
CacheKey make_cache_key(const Graph& traced, const std::vector<bool>& donated, const CompileOptions& options,
                        const std::string& device);
// The options part of a key: CompileOptions and TESSERA_DISABLE_PASSES.
std::string compile_options_text(const CompileOptions& options);

// Identifies the running tessera binary: the GNU build-id of the object that holds
// tessera's code (the linker hashes the whole output into it, so any rebuild that
// changes code changes it, and identical builds share it), else an XXH3-128 of that
// object file's bytes; "" when neither can be read (the index is then not used).
// Computed once per process.
const std::string& build_identity();
// Whether jit uses the index: TESSERA_COMPILATION_CACHE_INDEX=0 turns it off (every
// first call then traces, as without a cache_identity).
bool compilation_index_enabled();

// The index key: named parts (jit fills them), hashed in order like CacheKey's.
struct IndexKey {
  std::vector<std::pair<std::string, std::string>> parts;
  std::string fingerprint() const;  // 32 hex digits
  std::string to_json() const;
};

// An index entry: the full entry to load and what jit needs to run it untraced.
struct IndexEntry {
  std::string program;           // the full entry's fingerprint
  std::string program_key_json;  // its CacheKey::to_json(), compared byte for byte with the entry's
  std::string outputs;           // the output tree's structure (jit's structure text)

  static IndexEntry of(const CacheKey& program_key, std::string outputs);
};

struct CompilationCacheStats {
  size_t hits = 0;
  size_t misses = 0;
  size_t corrupt = 0;         // entries found damaged (removed and recompiled)
  size_t stores = 0;          // entries written
  size_t store_failures = 0;  // writes that failed (the run went on)
  size_t evictions = 0;       // entries removed to stay under the size bound
  size_t skipped = 0;         // programs not cached (SPMD, GPU)
  size_t index_hits = 0;      // calls that skipped tracing
  size_t index_misses = 0;
  size_t index_corrupt = 0;  // index entries removed as damaged, dangling or not fitting
};

struct CacheEntryInfo {
  std::string fingerprint;
  std::string program;
  CacheKey key;        // empty parts for a damaged entry
  uint64_t bytes = 0;  // the whole file
  std::filesystem::file_time_type last_used;
};

class CompilationCache {
 public:
  // Creates `dir` if needed and checks that it can be written; usable() says whether
  // it could (a warning was printed when not).
  explicit CompilationCache(std::filesystem::path dir, uint64_t max_bytes = kDefaultCompilationCacheBytes);

  bool usable() const { return usable_; }
  const std::filesystem::path& dir() const { return dir_; }
  uint64_t max_bytes() const { return max_bytes_; }

  // The cached executable for `key`, or nullptr on a miss. A hit refreshes the entry's
  // last-use time; a damaged entry is removed and counted, and reads as a miss. A miss
  // is recorded (last_miss.json) for explain().
  std::unique_ptr<Executable> load(const CacheKey& key);
  // Writes the entry atomically and evicts down to the size bound. Never throws: a
  // failed write prints a warning and counts in stats().store_failures.
  void store(const CacheKey& key, const Executable& executable);

  // The index entry for `key` with the executable it names, or nullopt on a miss.
  // `check` says what is wrong with the pair for the caller's call ("" when nothing);
  // an entry that is damaged, names a missing or damaged full entry, or fails the check
  // is removed with a warning, counted in index_corrupt, and reads as a miss.
  struct IndexHit {
    std::unique_ptr<Executable> executable;
    IndexEntry entry;
  };
  using IndexCheck = std::function<std::string(const Executable&, const IndexEntry&)>;
  std::optional<IndexHit> load_indexed(const IndexKey& key, const IndexCheck& check);
  // Writes the index entry atomically. Never throws (like store).
  void store_index(const IndexKey& key, const IndexEntry& entry);

  std::vector<CacheEntryInfo> entries() const;  // most recently used first
  // Removes every entry and index entry (and the last-miss record); returns how many
  // entries.
  size_t clear();
  // Removes least recently used entries until the entries total at most `max_bytes`.
  void evict_to(uint64_t max_bytes);
  // For the most recent miss: the parts in which it differs from the nearest entry of
  // the same program (fewest differing parts), as lines a person reads.
  std::string explain() const;

  CompilationCacheStats stats() const;

 private:
  std::filesystem::path entry_path(const std::string& fingerprint) const;
  void record_miss(const CacheKey& key);
  std::filesystem::path index_path(const std::string& fingerprint) const;
  // The entry named `fingerprint` whose header holds `key_json`, or nullptr (a damaged
  // entry is removed and counted); records no miss (the index's lookups: the traced
  // lookup that follows records it). An entry that uses an op this process has not
  // registered (a custom op) is kept and gives nullptr, with the op's name in
  // `unregistered_op`.
  std::unique_ptr<Executable> load_entry(const std::string& fingerprint, const std::string& key_json,
                                         std::string* unregistered_op = nullptr);
  std::optional<IndexEntry> read_index(const IndexKey& key, std::string& error);
  void drop_index(const IndexKey& key, const std::string& why);
  void drop_corrupt(const std::filesystem::path& path, const std::string& why);
  // Writes `parts` to a temporary file in dir_, fsyncs and renames it to `path`.
  void write_atomically(const std::filesystem::path& path, const std::vector<std::string_view>& parts);
  void count(size_t CompilationCacheStats::*field);  // here and in the process-wide sums

  std::filesystem::path dir_;
  uint64_t max_bytes_;
  bool usable_ = false;
  mutable std::mutex mutex_;  // stats_ (files are safe to share: writes are atomic renames)
  CompilationCacheStats stats_;
};

// The process-wide cache jit uses (nullptr when disabled or unusable). `dir` "" turns
// it off; set_compilation_cache overrides TESSERA_COMPILATION_CACHE_DIR.
void set_compilation_cache(const std::string& dir, uint64_t max_bytes = kDefaultCompilationCacheBytes);
std::shared_ptr<CompilationCache> compilation_cache();
// Sums over the process (all caches jit used), including skipped programs.
CompilationCacheStats compilation_cache_stats();
// jit: a program that was not looked up (SPMD, GPU); a note on stderr with
// TESSERA_COMPILATION_CACHE_DEBUG=1.
void note_compilation_cache_skip(const std::string& program, const std::string& why);

}  // namespace tessera::compiler
