// The compilation-cache keys fuzz_compilation_cache.cpp and the seed generator
// (make_seeds.cpp) share: an entry and an index entry are found by their key's
// fingerprint, so the seeds must be written under the keys the target looks up.
#pragma once

#include "tessera/compiler/compilation_cache.h"

namespace tessera::fuzz {

inline compiler::CacheKey fuzz_cache_key() {
  compiler::CacheKey key;
  key.program = "fuzz";
  key.signature = "(f32[4]) -> f32[4]";
  key.device = "cpu";
  key.compiler_version = "fuzz";
  key.format_version = "fuzz";
  return key;
}

inline compiler::IndexKey fuzz_index_key() { return compiler::IndexKey{{{"call", "fuzz"}, {"device", "cpu"}}}; }

}  // namespace tessera::fuzz
