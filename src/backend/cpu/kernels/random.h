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

// One Philox-4x32-10 block: 10 rounds of the Philox S-box on `counter` under `key`
// (Random123's philox4x32_10; its known-answer vectors are in the tests).
void philox4x32_10(const uint32_t counter[4], PhiloxKey key, uint32_t out[4]);

// out[i] = 32 random bits for i in [0, n): word i%4 of philox(key, (i/4 low, i/4 high, 0, 0)).
// uniform / normal / bernoulli below are functions of this same stream.
void random_bits(PhiloxKey key, uint32_t* out, int64_t n);
// n new keys derived from `key` (independent streams): key j = (keys[2j], keys[2j+1]) =
// first two words of philox(key, (j low, j high, 1, 0)); counter word 2 = 1 keeps these
// apart from the random_bits stream.
void split_key(PhiloxKey key, uint32_t* keys, int64_t n);
// Uniform in [low, high) of `dtype` (float types): element i is low + (high-low)*u with
// u = (bits[i] >> 8) * 2^-24 for float32/float16/bfloat16 (computed in float32, then
// rounded), u = 53 bits of (bits[2i], bits[2i+1]) * 2^-53 for float64; results are
// clamped to the representable values in [low, high). Needs finite low <= high (low ==
// high gives low).
void random_uniform(PhiloxKey key, DType dtype, double low, double high, void* out, int64_t n);
// Normal(mean, std) by Box-Muller: elements 2k, 2k+1 are r*cos(2 pi u2), r*sin(2 pi u2),
// r = sqrt(-2 ln u1), with u1, u2 in (0, 1) (the uniforms of elements 2k, 2k+1 plus half
// an ulp, so log(0) cannot happen). Computed in float32 (float64 for float64). stddev >= 0.
void random_normal(PhiloxKey key, DType dtype, double mean, double stddev, void* out, int64_t n);
// out[i] = uniform(i) < p[i] (p of `p_dtype`, read with index i, or p[0] when p_scalar),
// uniform(i) = bits[i] * 2^-32, so p = 0 never and p = 1 always fires. p must be in [0, 1].
void random_bernoulli(PhiloxKey key, DType p_dtype, const void* p, bool p_scalar, bool* out, int64_t n);

}  // namespace tessera::cpu
