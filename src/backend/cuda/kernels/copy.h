// Layout kernels on raw device pointers: strided copies (transpose, broadcast, slice,
// the zero-padded store of a slice's gradient) and concatenation. They move bytes, so
// every dtype works: a launcher takes the element size (1, 2, 4 or 8 bytes).
//
// Every launcher queues its work on `stream` only (no host synchronization, no device
// allocation) so a step that uses them can be captured in a CUDA graph, and does
// nothing for an empty tensor. Sizes and offsets are 64-bit throughout.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tessera/base/shape.h"

namespace tessera::cuda {

// Dims of one launch after merging: views of higher rank (after size-1 dims are
// dropped and mergeable neighbours merged) are split into several launches on the host.
inline constexpr int kMaxCopyRank = 8;

// For every multi-index c of `shape` (in elements of `elem_size` bytes):
//   dst[dst_offset + sum_d c[d] * dst_strides[d]] = src[src_offset + sum_d c[d] * src_strides[d]]
// Strides are >= 0 (0 broadcasts). Destination elements must not overlap each other or
// the source. Dims are merged first; when the innermost run is contiguous on both sides
// it is moved in 16/8/4-byte words where alignment allows. When the source's unit-stride
// dim is not the destination's (a transpose that moves the last axis) a 32x32 tile goes
// through shared memory, so both the reads and the writes are coalesced.
void strided_copy(size_t elem_size, const Shape& shape, const void* src, int64_t src_offset, const Strides& src_strides,
                  void* dst, int64_t dst_offset, const Strides& dst_strides, cudaStream_t stream);

// dst (dense, shape in_shape permuted) = transpose(src of in_shape, perm):
// dst.shape[i] = in_shape[perm[i]].
void transpose(size_t elem_size, const void* src, const Shape& in_shape, const std::vector<int>& perm, void* dst,
               cudaStream_t stream);

// dst (dense, out_shape) = src (dense, in_shape) broadcast numpy-style to out_shape.
void broadcast_to(size_t elem_size, const void* src, const Shape& in_shape, const Shape& out_shape, void* dst,
                  cudaStream_t stream);

// dst (dense, out_shape) = src[start[d] : ... : step[d]] per axis (src dense, in_shape;
// out_shape[d] elements taken along axis d from start[d] in steps of step[d] >= 1).
void slice(size_t elem_size, const void* src, const Shape& in_shape, const std::vector<int64_t>& start,
           const std::vector<int64_t>& step, const Shape& out_shape, void* dst, cudaStream_t stream);

// The transpose of slice: dst (dense, out_shape) = zeros, then src (dense, in_shape)
// written at dst[start[d] + c[d] * step[d]].
void slice_pad(size_t elem_size, const void* src, const Shape& in_shape, const Shape& out_shape,
               const std::vector<int64_t>& start, const std::vector<int64_t>& step, void* dst, cudaStream_t stream);

// One input of a concatenation: a dense [outer, axis_len, inner] buffer.
struct ConcatInput {
  const void* data = nullptr;
  int64_t axis_len = 0;
};
// dst [outer, sum(axis_len), inner] = the inputs side by side along the middle axis.
// One kernel writes the whole output when there are up to 32 non-empty inputs (their
// pointers travel in the launch's parameters); more inputs take one launch per 32.
void concatenate(size_t elem_size, const std::vector<ConcatInput>& inputs, int64_t outer, int64_t inner, void* dst,
                 cudaStream_t stream);

// dst = src, `bytes` bytes (cudaMemcpyAsync device to device; nothing when they alias).
void copy_bytes(const void* src, void* dst, size_t bytes, cudaStream_t stream);

}  // namespace tessera::cuda
