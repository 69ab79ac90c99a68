// Reductions on the GPU over dense row-major buffers: sum / prod / max / min over any
// set of axes, and arg max / arg min along one axis.
//
// dtypes: every DType. Accumulation (like the CPU kernels in backend/cpu/kernels/
// reduce.h): float32 for float32/bfloat16/float16, float64 for float64, int64 for
// integers and bool (wrapping); the output has the input's dtype (halves rounded to
// nearest even). NaN propagates through max/min. The order of every sum depends only
// on the shape (fixed trees, fixed chunking, no atomics): results are deterministic,
// though not bitwise the CPU's (its blocked order differs).
//
// A reduction is planned on the host from the shape alone (plan_reduce; and the path
// flag below, read once per process), then launched on a stream; the launchers never
// allocate or synchronize. Scratch (two-pass schemes) comes from the caller:
// plan.scratch_bytes, 256-byte aligned.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tessera/base/dtype.h"
#include "tessera/base/op_list.h"

namespace tessera::cuda {

using ReduceOp = ReduceKind;  // base/op_list.h

inline constexpr int kReduceMaxDims = 8;  // kept or reduced dim groups of the general kernel

// After dropping size-1 dims and merging neighbouring dims of the same kind (kept or
// reduced), a reduction runs as one of:
//   Empty   nothing to write (an output dim is 0);
//   Fill    every output is the identity (a reduced dim is 0: sum 0, prod 1);
//   Copy    nothing is reduced (only size-1 axes): out[i] = x[i];
//   Rows    [outer, len], reducing len (trailing axes): a thread, warp or block per
//           row by length; fewer than 256 rows of 4096 or more (a gradient norm's
//           sums of squares) are cut into `chunks` of chunk_len, about 512 blocks in
//           all, and finished by a second pass over the partials (legacy: rows longer
//           than 32768 in chunks of 16384);
//   ColumnStrips [outer, len, inner], reducing len (leading/middle axes, e.g. a bias
//           gradient [tokens, d] -> [d]) of a float dtype with inner >= 64: a block
//           per strip of columns and chunk of chunk_len rows with 16-byte loads, and
//           with chunks > 1 a second kernel adding the chunk partials in chunk order
//           (column_sum.h);
//   Columns the same shapes otherwise (narrow rows, integers; and every such shape
//           with TESSERA_CUDA_REDUCE=legacy): a thread per output column and chunk of
//           chunk_len rows, summed in row order; with chunks > 1 a second pass adds
//           the chunk partials in chunk order;
//   General any other pattern: a warp per output over the reduced index, with the
//           kept and reduced groups' strides (div/mod index math).
struct ReducePlan {
  enum class Kind { Empty, Fill, Copy, Rows, ColumnStrips, Columns, General };
  Kind kind = Kind::Empty;
  int64_t out_numel = 0;      // outputs
  int64_t reduced_numel = 0;  // elements reduced into each output
  int64_t outer = 1, len = 1, inner = 1;
  int64_t chunks = 1, chunk_len = 0;
  int kept_rank = 0, reduced_rank = 0;  // General
  int64_t kept_dims[kReduceMaxDims] = {}, kept_strides[kReduceMaxDims] = {};
  int64_t reduced_dims[kReduceMaxDims] = {}, reduced_strides[kReduceMaxDims] = {};
  size_t scratch_bytes = 0;
};

// The plans (TESSERA_CUDA_REDUCE, read on first use): Column the ColumnStrips kernels
// where they apply and the Rows chunking above (the default); Legacy the earlier plans,
// always the thread-per-column Columns kernel and the legacy Rows chunking (kept for
// A/B timing and as a reference).
enum class ReducePath { Column, Legacy };
ReducePath reduce_path();
void set_reduce_path(ReducePath path);  // tests

// Plans reducing an array of `dtype` and `shape` over `axes` (sorted, unique, in range:
// the caller checks). Returns false when the general kernel would need more than
// kReduceMaxDims kept or reduced groups.
bool plan_reduce(DType dtype, const std::vector<int64_t>& shape, const std::vector<int>& axes, ReducePlan* plan);

// Runs a plan: out has out_numel elements of `dtype`; scratch holds plan.scratch_bytes.
// Max/Min of a Fill plan (an empty reduction) is the caller's error to report. Returns
// the launch status (cudaGetLastError).
cudaError_t reduce(ReduceOp op, DType dtype, const ReducePlan& plan, const void* x, void* out, void* scratch,
                   cudaStream_t stream);

// out[o, c] = the index l of the max (min) of x[o, l, c] over l < len ([outer, len,
// inner] row-major); ties give the first index; a NaN wins (the first NaN). len > 0.
cudaError_t arg_reduce(bool is_max, DType dtype, const void* x, int64_t outer, int64_t len, int64_t inner, int64_t* out,
                       cudaStream_t stream);

}  // namespace tessera::cuda
