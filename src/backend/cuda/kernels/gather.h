// Gather and scatter-add along one axis on raw device pointers: the kernels behind
// take (embedding lookup), its gradient, take_along_axis and its gradient. As on the
// CPU (backend/cpu/kernels/gather.h) a buffer is viewed as [outer, axis_len, inner].
//
// Index buffers are int32 or int64 (idx_dtype); negative indices count from the end.
// Out-of-range indices: the CPU throws before it reads anything, but a GPU kernel cannot
// stop the stream to report. Here nothing is ever read or written out of bounds:
//  * gathers write NaN (all-ones bytes) into the output elements of an out-of-range index
//    for floating dtypes, and zero for integer and bool dtypes, so a bad token id shows
//    up as a NaN loss instead of a silent wrong answer;
//  * scatter-adds drop the updates of an out-of-range index.
//
// Launchers queue work on `stream` only (no host synchronization, no allocation: the
// scatter-add's sort workspace comes from the caller), so they can be captured in a
// CUDA graph. All results are deterministic (no atomics).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "tessera/base/dtype.h"

namespace tessera::cuda {

// out[o, i, r] = x[o, idx[i], r] for o < outer, i < n_idx, r < inner (out: [outer, n_idx,
// inner]). Any dtype (moves bytes; rows go in 16-byte words when aligned). The GPT
// embedding lookup is outer = 1, axis_len = vocab, inner = d_model.
void gather(DType dtype, const void* x, int64_t outer, int64_t axis_len, int64_t inner, const void* idx,
            DType idx_dtype, int64_t n_idx, void* out, cudaStream_t stream);

// Device workspace bytes scatter_add needs for n_idx indices into an axis of axis_len
// (host-only arithmetic plus cub's size query: safe while a graph is being captured).
size_t scatter_add_scratch_bytes(int64_t n_idx, int64_t axis_len);

// out = zeros [outer, axis_len, inner]; out[o, idx[i], r] += updates[o, i, r].
// The embedding backward (dtable[V, D] += dout[B*T, D] at ids), deterministic: the
// (index, position) pairs are sorted with a stable radix sort (cub), then one block per
// run of equal indices sums that run's update rows in position order and writes the row
// once. float32 and float64 sums are bitwise the CPU's (same order, same type);
// float16/bfloat16 accumulate in float32 and round once (the CPU rounds after every
// addition, so results differ by rounding); integers wrap; bool is logical or.
// `scratch` holds at least scatter_add_scratch_bytes(n_idx, axis_len) bytes, 256-byte
// aligned. Needs n_idx < 2^31 and axis_len < 2^32 - 1.
void scatter_add(DType dtype, const void* updates, int64_t outer, int64_t axis_len, int64_t inner, const void* idx,
                 DType idx_dtype, int64_t n_idx, void* out, void* scratch, size_t scratch_bytes, cudaStream_t stream);

// take_along_axis: out[o, j, r] = x[o, idx[o, j, r], r] with idx and out: [outer, n_idx,
// inner]. Element sizes 1, 2, 4, 8 (any dtype).
void gather_along(DType dtype, const void* x, int64_t outer, int64_t axis_len, int64_t inner, const void* idx,
                  DType idx_dtype, int64_t n_idx, void* out, cudaStream_t stream);

// out = zeros [outer, axis_len, inner]; out[o, idx[o, j, r], r] += updates[o, j, r]. One
// thread per (o, r) column adds its updates in j order in the element type, exactly as
// the CPU does: results are bitwise the CPU's for every dtype.
void scatter_add_along(DType dtype, const void* updates, int64_t outer, int64_t axis_len, int64_t inner,
                       const void* idx, DType idx_dtype, int64_t n_idx, void* out, cudaStream_t stream);

}  // namespace tessera::cuda
