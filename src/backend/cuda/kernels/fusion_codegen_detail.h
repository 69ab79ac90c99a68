// Private to the fusion code generator (fusion_codegen*.cpp): the pieces the files share.
//   fusion_codegen_ops.cpp: dtypes as C types, one instruction as a C expression, and the
//     fixed prelude (helpers the expressions call) that starts every source;
//   fusion_codegen.cpp: the public API (fusion_codegen.h), the Args struct, ts_body,
//     ts_element and the elementwise (map / map_vec) kernels;
//   fusion_codegen_reduce.cpp: the fused-reduction kernels (rows, warps, finish).
#pragma once

#include <string>

#include "backend/cuda/kernels/fusion_codegen.h"
#include "tessera/base/dtype.h"

namespace tessera::cuda::detail {

// ---- fusion_codegen_ops.cpp ----

bool is_float_class(DType d);  // f16, bf16, f32, f64
// The C type elements are stored as (bool as bytes, halves as bits).
const char* storage_type(DType d);
// The C type a register of dtype d is computed in.
const char* register_type(DType d);
// Reduction accumulator: float for float32 and halves, double, else int64.
const char* accumulator_type(DType d);
// A stored element as a register / a register as a stored element.
std::string load_expr(DType d, const std::string& stored);
std::string store_expr(DType d, const std::string& value);
// A computed value rounded to / typed as a register of dtype d.
std::string result_expr(DType d, const std::string& value);
// A unary op on register x of dtype d (the operand's dtype), before rounding.
std::string unary_code(FusedUnary k, DType d, const std::string& x);
// A binary op on registers a, b of dtype d, before rounding.
std::string binary_code(FusedBinary k, DType d, const std::string& a, const std::string& b);
// Register x of dtype `from` converted to a register of dtype `to`.
std::string convert_code(DType from, DType to, const std::string& x);
// The fixed start of every generated source.
extern const char* const kPrelude;

// ---- fusion_codegen.cpp ----

// Declarations "T0 o0; T1 o1; " of the output registers.
std::string output_decls(const FusedProgram& p);

// ---- fusion_codegen_reduce.cpp ----

// The fused-reduction kernels @NAME@_rows, @NAME@_warps, @NAME@_finish (p has one output).
void append_reduce_kernels(std::string& s, const FusedProgram& p);

}  // namespace tessera::cuda::detail
