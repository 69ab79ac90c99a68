// Private helpers shared by the elementwise, copy and reduce kernels: dtype
// dispatch, half-precision load/store, and the broadcast-layout machinery
// (dim collapsing + iteration over contiguous inner rows).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "tessera/base/dtype.h"
#include "tessera/base/error.h"
#include "tessera/base/shape.h"
#include "tessera/base/small_vector.h"
#include "tessera/base/thread_pool.h"

namespace tessera::cpu::detail {

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls fn(TypeTag<T>{}) with T the C++ type of `dtype`.
template <typename F>
decltype(auto) dispatch(DType dtype, F&& fn) {
  switch (dtype) {
    case DType::Bool:
      return fn(TypeTag<bool>{});
    case DType::UInt8:
      return fn(TypeTag<uint8_t>{});
    case DType::Int8:
      return fn(TypeTag<int8_t>{});
    case DType::UInt32:
      return fn(TypeTag<uint32_t>{});
    case DType::Int32:
      return fn(TypeTag<int32_t>{});
    case DType::Int64:
      return fn(TypeTag<int64_t>{});
    case DType::Float16:
      return fn(TypeTag<float16>{});
    case DType::BFloat16:
      return fn(TypeTag<bfloat16>{});
    case DType::Float32:
      return fn(TypeTag<float>{});
    case DType::Float64:
      return fn(TypeTag<double>{});
  }
  fail<DTypeError>("dispatch: unknown dtype {}", static_cast<int>(dtype));
}

// Calls fn(TypeTag<U>{}) with U an unsigned integer of the same width as `dtype`
// (for kernels that only move bytes).
template <typename F>
decltype(auto) dispatch_bytes(DType dtype, F&& fn) {
  switch (itemsize(dtype)) {
    case 1:
      return fn(TypeTag<uint8_t>{});
    case 2:
      return fn(TypeTag<uint16_t>{});
    case 4:
      return fn(TypeTag<uint32_t>{});
    default:
      return fn(TypeTag<uint64_t>{});
  }
}

template <typename T>
inline constexpr bool kIsHalf = std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>;

// Storage type -> compute type: halves compute in float, everything else natively.
template <typename T>
using Compute = std::conditional_t<kIsHalf<T>, float, T>;

template <typename T>
inline Compute<T> load(T v) {
  if constexpr (std::is_same_v<T, bfloat16>)
    return bf16_to_float(v);
  else if constexpr (std::is_same_v<T, float16>)
    return f16_to_float(v);
  else
    return v;
}

template <typename T>
inline T store(Compute<T> v) {
  if constexpr (std::is_same_v<T, bfloat16>)
    return float_to_bf16(v);
  else if constexpr (std::is_same_v<T, float16>)
    return float_to_f16(v);
  else
    return v;
}

// A broadcast layout over K operands after collapsing: dims of size 1 are dropped and
// adjacent dims merged when every operand walks them as one dim. Inline storage for
// the at most 16 dims collapse allows: building a layout allocates nothing.
template <int K>
struct Layout {
  SmallVec<int64_t, 16> shape;
  std::array<SmallVec<int64_t, 16>, K> strides;
  int64_t numel = 1;
};

template <int K>
Layout<K> collapse(DimsRef shape, const std::array<DimsRef, K>& strides) {
  Layout<K> out;
  for (size_t d = 0; d < shape.size(); ++d) {
    out.numel *= shape[d];
    if (shape[d] == 1) continue;
    bool merge = !out.shape.empty();
    for (int k = 0; k < K && merge; ++k) merge = out.strides[k].back() == strides[k][d] * shape[d];
    if (merge) {
      out.shape.back() *= shape[d];
      for (int k = 0; k < K; ++k) out.strides[k].back() = strides[k][d];
    } else {
      out.shape.push_back(shape[d]);
      for (int k = 0; k < K; ++k) out.strides[k].push_back(strides[k][d]);
    }
  }
  if (out.shape.size() > 16)
    fail<ShapeError>("elementwise: too many non-mergeable dims (got {}; expected <= 16)", out.shape.size());
  if (out.numel == 0) out.shape.assign(1, 0);
  if (out.shape.empty()) {  // a scalar: one row of one element
    out.shape.push_back(1);
    for (int k = 0; k < K; ++k) out.strides[k].push_back(0);
  }
  return out;
}

// Walks the flat (row-major) index range [begin, end) of `layout` as runs along the
// innermost dim: fn(offsets, n) with offsets[k] the element offset of operand k at the
// run's start; the flat position of the run start is begin + (elements seen so far).
template <int K, typename F>
void for_each_run(const Layout<K>& layout, int64_t begin, int64_t end, F&& fn) {
  const int nd = static_cast<int>(layout.shape.size());
  const int64_t inner = layout.shape[nd - 1];
  int64_t idx[16] = {};
  std::array<int64_t, K> off{};
  int64_t rem = begin / inner;
  int64_t col = begin % inner;
  for (int d = nd - 2; d >= 0; --d) {
    idx[d] = rem % layout.shape[d];
    rem /= layout.shape[d];
  }
  for (int k = 0; k < K; ++k) {
    off[k] = col * layout.strides[k][nd - 1];
    for (int d = 0; d < nd - 1; ++d) off[k] += idx[d] * layout.strides[k][d];
  }
  int64_t pos = begin;
  while (pos < end) {
    int64_t n = std::min(inner - col, end - pos);
    fn(off, n);
    pos += n;
    if (pos >= end) break;
    // advance to the start of the next row
    for (int k = 0; k < K; ++k) off[k] -= col * layout.strides[k][nd - 1];
    col = 0;
    for (int d = nd - 2; d >= 0; --d) {
      ++idx[d];
      for (int k = 0; k < K; ++k) off[k] += layout.strides[k][d];
      if (idx[d] < layout.shape[d]) break;
      for (int k = 0; k < K; ++k) off[k] -= idx[d] * layout.strides[k][d];
      idx[d] = 0;
    }
  }
}

// Elements per parallel chunk for streaming kernels: fixed (thread-count independent).
inline constexpr int64_t kStreamGrain = 1 << 16;

}  // namespace tessera::cpu::detail
