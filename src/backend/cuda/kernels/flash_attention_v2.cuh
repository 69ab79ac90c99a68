// Internal to the v2 attention kernels (flash_attention_forward_v2.cu): the sm_80+
// memory primitives they add to flash_attention_common.cuh, and their launchers.
//  * cp.async (global -> shared without registers, 16 bytes per thread, zero-filling rows
//    past the end of the sequence), grouped with commit/wait so that the next key tile
//    loads while the current one is computed.
//  * ldmatrix (x4, plain and .trans): a warp's four 8 x 8 fragments in one instruction;
//    the lane address patterns are in flash_attention_fragments.h.
// Shared-memory tiles are row-major with a row stride of D + 8 elements (D = 64: 144
// bytes, D = 128: 272 bytes, both 16 mod 128): the 8 row addresses of one ldmatrix
// matrix (8 consecutive rows, same column) fall in 8 different 16-byte bank groups, so
// each matrix is one conflict-free shared-memory wavefront, and every row start stays
// 16-byte aligned for cp.async.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/kernels/flash_attention_common.cuh"
#include "tessera/base/dtype.h"

namespace tessera::cuda::flash {

#ifndef TESSERA_FLASH_HOST_EMULATION
// Hardware primitives, behind TESSERA_FLASH_HOST_EMULATION like those of
// flash_attention_common.cuh (a host emulation may provide them instead).

// The 32-bit shared-state-space address of a pointer into shared memory.
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronously; src_bytes = 0 reads nothing and writes 16
// zero bytes (the rows past the end). Both addresses 16-byte aligned.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // the launchers never pick the v2 kernels below sm_80
#else
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
#endif
}

// 4 bytes global -> shared (the float lse/delta rows, only 4-byte aligned); src_bytes = 0
// writes zeros.
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, int src_bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Waits until at most `kPending` of this thread's committed groups are still in flight.
// Other threads' copies are visible only after a barrier that follows the wait.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

// ldmatrix x4 (see flash_attention_fragments.h): r[i] = this lane's pair of matrix i.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// The most dynamic shared memory a block may opt into on the current device.
inline int max_dynamic_smem_per_block() {
  int device = 0, optin = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&device));
  TESSERA_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return optin;
}

#endif  // TESSERA_FLASH_HOST_EMULATION

// Queues the copy of a [kRows][D] tile of 16-bit elements (rows contiguous in global
// memory from src, 16-byte aligned) into shared memory at dst with row stride kLd
// elements; rows r >= valid become zeros. Thread i moves 16-byte chunks i, i + kThreads,
// ...: 8 (D = 64) or 16 (D = 128) consecutive threads cover one 128/256-byte row, so the
// global reads are coalesced and the shared writes of a quarter warp are contiguous.
template <int D, int kRows, int kThreads, int kLd>
__device__ __forceinline__ void cp_async_tile(uint32_t dst, const uint16_t* src, int valid) {
  constexpr int kChunks = D / 8;
  static_assert((kRows * kChunks) % kThreads == 0, "whole rounds of chunks");
  static_assert((kLd * 2) % 16 == 0, "rows 16-byte aligned");
#pragma unroll
  for (int j = 0; j < kRows * kChunks / kThreads; ++j) {
    const int i = thread_index() + j * kThreads;
    const int r = i / kChunks, c = i % kChunks;
    const bool ok = r < valid;
    // A row past the end reads nothing; its address is the tile's first row (valid >= 1).
    const uint16_t* from = src + static_cast<int64_t>(ok ? r : 0) * D + c * 8;
    cp_async_16(dst + static_cast<uint32_t>(2 * (r * kLd + c * 8)), from, ok ? 16 : 0);
  }
}

// ---- launchers (host) ----

// The v2 forward for 16-bit dtypes, D = 64 or 128, no mask, 16-byte aligned operands on
// sm_80+. Returns false (launching nothing) when it does not apply to p on the current
// device (other D, or not enough shared memory per block), so the caller runs v1.
bool launch_forward_v2(DType dtype, const Params& p, cudaStream_t stream);

// The v2 backward's dK/dV and dQ kernels (flash_attention_backward_v2.cu), same
// conditions; p.delta must already hold delta. False: nothing launched, run v1.
bool launch_backward_v2(DType dtype, const Params& p, cudaStream_t stream);

}  // namespace tessera::cuda::flash
