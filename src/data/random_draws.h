// The random draws the data stream is built from, fully specified here (not by the
// standard library's implementation-defined distributions), so a stream is the same on
// every platform and compiler.
#pragma once

#include <cstdint>
#include <random>

namespace tessera::data::detail {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [0, bound] without modulo bias: reject draws from the incomplete last block.
inline uint64_t uniform_upto(std::mt19937_64& rng, uint64_t bound) {
  if (bound == UINT64_MAX) return rng();
  const uint64_t range = bound + 1;
  const uint64_t limit = UINT64_MAX - (UINT64_MAX % range + 1) % range;  // largest multiple of range, minus 1
  uint64_t draw;
  do {
    draw = rng();
  } while (draw > limit);
  return draw % range;
}

}  // namespace tessera::data::detail
