// Gather / scatter-add along one axis of a [outer, axis_len, inner] view.
//
// Indices are validated (and negatives normalized) on the calling thread before any
// work starts, so bad input throws instead of reading out of bounds.
//
// Scatter-add determinism: work is split over (outer, inner-block) pairs, never over
// indices, and each output element receives its updates in increasing index position.
// The result is therefore independent of the thread count. Low-precision floats
// (bfloat16, float16) are rounded after every addition, as the element type dictates;
// integers wrap (two's complement); bool accumulates as logical or.
#include "backend/cpu/kernels/gather.h"

#include <cstring>
#include <type_traits>
#include <vector>

#include "backend/cpu/kernels/nn_common.h"
#include "backend/cpu/kernels/scratch.h"
#include "tessera/base/error.h"
#include "tessera/base/thread_pool.h"

namespace tessera::cpu {
namespace {

void check_sizes(const char* op, int64_t outer, int64_t axis_len, int64_t inner, int64_t n_idx) {
  if (outer < 0 || axis_len < 0 || inner < 0 || n_idx < 0) {
    fail<ValueError>("{}: negative size (got outer={}, axis_len={}, inner={}, n_idx={}; expected >= 0)", op, outer,
                     axis_len, inner, n_idx);
  }
}

inline int64_t normalize(const char* op, int64_t v, int64_t pos, int64_t axis_len) {
  const int64_t i = v < 0 ? v + axis_len : v;
  if (i < 0 || i >= axis_len) {
    fail<ValueError>("{}: index out of range at position {} (got {}; expected -{} <= index < {})", op, pos, v, axis_len,
                     axis_len);
  }
  return i;
}

// Non-negative copies of n indices (throws on the first out-of-range one), in this
// thread's scratch.
const int64_t* normalized(const char* op, const int64_t* idx, int64_t n, int64_t axis_len) {
  int64_t* out = thread_scratch<int64_t>(static_cast<size_t>(n), Scratch::GatherIndices);
  for (int64_t p = 0; p < n; ++p) out[p] = normalize(op, idx[p], p, axis_len);
  return out;
}

// a += b in T's own arithmetic.
template <typename T>
inline void add_into(T& a, T b) {
  if constexpr (std::is_same_v<T, bool>) {
    a = a || b;
  } else if constexpr (nn_detail::kIsHalf<T>) {
    a = nn_detail::from_float<T>(nn_detail::to_float(a) + nn_detail::to_float(b));
  } else if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    a = static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    a += b;
  }
}

template <typename Fn>
void dispatch_all(DType dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case DType::Bool:
      fn(bool{});
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
    case DType::Float16:
      fn(float16{});
      break;
    case DType::BFloat16:
      fn(bfloat16{});
      break;
    case DType::Float32:
      fn(float{});
      break;
    case DType::Float64:
      fn(double{});
      break;
    default:
      fail<DTypeError>("{}: unsupported dtype (got {})", op, static_cast<int>(dtype));
  }
}

// Inner elements per scatter task: blocks of 512 let a single wide row (embedding
// gradients: outer = 1, inner = d_model) still split across threads.
int64_t inner_block(int64_t inner) { return std::max<int64_t>(1, std::min<int64_t>(inner, 512)); }

template <typename T>
void scatter_add_impl(const T* upd, int64_t outer, int64_t axis_len, int64_t inner, const int64_t* idx, int64_t n_idx,
                      T* out) {
  const int64_t block = inner_block(inner);
  const int64_t blocks = num_chunks(inner, block);
  const int64_t tasks = outer * blocks;
  const int64_t grain =
      std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, block * std::max<int64_t>(1, n_idx)));
  parallel_for(tasks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t o = task / blocks;
      const int64_t r0 = (task % blocks) * block;
      const int64_t r1 = std::min(inner, r0 + block);
      for (int64_t i = 0; i < n_idx; ++i) {
        const T* src = upd + (o * n_idx + i) * inner;
        T* dst = out + (o * axis_len + idx[i]) * inner;
        for (int64_t r = r0; r < r1; ++r) add_into(dst[r], src[r]);
      }
    }
  });
}

template <typename T>
void gather_along_impl(const T* x, int64_t outer, int64_t axis_len, int64_t inner, const int64_t* idx, int64_t n_idx,
                       T* out) {
  const int64_t rows = outer * n_idx;
  parallel_for(rows, nn_detail::row_grain(inner), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t o = row / n_idx;
      const int64_t* ir = idx + row * inner;
      T* dst = out + row * inner;
      for (int64_t r = 0; r < inner; ++r) {
        const int64_t i = ir[r] < 0 ? ir[r] + axis_len : ir[r];
        dst[r] = x[(o * axis_len + i) * inner + r];
      }
    }
  });
}

template <typename T>
void scatter_add_along_impl(const T* upd, int64_t outer, int64_t axis_len, int64_t inner, const int64_t* idx,
                            int64_t n_idx, T* out) {
  const int64_t block = inner_block(inner);
  const int64_t blocks = num_chunks(inner, block);
  const int64_t grain =
      std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, block * std::max<int64_t>(1, n_idx)));
  parallel_for(outer * blocks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t o = task / blocks;
      const int64_t r0 = (task % blocks) * block;
      const int64_t r1 = std::min(inner, r0 + block);
      for (int64_t j = 0; j < n_idx; ++j) {
        const int64_t* ir = idx + (o * n_idx + j) * inner;
        const T* src = upd + (o * n_idx + j) * inner;
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t i = ir[r] < 0 ? ir[r] + axis_len : ir[r];
          add_into(out[(o * axis_len + i) * inner + r], src[r]);
        }
      }
    }
  });
}

// Validates idx: [outer, n_idx, inner] against axis_len.
void check_along(const char* op, const int64_t* idx, int64_t count, int64_t axis_len) {
  if (count > 0 && !idx) fail<ValueError>("{}: index buffer is null", op);
  for (int64_t p = 0; p < count; ++p) normalize(op, idx[p], p, axis_len);
}

}  // namespace

void gather(DType dtype, const void* x, int64_t outer, int64_t axis_len, int64_t inner, const int64_t* idx,
            int64_t n_idx, void* out) {
  check_sizes("gather", outer, axis_len, inner, n_idx);
  if (n_idx > 0 && !idx) fail<ValueError>("gather: index buffer is null");
  const int64_t* ids = normalized("gather", idx, n_idx, axis_len);
  const size_t row_bytes = static_cast<size_t>(inner) * itemsize(dtype);
  if (row_bytes == 0 || outer == 0) return;
  const char* src = static_cast<const char*>(x);
  char* dst = static_cast<char*>(out);
  // One task per output row of `inner` elements: a memcpy from the selected input row.
  parallel_for(outer * n_idx, nn_detail::row_grain(static_cast<int64_t>(row_bytes) / 4 + 1),
               [&](int64_t begin, int64_t end) {
                 for (int64_t row = begin; row < end; ++row) {
                   const int64_t o = row / n_idx;
                   const int64_t i = ids[row % n_idx];
                   std::memcpy(dst + row * row_bytes, src + (o * axis_len + i) * row_bytes, row_bytes);
                 }
               });
}

void scatter_add(DType dtype, const void* updates, int64_t outer, int64_t axis_len, int64_t inner, const int64_t* idx,
                 int64_t n_idx, void* out) {
  check_sizes("scatter_add", outer, axis_len, inner, n_idx);
  if (n_idx > 0 && !idx) fail<ValueError>("scatter_add: index buffer is null");
  const int64_t* ids = normalized("scatter_add", idx, n_idx, axis_len);
  if (inner == 0 || outer == 0 || n_idx == 0) return;
  dispatch_all(dtype, "scatter_add", [&](auto tag) {
    using T = decltype(tag);
    scatter_add_impl(static_cast<const T*>(updates), outer, axis_len, inner, ids, n_idx, static_cast<T*>(out));
  });
}

void gather_along(DType dtype, const void* x, int64_t outer, int64_t axis_len, int64_t inner, const int64_t* idx,
                  int64_t n_idx, void* out) {
  check_sizes("gather_along", outer, axis_len, inner, n_idx);
  check_along("gather_along", idx, outer * n_idx * inner, axis_len);
  if (outer * n_idx * inner == 0) return;
  dispatch_all(dtype, "gather_along", [&](auto tag) {
    using T = decltype(tag);
    gather_along_impl(static_cast<const T*>(x), outer, axis_len, inner, idx, n_idx, static_cast<T*>(out));
  });
}

void scatter_add_along(DType dtype, const void* updates, int64_t outer, int64_t axis_len, int64_t inner,
                       const int64_t* idx, int64_t n_idx, void* out) {
  check_sizes("scatter_add_along", outer, axis_len, inner, n_idx);
  check_along("scatter_add_along", idx, outer * n_idx * inner, axis_len);
  if (outer * n_idx * inner == 0) return;
  dispatch_all(dtype, "scatter_add_along", [&](auto tag) {
    using T = decltype(tag);
    scatter_add_along_impl(static_cast<const T*>(updates), outer, axis_len, inner, idx, n_idx, static_cast<T*>(out));
  });
}

}  // namespace tessera::cpu
