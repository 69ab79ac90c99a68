// Strided copies and concatenation (see copy.h).
//
// Every copy is planned on the host first: size-1 dims are dropped and neighbouring
// dims merged where both sides' strides allow, so [8, 256, 12, 64] -> [8, 12, 256, 64]
// becomes a rank-3 copy with a contiguous run of 64 elements, which then moves as
// 16-byte words. The plan travels to the kernel by value (a small struct of at most 8
// dims). Two kernels:
//  * strided_copy_kernel: one thread per element (grid-stride), the multi-index decoded
//    from the linear output position; 32-bit index arithmetic when the element count
//    allows it.
//  * tiled_copy_kernel: for copies where the source's unit-stride dim (a) is not the
//    destination's (b). A 32x32 tile is read with lanes along a and written with lanes
//    along b through shared memory (padded to 33 columns: no bank conflicts on the
//    column reads), so neither side is accessed with a stride.
#include <cuda_runtime.h>

#include <algorithm>
#include <sstream>
#include <string>

#include "backend/cuda/kernels/copy.h"
#include "backend/cuda/kernels/cuda_check.h"
#include "backend/cuda/kernels/launch_config.h"
#include "backend/cuda/kernels/word_of.cuh"

namespace tessera::cuda {
namespace {

constexpr int kTile = 32;
constexpr int kTileRows = 8;  // a 32x32 tile is moved by 32x8 threads, 4 elements each
constexpr int kMaxConcatInputs = 32;

struct CopyPlan {
  int rank = 0;
  int64_t shape[kMaxCopyRank] = {};
  int64_t src[kMaxCopyRank] = {};
  int64_t dst[kMaxCopyRank] = {};
};

template <typename T, typename I>
__global__ void __launch_bounds__(kThreadsPerBlock)
    strided_copy_kernel(const T* __restrict__ src, T* __restrict__ dst, CopyPlan p, I total) {
  const I stride = static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x);
  for (I t = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + threadIdx.x; t < total; t += stride) {
    I rem = t;
    int64_t s = 0, d = 0;
#pragma unroll
    for (int k = kMaxCopyRank - 1; k >= 0; --k) {
      if (k < p.rank) {
        const I extent = static_cast<I>(p.shape[k]);
        const I c = rem % extent;
        rem /= extent;
        s += static_cast<int64_t>(c) * p.src[k];
        d += static_cast<int64_t>(c) * p.dst[k];
      }
    }
    dst[d] = src[s];
  }
}

struct TilePlan {
  int64_t len_a = 0, len_b = 0;  // extents of the two tiled dims
  int64_t src_a = 0, src_b = 0;  // their source strides (src_a is 1)
  int64_t dst_a = 0, dst_b = 0;  // their destination strides (dst_b is 1)
  int64_t tiles_a = 0, tiles_b = 0, total_tiles = 0;
  int batch_rank = 0;  // the remaining dims, looped over tile by tile
  int64_t batch_shape[kMaxCopyRank] = {};
  int64_t batch_src[kMaxCopyRank] = {};
  int64_t batch_dst[kMaxCopyRank] = {};
};

template <typename T>
__global__ void __launch_bounds__(kTile* kTileRows)
    tiled_copy_kernel(const T* __restrict__ src, T* __restrict__ dst, TilePlan p) {
  __shared__ T tile[kTile][kTile + 1];  // tile[b - b0][a - a0]
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  // The loop bound depends on blockIdx only: every thread of a block reaches each barrier.
  for (int64_t id = blockIdx.x; id < p.total_tiles; id += gridDim.x) {
    const int64_t tb = id % p.tiles_b;
    const int64_t rest = id / p.tiles_b;
    const int64_t ta = rest % p.tiles_a;
    int64_t batch = rest / p.tiles_a;
    int64_t s = 0, d = 0;
    for (int k = p.batch_rank - 1; k >= 0; --k) {
      const int64_t c = batch % p.batch_shape[k];
      batch /= p.batch_shape[k];
      s += c * p.batch_src[k];
      d += c * p.batch_dst[k];
    }
    const int64_t a0 = ta * kTile, b0 = tb * kTile;
    for (int j = ty; j < kTile; j += kTileRows) {  // lanes along a: unit stride in src
      const int64_t a = a0 + tx, b = b0 + j;
      if (a < p.len_a && b < p.len_b) tile[j][tx] = src[s + a * p.src_a + b * p.src_b];
    }
    __syncthreads();
    for (int j = ty; j < kTile; j += kTileRows) {  // lanes along b: unit stride in dst
      const int64_t a = a0 + j, b = b0 + tx;
      if (a < p.len_a && b < p.len_b) dst[d + a * p.dst_a + b * p.dst_b] = tile[tx][j];
    }
    __syncthreads();  // the tile is rewritten by the next iteration
  }
}

struct ConcatPlan {
  const void* src[kMaxConcatInputs] = {};
  int64_t begin[kMaxConcatInputs + 1] = {};  // axis offsets of the inputs within the group
  int count = 0;
  int64_t outer = 0, inner = 0;
  int64_t group_len = 0;    // begin[count]
  int64_t axis_offset = 0;  // where the group starts along the output's axis
  int64_t axis_total = 0;   // the output's axis length
};

template <typename T, typename I>
__global__ void __launch_bounds__(kThreadsPerBlock) concat_kernel(T* __restrict__ dst, ConcatPlan p, I total) {
  const I inner = static_cast<I>(p.inner), group_len = static_cast<I>(p.group_len);
  const I stride = static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x);
  for (I t = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + threadIdx.x; t < total; t += stride) {
    const I r = t % inner;
    const I q = t / inner;
    const int64_t a = static_cast<int64_t>(q % group_len);
    const int64_t o = static_cast<int64_t>(q / group_len);
    int k = 0;
    while (k + 1 < p.count && a >= p.begin[k + 1]) ++k;
    const int64_t len = p.begin[k + 1] - p.begin[k];
    const T* src = static_cast<const T*>(p.src[k]);
    dst[(o * p.axis_total + p.axis_offset + a) * p.inner + r] = src[(o * len + (a - p.begin[k])) * p.inner + r];
  }
}

// ---- host-side planning ----

struct Dims {
  std::vector<int64_t> shape, src, dst;
  int rank() const { return static_cast<int>(shape.size()); }
};

// Drops size-1 dims and merges an outer dim into the next inner one when both sides'
// strides say they are one run (outer stride == inner stride * inner extent).
Dims merge_dims(const Shape& shape, const Strides& src, const Strides& dst) {
  Dims m;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (!m.shape.empty() && m.src.back() == src[d] * shape[d] && m.dst.back() == dst[d] * shape[d]) {
      m.shape.back() *= shape[d];
      m.src.back() = src[d];
      m.dst.back() = dst[d];
    } else {
      m.shape.push_back(shape[d]);
      m.src.push_back(src[d]);
      m.dst.push_back(dst[d]);
    }
  }
  if (m.shape.empty()) m = Dims{{1}, {0}, {0}};  // a single element
  return m;
}

// When the innermost dim is contiguous on both sides, moves it in words of up to 16
// bytes (the extent, the other strides and both pointers must allow it). Returns the
// new element size.
size_t widen(Dims& m, size_t elem, const void* src, const void* dst) {
  const int last = m.rank() - 1;
  if (m.src[last] != 1 || m.dst[last] != 1) return elem;
  for (size_t w : {size_t{16}, size_t{8}, size_t{4}, size_t{2}}) {
    if (w <= elem || w % elem != 0) continue;
    const int64_t k = static_cast<int64_t>(w / elem);
    if (m.shape[last] % k != 0 || !aligned_to(src, static_cast<int>(w)) || !aligned_to(dst, static_cast<int>(w)))
      continue;
    bool ok = true;
    for (int d = 0; d < last; ++d) ok = ok && m.src[d] % k == 0 && m.dst[d] % k == 0;
    if (!ok) continue;
    m.shape[last] /= k;
    for (int d = 0; d < last; ++d) {
      m.src[d] /= k;
      m.dst[d] /= k;
    }
    return w;
  }
  return elem;
}

int64_t product(const std::vector<int64_t>& v) {
  int64_t n = 1;
  for (int64_t x : v) n *= x;
  return n;
}

template <typename T>
void launch_plain(const Dims& m, const void* src, void* dst, cudaStream_t stream) {
  CopyPlan p;
  p.rank = m.rank();
  for (int d = 0; d < p.rank; ++d) {
    p.shape[d] = m.shape[d];
    p.src[d] = m.src[d];
    p.dst[d] = m.dst[d];
  }
  const int64_t total = product(m.shape);
  const unsigned grid = grid_for(total);
  const T* s = static_cast<const T*>(src);
  T* d = static_cast<T*>(dst);
  if (total <= INT32_MAX) {
    strided_copy_kernel<T, uint32_t><<<grid, kThreadsPerBlock, 0, stream>>>(s, d, p, static_cast<uint32_t>(total));
  } else {
    strided_copy_kernel<T, uint64_t><<<grid, kThreadsPerBlock, 0, stream>>>(s, d, p, static_cast<uint64_t>(total));
  }
  TESSERA_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void launch_tiled(const Dims& m, int a, int b, const void* src, void* dst, cudaStream_t stream) {
  TilePlan p;
  p.len_a = m.shape[a];
  p.len_b = m.shape[b];
  p.src_a = m.src[a];
  p.src_b = m.src[b];
  p.dst_a = m.dst[a];
  p.dst_b = m.dst[b];
  p.tiles_a = (p.len_a + kTile - 1) / kTile;
  p.tiles_b = (p.len_b + kTile - 1) / kTile;
  int64_t batch = 1;
  for (int d = 0; d < m.rank(); ++d) {
    if (d == a || d == b) continue;
    p.batch_shape[p.batch_rank] = m.shape[d];
    p.batch_src[p.batch_rank] = m.src[d];
    p.batch_dst[p.batch_rank] = m.dst[d];
    ++p.batch_rank;
    batch *= m.shape[d];
  }
  p.total_tiles = batch * p.tiles_a * p.tiles_b;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(p.total_tiles, 132 * 16));
  tiled_copy_kernel<T>
      <<<grid, dim3(kTile, kTileRows), 0, stream>>>(static_cast<const T*>(src), static_cast<T*>(dst), p);
  TESSERA_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void launch_copy(const Dims& m, const void* src, void* dst, cudaStream_t stream) {
  int a = -1, b = -1;  // the source's and the destination's unit-stride dims
  for (int d = 0; d < m.rank(); ++d) {
    if (m.src[d] == 1) a = d;
    if (m.dst[d] == 1) b = d;
  }
  // Tiles only pay when both dims fill a good part of a 32-wide tile.
  if (a >= 0 && b >= 0 && a != b && m.shape[a] >= 16 && m.shape[b] >= 16) {
    launch_tiled<T>(m, a, b, src, dst, stream);
  } else {
    launch_plain<T>(m, src, dst, stream);
  }
}

void plan_and_launch(Dims m, size_t elem, const char* src, char* dst, cudaStream_t stream) {
  if (m.rank() > kMaxCopyRank) {
    // Rare (a view of more than 8 unmergeable dims): one launch per outermost index.
    Dims rest{{m.shape.begin() + 1, m.shape.end()}, {m.src.begin() + 1, m.src.end()}, {m.dst.begin() + 1, m.dst.end()}};
    for (int64_t i = 0; i < m.shape[0]; ++i) {
      plan_and_launch(rest, elem, src + i * m.src[0] * static_cast<int64_t>(elem),
                      dst + i * m.dst[0] * static_cast<int64_t>(elem), stream);
    }
    return;
  }
  switch (widen(m, elem, src, dst)) {
    case 1:
      return launch_copy<WordOf<1>::type>(m, src, dst, stream);
    case 2:
      return launch_copy<WordOf<2>::type>(m, src, dst, stream);
    case 4:
      return launch_copy<WordOf<4>::type>(m, src, dst, stream);
    case 8:
      return launch_copy<WordOf<8>::type>(m, src, dst, stream);
    case 16:
      return launch_copy<WordOf<16>::type>(m, src, dst, stream);
    default:
      value_error("strided_copy: element size ", elem, " (expected 1, 2, 4 or 8 bytes)");
  }
}

void check_elem(const char* op, size_t elem) {
  if (elem != 1 && elem != 2 && elem != 4 && elem != 8)
    value_error(op, ": element size ", elem, " (expected 1, 2, 4 or 8 bytes)");
}

void check_rank(const char* op, const char* what, size_t got, size_t expected) {
  if (got != expected) value_error(op, ": ", what, " has ", got, " entries (expected ", expected, ", the rank)");
}

template <typename T>
void launch_concat(const ConcatPlan& p, void* dst, cudaStream_t stream) {
  const int64_t total = p.outer * p.group_len * p.inner;
  const unsigned grid = grid_for(total);
  if (total <= INT32_MAX) {
    concat_kernel<T, uint32_t>
        <<<grid, kThreadsPerBlock, 0, stream>>>(static_cast<T*>(dst), p, static_cast<uint32_t>(total));
  } else {
    concat_kernel<T, uint64_t>
        <<<grid, kThreadsPerBlock, 0, stream>>>(static_cast<T*>(dst), p, static_cast<uint64_t>(total));
  }
  TESSERA_CUDA_CHECK(cudaGetLastError());
}

void launch_concat_words(size_t word, const ConcatPlan& p, void* dst, cudaStream_t stream) {
  switch (word) {
    case 1:
      return launch_concat<WordOf<1>::type>(p, dst, stream);
    case 2:
      return launch_concat<WordOf<2>::type>(p, dst, stream);
    case 4:
      return launch_concat<WordOf<4>::type>(p, dst, stream);
    case 8:
      return launch_concat<WordOf<8>::type>(p, dst, stream);
    default:
      return launch_concat<WordOf<16>::type>(p, dst, stream);
  }
}

}  // namespace

void strided_copy(size_t elem_size, const Shape& shape, const void* src, int64_t src_offset, const Strides& src_strides,
                  void* dst, int64_t dst_offset, const Strides& dst_strides, cudaStream_t stream) {
  check_elem("strided_copy", elem_size);
  check_rank("strided_copy", "src_strides", src_strides.size(), shape.size());
  check_rank("strided_copy", "dst_strides", dst_strides.size(), shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] < 0 || src_strides[d] < 0 || dst_strides[d] < 0)
      value_error("strided_copy: negative extent or stride at dim ", d, " (got ", shape[d], ", ", src_strides[d], ", ",
                  dst_strides[d], ")");
    if (shape[d] == 0) return;
  }
  const int64_t elem = static_cast<int64_t>(elem_size);
  plan_and_launch(merge_dims(shape, src_strides, dst_strides), elem_size,
                  static_cast<const char*>(src) + src_offset * elem, static_cast<char*>(dst) + dst_offset * elem,
                  stream);
}

void transpose(size_t elem_size, const void* src, const Shape& in_shape, const std::vector<int>& perm, void* dst,
               cudaStream_t stream) {
  check_rank("transpose", "perm", perm.size(), in_shape.size());
  const Strides in = contiguous_strides(in_shape);
  Shape out_shape(perm.size());
  Strides src_strides(perm.size());
  std::vector<bool> seen(perm.size(), false);
  for (size_t i = 0; i < perm.size(); ++i) {
    const int p = perm[i];
    if (p < 0 || p >= static_cast<int>(perm.size()) || seen[p])
      value_error("transpose: perm is not a permutation of the ", perm.size(), " axes (entry ", i, " is ", p, ")");
    seen[p] = true;
    out_shape[i] = in_shape[p];
    src_strides[i] = in[p];
  }
  strided_copy(elem_size, out_shape, src, 0, src_strides, dst, 0, contiguous_strides(out_shape), stream);
}

void broadcast_to(size_t elem_size, const void* src, const Shape& in_shape, const Shape& out_shape, void* dst,
                  cudaStream_t stream) {
  strided_copy(elem_size, out_shape, src, 0, broadcast_strides(in_shape, out_shape), dst, 0,
               contiguous_strides(out_shape), stream);
}

void slice(size_t elem_size, const void* src, const Shape& in_shape, const std::vector<int64_t>& start,
           const std::vector<int64_t>& step, const Shape& out_shape, void* dst, cudaStream_t stream) {
  check_rank("slice", "start", start.size(), in_shape.size());
  check_rank("slice", "step", step.size(), in_shape.size());
  check_rank("slice", "out_shape", out_shape.size(), in_shape.size());
  const Strides in = contiguous_strides(in_shape);
  Strides src_strides(in.size());
  int64_t offset = 0;
  for (size_t d = 0; d < in.size(); ++d) {
    if (out_shape[d] > 0 && (start[d] < 0 || step[d] < 1 || start[d] + (out_shape[d] - 1) * step[d] >= in_shape[d]))
      value_error("slice: axis ", d, " takes ", out_shape[d], " elements from ", start[d], " in steps of ", step[d],
                  " (out of range for extent ", in_shape[d], ")");
    offset += start[d] * in[d];
    src_strides[d] = in[d] * step[d];
  }
  if (numel(out_shape) == 0) return;
  strided_copy(elem_size, out_shape, src, offset, src_strides, dst, 0, contiguous_strides(out_shape), stream);
}

void slice_pad(size_t elem_size, const void* src, const Shape& in_shape, const Shape& out_shape,
               const std::vector<int64_t>& start, const std::vector<int64_t>& step, void* dst, cudaStream_t stream) {
  check_rank("slice_pad", "start", start.size(), out_shape.size());
  check_rank("slice_pad", "step", step.size(), out_shape.size());
  check_rank("slice_pad", "in_shape", in_shape.size(), out_shape.size());
  const Strides full = contiguous_strides(out_shape);
  Strides dst_strides(full.size());
  int64_t offset = 0;
  for (size_t d = 0; d < full.size(); ++d) {
    if (in_shape[d] > 0 && (start[d] < 0 || step[d] < 1 || start[d] + (in_shape[d] - 1) * step[d] >= out_shape[d]))
      value_error("slice_pad: axis ", d, " stores ", in_shape[d], " elements from ", start[d], " in steps of ", step[d],
                  " (out of range for extent ", out_shape[d], ")");
    offset += start[d] * full[d];
    dst_strides[d] = full[d] * step[d];
  }
  const size_t out_bytes = static_cast<size_t>(numel(out_shape)) * elem_size;
  if (out_bytes > 0) TESSERA_CUDA_CHECK(cudaMemsetAsync(dst, 0, out_bytes, stream));
  if (numel(in_shape) == 0) return;
  strided_copy(elem_size, in_shape, src, 0, contiguous_strides(in_shape), dst, offset, dst_strides, stream);
}

void concatenate(size_t elem_size, const std::vector<ConcatInput>& inputs, int64_t outer, int64_t inner, void* dst,
                 cudaStream_t stream) {
  check_elem("concatenate", elem_size);
  int64_t axis_total = 0;
  for (const ConcatInput& in : inputs) {
    if (in.axis_len < 0) value_error("concatenate: negative axis length ", in.axis_len);
    axis_total += in.axis_len;
  }
  if (outer < 0 || inner < 0) value_error("concatenate: negative outer ", outer, " or inner ", inner);
  if (outer == 0 || inner == 0 || axis_total == 0) return;
  // Rows of `inner` elements are contiguous in every input and in the output: move
  // them in the widest word every pointer and the row length allow.
  size_t word = elem_size;
  for (size_t w : {size_t{16}, size_t{8}, size_t{4}, size_t{2}}) {
    if (w <= elem_size || w % elem_size != 0 || (static_cast<size_t>(inner) * elem_size) % w != 0) continue;
    bool ok = aligned_to(dst, static_cast<int>(w));
    for (const ConcatInput& in : inputs) ok = ok && (in.axis_len == 0 || aligned_to(in.data, static_cast<int>(w)));
    if (ok) {
      word = w;
      break;
    }
  }
  ConcatPlan p;
  p.outer = outer;
  p.inner = inner / static_cast<int64_t>(word / elem_size);
  p.axis_total = axis_total;
  auto flush = [&] {
    if (p.count == 0) return;
    p.begin[p.count] = p.group_len;
    launch_concat_words(word, p, dst, stream);
    p.axis_offset += p.group_len;
    p.count = 0;
    p.group_len = 0;
  };
  for (const ConcatInput& in : inputs) {
    if (in.axis_len == 0) continue;
    if (p.count == kMaxConcatInputs) flush();
    p.src[p.count] = in.data;
    p.begin[p.count] = p.group_len;
    p.group_len += in.axis_len;
    ++p.count;
  }
  flush();
}

void copy_bytes(const void* src, void* dst, size_t bytes, cudaStream_t stream) {
  if (bytes == 0 || src == dst) return;
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
}

}  // namespace tessera::cuda
