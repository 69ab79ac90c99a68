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

// Queues the copy of a [kRows][D] tile of 16-bit elements (row r at src + r src_ld in
// global memory: src_ld = D when contiguous, the packed layouts' token stride otherwise;
// src and src_ld 16-byte aligned) into shared memory at dst with row stride kLd elements;
// rows r >= valid become zeros. Thread i moves 16-byte chunks i, i + kThreads, ...: 8
// (D = 64) or 16 (D = 128) consecutive threads cover one 128/256-byte row, so the global
// reads are coalesced (within a row when strided) and the shared writes of a quarter warp
// are contiguous.
template <int D, int kRows, int kThreads, int kLd>
__device__ __forceinline__ void cp_async_tile(uint32_t dst, const uint16_t* src, int64_t src_ld, int valid) {
  constexpr int kChunks = D / 8, kRowsPerPass = kThreads / kChunks;
  static_assert((kRows * kChunks) % kThreads == 0 && kThreads % kChunks == 0, "whole rounds of rows");
  static_assert((kLd * 2) % 16 == 0, "rows 16-byte aligned");
  const unsigned tid = static_cast<unsigned>(thread_index());
  const int r0 = static_cast<int>(tid / kChunks), c = static_cast<int>(tid % kChunks);
  const uint16_t* from0 = src + r0 * src_ld + c * 8;  // this thread's chunk of row r0
#pragma unroll
  for (int j = 0; j < kRows / kRowsPerPass; ++j) {
    const int r = r0 + j * kRowsPerPass;
    const bool ok = r < valid;
    // A row past the end reads nothing; its address is the tile's first row (valid >= 1).
    const uint16_t* from = ok ? from0 + j * kRowsPerPass * src_ld : src;
    cp_async_16(dst + static_cast<uint32_t>(2 * (r * kLd + c * 8)), from, ok ? 16 : 0);
  }
}

// Queues the copy of kRows int32 (segment ids) src[0 .. kRows) into shared memory at dst,
// zeros for i >= valid: threads kFirst .. kFirst + kRows - 1, one 4-byte copy each.
template <int kRows, int kFirst = 0>
__device__ __forceinline__ void cp_async_ids(uint32_t dst, const int32_t* src, int valid) {
  const int i = thread_index() - kFirst;
  if (i >= 0 && i < kRows) cp_async_4(dst + 4 * i, src + (i < valid ? i : 0), i < valid ? 4 : 0);
}

// The CTA-uniform pointers a main loop needs once per tile (the K/V rows of the kv head
// and its segment ids, for the forward and dQ kernels), kept in shared memory rather than
// registers, where the MMA fragments fill the 128-register budget: thread 0 stores them
// before the loop's first barrier, each tile loads them after its barrier.
struct KvSources {
  const uint16_t* k;
  const uint16_t* v;
  const int32_t* seg;
};

// ---- launchers (host) ----

// Whether the v2 forward (resp. backward) applies to p on the current device: a 16-bit
// dtype, D = 64 or 128, no mask, T and S below 2^31 - 256 (32-bit positions in the
// kernels), enough shared memory per block. The caller checks the alignment of pointers
// and strides (16 bytes) and sm_80+.
bool forward_v2_applies(DType dtype, const Params& p);
bool backward_v2_applies(DType dtype, const Params& p);

// The v2 forward. Returns false (launching nothing) when it does not apply, so the caller
// runs v1.
bool launch_forward_v2(DType dtype, const Params& p, cudaStream_t stream);

// The v2 backward's dK/dV and dQ kernels (flash_attention_backward_v2.cu); p.delta must
// already hold delta. False: nothing launched, run v1.
bool launch_backward_v2(DType dtype, const Params& p, cudaStream_t stream);

}  // namespace tessera::cuda::flash
