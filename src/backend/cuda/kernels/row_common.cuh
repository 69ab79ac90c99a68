// Private device helpers of the row-wise kernels (norm.cu, softmax.cu,
// cross_entropy.cu, gemm.cu): element types and their float conversions, 16-byte
// vector loads/stores, deterministic block reductions, and launch shapes.
//
// Every reduction here combines values in a fixed order (warp butterflies, then the
// warps' partials in warp order), so a kernel's result does not depend on timing.
// Block sizes are always a multiple of 32 (full warps: the shuffles use a full mask).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "backend/cuda/kernels/cuda_check.h"
#include "tessera/base/dtype.h"

namespace tessera::cuda::rows {

// ---- element types ----

template <typename T>
inline constexpr bool kIsHalf = std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>;

// The type arithmetic happens in (accumulation_dtype): double for double, else float.
template <typename T>
using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <typename A, typename T>
__device__ __forceinline__ A to_acc(T v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return static_cast<A>(__bfloat162float(v));
  } else if constexpr (std::is_same_v<T, __half>) {
    return static_cast<A>(__half2float(v));
  } else {
    return static_cast<A>(v);
  }
}

// Rounds to nearest even (as the host's float_to_bf16 / float_to_f16 do).
template <typename T, typename A>
__device__ __forceinline__ T from_acc(A v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(static_cast<float>(v));
  } else if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}

template <typename A>
__device__ __forceinline__ A exp_(A x) {
  if constexpr (std::is_same_v<A, double>) {
    return exp(x);
  } else {
    return expf(x);  // full precision (the build does not use --use_fast_math)
  }
}
template <typename A>
__device__ __forceinline__ A log_(A x) {
  if constexpr (std::is_same_v<A, double>) {
    return log(x);
  } else {
    return logf(x);
  }
}
template <typename A>
__device__ __forceinline__ A sqrt_(A x) {
  if constexpr (std::is_same_v<A, double>) {
    return sqrt(x);
  } else {
    return sqrtf(x);
  }
}
template <typename A>
__device__ __forceinline__ A neg_inf() {
  if constexpr (std::is_same_v<A, double>) {
    return -__longlong_as_double(0x7ff0000000000000LL);
  } else {
    return -__int_as_float(0x7f800000);
  }
}
template <typename A>
__device__ __forceinline__ A quiet_nan() {
  if constexpr (std::is_same_v<A, double>) {
    return __longlong_as_double(0x7ff8000000000000LL);
  } else {
    return __int_as_float(0x7fc00000);
  }
}

// ---- 16-byte vectors ----

// Elements per 16-byte vector.
template <typename T>
inline constexpr int kVec = static_cast<int>(16 / sizeof(T));

template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// Loads V elements at p (p must be aligned to V elements) as A.
template <int V, typename A, typename T>
__device__ __forceinline__ void load_vec(const T* p, A (&out)[V]) {
  const Pack<T, V> pk = *reinterpret_cast<const Pack<T, V>*>(p);
#pragma unroll
  for (int k = 0; k < V; ++k) out[k] = to_acc<A>(pk.v[k]);
}

template <int V, typename T, typename A>
__device__ __forceinline__ void store_vec(T* p, const A (&in)[V]) {
  Pack<T, V> pk;
#pragma unroll
  for (int k = 0; k < V; ++k) pk.v[k] = from_acc<T>(in[k]);
  *reinterpret_cast<Pack<T, V>*>(p) = pk;
}

// Elements before the first 16-byte boundary of a row starting at p (at most cols):
// with V == 1 there is no vector part and the head is empty.
template <int V, typename T>
__device__ __forceinline__ int64_t row_head(const T* p, int64_t cols) {
  if constexpr (V == 1) {
    return 0;
  } else {
    const uintptr_t mis = reinterpret_cast<uintptr_t>(p) % 16u;
    const int64_t head = mis == 0 ? 0 : static_cast<int64_t>((16u - mis) / sizeof(T));
    return head < cols ? head : cols;
  }
}

// Visits a row of `cols` elements starting at `row` with the block's threads: the
// elements before the first 16-byte boundary one by one, then whole 16-byte vectors,
// then the tail one by one. f(j, width) gets the first column and a
// std::integral_constant width (1 or V). Buffers that are read or written alongside
// must be congruent to `row` modulo 16 bytes (congruent16) when V > 1.
template <int V, typename T, typename F>
__device__ __forceinline__ void row_segments(const T* row, int64_t cols, F&& f) {
  const int64_t head = row_head<V>(row, cols);
  const int64_t nvec = (cols - head) / V;
  for (int64_t j = threadIdx.x; j < head; j += blockDim.x) f(j, std::integral_constant<int, 1>{});
  for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) f(head + v * V, std::integral_constant<int, V>{});
  for (int64_t j = head + nvec * V + threadIdx.x; j < cols; j += blockDim.x) f(j, std::integral_constant<int, 1>{});
}

// ---- deterministic block reductions (blockDim.x a multiple of 32) ----

template <typename A>
__device__ __forceinline__ A warp_sum(A v) {
  // Butterfly: every lane ends with the same bits (a + b == b + a exactly).
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block; every thread gets the result. `shared` holds >= 33 values and is
// only this function's (consecutive calls may reuse it: the result slot is separate
// from the partial slots, see the comment inside).
template <typename A>
__device__ __forceinline__ A block_sum(A v, A* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    A r = lane < warps ? shared[lane] : A(0);
    r = warp_sum(r);
    if (lane == 0) shared[32] = r;
  }
  __syncthreads();
  // A later call writes shared[0..31] before its first barrier and shared[32] only after
  // it, and no thread passes that barrier before every thread has read shared[32] here.
  return shared[32];
}

// Online softmax statistics: the running max m and s = sum exp(x - m).
template <typename A>
struct MaxSum {
  A m, s;
};

template <typename A>
__device__ __forceinline__ MaxSum<A> maxsum_init() {
  return {neg_inf<A>(), A(0)};
}

// Adds one element. -inf elements add exp(-inf) = 0 (also while m is still -inf, where
// exp(x - m) would be NaN); a NaN element makes s NaN.
template <typename A>
__device__ __forceinline__ void maxsum_add(MaxSum<A>& a, A x) {
  if (x > a.m) {
    a.s = a.s * exp_(a.m - x) + A(1);  // a.m = -inf: 0 * 0 + 1
    a.m = x;
  } else if (x != neg_inf<A>()) {
    a.s += exp_(x - a.m);
  }
}

// Combines two partial statistics (either may be empty: s == 0).
template <typename A>
__device__ __forceinline__ MaxSum<A> maxsum_combine(MaxSum<A> a, MaxSum<A> b) {
  const A m = a.m > b.m ? a.m : b.m;
  const A sa = a.s == A(0) ? A(0) : a.s * exp_(a.m - m);
  const A sb = b.s == A(0) ? A(0) : b.s * exp_(b.m - m);
  return {m, sa + sb};
}

template <typename A>
__device__ __forceinline__ MaxSum<A> warp_maxsum(MaxSum<A> v) {
  // Butterfly with a symmetric combine: both lanes of a pair compute the same values.
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    MaxSum<A> other{__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)};
    // Order the pair by lane so both lanes combine (lower lane, upper lane).
    v = (threadIdx.x & o) ? maxsum_combine(other, v) : maxsum_combine(v, other);
  }
  return v;
}

// Block-wide statistics; every thread gets the result. shared_m / shared_s: >= 33 each.
template <typename A>
__device__ __forceinline__ MaxSum<A> block_maxsum(MaxSum<A> v, A* shared_m, A* shared_s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_maxsum(v);
  if (lane == 0) {
    shared_m[warp] = v.m;
    shared_s[warp] = v.s;
  }
  __syncthreads();
  if (warp == 0) {
    MaxSum<A> r = lane < warps ? MaxSum<A>{shared_m[lane], shared_s[lane]} : maxsum_init<A>();
    r = warp_maxsum(r);
    if (lane == 0) {
      shared_m[32] = r.m;
      shared_s[32] = r.s;
    }
  }
  __syncthreads();
  return {shared_m[32], shared_s[32]};
}

// ---- launch shapes ----

// Threads for a block working on one row of `units` vectors: a power of two in [32, cap].
inline int block_threads(int64_t units, int cap = 512) {
  int t = 32;
  while (t < cap && t < units) t *= 2;
  return t;
}

// Blocks for block-per-row kernels (they loop over rows with a grid stride).
inline unsigned row_blocks(int64_t rows) {
  const int64_t cap = int64_t{1} << 20;
  return static_cast<unsigned>(rows < 1 ? 1 : (rows < cap ? rows : cap));
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16u == 0; }
// Same offset within a 16-byte line: rows of equal stride then split identically.
inline bool congruent16(const void* a, const void* b) {
  return reinterpret_cast<uintptr_t>(a) % 16u == reinterpret_cast<uintptr_t>(b) % 16u;
}

// Calls fn(T{}) with the CUDA element type of a float dtype; others are a DTypeError.
template <typename Fn>
void dispatch_float(DType dtype, const char* op, Fn&& fn) {
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
    default:
      throw_dtype_error(std::string(op) + ": unsupported dtype (got " + std::string(name(dtype)) +
                        "; expected float32, bfloat16, float16 or float64)");
  }
}

}  // namespace tessera::cuda::rows
