// The caching buffer allocator: alignment, reuse of large blocks, the cache limit.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

#include "tessera/base/allocator.h"

namespace tessera {
namespace {

TEST(Allocator, BlocksAreAlignedAndLargeEnough) {
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{63}, size_t{1000}, size_t{300000}, size_t{5000001}}) {
    size_t capacity = 0;
    void* p = allocate_buffer(bytes, &capacity);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u) << bytes;
    EXPECT_GE(capacity, bytes);
    EXPECT_LE(capacity, bytes + bytes / 8 + 64) << "size class slack above 12.5% for " << bytes;
    std::memset(p, 0xab, bytes);
    free_buffer(p, capacity);
  }
}

TEST(Allocator, FreedLargeBlockIsReused) {
  release_cached_buffers();
  size_t cap1 = 0, cap2 = 0;
  void* a = allocate_buffer(48 << 20, &cap1);
  free_buffer(a, cap1);
  AllocatorStats before = allocator_stats();
  EXPECT_GE(before.bytes_cached, static_cast<int64_t>(cap1));
  void* b = allocate_buffer((48 << 20) - 100, &cap2);  // same size class
  AllocatorStats after = allocator_stats();
  EXPECT_EQ(a, b);
  EXPECT_EQ(cap1, cap2);
  EXPECT_EQ(after.cache_hits, before.cache_hits + 1);
  free_buffer(b, cap2);
  release_cached_buffers();
  EXPECT_EQ(allocator_stats().bytes_cached, 0);
}

TEST(Allocator, CacheLimitIsRespected) {
  release_cached_buffers();
  set_buffer_cache_limit(1 << 20);
  size_t cap = 0;
  void* a = allocate_buffer(4 << 20, &cap);
  free_buffer(a, cap);  // larger than the limit: returned to the OS
  EXPECT_EQ(allocator_stats().bytes_cached, 0);
  set_buffer_cache_limit(int64_t{4096} << 20);
}

}  // namespace
}  // namespace tessera
