// Column reductions of wide rows: out[o, c] = op over l < len of x[o, l, c] for a dense
// row-major float array [outer, len, inner] with inner >= kColumnSumMinColumns. This is
// a bias gradient ([tokens, d] -> [d]: GPT-2's qkv, attention-out, fc1 and fc2 biases
// sum 16384 rows of 768 to 3072 bf16 columns each), and any other sum / prod / max /
// min over leading or middle axes of such an array.
//
// Two kernels. The first gives a block of 32 x 8 threads a unit: a strip of 32 x V
// adjacent columns (V = 16 bytes of elements: 8 bf16/f16, 4 f32, 2 f64) of one chunk of
// chunk_len rows. Thread (tx, ty) owns the strip's columns [tx V, tx V + V) and adds
// the chunk's rows ty, ty + 8, ... in row order with one 16-byte load per row; the 8
// row lanes are then combined in lane order through shared memory, and the block writes
// the chunk's partial row (or, with one chunk, the output). The second kernel adds each
// column's chunk partials: lane ty takes chunks ty, ty + 8, ... in order, then the 8
// lanes in lane order. Where the rows or the pointer do not allow 16-byte loads, each
// thread owns one column (scalar loads) with the same row lanes and chunks, so the
// order of every sum depends on the shape only: no atomics, the same bits on every
// run and at any alignment. Accumulation as in reduce.h: float32 for float32 /
// bfloat16 / float16, float64 for float64; halves are rounded once, at the end.
//
// Cost: one read of x, plus outer x chunks x inner accumulators written and read back
// (chunks is chosen so that about kColumnSumTargetUnits units fill the device, at
// least kColumnSumMinChunkRows rows each: for [16384, 768] bf16 that is 256 chunks of
// 64 rows, 0.8 MB of partials beside the 25 MB read).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/kernels/reduce.h"

namespace tessera::cuda {

inline constexpr int64_t kColumnSumMinColumns = 64;     // narrower rows keep the thread-per-column kernel
inline constexpr int64_t kColumnSumTargetUnits = 1024;  // ~8 blocks per SM of a 132-SM H100
inline constexpr int64_t kColumnSumMinChunkRows = 64;   // 8 rows per row lane at least

// Whether the column kernels take an array of `dtype` with rows of `inner` elements.
bool column_sum_applies(DType dtype, int64_t inner);

// The row chunking of [outer, len, inner] (shape only): chunk_len rows per chunk, a
// multiple of the 8 row lanes; chunks = ceil(len / chunk_len). With chunks > 1 the
// launch needs outer * chunks * inner accumulators of scratch.
void plan_column_sum(DType dtype, int64_t outer, int64_t len, int64_t inner, int64_t* chunk_len, int64_t* chunks);

// Runs the kernels on `stream`: x as above, out [outer, inner] of `dtype`, scratch the
// partials (256-byte aligned; unused with one chunk). len > 0. Returns the launch status.
cudaError_t column_sum(ReduceOp op, DType dtype, int64_t outer, int64_t len, int64_t inner, int64_t chunk_len,
                       int64_t chunks, const void* x, void* out, void* scratch, cudaStream_t stream);

}  // namespace tessera::cuda
