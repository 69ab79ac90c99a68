// Reduction kernels: the plans of reduce.h and arg max / arg min.
//
// Every kernel is a grid-stride loop over independent work units (rows, (row, chunk)
// pairs, columns, outputs); a unit is reduced by one thread, one warp or one block in
// a fixed order (sequential for a thread, a shuffle-down tree for a warp, warps then
// warp 0 for a block), so the result depends on the shape only, never on the grid.
// The reduce op is a kernel argument (a uniform branch), not a template parameter:
// ten dtypes x eight kernels instead of forty x eight.
#include <algorithm>

#include "backend/cuda/kernels/column_sum.h"
#include "backend/cuda/kernels/reduce.h"
#include "backend/cuda/kernels/reduce_element.cuh"

namespace tessera::cuda {
namespace {

using namespace reduce_element;  // NOLINT(build/namespaces): the shared element helpers

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 4096;
constexpr int64_t kThreadRowMax = 16;   // rows this short: a thread per row
constexpr int64_t kWarpRowMax = 1024;   // rows this short: a warp per row (else a block)
constexpr int64_t kFewRows = 256;       // fewer rows than this, when long, are cut into chunks (two passes):
constexpr int64_t kRowUnits = 512;      //   about this many (row, chunk) blocks (~4 per SM of an H100),
constexpr int64_t kRowChunkMin = 2048;  //   each of this many elements at least (8 per thread)
constexpr int64_t kLongRow = 32768;     // TESSERA_CUDA_REDUCE=legacy: rows longer than this,
constexpr int64_t kRowChunk = 16384;    //   in chunks of this
constexpr int64_t kColumnChunks = 256;  // target row chunks of a column reduction
constexpr int64_t kColumnChunkMin = 16;

// Fixed tree: lane l takes lane l + o for o = 16, 8, 4, 2, 1; the result is in lane 0.
template <typename A>
__device__ __forceinline__ A warp_reduce(ReduceOp op, A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = combine(op, v, __shfl_down_sync(0xffffffffu, v, o));
  return v;
}

// All threads of the block call it; the result is in thread 0. `shared` holds 32.
template <typename A>
__device__ __forceinline__ A block_reduce(ReduceOp op, A v, A* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_reduce(op, v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) v = warp_reduce(op, lane < static_cast<int>(blockDim.x >> 5) ? shared[lane] : identity<A>(op));
  __syncthreads();  // shared is reused by the block's next unit
  return v;
}

__device__ __forceinline__ int64_t global_thread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_threads() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// ---- kernels -------------------------------------------------------------------------

template <typename T>
__global__ void __launch_bounds__(kThreads) fill_kernel(ReduceOp op, T* out, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) store(out, i, identity<Acc<T>>(op));
}

template <typename T>
__global__ void __launch_bounds__(kThreads) copy_kernel(const T* x, T* out, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) store(out, i, load(x, i));
}

// Elements a row kernel's thread loads before it adds them (loads in flight: a loop of
// one load per add leaves a warp one outstanding load): 32 bytes of accumulators, as
// many as fit in 64 registers without spilling.
template <typename T>
constexpr int kRowBatch = static_cast<int>(32 / sizeof(Acc<T>));

// acc combined with x[first], x[first + step], ... < x[end] in order, kRowBatch<T>
// loads at a time.
template <typename T>
__device__ __forceinline__ Acc<T> strided_span(ReduceOp op, Acc<T> acc, const T* x, int64_t first, int64_t end,
                                               int64_t step) {
  for (int64_t c = first; c < end; c += kRowBatch<T> * step) {
    Acc<T> v[kRowBatch<T>];
#pragma unroll
    for (int b = 0; b < kRowBatch<T>; ++b)
      if (c + b * step < end) v[b] = load(x, c + b * step);
#pragma unroll
    for (int b = 0; b < kRowBatch<T>; ++b)
      if (c + b * step < end) acc = combine(op, acc, v[b]);
  }
  return acc;
}

// [rows, len]: a thread per row, in column order.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    rows_thread_kernel(ReduceOp op, const T* x, T* out, int64_t rows, int64_t len) {
  for (int64_t r = global_thread(); r < rows; r += grid_threads()) {
    Acc<T> acc = identity<Acc<T>>(op);
    for (int64_t c = 0; c < len; ++c) acc = combine(op, acc, load(x, r * len + c));
    store(out, r, acc);
  }
}

// [rows, len]: a warp per row; lane l takes columns l, l + 32, ...
template <typename T>
__global__ void __launch_bounds__(kThreads)
    rows_warp_kernel(ReduceOp op, const T* x, T* out, int64_t rows, int64_t len) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = grid_threads() >> 5;
  for (int64_t r = global_thread() >> 5; r < rows; r += warps) {
    Acc<T> acc = strided_span(op, identity<Acc<T>>(op), x + r * len, lane, len, 32);
    acc = warp_reduce(op, acc);
    if (lane == 0) store(out, r, acc);
  }
}

// [rows, len]: a block per (row, chunk of chunk_len columns). One chunk: the block
// writes the output; several: partial[row * chunks + chunk].
template <typename T>
__global__ void __launch_bounds__(kThreads)
    rows_block_kernel(ReduceOp op, const T* x, T* out, Acc<T>* partial, int64_t rows, int64_t len, int64_t chunk_len,
                      int64_t chunks) {
  __shared__ Acc<T> shared[32];
  const int64_t units = rows * chunks;
  for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {
    const int64_t row = u / chunks, c0 = (u - row * chunks) * chunk_len;
    const int64_t c1 = len - c0 < chunk_len ? len : c0 + chunk_len;
    Acc<T> acc = strided_span(op, identity<Acc<T>>(op), x + row * len, c0 + threadIdx.x, c1, blockDim.x);
    acc = block_reduce(op, acc, shared);
    if (threadIdx.x == 0) {
      if (chunks == 1)
        store(out, row, acc);
      else
        partial[u] = acc;
    }
  }
}

// partial [rows, chunks] -> out[rows]: a warp per row.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    rows_finish_kernel(ReduceOp op, const Acc<T>* partial, T* out, int64_t rows, int64_t chunks) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = grid_threads() >> 5;
  for (int64_t r = global_thread() >> 5; r < rows; r += warps) {
    Acc<T> acc = strided_span(op, identity<Acc<T>>(op), partial + r * chunks, lane, chunks, 32);
    acc = warp_reduce(op, acc);
    if (lane == 0) store(out, r, acc);
  }
}

// [outer, len, inner] reducing len: a thread per (o, chunk k, column c), unit index
// t = (o * chunks + k) * inner + c (consecutive threads read consecutive columns),
// over rows [k * chunk_len, +chunk_len) in order. One chunk: writes out[o, c]; several:
// partial[t].
template <typename T>
__global__ void __launch_bounds__(kThreads)
    columns_kernel(ReduceOp op, const T* x, T* out, Acc<T>* partial, int64_t outer, int64_t len, int64_t inner,
                   int64_t chunk_len, int64_t chunks) {
  const int64_t units = outer * chunks * inner;
  for (int64_t t = global_thread(); t < units; t += grid_threads()) {
    const int64_t c = t % inner, ok = t / inner;
    const int64_t k = ok % chunks, o = ok / chunks;
    const int64_t r0 = k * chunk_len, r1 = len - r0 < chunk_len ? len : r0 + chunk_len;
    const int64_t base = o * len * inner + c;
    Acc<T> acc = identity<Acc<T>>(op);
    for (int64_t r = r0; r < r1; ++r) acc = combine(op, acc, load(x, base + r * inner));
    if (chunks == 1)
      store(out, o * inner + c, acc);
    else
      partial[t] = acc;
  }
}

// partial [outer, chunks, inner] -> out[outer, inner], chunks in order.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    columns_finish_kernel(ReduceOp op, const Acc<T>* partial, T* out, int64_t outer, int64_t inner, int64_t chunks) {
  for (int64_t t = global_thread(); t < outer * inner; t += grid_threads()) {
    const int64_t o = t / inner, c = t - o * inner;
    Acc<T> acc = identity<Acc<T>>(op);
    for (int64_t k = 0; k < chunks; ++k) acc = combine(op, acc, partial[(o * chunks + k) * inner + c]);
    store(out, t, acc);
  }
}

// Kept and reduced groups of the general kernel (by value: a kernel argument).
struct GeneralLayout {
  int kept_rank, reduced_rank;
  int64_t kept_dims[kReduceMaxDims], kept_strides[kReduceMaxDims];
  int64_t reduced_dims[kReduceMaxDims], reduced_strides[kReduceMaxDims];
};

// Element offset of flat index i over dims/strides (row-major).
__device__ __forceinline__ int64_t offset_of(int64_t i, int rank, const int64_t* dims, const int64_t* strides) {
  int64_t off = 0;
  for (int d = rank - 1; d >= 0; --d) {
    const int64_t c = i % dims[d];
    i /= dims[d];
    off += c * strides[d];
  }
  return off;
}

// A warp per output; lane l takes reduced indices l, l + 32, ...
template <typename T>
__global__ void __launch_bounds__(kThreads)
    general_kernel(ReduceOp op, const T* x, T* out, GeneralLayout g, int64_t out_numel, int64_t reduced_numel) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = grid_threads() >> 5;
  for (int64_t o = global_thread() >> 5; o < out_numel; o += warps) {
    const int64_t base = offset_of(o, g.kept_rank, g.kept_dims, g.kept_strides);
    Acc<T> acc = identity<Acc<T>>(op);
    for (int64_t r = lane; r < reduced_numel; r += 32)
      acc = combine(op, acc, load(x, base + offset_of(r, g.reduced_rank, g.reduced_dims, g.reduced_strides)));
    acc = warp_reduce(op, acc);
    if (lane == 0) store(out, o, acc);
  }
}

// ---- arg max / arg min -------------------------------------------------------------

// Does candidate (v, i) beat the best so far (bv, bi)? bi < 0: nothing yet. The first
// NaN wins; otherwise the strictly larger (smaller) value, ties to the lower index.
// The same answer in any combination order (a sequential scan's answer).
template <typename A>
__device__ __forceinline__ bool arg_better(bool is_max, A v, int64_t i, A bv, int64_t bi) {
  if (bi < 0) return true;
  const bool vn = v != v, bn = bv != bv;
  if (vn || bn) return vn && (!bn || i < bi);
  if (v == bv) return i < bi;
  return is_max ? v > bv : v < bv;
}

// Combines (bv, bi) across a warp with the shuffle-down tree; the result is in lane 0.
template <typename A>
__device__ __forceinline__ void arg_warp_reduce(bool is_max, A& bv, int64_t& bi) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const A ov = __shfl_down_sync(0xffffffffu, bv, o);
    const int64_t oi = __shfl_down_sync(0xffffffffu, bi, o);
    if (oi >= 0 && arg_better(is_max, ov, oi, bv, bi)) {
      bv = ov;
      bi = oi;
    }
  }
}

// [rows, len] (inner == 1): a block per row; thread t scans columns t, t + 256, ...
template <typename T>
__global__ void __launch_bounds__(kThreads)
    arg_rows_kernel(bool is_max, const T* x, int64_t* out, int64_t rows, int64_t len) {
  using A = Acc<T>;
  __shared__ A shared_v[32];
  __shared__ int64_t shared_i[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    A bv = A(0);
    int64_t bi = -1;  // nothing seen yet
    for (int64_t c = threadIdx.x; c < len; c += blockDim.x) {
      const A v = load(x, r * len + c);
      if (arg_better(is_max, v, c, bv, bi)) {
        bv = v;
        bi = c;
      }
    }
    arg_warp_reduce(is_max, bv, bi);
    if (lane == 0) {
      shared_v[warp] = bv;
      shared_i[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
      const bool has = lane < static_cast<int>(blockDim.x >> 5);
      bv = has ? shared_v[lane] : A(0);
      bi = has ? shared_i[lane] : -1;
      arg_warp_reduce(is_max, bv, bi);
      if (lane == 0) out[r] = bi;
    }
    __syncthreads();  // shared is reused by the block's next row
  }
}

// [outer, len, inner]: a thread per output (o, c), scanning l in order.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    arg_columns_kernel(bool is_max, const T* x, int64_t* out, int64_t outer, int64_t len, int64_t inner) {
  using A = Acc<T>;
  for (int64_t t = global_thread(); t < outer * inner; t += grid_threads()) {
    const int64_t o = t / inner, c = t - o * inner;
    const int64_t base = o * len * inner + c;
    A bv = load(x, base);
    int64_t bi = 0;
    for (int64_t l = 1; l < len; ++l) {
      const A v = load(x, base + l * inner);
      if (arg_better(is_max, v, l, bv, bi)) {
        bv = v;
        bi = l;
      }
    }
    out[t] = bi;
  }
}

// ---- launch ----------------------------------------------------------------------------

unsigned int blocks_for(int64_t units, int64_t per_block) {
  const int64_t blocks = (units + per_block - 1) / per_block;
  return static_cast<unsigned int>(std::clamp<int64_t>(blocks, 1, kMaxBlocks));
}

template <typename T>
void launch_reduce(ReduceOp op, const ReducePlan& p, const void* xv, void* outv, void* scratch, cudaStream_t s) {
  const T* x = static_cast<const T*>(xv);
  T* out = static_cast<T*>(outv);
  Acc<T>* partial = static_cast<Acc<T>*>(scratch);
  switch (p.kind) {
    case ReducePlan::Kind::Empty:
      return;
    case ReducePlan::Kind::Fill:
      fill_kernel<T><<<blocks_for(p.out_numel, kThreads), kThreads, 0, s>>>(op, out, p.out_numel);
      return;
    case ReducePlan::Kind::Copy:
      copy_kernel<T><<<blocks_for(p.out_numel, kThreads), kThreads, 0, s>>>(x, out, p.out_numel);
      return;
    case ReducePlan::Kind::Rows:
      if (p.chunks > 1) {
        rows_block_kernel<T><<<blocks_for(p.outer * p.chunks, 1), kThreads, 0, s>>>(op, x, out, partial, p.outer, p.len,
                                                                                    p.chunk_len, p.chunks);
        rows_finish_kernel<T>
            <<<blocks_for(p.outer, kThreads / 32), kThreads, 0, s>>>(op, partial, out, p.outer, p.chunks);
      } else if (p.len <= kThreadRowMax) {
        rows_thread_kernel<T><<<blocks_for(p.outer, kThreads), kThreads, 0, s>>>(op, x, out, p.outer, p.len);
      } else if (p.len <= kWarpRowMax) {
        rows_warp_kernel<T><<<blocks_for(p.outer, kThreads / 32), kThreads, 0, s>>>(op, x, out, p.outer, p.len);
      } else {
        rows_block_kernel<T><<<blocks_for(p.outer, 1), kThreads, 0, s>>>(op, x, out, nullptr, p.outer, p.len, p.len, 1);
      }
      return;
    case ReducePlan::Kind::ColumnStrips:
      return;  // reduce() launches it (column_sum.h)
    case ReducePlan::Kind::Columns:
      columns_kernel<T><<<blocks_for(p.outer * p.chunks * p.inner, kThreads), kThreads, 0, s>>>(
          op, x, out, partial, p.outer, p.len, p.inner, p.chunk_len, p.chunks);
      if (p.chunks > 1)
        columns_finish_kernel<T>
            <<<blocks_for(p.outer * p.inner, kThreads), kThreads, 0, s>>>(op, partial, out, p.outer, p.inner, p.chunks);
      return;
    case ReducePlan::Kind::General: {
      GeneralLayout g{};
      g.kept_rank = p.kept_rank;
      g.reduced_rank = p.reduced_rank;
      for (int d = 0; d < kReduceMaxDims; ++d) {
        g.kept_dims[d] = p.kept_dims[d];
        g.kept_strides[d] = p.kept_strides[d];
        g.reduced_dims[d] = p.reduced_dims[d];
        g.reduced_strides[d] = p.reduced_strides[d];
      }
      general_kernel<T>
          <<<blocks_for(p.out_numel, kThreads / 32), kThreads, 0, s>>>(op, x, out, g, p.out_numel, p.reduced_numel);
      return;
    }
  }
}

template <typename T>
void launch_arg_reduce(bool is_max, const void* xv, int64_t outer, int64_t len, int64_t inner, int64_t* out,
                       cudaStream_t s) {
  const T* x = static_cast<const T*>(xv);
  if (inner == 1 && len > 64)
    arg_rows_kernel<T><<<blocks_for(outer, 1), kThreads, 0, s>>>(is_max, x, out, outer, len);
  else
    arg_columns_kernel<T><<<blocks_for(outer * inner, kThreads), kThreads, 0, s>>>(is_max, x, out, outer, len, inner);
}

// Calls fn.template operator()<T>() with T the storage type of `dtype`.
template <typename F>
void dispatch(DType dtype, F&& fn) {
  switch (dtype) {
    case DType::Bool:
      return fn.template operator()<bool>();
    case DType::UInt8:
      return fn.template operator()<uint8_t>();
    case DType::Int8:
      return fn.template operator()<int8_t>();
    case DType::UInt32:
      return fn.template operator()<uint32_t>();
    case DType::Int32:
      return fn.template operator()<int32_t>();
    case DType::Int64:
      return fn.template operator()<int64_t>();
    case DType::Float16:
      return fn.template operator()<float16>();
    case DType::BFloat16:
      return fn.template operator()<bfloat16>();
    case DType::Float32:
      return fn.template operator()<float>();
    case DType::Float64:
      return fn.template operator()<double>();
  }
}

size_t accumulator_bytes(DType dtype) {
  return (dtype == DType::Float32 || dtype == DType::BFloat16 || dtype == DType::Float16) ? 4 : 8;
}

}  // namespace

bool plan_reduce(DType dtype, const std::vector<int64_t>& shape, const std::vector<int>& axes, ReducePlan* plan) {
  ReducePlan p;
  std::vector<bool> reduced(shape.size(), false);
  for (int a : axes) reduced[static_cast<size_t>(a)] = true;
  p.out_numel = 1;
  p.reduced_numel = 1;
  for (size_t d = 0; d < shape.size(); ++d) (reduced[d] ? p.reduced_numel : p.out_numel) *= shape[d];
  if (p.out_numel == 0) {
    p.kind = ReducePlan::Kind::Empty;
  } else if (p.reduced_numel == 0) {
    p.kind = ReducePlan::Kind::Fill;
  }
  if (p.out_numel == 0 || p.reduced_numel == 0) {
    *plan = p;
    return true;
  }
  // Groups: size-1 dims dropped, neighbours of the same kind merged.
  std::vector<int64_t> sizes;
  std::vector<bool> kinds;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (!kinds.empty() && kinds.back() == reduced[d]) {
      sizes.back() *= shape[d];
    } else {
      sizes.push_back(shape[d]);
      kinds.push_back(reduced[d]);
    }
  }
  const size_t g = sizes.size();
  if (g == 0 || (g == 1 && !kinds[0])) {
    p.kind = ReducePlan::Kind::Copy;
  } else if (kinds[g - 1] && g <= 2) {  // [R] or [K, R]
    p.kind = ReducePlan::Kind::Rows;
    p.outer = g == 2 ? sizes[0] : 1;
    p.len = sizes[g - 1];
    p.chunk_len = p.len;
    if (reduce_path() == ReducePath::Legacy) {
      if (p.outer < kFewRows && p.len > kLongRow) p.chunk_len = kRowChunk;
    } else if (p.outer < kFewRows && p.len >= 2 * kRowChunkMin) {
      // Few long rows (a gradient norm's sum of squares over a whole weight): chunks
      // enough for about kRowUnits blocks.
      const int64_t wanted = (kRowUnits + p.outer - 1) / p.outer;
      p.chunk_len = std::max(kRowChunkMin, (p.len + wanted - 1) / wanted);
    }
    if (p.chunk_len < p.len) {
      p.chunks = (p.len + p.chunk_len - 1) / p.chunk_len;
      p.scratch_bytes = static_cast<size_t>(p.outer * p.chunks) * accumulator_bytes(dtype);
    }
  } else if (!kinds[g - 1] && (g == 2 || (g == 3 && !kinds[0]))) {  // [R, K] or [K, R, K]
    p.outer = g == 3 ? sizes[0] : 1;
    p.len = sizes[g - 2];
    p.inner = sizes[g - 1];
    p.chunk_len = p.len;
    if (reduce_path() == ReducePath::Column && column_sum_applies(dtype, p.inner)) {
      p.kind = ReducePlan::Kind::ColumnStrips;
      plan_column_sum(dtype, p.outer, p.len, p.inner, &p.chunk_len, &p.chunks);
      if (p.chunks > 1) p.scratch_bytes = static_cast<size_t>(p.outer * p.chunks * p.inner) * accumulator_bytes(dtype);
    } else {
      p.kind = ReducePlan::Kind::Columns;
    }
    if (p.kind == ReducePlan::Kind::Columns && p.len > 2 * kColumnChunkMin) {
      p.chunk_len = std::max(kColumnChunkMin, (p.len + kColumnChunks - 1) / kColumnChunks);
      p.chunks = (p.len + p.chunk_len - 1) / p.chunk_len;
      p.scratch_bytes = static_cast<size_t>(p.outer * p.chunks * p.inner) * accumulator_bytes(dtype);
    }
  } else {
    p.kind = ReducePlan::Kind::General;
    int64_t stride = 1;
    std::vector<int64_t> strides(g);
    for (size_t i = g; i-- > 0;) {
      strides[i] = stride;
      stride *= sizes[i];
    }
    for (size_t i = 0; i < g; ++i) {
      int& rank = kinds[i] ? p.reduced_rank : p.kept_rank;
      if (rank == kReduceMaxDims) return false;
      (kinds[i] ? p.reduced_dims : p.kept_dims)[rank] = sizes[i];
      (kinds[i] ? p.reduced_strides : p.kept_strides)[rank] = strides[i];
      ++rank;
    }
  }
  *plan = p;
  return true;
}

cudaError_t reduce(ReduceOp op, DType dtype, const ReducePlan& plan, const void* x, void* out, void* scratch,
                   cudaStream_t stream) {
  if (plan.kind == ReducePlan::Kind::ColumnStrips)
    return column_sum(op, dtype, plan.outer, plan.len, plan.inner, plan.chunk_len, plan.chunks, x, out, scratch,
                      stream);
  dispatch(dtype, [&]<typename T>() { launch_reduce<T>(op, plan, x, out, scratch, stream); });
  return cudaGetLastError();
}

cudaError_t arg_reduce(bool is_max, DType dtype, const void* x, int64_t outer, int64_t len, int64_t inner, int64_t* out,
                       cudaStream_t stream) {
  if (outer * inner == 0) return cudaSuccess;
  dispatch(dtype, [&]<typename T>() { launch_arg_reduce<T>(is_max, x, outer, len, inner, out, stream); });
  return cudaGetLastError();
}

}  // namespace tessera::cuda
