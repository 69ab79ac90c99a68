// Elementwise CPU kernels over dense row-major buffers, with numpy broadcasting
// expressed as input strides (0 = broadcast dim).
//
// dtypes: every DType. float32/float64 compute natively; bfloat16/float16 are
// loaded to float32, computed, and rounded back (round-to-nearest-even); integer
// types compute natively (integer division truncates, division by zero gives 0).
// float32 hot paths use AVX2+FMA (vectorized exp/log/tanh/erf) when compiled with
// TESSERA_AVX2, with a scalar fallback. Results are independent of the thread count.
#pragma once

#include <cstdint>

#include "tessera/base/dtype.h"
#include "tessera/base/op_list.h"
#include "tessera/base/shape.h"
#include "tessera/base/small_vector.h"

namespace tessera::cpu {

// The op lists of base/op_list.h (the IR's kinds): GeluTanh is
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), GeluErf 0.5 x (1 + erf(x / sqrt(2))),
// Silu x * sigmoid(x); comparisons give Bool; the *Grad ops take a = x, b = g.
using UnaryOp = UnaryKind;
using BinaryOp = BinaryKind;

bool is_comparison(BinaryOp op);

// out[i] = op(x[i]) for n contiguous elements of `dtype` (LogicalNot: Bool).
void unary(UnaryOp op, DType dtype, const void* x, void* out, int64_t n);

// out = op(a, b) over `out_shape`, contiguous. a and b have dtype `dtype` and are read
// with the given strides (length == out_shape.size(); 0 where broadcast). Comparisons
// write Bool. The innermost dim is vectorized when it is contiguous or broadcast.
void binary(BinaryOp op, DType dtype, const void* a, DimsRef a_strides, const void* b, DimsRef b_strides, void* out,
            const Shape& out_shape);

// out = cond ? a : b, broadcast like `binary`; cond is Bool.
void where(const void* cond, DimsRef cond_strides, DType dtype, const void* a, DimsRef a_strides, const void* b,
           DimsRef b_strides, void* out, const Shape& out_shape);

// Element conversion (see tessera::convert), parallel over n.
void cast(DType from, const void* x, DType to, void* out, int64_t n);

// Fills n elements of `dtype` with `value` (converted like store_from_double).
void fill(DType dtype, double value, void* out, int64_t n);

// Serial forms of unary / binary / cast over one contiguous span, for fused kernels
// that already run inside a parallel_for: the same per-element code as the functions
// above, so results are bitwise equal. binary_span's operand strides are 0 (one
// broadcast element) or 1. out may equal x / a / b when the element sizes match.
void unary_span(UnaryOp op, DType dtype, const void* x, void* out, int64_t n);
void binary_span(BinaryOp op, DType dtype, const void* a, int64_t a_stride, const void* b, int64_t b_stride, void* out,
                 int64_t n);
void cast_span(DType from, const void* x, DType to, void* out, int64_t n);

}  // namespace tessera::cpu
