// Device building blocks shared by flash_attention_forward.cu and
// flash_attention_backward.cu (internal to the two; not a public header).
//
// Two groups:
//  * Hardware primitives (the only CUDA-specific code the kernels call): thread and
//    block index, __syncthreads, warp shuffles, dynamic shared memory, the tensor-core
//    MMA (mma.sync m16n8k16, inline PTX) and the launch. They sit behind
//    TESSERA_FLASH_HOST_EMULATION so that a host emulation (CPU fibers standing in for
//    CUDA threads, the MMA evaluated from its documented fragment layout) can provide
//    them instead and run the kernels' index math on a machine without a GPU. (Such an
//    emulation, with randomized warp scheduling to expose missing barriers, was used to
//    check these kernels against a float64 reference before they first ran on a GPU;
//    tools/flash_attention_emulation.cpp is such an emulation, for v1 and v2.)
//  * Plain device helpers built on them: dtype conversions, packing two floats into the
//    16-bit pair an MMA operand register holds, warp reductions, tile loads.
//
// The MMA fragment layout (PTX ISA, "Matrix Fragments for mma.m16n8k16", 16-bit A/B,
// fp32 C/D), for lane l of the warp with g = l / 4 (group) and t = l % 4 (thread in
// group); a "pair" is two 16-bit elements in one 32-bit register, the lower column/row
// index in the low half:
//   A (16 x 16, row-major M x K): a[0] = A[g][2t..2t+1]      a[1] = A[g+8][2t..2t+1]
//                                 a[2] = A[g][2t+8..2t+9]    a[3] = A[g+8][2t+8..2t+9]
//   B (16 x 8, K x N):            b[0] = B[2t..2t+1][g]      b[1] = B[2t+8..2t+9][g]
//   C (16 x 8, fp32):             c[0], c[1] = C[g][2t], C[g][2t+1]
//                                 c[2], c[3] = C[g+8][2t], C[g+8][2t+1]
// So the C fragments of two adjacent 16 x 8 tiles (columns 16j..16j+7 and 16j+8..16j+15)
// are exactly the A fragment of the 16 x 16 block they form (FlashAttention-2's register
// reuse of P as the A operand of P V): a[0] = pack(c0[0], c0[1]), a[1] = pack(c0[2],
// c0[3]), a[2] = pack(c1[0], c1[1]), a[3] = pack(c1[2], c1[3]).
// B[k][n] pairs along k: when B = X^T for a row-major X[n][k] (K in Q K^T) a pair is two
// adjacent elements of one row of X (one 32-bit load); when B = Y for a row-major Y[k][n]
// (V in P V) the kernels keep a transposed copy Y^T in shared memory for the same reason.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

// Not tessera/base/error.h: nvcc cannot compile fmt, so errors go through the plain
// throw_* functions of cuda_check.h.
#include "backend/cuda/kernels/cuda_check.h"
#include "backend/cuda/kernels/flash_attention.h"

namespace tessera::cuda::flash {

inline constexpr float kLog2e = 1.4426950408889634f;  // log2(e): e^x = 2^(x log2 e)
inline constexpr float kLn2 = 0.6931471805599453f;    // ln(2)

// Everything a kernel needs, passed by value (kernel parameter space). Layouts as in
// flash_attention.h: row (b, h, t) of q and dq at b qs.batch + (h / G) qs.group +
// (h % G) qs.head + t qs.row, of out and dout at b os.batch + h os.head + t os.row; row
// (b, kvh, s) of k, v, dk, dv at b kvs.batch + kvh kvs.head + s kvs.row; lse, delta
// [B, H, T] (float32). make_params sets the contiguous strides ([B, H, T, D],
// [B, Hkv, S, D]), the only ones the v1 and fp32 kernels take; the v2 kernels and the
// delta kernel honour any. The strides stay in parameter space (the constant bank), read
// where used rather than held in registers.
struct Params {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* out = nullptr;   // backward: the forward's output (delta)
  const void* dout = nullptr;  // backward
  void* o = nullptr;           // forward: the output
  float* lse = nullptr;        // forward: written; backward: read
  float* delta = nullptr;      // backward: written by the delta kernel, then read
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  const uint8_t* mask = nullptr;  // Bool, true = attend; null: none
  int64_t mask_b_stride = 0, mask_h_stride = 0;
  const int32_t* segments = nullptr;  // [B, T] document ids (T == S); null: none
  int64_t B = 0, H = 0, Hkv = 0, T = 0, S = 0;
  FlashAttentionStrides qs, kvs, os;  // elements
  int D = 0;
  int causal = 0;
  float scale = 1.0f;
};

#ifndef TESSERA_FLASH_HOST_EMULATION

// ---- hardware primitives ----

__device__ __forceinline__ int thread_index() { return static_cast<int>(threadIdx.x); }
__device__ __forceinline__ int64_t block_index() { return static_cast<int64_t>(blockIdx.x); }
__device__ __forceinline__ void cta_sync() { __syncthreads(); }
// The block index again, opaque to the compiler (a volatile read it cannot merge with an
// earlier block_index()): a kernel recomputes what it derives from it in its epilogue
// instead of holding the values in registers through its main loop.
__device__ __forceinline__ int64_t block_index_again() {
  unsigned x;
  asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(x));
  return static_cast<int64_t>(x);
}

__device__ __forceinline__ unsigned char* dynamic_smem() {
  extern __shared__ __align__(16) unsigned char flash_smem[];
  return flash_smem;
}

// Full-warp shuffles: every call site is reached by all 32 lanes.
__device__ __forceinline__ float shfl_xor(float v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }
__device__ __forceinline__ float shfl_idx(float v, int src) { return __shfl_sync(0xffffffffu, v, src); }

// d += A B for one 16 x 8 x 16 tile (fragments as in the header comment), fp32
// accumulators; T = __nv_bfloat16 or __half selects the input type.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]);

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4],
                                                         const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // the launchers never pick the tensor-core kernels below sm_80
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

template <>
__device__ __forceinline__ void mma_16816<__half>(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// Launches kernel<<<blocks, threads, smem, stream>>>(params) (a 1-D grid; nothing when
// blocks == 0; P is Params but for the row copy). Dynamic shared memory above the default
// 48 KiB must be opted into per kernel (and per device), so the attribute is set on every
// launch that needs it (a host-side call, allowed while a stream is being captured).
template <typename P>
void launch(void (*kernel)(P), int64_t blocks, int threads, size_t smem, cudaStream_t stream, const P& params) {
  if (blocks == 0) return;
  if (blocks > INT32_MAX)
    throw_value_error("flash_attention: " + std::to_string(blocks) + " thread blocks exceed the grid limit (2^31 - 1)");
  if (smem > 48 * 1024)
    TESSERA_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  kernel<<<static_cast<unsigned>(blocks), threads, smem, stream>>>(params);
  TESSERA_CUDA_CHECK(cudaGetLastError());
}

// Compute capability (major) of the current device.
inline int current_sm_major() {
  int device = 0, major = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&device));
  TESSERA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return major;
}

#endif  // TESSERA_FLASH_HOST_EMULATION

// ---- helpers ----

__host__ __device__ constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}

// Two floats rounded to T and packed into one 32-bit register, `lo` in the low half
// (the element with the smaller row/column index in an MMA fragment).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x = lo (low half), .y = hi
  uint32_t u;
  memcpy(&u, &v, sizeof(u));
  return u;
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  uint32_t u;
  memcpy(&u, &v, sizeof(u));
  return u;
}

// 32 bits (two 16-bit elements) at p, 4-byte aligned: shared-memory fragment loads and
// the packed output stores.
__device__ __forceinline__ uint32_t ld32(const uint16_t* p) { return *reinterpret_cast<const uint32_t*>(p); }
__device__ __forceinline__ void st32(uint16_t* p, uint32_t v) { *reinterpret_cast<uint32_t*>(p) = v; }

// Butterfly reductions over the 32 lanes of a warp. Each step combines a lane with its
// xor partner symmetrically, so every lane ends with the bitwise same value.
__device__ __forceinline__ float warp_sum(float v) {
  for (int m = 16; m >= 1; m /= 2) v += shfl_xor(v, m);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int m = 16; m >= 1; m /= 2) v = fmaxf(v, shfl_xor(v, m));
  return v;
}
// Over the 4 lanes of a group (lanes 4g..4g+3: the lanes that hold one row of an MMA
// C fragment).
__device__ __forceinline__ float quad_sum(float v) {
  v += shfl_xor(v, 1);
  return v + shfl_xor(v, 2);
}
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, shfl_xor(v, 1));
  return fmaxf(v, shfl_xor(v, 2));
}

// ---- tile loads (16-bit tensor-core kernels) ----
// Rows are D 16-bit elements (D a multiple of 8, source 16-byte aligned), moved in
// 16-byte chunks of 8 elements. Rows r >= valid (past the end of the sequence) are
// zero-filled: padded keys/queries then contribute exact zeros, never stale data.

// dst[r * ld + c] = src[r * D + c] for r < kRows (ld a multiple of 8).
template <int D, int kRows, int kThreads>
__device__ __forceinline__ void load_tile(uint16_t* dst, int ld, const uint16_t* src, int valid) {
  constexpr int kChunks = D / 8;
  for (int i = thread_index(); i < kRows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks;
    uint4 val = {0, 0, 0, 0};
    if (r < valid) val = *reinterpret_cast<const uint4*>(src + static_cast<int64_t>(r) * D + c * 8);
    *reinterpret_cast<uint4*>(dst + r * ld + c * 8) = val;
  }
}

// The transpose: dst[c * ld + r] = src[r * D + c] for r < kRows, c < D. Consecutive
// threads take consecutive rows r, so each of the 8 scalar stores of a chunk writes
// consecutive 16-bit words across the warp (no bank conflicts).
template <int D, int kRows, int kThreads>
__device__ __forceinline__ void load_tile_transposed(uint16_t* dst, int ld, const uint16_t* src, int valid) {
  constexpr int kChunks = D / 8;
  for (int i = thread_index(); i < kRows * kChunks; i += kThreads) {
    const int r = i % kRows, c = i / kRows;
    uint4 val = {0, 0, 0, 0};
    if (r < valid) val = *reinterpret_cast<const uint4*>(src + static_cast<int64_t>(r) * D + c * 8);
    uint16_t e[8];
    memcpy(e, &val, sizeof(e));
    for (int j = 0; j < 8; ++j) dst[(c * 8 + j) * ld + r] = e[j];
  }
}

// ---- tile loads (float32 CUDA-core kernels, any D) ----
// dst[r * ld + c] = mul * float(src[r * D + c]) for r < rows, c < D; 0 for r >= valid.
template <typename T>
__device__ __forceinline__ void load_tile_float(float* dst, int ld, const T* src, int D, int rows, int valid, float mul,
                                                int threads) {
  for (int i = thread_index(); i < rows * D; i += threads) {
    const int r = i / D, c = i % D;
    dst[r * ld + c] = r < valid ? mul * to_float(src[static_cast<int64_t>(r) * D + c]) : 0.0f;
  }
}

// ---- host side: argument checks and the choice of kernels ----

// The arguments shared by the forward and the backward (mirrors the CPU kernels' checks).
inline void validate(const char* op, DType dtype, const FlashAttentionShape& sh) {
  const std::string name_of_op(op);
  if (dtype != DType::Float32 && dtype != DType::BFloat16 && dtype != DType::Float16)
    throw_dtype_error(name_of_op + ": unsupported dtype " + std::string(name(dtype)) +
                      " on CUDA (expected float32, bfloat16 or float16)");
  if (sh.batch < 0 || sh.q_len < 0 || sh.kv_len < 0 || sh.head_dim < 0)
    throw_value_error(name_of_op + ": negative size (got batch=" + std::to_string(sh.batch) +
                      ", q_len=" + std::to_string(sh.q_len) + ", kv_len=" + std::to_string(sh.kv_len) +
                      ", head_dim=" + std::to_string(sh.head_dim) + ")");
  if (sh.heads < 1 || sh.kv_heads < 1 || sh.heads % sh.kv_heads != 0)
    throw_value_error(name_of_op + ": heads=" + std::to_string(sh.heads) +
                      " is not a positive multiple of kv_heads=" + std::to_string(sh.kv_heads));
  if (sh.head_dim > 256)
    throw_value_error(name_of_op + ": head_dim " + std::to_string(sh.head_dim) +
                      " is not supported on CUDA (expected at most 256)");
  if (!std::isfinite(sh.scale))
    throw_value_error(name_of_op + ": scale must be finite (got " + std::to_string(sh.scale) + ")");
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The tensor-core kernels: 16-bit inputs, D = 64 or 128, no mask, sm_80 or newer; with
// segment ids only the v2 kernels (tensor_core_v1_shape: the v1 kernels take none).
inline bool tensor_core_shape(DType dtype, const FlashAttentionShape& sh) {
  return (dtype == DType::BFloat16 || dtype == DType::Float16) && (sh.head_dim == 64 || sh.head_dim == 128) &&
         sh.mask == nullptr && current_sm_major() >= 8;
}
inline bool tensor_core_v1_shape(DType dtype, const FlashAttentionShape& sh) {
  return tensor_core_shape(dtype, sh) && sh.segments == nullptr;
}

// The checks of the strided entry points that need neither pointers nor Params: the v2
// kernels are selected (TESSERA_ATTENTION_KERNEL) and apply to dtype and shape, and every
// stride whose index can be nonzero keeps rows 16-byte aligned (8 16-bit elements), as
// cp.async needs.
inline bool strided_v2_shape(DType dtype, const FlashAttentionShape& sh, const FlashAttentionLayout& l) {
  if (!tensor_core_shape(dtype, sh) || flash_attention_kernel() != FlashAttentionKernel::V2) return false;
  const auto ok = [](int64_t stride, int64_t extent) { return extent <= 1 || stride % 8 == 0; };
  const int64_t G = sh.heads / sh.kv_heads;
  return ok(l.q.batch, sh.batch) && ok(l.q.group, sh.kv_heads) && ok(l.q.head, G) && ok(l.q.row, sh.q_len) &&
         ok(l.kv.batch, sh.batch) && ok(l.kv.head, sh.kv_heads) && ok(l.kv.row, sh.kv_len) && ok(l.o.batch, sh.batch) &&
         ok(l.o.head, sh.heads) && ok(l.o.row, sh.q_len);
}

// Params common to both directions.
inline Params make_params(const FlashAttentionShape& sh) {
  Params p;
  p.B = sh.batch;
  p.H = sh.heads;
  p.Hkv = sh.kv_heads;
  p.T = sh.q_len;
  p.S = sh.kv_len;
  p.D = static_cast<int>(sh.head_dim);
  p.causal = sh.causal ? 1 : 0;
  p.scale = static_cast<float>(sh.scale);
  p.mask = static_cast<const uint8_t*>(sh.mask);
  p.mask_b_stride = sh.mask_b_stride;
  p.mask_h_stride = sh.mask_h_stride;
  p.segments = sh.segments;
  const FlashAttentionLayout layout = contiguous_attention_layout(sh);
  p.qs = layout.q;
  p.kvs = layout.kv;
  p.os = layout.o;
  return p;
}

// The fp32 kernels spread a row of head_dim over the 32 lanes of a warp, kDPL elements
// per lane (d = lane + 32 i); they are instantiated for kDPL = 1, 2, 4, 8 (D <= 32, 64,
// 128, 256).
inline int dims_per_lane(int64_t D) { return D <= 32 ? 1 : D <= 64 ? 2 : D <= 128 ? 4 : 8; }

}  // namespace tessera::cuda::flash
