#include "tessera/base/allocator.h"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

#include "tessera/base/error.h"
#include "tessera/base/flags.h"

namespace tessera {
namespace {

// Blocks below this size go straight to malloc (glibc caches them well).
constexpr size_t kCacheMinBytes = 256 * 1024;

int64_t default_limit() {
  if (const char* env = flags::env("TESSERA_BUFFER_CACHE_MB")) return std::atoll(env) * (int64_t{1} << 20);
  return int64_t{4096} << 20;
}

struct Cache {
  std::mutex mutex;
  std::map<size_t, std::vector<void*>> free_lists;  // capacity -> blocks
  AllocatorStats stats;
  int64_t limit = default_limit();

  void trim_to(int64_t target) {
    // Largest blocks first: they are the rarest to be reused exactly.
    while (stats.bytes_cached > target && !free_lists.empty()) {
      auto it = std::prev(free_lists.end());
      std::free(it->second.back());
      it->second.pop_back();
      stats.bytes_cached -= static_cast<int64_t>(it->first);
      if (it->second.empty()) free_lists.erase(it);
    }
  }
};

Cache& cache() {
  static Cache* instance = new Cache();  // never destroyed: buffers may outlive static destructors
  return *instance;
}

}  // namespace

// Size classes: 8 steps per power of two (at most 12.5% slack).
size_t buffer_capacity(size_t bytes) {
  if (bytes <= 64) return 64;
  if (bytes < kCacheMinBytes) return (bytes + 63) / 64 * 64;
  int top = std::bit_width(bytes - 1) - 1;  // 2^top < bytes <= 2^(top+1)
  size_t step = size_t{1} << (top - 3);
  return (bytes + step - 1) / step * step;
}

void* allocate_buffer(size_t bytes, size_t* capacity) {
  size_t cap = buffer_capacity(bytes);
  Cache& c = cache();
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    ++c.stats.allocations;
    c.stats.bytes_in_use += static_cast<int64_t>(cap);
    c.stats.peak_bytes_in_use = std::max(c.stats.peak_bytes_in_use, c.stats.bytes_in_use);
    if (cap >= kCacheMinBytes) {
      auto it = c.free_lists.find(cap);
      if (it != c.free_lists.end() && !it->second.empty()) {
        void* block = it->second.back();
        it->second.pop_back();
        c.stats.bytes_cached -= static_cast<int64_t>(cap);
        ++c.stats.cache_hits;
        *capacity = cap;
        return block;
      }
    }
  }
  void* block = std::aligned_alloc(64, cap);
  if (!block) {
    release_cached_buffers();
    block = std::aligned_alloc(64, cap);
  }
  if (!block) fail<Error>("out of memory: could not allocate {} bytes", bytes);
  *capacity = cap;
  return block;
}

void free_buffer(void* data, size_t capacity) {
  if (!data) return;
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.stats.bytes_in_use -= static_cast<int64_t>(capacity);
  if (capacity < kCacheMinBytes || static_cast<int64_t>(capacity) > c.limit) {
    std::free(data);
    return;
  }
  c.free_lists[capacity].push_back(data);
  c.stats.bytes_cached += static_cast<int64_t>(capacity);
  c.trim_to(c.limit);
}

AllocatorStats allocator_stats() {
  std::lock_guard<std::mutex> lock(cache().mutex);
  return cache().stats;
}

void reset_peak_bytes_in_use() {
  std::lock_guard<std::mutex> lock(cache().mutex);
  cache().stats.peak_bytes_in_use = cache().stats.bytes_in_use;
}

void release_cached_buffers() {
  std::lock_guard<std::mutex> lock(cache().mutex);
  cache().trim_to(0);
}

void set_buffer_cache_limit(int64_t bytes) {
  std::lock_guard<std::mutex> lock(cache().mutex);
  cache().limit = std::max<int64_t>(0, bytes);
  cache().trim_to(cache().limit);
}

}  // namespace tessera
