// The host buffer allocator: 64-byte aligned blocks, with freed large blocks kept
// in size-class free lists for reuse.
//
// Why: glibc hands blocks over 32 MiB straight back to the OS, so an eager program
// that allocates a 48 MiB temporary every step page-faults it in every step (4 KiB
// at a time; measured ~20 ms per 48 MiB here). Reusing the block costs nothing. The
// compiler's static arena removes the allocations entirely; this cache makes eager
// mode fast too.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tessera {

struct AllocatorStats {
  int64_t allocations = 0;   // calls to allocate_buffer
  int64_t cache_hits = 0;    // served from the free lists
  int64_t bytes_in_use = 0;  // live blocks (capacity)
  int64_t bytes_cached = 0;  // free blocks kept for reuse
  int64_t peak_bytes_in_use = 0;
};

// A block of at least `bytes` (its real size is written to *capacity); never null.
void* allocate_buffer(size_t bytes, size_t* capacity);
// The capacity allocate_buffer gives a request of `bytes`: 64-byte multiples below
// 256 KiB, above that 8 size classes per power of two (at most 12.5% more). The
// planner counts host memory in these blocks.
size_t buffer_capacity(size_t bytes);
void free_buffer(void* data, size_t capacity);

AllocatorStats allocator_stats();
// Restarts peak_bytes_in_use from the bytes in use now (peak of one phase, e.g. a step).
void reset_peak_bytes_in_use();
// Returns every cached block to the OS.
void release_cached_buffers();
// Upper bound of cached bytes (default: TESSERA_BUFFER_CACHE_MB, else 4096 MiB).
void set_buffer_cache_limit(int64_t bytes);

}  // namespace tessera
