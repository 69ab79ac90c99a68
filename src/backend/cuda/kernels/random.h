// Counter-based random numbers on the device: Philox-4x32-10, the same streams as the
// CPU kernels (backend/cpu/kernels/random.h). Element i of a stream is a pure function
// of (key, i), so the GPU produces the CPU's values, in any launch shape:
//  * bits, split keys, uniform (every dtype) and bernoulli are bitwise the CPU's (the
//    arithmetic is the same sequence of correctly rounded operations, fused
//    multiply-adds where the CPU build has them);
//  * normal uses the CPU's Box-Muller formula, with log, sin and cos evaluated in double
//    and rounded to float32 (correctly rounded but for ~2^-28 of inputs) where the CPU
//    calls glibc's logf / sincosf, which are not always correctly rounded (about 1% of
//    24-bit inputs): a few percent of float32 elements differ in the last bit. float64
//    normal uses CUDA's double log/sin/cos (within 1-2 ulp of glibc's).
//
// The key is a device buffer of two uint32 words (k0, k1), read by the kernels, so a
// key produced on the device (by split) never comes back to the host. Launchers queue
// work on `stream` only and can be captured in a CUDA graph.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tessera/base/dtype.h"

namespace tessera::cuda {

// out[i] = word i%4 of philox(key, (i/4 low, i/4 high, 0, 0)), i < n.
void random_bits(const uint32_t* key, uint32_t* out, int64_t n, cudaStream_t stream);

// n keys: keys[2j], keys[2j+1] = the first two words of philox(key, (j low, j high, 1, 0)).
void split_key(const uint32_t* key, uint32_t* keys, int64_t n, cudaStream_t stream);

// Uniform in [low, high) of `dtype` (float16, bfloat16, float32, float64): the CPU's
// formula, bounds and clamping (low + (high-low) u, u = (bits >> 8) 2^-24 in float32, or
// 53 bits from two words for float64). Needs finite low <= high (ValueError otherwise).
void random_uniform(const uint32_t* key, DType dtype, double low, double high, void* out, int64_t n,
                    cudaStream_t stream);

// Normal(mean, stddev) by Box-Muller: elements 2k, 2k+1 from stream words 2k, 2k+1
// (float64: element pair b from the four words of block b). stddev >= 0, both finite.
void random_normal(const uint32_t* key, DType dtype, double mean, double stddev, void* out, int64_t n,
                   cudaStream_t stream);

// out[i] = bits[i] 2^-32 < p[i] (p of p_dtype, any dtype; p[0] for every i when
// p_scalar). The CPU rejects p outside [0, 1]; here p <= 0 never fires, p >= 1 always
// does, NaN never does (the device cannot report).
void random_bernoulli(const uint32_t* key, DType p_dtype, const void* p, bool p_scalar, bool* out, int64_t n,
                      cudaStream_t stream);

}  // namespace tessera::cuda
