// Launch-shape helpers shared by the CUDA kernels.
#pragma once

#include <algorithm>
#include <cstdint>

namespace tessera::cuda {

inline constexpr int kThreadsPerBlock = 256;

// Blocks for a grid-stride loop over n items with `per_thread` items per thread:
// enough to fill the device several times over, never more than the work needs.
inline unsigned grid_for(int64_t n, int per_thread = 1, int threads = kThreadsPerBlock, int multiprocessors = 132) {
  const int64_t per_block = static_cast<int64_t>(threads) * per_thread;
  const int64_t needed = (n + per_block - 1) / per_block;
  const int64_t cap = static_cast<int64_t>(std::max(multiprocessors, 1)) * 32;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(needed, cap)));
}

// Whether a pointer allows `bytes`-wide vector accesses.
inline bool aligned_to(const void* p, int bytes) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0;
}

}  // namespace tessera::cuda
