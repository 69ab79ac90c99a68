// Gathers and scatter-adds along one axis (see gather.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cub/device/device_radix_sort.cuh>
#include <sstream>
#include <string>
#include <type_traits>

#include "backend/cuda/kernels/cuda_check.h"
#include "backend/cuda/kernels/gather.h"
#include "backend/cuda/kernels/launch_config.h"
#include "backend/cuda/kernels/word_of.cuh"

namespace tessera::cuda {
namespace {

// ---- device helpers ----

// Index i of an int32 / int64 index buffer, normalized (negatives count from the end);
// -1 when out of range.
template <typename Idx>
__device__ __forceinline__ int64_t load_index(const Idx* idx, int64_t i, int64_t axis_len) {
  int64_t v = static_cast<int64_t>(idx[i]);
  if (v < 0) v += axis_len;
  return v >= 0 && v < axis_len ? v : -1;
}

// A word of sizeof(T) bytes, every byte `b`.
template <typename T>
__device__ __forceinline__ T splat(unsigned char b) {
  if constexpr (std::is_same_v<T, uint4>) {
    const unsigned w = 0x01010101u * b;
    return make_uint4(w, w, w, w);
  } else {
    return static_cast<T>(static_cast<T>(~T{0}) / 0xFF * b);
  }
}

// Addition in an element type's own arithmetic, with an accumulator type: integers wrap
// (two's complement), bool is logical or, half types accumulate in float32.
template <typename T>
struct Sum {
  using A = T;
  __device__ static A zero() { return A(0); }
  __device__ static A load(T v) { return v; }
  __device__ static T store(A a) { return a; }
  __device__ static A add(A a, A b) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  }
};
template <>
struct Sum<bool> {
  using A = bool;
  __device__ static A zero() { return A(0); }
  __device__ static A load(bool v) { return v; }
  __device__ static bool store(A a) { return a; }
  __device__ static A add(A a, A b) { return a || b; }
};
template <>
struct Sum<float> {
  using A = float;
  __device__ static A zero() { return A(0); }
  __device__ static A load(float v) { return v; }
  __device__ static float store(A a) { return a; }
  __device__ static A add(A a, A b) { return __fadd_rn(a, b); }
};
template <>
struct Sum<double> {
  using A = double;
  __device__ static A zero() { return A(0); }
  __device__ static A load(double v) { return v; }
  __device__ static double store(A a) { return a; }
  __device__ static A add(A a, A b) { return __dadd_rn(a, b); }
};
template <>
struct Sum<__half> {
  using A = float;
  __device__ static A zero() { return A(0); }
  __device__ static A load(__half v) { return __half2float(v); }
  __device__ static __half store(A a) { return __float2half_rn(a); }
  __device__ static A add(A a, A b) { return __fadd_rn(a, b); }
};
template <>
struct Sum<__nv_bfloat16> {
  using A = float;
  __device__ static A zero() { return A(0); }
  __device__ static A load(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 store(A a) { return __float2bfloat16_rn(a); }
  __device__ static A add(A a, A b) { return __fadd_rn(a, b); }
};

// ---- kernels ----

// One row of `row_words` words per (o, i): threadIdx.y picks the row, threadIdx.x walks it.
template <typename T, typename Idx>
__global__ void __launch_bounds__(kThreadsPerBlock)
    gather_rows_kernel(const T* __restrict__ x, const Idx* __restrict__ idx, T* __restrict__ out, int64_t outer,
                       int64_t axis_len, int64_t n_idx, int64_t row_words, unsigned char fill_byte) {
  const int64_t rows = outer * n_idx;
  const int64_t row_stride = static_cast<int64_t>(gridDim.x) * blockDim.y;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; row < rows; row += row_stride) {
    const int64_t o = row / n_idx;
    const int64_t id = load_index(idx, row - o * n_idx, axis_len);
    T* dst = out + row * row_words;
    if (id < 0) {
      const T fill = splat<T>(fill_byte);
      for (int64_t c = threadIdx.x; c < row_words; c += blockDim.x) dst[c] = fill;
      continue;
    }
    const T* src = x + (o * axis_len + id) * row_words;
    for (int64_t c = threadIdx.x; c < row_words; c += blockDim.x) dst[c] = src[c];
  }
}

template <typename T, typename Idx>
__global__ void __launch_bounds__(kThreadsPerBlock)
    gather_along_kernel(const T* __restrict__ x, const Idx* __restrict__ idx, T* __restrict__ out, int64_t outer,
                        int64_t axis_len, int64_t n_idx, int64_t inner, unsigned char fill_byte) {
  const int64_t total = outer * n_idx * inner;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += stride) {
    const int64_t r = t % inner;
    const int64_t o = t / inner / n_idx;
    const int64_t id = load_index(idx, t, axis_len);
    out[t] = id < 0 ? splat<T>(fill_byte) : x[(o * axis_len + id) * inner + r];
  }
}

// keys[p] = the normalized index of position p (axis_len when out of range: sorts last
// and is skipped), pos[p] = p.
template <typename Idx>
__global__ void __launch_bounds__(kThreadsPerBlock)
    make_keys_kernel(const Idx* __restrict__ idx, int64_t n_idx, int64_t axis_len, uint32_t* __restrict__ keys,
                     int32_t* __restrict__ pos) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < n_idx; p += stride) {
    const int64_t id = load_index(idx, p, axis_len);
    keys[p] = static_cast<uint32_t>(id < 0 ? axis_len : id);
    pos[p] = static_cast<int32_t>(p);
  }
}

// After the stable sort: the block at sorted position s owns the run of equal keys that
// starts there (if one does) and writes out[o, key, :] = sum of the run's update rows in
// position order. Every output row is written by at most one block; rows no index names
// keep the zeros written before.
// (kThreadsPerBlock, 1): with no minimum, ptxas spilled the integer instances for sm_80
// (a build error, -warn-spills).
template <typename T>
__global__ void __launch_bounds__(kThreadsPerBlock, 1)
    scatter_runs_kernel(const T* __restrict__ upd, const uint32_t* __restrict__ keys, const int32_t* __restrict__ pos,
                        T* __restrict__ out, int64_t outer, int64_t axis_len, int64_t n_idx, int64_t inner) {
  using S = Sum<T>;
  for (int64_t s = blockIdx.x; s < n_idx; s += gridDim.x) {
    const uint32_t key = keys[s];
    if (static_cast<int64_t>(key) >= axis_len || (s > 0 && keys[s - 1] == key)) continue;
    int64_t e = s + 1;
    while (e < n_idx && keys[e] == key) ++e;
    for (int64_t o = blockIdx.y; o < outer; o += gridDim.y) {
      const T* src = upd + o * n_idx * inner;
      T* dst = out + (o * axis_len + key) * inner;
      for (int64_t r = threadIdx.x; r < inner; r += blockDim.x) {
        typename S::A acc = S::zero();
        for (int64_t q = s; q < e; ++q) acc = S::add(acc, S::load(src[static_cast<int64_t>(pos[q]) * inner + r]));
        dst[r] = S::store(acc);
      }
    }
  }
}

// One thread per (o, r) column: its updates in j order, added in the element type.
template <typename T, typename Idx>
__global__ void __launch_bounds__(kThreadsPerBlock)
    scatter_along_kernel(const T* __restrict__ upd, const Idx* __restrict__ idx, T* __restrict__ out, int64_t outer,
                         int64_t axis_len, int64_t n_idx, int64_t inner) {
  using S = Sum<T>;
  const int64_t columns = outer * inner;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < columns; c += stride) {
    const int64_t o = c / inner, r = c - o * inner;
    for (int64_t j = 0; j < n_idx; ++j) {
      const int64_t at = (o * n_idx + j) * inner + r;
      const int64_t id = load_index(idx, at, axis_len);
      if (id < 0) continue;
      T& d = out[(o * axis_len + id) * inner + r];
      d = S::store(S::add(S::load(d), S::load(upd[at])));
    }
  }
}

// ---- host side ----

void check_sizes(const char* op, int64_t outer, int64_t axis_len, int64_t inner, int64_t n_idx) {
  if (outer < 0 || axis_len < 0 || inner < 0 || n_idx < 0)
    value_error(op, ": negative size (got outer=", outer, ", axis_len=", axis_len, ", inner=", inner, ", n_idx=", n_idx,
                "; expected >= 0)");
}

void check_index_dtype(const char* op, DType idx_dtype) {
  if (idx_dtype != DType::Int32 && idx_dtype != DType::Int64)
    value_error(op, ": index dtype ", name(idx_dtype), " (expected int32 or int64)");
}

// Bytes that mark the output of an out-of-range gather: NaN for floats, zero otherwise.
unsigned char fill_byte_for(DType dtype) { return is_floating(dtype) ? 0xFF : 0x00; }

// Calls fn(T{}) with the device storage type of `dtype`.
template <typename Fn>
void dispatch_typed(const char* op, DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::Bool:
      return fn(bool{});
    case DType::UInt8:
      return fn(uint8_t{});
    case DType::Int8:
      return fn(int8_t{});
    case DType::UInt32:
      return fn(uint32_t{});
    case DType::Int32:
      return fn(int32_t{});
    case DType::Int64:
      return fn(int64_t{});
    case DType::Float16:
      return fn(__half{});
    case DType::BFloat16:
      return fn(__nv_bfloat16{});
    case DType::Float32:
      return fn(float{});
    case DType::Float64:
      return fn(double{});
  }
  value_error(op, ": unsupported dtype ", static_cast<int>(dtype));
}

// Calls fn(Idx{}) with the index type.
template <typename Fn>
void dispatch_index(DType idx_dtype, Fn&& fn) {
  if (idx_dtype == DType::Int32) {
    fn(int32_t{});
  } else {
    fn(int64_t{});
  }
}

template <typename T, typename Idx>
void launch_gather_rows(const void* x, const Idx* idx, void* out, int64_t outer, int64_t axis_len, int64_t n_idx,
                        int64_t row_words, unsigned char fill, cudaStream_t stream) {
  // Lanes along the row; short rows share a block (threadIdx.y picks the row).
  int tx = 1;
  while (tx < kThreadsPerBlock && tx < row_words) tx *= 2;
  const int ty = kThreadsPerBlock / tx;
  const int64_t rows = outer * n_idx;
  const unsigned grid = static_cast<unsigned>(std::clamp<int64_t>((rows + ty - 1) / ty, 1, 132 * 32));
  gather_rows_kernel<T, Idx><<<grid, dim3(tx, ty), 0, stream>>>(static_cast<const T*>(x), idx, static_cast<T*>(out),
                                                                outer, axis_len, n_idx, row_words, fill);
  TESSERA_CUDA_CHECK(cudaGetLastError());
}

constexpr size_t kScratchAlign = 256;
size_t align_up(size_t n) { return (n + kScratchAlign - 1) / kScratchAlign * kScratchAlign; }

// Bits the sort looks at: enough for every index and the out-of-range key axis_len.
int sort_bits(int64_t axis_len) {
  return std::max(1, static_cast<int>(std::bit_width(static_cast<uint64_t>(axis_len))));
}

size_t cub_sort_bytes(int64_t n_idx, int64_t axis_len) {
  size_t bytes = 0;
  TESSERA_CUDA_CHECK(
      cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const uint32_t*>(nullptr),
                                      static_cast<uint32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                      static_cast<int32_t*>(nullptr), static_cast<int>(n_idx), 0, sort_bits(axis_len)));
  return bytes;
}

}  // namespace

void gather(DType dtype, const void* x, int64_t outer, int64_t axis_len, int64_t inner, const void* idx,
            DType idx_dtype, int64_t n_idx, void* out, cudaStream_t stream) {
  check_sizes("gather", outer, axis_len, inner, n_idx);
  check_index_dtype("gather", idx_dtype);
  if (outer == 0 || inner == 0 || n_idx == 0) return;
  const size_t elem = itemsize(dtype);
  const size_t row_bytes = static_cast<size_t>(inner) * elem;
  // Rows move in the widest word both buffers and the row length allow.
  size_t word = 1;
  for (size_t w : {size_t{16}, size_t{8}, size_t{4}, size_t{2}}) {
    if (row_bytes % w == 0 && aligned_to(x, static_cast<int>(w)) && aligned_to(out, static_cast<int>(w))) {
      word = w;
      break;
    }
  }
  const int64_t row_words = static_cast<int64_t>(row_bytes / word);
  const unsigned char fill = fill_byte_for(dtype);
  dispatch_index(idx_dtype, [&](auto itag) {
    using Idx = decltype(itag);
    const Idx* ids = static_cast<const Idx*>(idx);
    switch (word) {
      case 16:
        return launch_gather_rows<WordOf<16>::type>(x, ids, out, outer, axis_len, n_idx, row_words, fill, stream);
      case 8:
        return launch_gather_rows<WordOf<8>::type>(x, ids, out, outer, axis_len, n_idx, row_words, fill, stream);
      case 4:
        return launch_gather_rows<WordOf<4>::type>(x, ids, out, outer, axis_len, n_idx, row_words, fill, stream);
      case 2:
        return launch_gather_rows<WordOf<2>::type>(x, ids, out, outer, axis_len, n_idx, row_words, fill, stream);
      default:
        return launch_gather_rows<WordOf<1>::type>(x, ids, out, outer, axis_len, n_idx, row_words, fill, stream);
    }
  });
}

size_t scatter_add_scratch_bytes(int64_t n_idx, int64_t axis_len) {
  if (n_idx <= 0) return 0;
  const size_t keys = align_up(static_cast<size_t>(n_idx) * sizeof(uint32_t));
  const size_t pos = align_up(static_cast<size_t>(n_idx) * sizeof(int32_t));
  return 2 * keys + 2 * pos + align_up(cub_sort_bytes(n_idx, axis_len));
}

void scatter_add(DType dtype, const void* updates, int64_t outer, int64_t axis_len, int64_t inner, const void* idx,
                 DType idx_dtype, int64_t n_idx, void* out, void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  check_sizes("scatter_add", outer, axis_len, inner, n_idx);
  check_index_dtype("scatter_add", idx_dtype);
  if (n_idx >= (int64_t{1} << 31) || axis_len >= (int64_t{1} << 32) - 1)
    value_error("scatter_add: ", n_idx, " indices into an axis of ", axis_len,
                " (expected fewer than 2^31 indices and an axis shorter than 2^32 - 1)");
  const size_t out_bytes = static_cast<size_t>(outer * axis_len * inner) * itemsize(dtype);
  if (out_bytes > 0) TESSERA_CUDA_CHECK(cudaMemsetAsync(out, 0, out_bytes, stream));
  if (outer == 0 || inner == 0 || n_idx == 0 || axis_len == 0) return;
  const size_t needed = scatter_add_scratch_bytes(n_idx, axis_len);
  if (scratch == nullptr || scratch_bytes < needed)
    value_error("scatter_add: scratch of ", scratch_bytes, " bytes (expected at least ", needed, ")");
  if (!aligned_to(scratch, static_cast<int>(kScratchAlign)))
    value_error("scatter_add: scratch is not ", kScratchAlign, "-byte aligned");

  char* base = static_cast<char*>(scratch);
  const size_t key_bytes = align_up(static_cast<size_t>(n_idx) * sizeof(uint32_t));
  const size_t pos_bytes = align_up(static_cast<size_t>(n_idx) * sizeof(int32_t));
  auto* keys_in = reinterpret_cast<uint32_t*>(base);
  auto* keys_out = reinterpret_cast<uint32_t*>(base + key_bytes);
  auto* pos_in = reinterpret_cast<int32_t*>(base + 2 * key_bytes);
  auto* pos_out = reinterpret_cast<int32_t*>(base + 2 * key_bytes + pos_bytes);
  void* sort_temp = base + 2 * key_bytes + 2 * pos_bytes;
  size_t sort_bytes = needed - (2 * key_bytes + 2 * pos_bytes);

  dispatch_index(idx_dtype, [&](auto itag) {
    using Idx = decltype(itag);
    make_keys_kernel<Idx><<<grid_for(n_idx), kThreadsPerBlock, 0, stream>>>(static_cast<const Idx*>(idx), n_idx,
                                                                            axis_len, keys_in, pos_in);
    TESSERA_CUDA_CHECK(cudaGetLastError());
  });
  TESSERA_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(sort_temp, sort_bytes, keys_in, keys_out, pos_in, pos_out,
                                                     static_cast<int>(n_idx), 0, sort_bits(axis_len), stream));

  int threads = 32;
  while (threads < kThreadsPerBlock && threads < inner) threads *= 2;
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(n_idx, int64_t{1} << 20)),
                  static_cast<unsigned>(std::min<int64_t>(outer, 65535)));
  dispatch_typed("scatter_add", dtype, [&](auto tag) {
    using T = decltype(tag);
    scatter_runs_kernel<T><<<grid, threads, 0, stream>>>(static_cast<const T*>(updates), keys_out, pos_out,
                                                         static_cast<T*>(out), outer, axis_len, n_idx, inner);
    TESSERA_CUDA_CHECK(cudaGetLastError());
  });
}

void gather_along(DType dtype, const void* x, int64_t outer, int64_t axis_len, int64_t inner, const void* idx,
                  DType idx_dtype, int64_t n_idx, void* out, cudaStream_t stream) {
  check_sizes("gather_along", outer, axis_len, inner, n_idx);
  check_index_dtype("gather_along", idx_dtype);
  const int64_t total = outer * n_idx * inner;
  if (total == 0) return;
  const unsigned char fill = fill_byte_for(dtype);
  const unsigned grid = grid_for(total);
  dispatch_index(idx_dtype, [&](auto itag) {
    using Idx = decltype(itag);
    const Idx* ids = static_cast<const Idx*>(idx);
    auto launch = [&](auto wtag) {
      using T = decltype(wtag);
      gather_along_kernel<T, Idx><<<grid, kThreadsPerBlock, 0, stream>>>(
          static_cast<const T*>(x), ids, static_cast<T*>(out), outer, axis_len, n_idx, inner, fill);
      TESSERA_CUDA_CHECK(cudaGetLastError());
    };
    switch (itemsize(dtype)) {
      case 1:
        return launch(uint8_t{});
      case 2:
        return launch(uint16_t{});
      case 4:
        return launch(uint32_t{});
      default:
        return launch(static_cast<unsigned long long>(0));
    }
  });
}

void scatter_add_along(DType dtype, const void* updates, int64_t outer, int64_t axis_len, int64_t inner,
                       const void* idx, DType idx_dtype, int64_t n_idx, void* out, cudaStream_t stream) {
  check_sizes("scatter_add_along", outer, axis_len, inner, n_idx);
  check_index_dtype("scatter_add_along", idx_dtype);
  const size_t out_bytes = static_cast<size_t>(outer * axis_len * inner) * itemsize(dtype);
  if (out_bytes > 0) TESSERA_CUDA_CHECK(cudaMemsetAsync(out, 0, out_bytes, stream));
  if (outer * inner == 0 || n_idx == 0 || axis_len == 0) return;
  const unsigned grid = grid_for(outer * inner);
  dispatch_index(idx_dtype, [&](auto itag) {
    using Idx = decltype(itag);
    dispatch_typed("scatter_add_along", dtype, [&](auto tag) {
      using T = decltype(tag);
      scatter_along_kernel<T, Idx>
          <<<grid, kThreadsPerBlock, 0, stream>>>(static_cast<const T*>(updates), static_cast<const Idx*>(idx),
                                                  static_cast<T*>(out), outer, axis_len, n_idx, inner);
      TESSERA_CUDA_CHECK(cudaGetLastError());
    });
  });
}

}  // namespace tessera::cuda
