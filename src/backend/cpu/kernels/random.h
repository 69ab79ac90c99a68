// Counter-based random numbers: Philox-4x32-10 (Salmon et al., SC'11).
// Element i of a stream is a pure function of (key, i): identical for any thread
// count, any chunking and across runs.
#pragma once

#include <cstdint>

#include "tessera/base/dtype.h"

namespace tessera::cpu {

struct PhiloxKey {
  uint32_t k0 = 0, k1 = 0;
};

// out[i] = 32 random bits for i in [0, n).
void random_bits(PhiloxKey key, uint32_t* out, int64_t n);
// n new keys derived from `key` (independent streams): keys[2j], keys[2j+1].
void split_key(PhiloxKey key, uint32_t* keys, int64_t n);
// Uniform in [low, high) of `dtype` (float types): 24 (float) / 53 (double) random mantissa bits.
void random_uniform(PhiloxKey key, DType dtype, double low, double high, void* out, int64_t n);
// Normal(mean, std) by Box-Muller on pairs of uniforms.
void random_normal(PhiloxKey key, DType dtype, double mean, double stddev, void* out, int64_t n);
// out[i] = uniform(i) < p[i] (p of `p_dtype`, read with index i, or p[0] when p_scalar).
void random_bernoulli(PhiloxKey key, DType p_dtype, const void* p, bool p_scalar, bool* out, int64_t n);

}  // namespace tessera::cpu
