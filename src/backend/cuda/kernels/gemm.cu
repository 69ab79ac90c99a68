// The CUDA kernels behind gemm() (gemm.h): the elementwise epilogue that follows a
// GEMM when cuBLASLt cannot fuse it, and the tiled fallback GEMM.
#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "backend/cuda/kernels/gemm.h"
#include "backend/cuda/kernels/launch_config.h"
#include "backend/cuda/kernels/row_common.cuh"

namespace tessera::cuda::detail {
namespace {

using rows::Acc;

// The CPU's per-element formulas (backend/cpu/kernels/elementwise_unary.cpp).
template <typename A>
__device__ __forceinline__ A activate(A x, GemmActivation act) {
  constexpr bool kD = std::is_same_v<A, double>;
  switch (act) {
    case GemmActivation::GeluTanh: {
      const A u = A(0.7978845608028654) * (x + A(0.044715) * x * x * x);
      return A(0.5) * x * (A(1) + (kD ? tanh(u) : tanhf(u)));
    }
    case GemmActivation::GeluErf: {
      const A u = x * A(0.7071067811865476);
      return A(0.5) * x * (A(1) + (kD ? erf(u) : erff(u)));
    }
    case GemmActivation::Relu:
      return x > A(0) ? x : (x != x ? x : A(0));
    case GemmActivation::Silu:
      return x / (A(1) + rows::exp_(-x));
    case GemmActivation::Sigmoid:
      return A(1) / (A(1) + rows::exp_(-x));
    case GemmActivation::Tanh:
      return kD ? tanh(x) : tanhf(x);
    case GemmActivation::None:
      break;
  }
  return x;
}

// s, pre and out may alias (s == out, or s == pre): each element is read before it is
// written, by the same thread.
template <typename T>
__global__ void gemm_epilogue_kernel(const T* s, const T* __restrict__ bias, T* pre, T* out, int64_t total, int64_t n,
                                     GemmActivation act) {
  using A = Acc<T>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    T v = s[i];
    if (bias != nullptr) v = rows::from_acc<T>(rows::to_acc<A>(v) + rows::to_acc<A>(bias[i % n]));
    if (pre != nullptr) pre[i] = v;
    out[i] = rows::from_acc<T>(activate(rows::to_acc<A>(v), act));
  }
}

// The integer twin (bias add wrapping like the CPU's integer add; relu the only
// activation an integer product can have).
template <typename T>
__global__ void int_gemm_epilogue_kernel(const T* s, const T* __restrict__ bias, T* pre, T* out, int64_t total,
                                         int64_t n, bool relu) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    T v = s[i];
    if (bias != nullptr)
      v = static_cast<T>(static_cast<int64_t>(static_cast<uint64_t>(static_cast<int64_t>(v)) +
                                              static_cast<uint64_t>(static_cast<int64_t>(bias[i % n]))));
    if (pre != nullptr) pre[i] = v;
    out[i] = relu && !(v > T(0)) ? T(0) : v;
  }
}

// Accumulator of the fallback GEMM: float for the 16-bit floats and float32, double for
// float64, 64-bit wrapping (unsigned arithmetic) for the integers, rounded back into T
// like the CPU's native loop.
template <typename T>
using GemmAcc = std::conditional_t<std::is_integral_v<T>, uint64_t, Acc<T>>;

template <typename A, typename T>
__device__ __forceinline__ A gemm_load(T v) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<uint64_t>(static_cast<int64_t>(v));
  } else {
    return rows::to_acc<A>(v);
  }
}
template <typename T, typename A>
__device__ __forceinline__ T gemm_store(A v) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(static_cast<int64_t>(v));
  } else {
    return rows::from_acc<T>(v);
  }
}

constexpr int kTile = 16;

// One 16x16 tile of C per block and batch entry; K in steps of 16 through shared memory.
template <typename T>
__global__ void reference_gemm_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ c,
                                      int64_t batch, int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b,
                                      int64_t a_stride, int64_t b_stride) {
  using A = GemmAcc<T>;
  __shared__ A as[kTile][kTile + 1];
  __shared__ A bs[kTile][kTile + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kTile + tx;
  for (int64_t bz = blockIdx.z; bz < batch; bz += gridDim.z) {
    const T* ab = a + bz * a_stride;
    const T* bb = b + bz * b_stride;
    for (int64_t tile_row = blockIdx.y; tile_row * kTile < m; tile_row += gridDim.y) {
      const int64_t row = tile_row * kTile + ty;
      A acc = 0;
      for (int64_t k0 = 0; k0 < k; k0 += kTile) {
        const int64_t ka = k0 + tx;  // as[ty][tx] = A(row, ka)
        const int64_t kb = k0 + ty;  // bs[ty][tx] = B(kb, col)
        A av = 0, bv = 0;
        if (row < m && ka < k) av = gemm_load<A>(trans_a ? ab[ka * m + row] : ab[row * k + ka]);
        if (kb < k && col < n) bv = gemm_load<A>(trans_b ? bb[col * k + kb] : bb[kb * n + col]);
        as[ty][tx] = av;
        bs[ty][tx] = bv;
        __syncthreads();
#pragma unroll
        for (int q = 0; q < kTile; ++q) acc += as[ty][q] * bs[q][tx];
        __syncthreads();
      }
      if (row < m && col < n) c[(bz * m + row) * n + col] = gemm_store<T>(acc);
    }
  }
}

template <typename Fn>
void dispatch_gemm(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::Float32:
      fn(float{});
      break;
    case DType::BFloat16:
      fn(__nv_bfloat16{});
      break;
    case DType::Float16:
      fn(__half{});
      break;
    case DType::Float64:
      fn(double{});
      break;
    case DType::UInt8:
      fn(uint8_t{});
      break;
    case DType::Int8:
      fn(int8_t{});
      break;
    case DType::UInt32:
      fn(uint32_t{});
      break;
    case DType::Int32:
      fn(int32_t{});
      break;
    case DType::Int64:
      fn(int64_t{});
      break;
    default:
      throw_dtype_error("matmul: unsupported dtype on the GPU (got " + std::string(name(dtype)) + ")");
  }
}

}  // namespace

void launch_gemm_epilogue(DType dtype, const void* s, const void* bias, void* pre, void* out, int64_t n_rows, int64_t n,
                          GemmActivation activation, cudaStream_t stream) {
  const int64_t total = n_rows * n;
  if (total <= 0) return;
  if (is_integral(dtype)) {
    if (activation != GemmActivation::None && activation != GemmActivation::Relu)
      throw_dtype_error("matmul_epilogue: an integer product takes only relu as its activation (got " +
                        std::string(name(dtype)) + ")");
    dispatch_gemm(dtype, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_integral_v<T>) {
        int_gemm_epilogue_kernel<T><<<grid_for(total, 4), kThreadsPerBlock, 0, stream>>>(
            static_cast<const T*>(s), static_cast<const T*>(bias), static_cast<T*>(pre), static_cast<T*>(out), total, n,
            activation == GemmActivation::Relu);
      }
    });
    TESSERA_CUDA_CHECK(cudaGetLastError());
    return;
  }
  rows::dispatch_float(dtype, "matmul_epilogue", [&](auto tag) {
    using T = decltype(tag);
    gemm_epilogue_kernel<T><<<grid_for(total, 4), kThreadsPerBlock, 0, stream>>>(
        static_cast<const T*>(s), static_cast<const T*>(bias), static_cast<T*>(pre), static_cast<T*>(out), total, n,
        activation);
  });
  TESSERA_CUDA_CHECK(cudaGetLastError());
}

void launch_reference_gemm(DType dtype, const GemmShape& shape, const void* a, const void* b, void* c,
                           cudaStream_t stream) {
  if (shape.batch <= 0 || shape.m <= 0 || shape.n <= 0) return;
  const int64_t tiles_n = (shape.n + kTile - 1) / kTile;
  const int64_t tiles_m = (shape.m + kTile - 1) / kTile;
  if (tiles_n > 0x7fffffff) throw_value_error("matmul: n is too large for the fallback GEMM kernel");
  const dim3 grid(static_cast<unsigned>(tiles_n), static_cast<unsigned>(tiles_m < 65535 ? tiles_m : 65535),
                  static_cast<unsigned>(shape.batch < 65535 ? shape.batch : 65535));
  const dim3 block(kTile, kTile);
  dispatch_gemm(dtype, [&](auto tag) {
    using T = decltype(tag);
    reference_gemm_kernel<T><<<grid, block, 0, stream>>>(
        static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(c), shape.batch, shape.m, shape.n, shape.k,
        shape.trans_a, shape.trans_b, shape.a_batch_stride, shape.b_batch_stride);
  });
  TESSERA_CUDA_CHECK(cudaGetLastError());
}

namespace {
// dst (dst_rows x dst_ld) = src (src_rows x src_row, row stride src_ld) in its top-left
// corner, zeros elsewhere; dst rows 16-byte aligned. Each thread moves 8 consecutive
// elements of a row: one 16-byte store, and one 16-byte load where the source rows are
// aligned too (vec_src), else 8 2-byte ones.
__global__ void pad_copy16_kernel(uint16_t* __restrict__ dst, int64_t dst_rows, int64_t dst_ld,
                                  const uint16_t* __restrict__ src, int64_t src_ld, int64_t src_rows, int64_t src_row,
                                  bool vec_src) {
  const int64_t chunks = (dst_ld + 7) / 8;
  for (int64_t r = blockIdx.y; r < dst_rows; r += gridDim.y) {
    const uint16_t* srow = src + r * src_ld;
    uint16_t* drow = dst + r * dst_ld;
    const bool have_row = r < src_rows;
    for (int64_t ch = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; ch < chunks;
         ch += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const int64_t c0 = ch * 8;
      uint16_t v[8];
      if (have_row && vec_src && c0 + 8 <= src_row) {
        const uint4 w = *reinterpret_cast<const uint4*>(srow + c0);
        memcpy(v, &w, 16);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = (have_row && c0 + e < src_row) ? srow[c0 + e] : uint16_t{0};
      }
      if (c0 + 8 <= dst_ld) {
        uint4 w;
        memcpy(&w, v, 16);
        *reinterpret_cast<uint4*>(drow + c0) = w;
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e)
          if (c0 + e < dst_ld) drow[c0 + e] = v[e];
      }
    }
  }
}

// The same for a destination whose rows are not 16-byte aligned (the padded product's
// corner copied back): lane-contiguous 2-byte accesses, so each warp instruction writes 64
// contiguous bytes (8 strided 2-byte stores per thread ran at a third of that speed).
__global__ void pad_copy16_scalar_kernel(uint16_t* __restrict__ dst, int64_t dst_rows, int64_t dst_ld,
                                         const uint16_t* __restrict__ src, int64_t src_ld, int64_t src_rows,
                                         int64_t src_row) {
  for (int64_t r = blockIdx.y; r < dst_rows; r += gridDim.y) {
    const uint16_t* srow = src + r * src_ld;
    uint16_t* drow = dst + r * dst_ld;
    const bool have_row = r < src_rows;
    for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < dst_ld;
         c += static_cast<int64_t>(gridDim.x) * blockDim.x)
      drow[c] = (have_row && c < src_row) ? srow[c] : uint16_t{0};
  }
}
}  // namespace

void launch_pad_copy16(void* dst, int64_t dst_rows, int64_t dst_ld, const void* src, int64_t src_ld, int64_t src_rows,
                       int64_t src_row, cudaStream_t stream) {
  if (dst_rows == 0 || dst_ld == 0) return;
  constexpr int kThreads = 256;
  const bool vec_src = src_ld % 8 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0;
  const bool vec_dst = dst_ld % 8 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0;
  const int64_t per_thread = vec_dst ? 8 : 1;
  const int64_t units = (dst_ld + per_thread - 1) / per_thread;
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>((units + kThreads - 1) / kThreads, 64)),
                  static_cast<unsigned>(std::min<int64_t>(dst_rows, 65535)));
  if (vec_dst) {
    pad_copy16_kernel<<<grid, kThreads, 0, stream>>>(static_cast<uint16_t*>(dst), dst_rows, dst_ld,
                                                     static_cast<const uint16_t*>(src), src_ld, src_rows, src_row,
                                                     vec_src);
  } else {
    pad_copy16_scalar_kernel<<<grid, kThreads, 0, stream>>>(
        static_cast<uint16_t*>(dst), dst_rows, dst_ld, static_cast<const uint16_t*>(src), src_ld, src_rows, src_row);
  }
  TESSERA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace tessera::cuda::detail
