// DeviceAllocator: a caching allocator over plain cudaMalloc (never managed memory),
// one per device. Freed blocks go to a size-ordered free list and are handed out again
// (best fit, at most 25% larger than asked, so a small request never pins a huge
// block); cudaMalloc runs only on a miss. All work on a device runs on its one stream
// (runtime.h), so a block freed by the host can be reused at once by work queued later.
// When cudaMalloc fails, the cache is returned to the driver and the call retried once;
// then the error names the request and the allocator's counters.
//
// Sizes are rounded up to 512 bytes (every block is 512-byte aligned: 16-byte vector
// accesses and cuBLASLt's alignment rules hold for any offset the memory planner gives).
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "tessera/backend/cuda.h"

namespace tessera::cuda {

class DeviceAllocator {
 public:
  static DeviceAllocator& get(int device);

  void* allocate(size_t bytes);
  void free(void* ptr);
  // A block freed when the last holder lets go (DeviceData::owner).
  std::shared_ptr<void> allocate_shared(size_t bytes);

  MemoryStats stats() const;
  void reset_peak();
  void empty_cache();

  static size_t round_size(size_t bytes) { return bytes == 0 ? 512 : (bytes + 511) / 512 * 512; }

 private:
  explicit DeviceAllocator(int device) : device_(device) {}
  void release_cached_locked();

  int device_;
  mutable std::mutex mutex_;
  std::multimap<size_t, void*> free_blocks_;  // size -> block
  std::unordered_map<void*, size_t> live_;    // block -> size
  MemoryStats stats_;
};

}  // namespace tessera::cuda
