// Reductions over any set of axes of a dense row-major buffer.
//
// Accumulation: float64 in double; float32/bfloat16/float16 in float32 with a
// blocked (pairwise-like) order; integers and bool in int64. The output dtype equals
// the input dtype (the op layer casts bool to int64 before Sum). The summation order
// depends only on the shape, never on the thread count (bitwise reproducible).
#pragma once

#include <cstdint>
#include <vector>

#include "tessera/base/dtype.h"
#include "tessera/base/op_list.h"
#include "tessera/base/shape.h"

namespace tessera::cpu {

using ReduceOp = ReduceKind;  // base/op_list.h

// out has `shape` with `axes` removed (axes sorted, unique, non-empty). Max/Min of an
// empty reduction is an error caught by the op layer; Sum of empty is 0, Prod 1.
// NaN propagates through Max/Min.
void reduce(ReduceOp op, DType dtype, const void* x, const Shape& shape, const std::vector<int>& axes, void* out);

// Index (int64) of the max (or min) along `axis`; ties give the first index; NaN wins.
// out has `shape` with `axis` removed.
void arg_reduce(bool is_max, DType dtype, const void* x, const Shape& shape, int axis, int64_t* out);

}  // namespace tessera::cpu
