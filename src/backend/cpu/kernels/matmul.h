// Batched matrix multiply C[b] = op(A[b]) * op(B[b]) with op = transpose or not.
// float32 -> cblas_sgemm, float64 -> cblas_dgemm; bfloat16/float16 are converted
// to float32 panels, multiplied with sgemm, and rounded back; integer types use a
// blocked native loop (int64 accumulation).
//
// Threading: one pool. BLAS always runs single-threaded inside our parallel_for over
// (batch entry, C tile) tasks whose shapes depend only on the problem, so results are
// bitwise identical for any thread count (see matmul.cpp for the measurements).
#pragma once

#include <cstdint>

#include "backend/cpu/kernels/elementwise.h"
#include "tessera/base/dtype.h"

namespace tessera::cpu {

struct MatmulShape {
  int64_t batch = 1;
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false;        // A stored as [k, m] when true, else [m, k]
  bool trans_b = false;        // B stored as [n, k] when true, else [k, n]
  int64_t a_batch_stride = 0;  // elements between batches of A; 0 = same A for every batch
  int64_t b_batch_stride = 0;
};

// C is contiguous [batch, m, n] and is overwritten.
void matmul(DType dtype, const MatmulShape& shape, const void* a, const void* b, void* c);

// An elementwise epilogue run on each tile of C right after its GEMM, while the tile
// is in cache: S = C + bias (bias [n] broadcast along rows), C = act(S), and S is also
// written to pre_activation ([batch, m, n]) when given. Each element goes through
// binary_span / unary_span, the per-element code of the unfused add and activation,
// so the result is bitwise matmul, then add, then the activation.
struct GemmEpilogue {
  const void* bias = nullptr;  // n elements of C's dtype; nullptr: no bias
  bool bias_first = false;     // add(bias, C) instead of add(C, bias) (keeps NaN payloads)
  bool has_activation = false;
  UnaryOp activation = UnaryOp::Copy;
  void* pre_activation = nullptr;  // needs has_activation
};

// matmul followed by the epilogue. float32/float64 apply it per tile; other dtypes
// after the whole product (same per-element results).
void matmul(DType dtype, const MatmulShape& shape, const void* a, const void* b, void* c, const GemmEpilogue& epilogue);

// Raw BLAS sgemm on the whole machine, for benchmarks: C[m,n] = A[m,k] * B[k,n] (or B^T when trans_b).
void blas_sgemm(int64_t m, int64_t n, int64_t k, const float* a, const float* b, bool trans_b, float* c);

}  // namespace tessera::cpu
