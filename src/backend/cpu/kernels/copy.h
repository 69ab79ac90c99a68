// Layout kernels: strided gathers into contiguous buffers (transpose, slice,
// broadcast materialization), concatenation and padding. All dtypes (byte copies).
#pragma once

#include <cstdint>
#include <vector>

#include "tessera/base/dtype.h"
#include "tessera/base/shape.h"
#include "tessera/base/small_vector.h"

namespace tessera::cpu {

// dst (contiguous, `shape`) [i0..in] = src[offset + sum_k i_k * src_strides[k]].
// Strides are in elements and may be 0 (broadcast) or negative. Blocked for cache
// when the innermost source stride is not 1 (transposes).
void strided_copy(DType dtype, const void* src, int64_t src_offset, DimsRef src_strides, DimsRef shape, void* dst);

// Writes a contiguous `src` of `shape` into dst (contiguous, `dst_shape`) at element
// offset `dst_offset` with dst strides `dst_strides` (the inverse of strided_copy;
// used by pad and concatenate).
void strided_store(DType dtype, const void* src, const Shape& shape, void* dst, int64_t dst_offset,
                   DimsRef dst_strides);

}  // namespace tessera::cpu
