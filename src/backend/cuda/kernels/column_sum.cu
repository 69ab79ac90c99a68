// Column reduction kernels (see column_sum.h for the units, the order of every sum and
// the cost).
#include <algorithm>

#include "backend/cuda/kernels/column_sum.h"
#include "backend/cuda/kernels/launch_config.h"
#include "backend/cuda/kernels/reduce_element.cuh"

namespace tessera::cuda {
namespace {

using namespace reduce_element;  // NOLINT(build/namespaces): the shared element helpers

constexpr int kColumnLanes = 32;                    // threads across a strip (a warp)
constexpr int kRowLanes = 8;                        // threads down a chunk
constexpr int kThreads = kColumnLanes * kRowLanes;  // 256
constexpr int kBatch = 4;                           // rows a thread loads before it adds them
constexpr unsigned int kMaxBlocks = 4096;           // grid cap (the kernels stride over units)
constexpr int kVectorBytes = 16;

template <typename T>
constexpr int kVecOf = kVectorBytes / static_cast<int>(sizeof(T));

// 32-bit word k of a 16-byte vector (k is a constant after unrolling).
__device__ __forceinline__ unsigned int word32(const uint4& w, int k) {
  return k == 0 ? w.x : k == 1 ? w.y : k == 2 ? w.z : w.w;
}

// Element i of a 16-byte vector of T, as its accumulator (little-endian lanes).
template <typename T>
__device__ __forceinline__ Acc<T> element(const uint4& w, int i) {
  if constexpr (std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>) {
    const unsigned int u = word32(w, i / 2);
    const unsigned short bits = static_cast<unsigned short>((i & 1) != 0 ? u >> 16 : u & 0xffffu);
    return widen_half<T>(bits);
  } else if constexpr (std::is_same_v<T, float>) {
    return __uint_as_float(word32(w, i));
  } else {
    static_assert(std::is_same_v<T, double>);
    return __hiloint2double(static_cast<int>(word32(w, 2 * i + 1)), static_cast<int>(word32(w, 2 * i)));
  }
}

// Pass 1. Unit u = (o * chunks + k) * strips + s: strip s (columns [s 32 V, +32 V)) of
// chunk k (rows [k chunk_len, +chunk_len)) of x[o]. V = kVecOf<T> takes 16-byte loads
// (the launcher checks that x is 16-byte aligned and V divides inner), V = 1 scalar
// ones. Thread (tx, ty) adds rows r0 + ty, r0 + ty + 8, ... of its V columns in row
// order, loading kBatch rows before adding them (loads in flight); row lane 0..7's sums
// are then combined in lane order.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    column_chunks_kernel(ReduceOp op, const T* __restrict__ x, T* __restrict__ out, Acc<T>* __restrict__ partial,
                         int64_t outer, int64_t len, int64_t inner, int64_t chunk_len, int64_t chunks, int64_t strips) {
  using A = Acc<T>;
  constexpr int kStrip = kColumnLanes * V;
  __shared__ A lanes[kRowLanes][kStrip];
  const int tx = static_cast<int>(threadIdx.x) % kColumnLanes, ty = static_cast<int>(threadIdx.x) / kColumnLanes;
  const int64_t units = outer * chunks * strips;
  for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {  // uniform over the block
    const int64_t s = u % strips, ok = u / strips;
    const int64_t k = ok % chunks, o = ok / chunks;
    const int64_t c0 = s * kStrip + static_cast<int64_t>(tx) * V;  // this thread's first column
    const int64_t r0 = k * chunk_len, r1 = std::min(len, r0 + chunk_len);
    A acc[V];
#pragma unroll
    for (int i = 0; i < V; ++i) acc[i] = identity<A>(op);
    if (c0 < inner) {  // V divides inner: all V columns are in range, or none
      const T* column = x + o * len * inner + c0;
      for (int64_t r = r0 + ty; r < r1; r += kRowLanes * kBatch) {
        if constexpr (V == 1) {
          A v[kBatch];
#pragma unroll
          for (int b = 0; b < kBatch; ++b) {
            const int64_t row = r + static_cast<int64_t>(b) * kRowLanes;
            if (row < r1) v[b] = load(column, row * inner);
          }
#pragma unroll
          for (int b = 0; b < kBatch; ++b)
            if (r + static_cast<int64_t>(b) * kRowLanes < r1) acc[0] = combine(op, acc[0], v[b]);
        } else {
          uint4 w[kBatch];
#pragma unroll
          for (int b = 0; b < kBatch; ++b) {
            const int64_t row = r + static_cast<int64_t>(b) * kRowLanes;
            if (row < r1) w[b] = __ldg(reinterpret_cast<const uint4*>(column + row * inner));
          }
#pragma unroll
          for (int b = 0; b < kBatch; ++b)
            if (r + static_cast<int64_t>(b) * kRowLanes < r1) {
#pragma unroll
              for (int i = 0; i < V; ++i) acc[i] = combine(op, acc[i], element<T>(w[b], i));
            }
        }
      }
    }
#pragma unroll
    for (int i = 0; i < V; ++i) lanes[ty][tx * V + i] = acc[i];
    __syncthreads();
    for (int c = static_cast<int>(threadIdx.x); c < kStrip; c += kThreads) {
      const int64_t column = s * kStrip + c;
      if (column < inner) {
        A v = lanes[0][c];
#pragma unroll
        for (int j = 1; j < kRowLanes; ++j) v = combine(op, v, lanes[j][c]);
        if (chunks == 1)
          store(out, o * inner + column, v);
        else
          partial[ok * inner + column] = v;  // ok = o * chunks + k
      }
    }
    __syncthreads();  // lanes is reused by the block's next unit
  }
}

// Pass 2: partial [outer, chunks, inner] -> out [outer, inner]. Unit u = o * groups + g:
// columns [g 32, +32) of x[o]. Thread (tx, ty) adds chunks ty, ty + 8, ... of column
// g 32 + tx in chunk order; the 8 row lanes are combined in lane order.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    column_finish_kernel(ReduceOp op, const Acc<T>* __restrict__ partial, T* __restrict__ out, int64_t outer,
                         int64_t inner, int64_t chunks) {
  using A = Acc<T>;
  __shared__ A lanes[kRowLanes][kColumnLanes];
  const int tx = static_cast<int>(threadIdx.x) % kColumnLanes, ty = static_cast<int>(threadIdx.x) / kColumnLanes;
  const int64_t groups = (inner + kColumnLanes - 1) / kColumnLanes;
  for (int64_t u = blockIdx.x; u < outer * groups; u += gridDim.x) {  // uniform over the block
    const int64_t o = u / groups, column = (u - o * groups) * kColumnLanes + tx;
    A acc = identity<A>(op);
    if (column < inner) {
      const A* p = partial + o * chunks * inner + column;
#pragma unroll 4
      for (int64_t k = ty; k < chunks; k += kRowLanes) acc = combine(op, acc, p[k * inner]);
    }
    lanes[ty][tx] = acc;
    __syncthreads();
    if (ty == 0 && column < inner) {
      A v = lanes[0][tx];
#pragma unroll
      for (int j = 1; j < kRowLanes; ++j) v = combine(op, v, lanes[j][tx]);
      store(out, o * inner + column, v);
    }
    __syncthreads();  // lanes is reused by the block's next unit
  }
}

unsigned int blocks_for(int64_t units) { return static_cast<unsigned int>(std::clamp<int64_t>(units, 1, kMaxBlocks)); }

template <typename T>
void launch(ReduceOp op, int64_t outer, int64_t len, int64_t inner, int64_t chunk_len, int64_t chunks, const void* xv,
            void* outv, void* scratch, cudaStream_t s) {
  const T* x = static_cast<const T*>(xv);
  T* out = static_cast<T*>(outv);
  Acc<T>* partial = static_cast<Acc<T>*>(scratch);
  constexpr int V = kVecOf<T>;
  if (inner % V == 0 && aligned_to(x, kVectorBytes)) {
    const int64_t strips = (inner + kColumnLanes * V - 1) / (kColumnLanes * V);
    column_chunks_kernel<T, V><<<blocks_for(outer * chunks * strips), kThreads, 0, s>>>(
        op, x, out, partial, outer, len, inner, chunk_len, chunks, strips);
  } else {
    const int64_t strips = (inner + kColumnLanes - 1) / kColumnLanes;
    column_chunks_kernel<T, 1><<<blocks_for(outer * chunks * strips), kThreads, 0, s>>>(
        op, x, out, partial, outer, len, inner, chunk_len, chunks, strips);
  }
  if (chunks > 1) {
    const int64_t groups = (inner + kColumnLanes - 1) / kColumnLanes;
    column_finish_kernel<T><<<blocks_for(outer * groups), kThreads, 0, s>>>(op, partial, out, outer, inner, chunks);
  }
}

}  // namespace

bool column_sum_applies(DType dtype, int64_t inner) {
  const bool is_float =
      dtype == DType::Float32 || dtype == DType::BFloat16 || dtype == DType::Float16 || dtype == DType::Float64;
  return is_float && inner >= kColumnSumMinColumns;
}

void plan_column_sum(DType dtype, int64_t outer, int64_t len, int64_t inner, int64_t* chunk_len, int64_t* chunks) {
  // Units of the vectorized kernel without chunking; chunks enough to make about
  // kColumnSumTargetUnits, each of at least kColumnSumMinChunkRows rows (a multiple of
  // the row lanes, so that every lane has as many rows).
  const int64_t strip = kColumnLanes * (kVectorBytes / static_cast<int64_t>(itemsize(dtype)));
  const int64_t strips = (inner + strip - 1) / strip;
  const int64_t wanted = std::max<int64_t>(1, (kColumnSumTargetUnits + outer * strips - 1) / (outer * strips));
  int64_t rows = std::max(kColumnSumMinChunkRows, (len + wanted - 1) / wanted);
  rows = (rows + kRowLanes - 1) / kRowLanes * kRowLanes;
  *chunk_len = rows;
  *chunks = (len + rows - 1) / rows;
}

cudaError_t column_sum(ReduceOp op, DType dtype, int64_t outer, int64_t len, int64_t inner, int64_t chunk_len,
                       int64_t chunks, const void* x, void* out, void* scratch, cudaStream_t stream) {
  switch (dtype) {
    case DType::Float32:
      launch<float>(op, outer, len, inner, chunk_len, chunks, x, out, scratch, stream);
      break;
    case DType::BFloat16:
      launch<bfloat16>(op, outer, len, inner, chunk_len, chunks, x, out, scratch, stream);
      break;
    case DType::Float16:
      launch<float16>(op, outer, len, inner, chunk_len, chunks, x, out, scratch, stream);
      break;
    case DType::Float64:
      launch<double>(op, outer, len, inner, chunk_len, chunks, x, out, scratch, stream);
      break;
    default:
      return cudaErrorInvalidValue;  // column_sum_applies() is false: reduce.cu never plans it
  }
  return cudaGetLastError();
}

}  // namespace tessera::cuda
