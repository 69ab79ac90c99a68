// Reductions (sum, prod, max, min) and arg max/min over a dense row-major buffer.
//
// After dropping size-1 dims and merging adjacent dims of the same kind, a reduction
// is one of:
//  * [K, R]     trailing axes reduced: each output is a row reduction;
//  * [K, R, K2] (or [R, K2]): column accumulation into K2-wide output rows;
//  * anything else: the input is permuted to [kept..., reduced...] (strided_copy)
//    and reduced as rows.
// Summation order is fixed by the shape alone:
//  * a row is cut into kBlock-element blocks; inside a block element i goes to lane
//    i % kLanes, the lanes are combined in a fixed halving tree, and the blocks are
//    combined pairwise (so float32 error grows ~ log n, not n);
//  * columns accumulate kRowBlock rows at a time, and the block sums are combined
//    pairwise with a binary-counter stack.
// Threads only decide who computes which block/row; partials are combined in order.
#include "backend/cpu/kernels/reduce.h"

#include <bit>
#include <limits>

#include "backend/cpu/kernels/copy.h"
#include "backend/cpu/kernels/elementwise_detail.h"
#include "backend/cpu/kernels/scratch.h"
#include "tessera/base/small_vector.h"

namespace tessera::cpu {
namespace {

using detail::Compute;

constexpr int64_t kBlock = 4096;    // elements per row block
constexpr int kLanes = 32;          // accumulators inside a block (4 AVX2 vectors)
constexpr int64_t kRowBlock = 16;   // rows summed sequentially before pairwise merging
constexpr int64_t kColChunk = 512;  // output columns per column-reduction task

// Accumulator type: float for float32 and halves, double for float64, int64 otherwise.
template <typename T>
using Acc = std::conditional_t<std::is_floating_point_v<Compute<T>>, Compute<T>, int64_t>;

template <typename T>
inline Acc<T> acc_load(T v) {
  return static_cast<Acc<T>>(detail::load(v));
}

template <ReduceOp Op, typename A>
struct Reducer {
  static A identity() {
    if constexpr (Op == ReduceOp::Sum)
      return A(0);
    else if constexpr (Op == ReduceOp::Prod)
      return A(1);
    else if constexpr (Op == ReduceOp::Max)  // -inf for floats: the max of an all -inf row is -inf
      return std::numeric_limits<A>::has_infinity ? -std::numeric_limits<A>::infinity()
                                                  : std::numeric_limits<A>::lowest();
    else
      return std::numeric_limits<A>::has_infinity ? std::numeric_limits<A>::infinity() : std::numeric_limits<A>::max();
  }
  // NaN in either operand wins for Max/Min; integers wrap (computed unsigned).
  static A combine(A a, A b) {
    if constexpr (Op == ReduceOp::Sum) {
      if constexpr (std::is_integral_v<A>)
        return static_cast<A>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
      else
        return a + b;
    } else if constexpr (Op == ReduceOp::Prod) {
      if constexpr (std::is_integral_v<A>)
        return static_cast<A>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
      else
        return a * b;
    } else if constexpr (Op == ReduceOp::Max) {
      return (b > a || b != b) ? b : a;
    } else {
      return (b < a || b != b) ? b : a;
    }
  }
};

// One block of a row: lane-strided accumulation then a fixed halving tree.
template <ReduceOp Op, typename T>
Acc<T> reduce_block(const T* x, int64_t n) {
  using A = Acc<T>;
  using R = Reducer<Op, A>;
  A acc[kLanes];
  for (int j = 0; j < kLanes; ++j) acc[j] = R::identity();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] = R::combine(acc[j], acc_load(x[i + j]));
  for (int j = 0; i + j < n; ++j) acc[j] = R::combine(acc[j], acc_load(x[i + j]));
  for (int s = kLanes / 2; s >= 1; s /= 2)
    for (int j = 0; j < s; ++j) acc[j] = R::combine(acc[j], acc[j + s]);
  return acc[0];
}

template <ReduceOp Op, typename A>
A combine_tree(const A* partials, int64_t lo, int64_t hi) {
  if (hi - lo == 1) return partials[lo];
  int64_t mid = lo + (hi - lo) / 2;
  return Reducer<Op, A>::combine(combine_tree<Op>(partials, lo, mid), combine_tree<Op>(partials, mid, hi));
}

template <ReduceOp Op, typename T>
Acc<T> reduce_row(const T* x, int64_t n, Acc<T>* partials) {  // partials: ceil(n / kBlock)
  if (n <= kBlock) return reduce_block<Op>(x, n);
  const int64_t nb = (n + kBlock - 1) / kBlock;
  for (int64_t b = 0; b < nb; ++b) partials[b] = reduce_block<Op>(x + b * kBlock, std::min(kBlock, n - b * kBlock));
  return combine_tree<Op>(partials, 0, nb);
}

template <typename T, typename A>
void store_out(T* out, int64_t i, A v) {
  out[i] = detail::store<T>(static_cast<Compute<T>>(v));
}

template <ReduceOp Op, typename T, typename Out>
void reduce_rows(const T* x, int64_t rows, int64_t len, Out* out) {
  if (rows >= 8 || rows * len < (1 << 16)) {
    const int64_t grain = std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(1, len));
    const ChunkScratch row_partials(sizeof(Acc<T>) * static_cast<size_t>((len + kBlock - 1) / kBlock),
                                    Scratch::ReduceChunks);
    parallel_for(rows, grain, [&](int64_t b, int64_t e) {
      ChunkScratch::Lease lease(row_partials);
      for (int64_t r = b; r < e; ++r) store_out(out, r, reduce_row<Op>(x + r * len, len, lease.as<Acc<T>>()));
    });
    return;
  }
  // Few long rows: blocks in parallel, then the same pairwise tree as reduce_row.
  const int64_t nb = (len + kBlock - 1) / kBlock;
  Acc<T>* partials = thread_scratch<Acc<T>>(static_cast<size_t>(rows * nb), Scratch::ReducePartials);
  parallel_for(rows * nb, 16, [&](int64_t b, int64_t e) {
    for (int64_t u = b; u < e; ++u) {
      int64_t r = u / nb, blk = u % nb;
      partials[u] = reduce_block<Op>(x + r * len + blk * kBlock, std::min(kBlock, len - blk * kBlock));
    }
  });
  for (int64_t r = 0; r < rows; ++r)
    store_out(out, r, nb == 1 ? partials[r] : combine_tree<Op>(partials + r * nb, 0, nb));
}

// out[o, c] = reduce_r x[o, r, c] for [outer, rows, cols].
template <ReduceOp Op, typename T, typename Out>
void reduce_columns(const T* x, int64_t outer, int64_t rows, int64_t cols, Out* out) {
  using A = Acc<T>;
  using R = Reducer<Op, A>;
  // Column chunks only split work (each column's order is fixed): wide chunks keep whole
  // pages of each input row in one task, at least 4 chunks give the threads work.
  const int64_t chunk = std::clamp<int64_t>((cols / 4 + 63) / 64 * 64, kColChunk, 4096);
  const int64_t chunks = (cols + chunk - 1) / chunk;
  // The stack is a binary counter over the row blocks: it never needs more levels than
  // the block count has bits.
  const int levels = std::bit_width(static_cast<uint64_t>((rows + kRowBlock - 1) / kRowBlock));
  const ChunkScratch buffers(sizeof(A) * static_cast<size_t>((levels + 1) * chunk), Scratch::ReduceChunks);
  parallel_for(outer * chunks, 1, [&](int64_t begin, int64_t end) {
    ChunkScratch::Lease lease(buffers);
    A* block = lease.as<A>();
    A* stack = block + chunk;  // level l at [l * chunk, (l + 1) * chunk)
    bool used[64];
    for (int64_t u = begin; u < end; ++u) {
      const int64_t o = u / chunks, c0 = (u % chunks) * chunk, w = std::min(chunk, cols - c0);
      const T* base = x + o * rows * cols + c0;
      std::fill(used, used + levels, false);
      for (int64_t r0 = 0; r0 < rows; r0 += kRowBlock) {
        std::fill(block, block + w, R::identity());
        const int64_t r1 = std::min(rows, r0 + kRowBlock);
        A* __restrict acc = block;  // never aliases x: lets the loop vectorize
        for (int64_t r = r0; r < r1; ++r) {
          const T* __restrict row = base + r * cols;
          for (int64_t c = 0; c < w; ++c) acc[c] = R::combine(acc[c], acc_load(row[c]));
        }
        int level = 0;
        for (; level < levels && used[level]; ++level) {
          A* s = stack + level * chunk;
          for (int64_t c = 0; c < w; ++c) block[c] = R::combine(s[c], block[c]);
          used[level] = false;
        }
        std::copy(block, block + w, stack + level * chunk);
        used[level] = true;
      }
      bool have = false;
      for (int level = 0; level < levels; ++level) {
        if (!used[level]) continue;
        A* s = stack + level * chunk;
        for (int64_t c = 0; c < w; ++c) block[c] = have ? R::combine(s[c], block[c]) : s[c];
        have = true;
      }
      if (!have) std::fill(block, block + w, R::identity());
      for (int64_t c = 0; c < w; ++c) store_out(out, o * cols + c0 + c, block[c]);
    }
  });
}

std::string_view op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Prod:
      return "prod";
    case ReduceOp::Max:
      return "max";
    case ReduceOp::Min:
      return "min";
  }
  return "reduce";
}

// Fallback: moves the reduced groups last ([kept..., reduced...]) and row-reduces.
template <ReduceOp Op, typename T, typename Out>
void reduce_permuted(const T* x, const int64_t* sizes, const bool* kinds, size_t g, Out* out) {
  SmallDims perm_shape, perm_strides, strides(g);
  int64_t stride = 1, kept = 1, red = 1;
  for (size_t i = g; i-- > 0;) {
    strides[i] = stride;
    stride *= sizes[i];
  }
  for (int pass = 0; pass < 2; ++pass)
    for (size_t i = 0; i < g; ++i)
      if (kinds[i] == (pass == 1)) {
        perm_shape.push_back(sizes[i]);
        perm_strides.push_back(strides[i]);
        (pass == 0 ? kept : red) *= sizes[i];
      }
  T* tmp = thread_scratch<T>(static_cast<size_t>(kept * red), Scratch::ReducePermuted);
  strided_copy(dtype_v<T>, x, 0, perm_strides, perm_shape, tmp);
  reduce_rows<Op>(tmp, kept, red, out);
}

template <ReduceOp Op, typename T, typename Out>
void reduce_groups(const T* x, const int64_t* sizes, const bool* kinds, size_t g, Out* out);

template <ReduceOp Op, typename T, typename Out>
void reduce_typed(const T* x, const Shape& shape, const SmallVec<bool, 8>& reduced, Out* out) {
  // Collapse to alternating groups of kept (false) / reduced (true) dims.
  SmallDims sizes;
  SmallVec<bool, 8> kinds;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (!kinds.empty() && kinds.back() == reduced[d]) {
      sizes.back() *= shape[d];
    } else {
      sizes.push_back(shape[d]);
      kinds.push_back(reduced[d]);
    }
  }
  if (sizes.empty()) {  // a single element
    store_out(out, 0, acc_load(x[0]));
    return;
  }
  reduce_groups<Op>(x, sizes.data(), kinds.data(), sizes.size(), out);
}

// sizes/kinds: alternating kept (false) / reduced (true) groups, row-major.
template <ReduceOp Op, typename T, typename Out>
void reduce_groups(const T* x, const int64_t* sizes, const bool* kinds, size_t g, Out* out) {
  if (g == 1 && !kinds[0]) {  // only size-1 dims reduced
    for (int64_t i = 0; i < sizes[0]; ++i) store_out(out, i, acc_load(x[i]));
  } else if (kinds[g - 1] && g <= 2) {
    reduce_rows<Op>(x, g == 1 ? 1 : sizes[0], sizes[g - 1], out);
  } else if (!kinds[g - 1] && g == 2) {
    reduce_columns<Op>(x, 1, sizes[0], sizes[1], out);
  } else if (!kinds[g - 1] && g == 3) {
    reduce_columns<Op>(x, sizes[0], sizes[1], sizes[2], out);
  } else if (kinds[g - 1]) {
    // [..., K, R]: reduce the trailing group as rows into accumulator-typed partials,
    // then reduce the rest (now ending in a kept group, so this branch is not taken
    // again and the slot is not reused while alive) from those.
    const int64_t len = sizes[g - 1];
    int64_t rows_n = 1;
    for (size_t i = 0; i + 1 < g; ++i) rows_n *= sizes[i];
    Acc<T>* partial = thread_scratch<Acc<T>>(static_cast<size_t>(rows_n), Scratch::ReduceGroupPartial);
    reduce_rows<Op>(x, rows_n, len, partial);
    reduce_groups<Op>(static_cast<const Acc<T>*>(partial), sizes, kinds, g - 1, out);
  } else {
    reduce_permuted<Op>(x, sizes, kinds, g, out);
  }
}

template <ReduceOp Op>
void reduce_op(DType dtype, const void* x, const Shape& shape, const SmallVec<bool, 8>& reduced, void* out) {
  detail::dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    reduce_typed<Op, T>(static_cast<const T*>(x), shape, reduced, static_cast<T*>(out));
  });
}

}  // namespace

void reduce(ReduceOp op, DType dtype, const void* x, const Shape& shape, const std::vector<int>& axes, void* out) {
  SmallVec<bool, 8> reduced(shape.size(), false);
  for (size_t i = 0; i < axes.size(); ++i) {
    if (axes[i] < 0 || axes[i] >= static_cast<int>(shape.size()) || (i > 0 && axes[i] <= axes[i - 1]))
      fail<AxisError>("{}: axes must be sorted, unique and in [0, {}) (got axis {})", op_name(op), shape.size(),
                      axes[i]);
    reduced[axes[i]] = true;
  }
  int64_t out_numel = 1, red_numel = 1;
  for (size_t d = 0; d < shape.size(); ++d) (reduced[d] ? red_numel : out_numel) *= shape[d];
  if (out_numel == 0) return;
  if (red_numel == 0) {
    if (op == ReduceOp::Max || op == ReduceOp::Min)
      fail<ValueError>("{}: reduction over an empty axis of shape {} has no identity", op_name(op), to_string(shape));
    store_from_double(dtype, out, 0, op == ReduceOp::Sum ? 0.0 : 1.0);
    detail::dispatch_bytes(dtype, [&](auto tag) {
      using U = typename decltype(tag)::type;
      U* o = static_cast<U*>(out);
      std::fill(o + 1, o + out_numel, o[0]);
    });
    return;
  }
  switch (op) {
    case ReduceOp::Sum:
      reduce_op<ReduceOp::Sum>(dtype, x, shape, reduced, out);
      break;
    case ReduceOp::Prod:
      reduce_op<ReduceOp::Prod>(dtype, x, shape, reduced, out);
      break;
    case ReduceOp::Max:
      reduce_op<ReduceOp::Max>(dtype, x, shape, reduced, out);
      break;
    case ReduceOp::Min:
      reduce_op<ReduceOp::Min>(dtype, x, shape, reduced, out);
      break;
  }
}

namespace {

// Does v replace best (at a later index) in an arg max/min? NaN wins and then stays.
template <typename C>
inline bool better(bool is_max, C v, C best) {
  if (best != best) return false;
  if (v != v) return true;
  return is_max ? v > best : v < best;
}

}  // namespace

void arg_reduce(bool is_max, DType dtype, const void* x, const Shape& shape, int axis, int64_t* out) {
  const char* op = is_max ? "argmax" : "argmin";
  if (axis < 0 || axis >= static_cast<int>(shape.size()))
    fail<AxisError>("{}: axis {} out of range for shape {}", op, axis, to_string(shape));
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= shape[d];
  for (size_t d = axis + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t len = shape[axis];
  if (outer * inner == 0) return;
  if (len == 0) fail<ValueError>("{}: empty axis {} of shape {}", op, axis, to_string(shape));
  detail::dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = Compute<T>;
    const T* xs = static_cast<const T*>(x);
    const int64_t chunks = (inner + kColChunk - 1) / kColChunk;
    const ChunkScratch scratch(sizeof(C) * static_cast<size_t>(std::min(inner, kColChunk)), Scratch::ReduceChunks);
    parallel_for(outer * chunks, std::max<int64_t>(1, (1 << 15) / (len * std::min(inner, kColChunk))),
                 [&](int64_t begin, int64_t end) {
                   ChunkScratch::Lease lease(scratch);
                   C* best = lease.as<C>();
                   for (int64_t u = begin; u < end; ++u) {
                     const int64_t o = u / chunks, c0 = (u % chunks) * kColChunk, w = std::min(kColChunk, inner - c0);
                     const T* base = xs + o * len * inner + c0;
                     int64_t* idx = out + o * inner + c0;
                     for (int64_t c = 0; c < w; ++c) {
                       best[c] = detail::load(base[c]);
                       idx[c] = 0;
                     }
                     for (int64_t l = 1; l < len; ++l) {
                       const T* row = base + l * inner;
                       for (int64_t c = 0; c < w; ++c) {
                         C v = detail::load(row[c]);
                         if (better<C>(is_max, v, best[c])) {
                           best[c] = v;
                           idx[c] = l;
                         }
                       }
                     }
                   }
                 });
  });
}

}  // namespace tessera::cpu
