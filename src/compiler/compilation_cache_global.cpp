// The process-wide compilation cache jit uses: set_compilation_cache, else
// TESSERA_COMPILATION_CACHE_DIR (and _MAX_MB); one cache object per directory, and an
// unusable directory reported once.
#include <cstdlib>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "compiler/cache_format.h"
#include "tessera/base/error.h"
#include "tessera/base/file_io.h"
#include "tessera/base/flags.h"
#include "tessera/compiler/compilation_cache.h"

namespace tessera::compiler {

using namespace cache_format;
namespace fs = std::filesystem;

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
  dir = fileio::expand_home(dir);
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
