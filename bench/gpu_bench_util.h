// What the GPU kernel benchmarks (bench_gpu_gemm, bench_gpu_attention) share. CUDA builds
// only: include it inside their `#if TESSERA_HAS_CUDA` part.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "backend/cuda/kernels/cuda_check.h"

namespace tessera::bench {

// A device buffer of n bf16 values uniform in [-1, 1) (never zeros: timing on zeros can
// flatter a kernel), from a splitmix64 stream: fast enough for the 824M-element logits
// matrices. The caller cudaFree()s it.
inline void* random_bf16_on_device(int64_t n, uint64_t seed) {
  std::vector<uint16_t> host(static_cast<size_t>(n));
  uint64_t x = seed;
  for (uint16_t& h : host) {
    x += 0x9e3779b97f4a7c15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const float f = static_cast<float>(z >> 40) * (2.0f / 16777216.0f) - 1.0f;
    uint32_t bits = 0;
    std::memcpy(&bits, &f, 4);
    h = static_cast<uint16_t>(bits >> 16);
  }
  void* d = nullptr;
  TESSERA_CUDA_CHECK(cudaMalloc(&d, static_cast<size_t>(n) * 2));
  TESSERA_CUDA_CHECK(cudaMemcpy(d, host.data(), static_cast<size_t>(n) * 2, cudaMemcpyHostToDevice));
  return d;
}

}  // namespace tessera::bench
