// Batched matrix multiply C[b] = op(A[b]) * op(B[b]) with op = transpose or not.
// float32 -> cblas_sgemm, float64 -> cblas_dgemm; bfloat16 on the CPU's bf16 units
// (AMX tiles, else AVX512-BF16: bf16_gemm_path()), else like float16 converted to
// float32 panels, multiplied with sgemm, and rounded back; integer types use a blocked
// native loop (int64 accumulation).
//
// Threading: one pool. BLAS always runs single-threaded inside our parallel_for over
// (batch entry, C tile) tasks whose shapes depend only on the problem, so results are
// bitwise identical for any thread count (see matmul.cpp for the measurements).
#pragma once

#include <cstdint>
#include <string>

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

// The bfloat16 GEMM kernels. Each multiplies bf16 values exactly, accumulates in
// float32 in an order fixed by the shape alone, and rounds every result once to bf16.
//   Float32:    operands widened to float32 panels for sgemm (any CPU)
//   Amx:        AMX tiles, TDPBF16PS (matmul_amx.h; Sapphire Rapids and later)
//   Avx512Bf16: VDPBF16PS on zmm registers (matmul_avx512bf16.h; Zen 4, Cooper Lake)
enum class Bf16Kernel { Float32, Amx, Avx512Bf16 };
const char* bf16_kernel_name(Bf16Kernel kernel);  // "float32", "amx", "avx512bf16": the flag's values

// Whether `kernel` can run here (CPU, OS, build); `why_not` says why not.
bool bf16_kernel_usable(Bf16Kernel kernel, const char** why_not = nullptr);

// Which kernel bfloat16 GEMMs take on this machine, decided once from
// TESSERA_CPU_BF16_GEMM (auto | float32 | amx | avx512bf16): auto takes AMX where the
// CPU has AMX-BF16 and the OS grants the tile state, else AVX512-BF16 where the CPU has
// it, else float32; a forced kernel this machine cannot run falls back to float32 (the
// description says why).
struct Bf16GemmPath {
  Bf16Kernel kernel = Bf16Kernel::Float32;
  bool native = false;  // kernel != Float32: the products run on the CPU's bf16 units
  // Whether bf16 GEMMs on this kernel were measured faster than float32 sgemm, which is
  // what model.compute_dtype = "auto" asks: AMX yes (3x); AVX512-BF16 on AMD yes (Zen 4:
  // 1.8x, VDPBF16PS issues at the FMA's rate, bench/results/2026-11-29-lowp-zen4.md), on
  // Intel no (the AMX Xeon measured: 0.7x, VDPBF16PS at half the FMA rate, so its pair
  // products only match sgemm's FLOPs; bench/results/2026-11-27-avx512-gemms.md).
  bool faster_than_float32 = false;
  std::string description;  // for `tessera info`: the path, or why not the bf16 units
};
const Bf16GemmPath& bf16_gemm_path();

// bfloat16 C = op(A) op(B) (then the epilogue, when given) on `kernel` whatever the
// path: the tests and benchmarks compare the kernels. ValueError if it cannot run here.
void matmul_bf16(Bf16Kernel kernel, const MatmulShape& shape, const bfloat16* a, const bfloat16* b, bfloat16* c,
                 const GemmEpilogue* epilogue = nullptr);

// Raw BLAS sgemm on the whole machine, for benchmarks: C[m,n] = A[m,k] * B[k,n] (or B^T when trans_b).
void blas_sgemm(int64_t m, int64_t n, int64_t k, const float* a, const float* b, bool trans_b, float* c);

}  // namespace tessera::cpu
