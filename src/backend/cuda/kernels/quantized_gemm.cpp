// quantized_gemm(): the scratch carve-up, the cuBLASLt int8 product and its fallback
// (see quantized_gemm.h).
#include "backend/cuda/kernels/quantized_gemm.h"

#include <cublasLt.h>

#include "backend/cuda/kernels/cuda_check.h"
#include "tessera/base/error.h"

namespace tessera::cuda {

namespace {

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
size_t piece(size_t bytes) { return (bytes + 255) / 256 * 256; }

// The scratch's pieces, in order (each 256-byte aligned).
struct Pieces {
  int8_t* qa = nullptr;  // [m, k_pad]
  int8_t* qb = nullptr;  // [n, k_pad]
  float *sa = nullptr, *ia = nullptr, *sb = nullptr, *ib = nullptr;
  int32_t* acc = nullptr;  // [m, n_pad]
  void* workspace = nullptr;
  int64_t k_pad = 0, n_pad = 0;
  size_t bytes = 0;
};

Pieces carve(const QuantizedGemmShape& s, void* base) {
  Pieces p;
  p.k_pad = round_up(s.k, 16);
  p.n_pad = round_up(s.n, 16);
  auto* at = static_cast<unsigned char*>(base);
  size_t off = 0;
  auto take = [&](size_t bytes) {
    void* ptr = at ? at + off : nullptr;
    off += piece(bytes);
    return ptr;
  };
  p.qa = static_cast<int8_t*>(take(static_cast<size_t>(s.m * p.k_pad)));
  p.qb = static_cast<int8_t*>(take(static_cast<size_t>(s.n * p.k_pad)));
  p.sa = static_cast<float*>(take(sizeof(float) * static_cast<size_t>(s.m)));
  p.ia = static_cast<float*>(take(sizeof(float) * static_cast<size_t>(s.m)));
  p.sb = static_cast<float*>(take(sizeof(float) * static_cast<size_t>(s.n)));
  p.ib = static_cast<float*>(take(sizeof(float) * static_cast<size_t>(s.n)));
  p.acc = static_cast<int32_t*>(take(sizeof(int32_t) * static_cast<size_t>(s.m * p.n_pad)));
  p.workspace = take(kGemmWorkspaceBytes);
  p.bytes = off;
  return p;
}

// acc [m, n_pad] (column-major [n_pad, m]: cuBLASLt's D) = qa qb^T through cuBLASLt: D =
// op(A') op(B') with A' = qb ([k_pad, n] column-major, transposed) and B' = qa ([k_pad,
// m] column-major): the "TN" form of its int8 kernels. False when it has no algorithm.
bool lt_int8_gemm(const QuantizedGemmShape& s, const Pieces& p, const GemmContext& ctx) {
  if (ctx.handle == nullptr) return false;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  bool ran = false;
  auto cleanup = [&] {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
  };
  auto ok = [](cublasStatus_t st) { return st == CUBLAS_STATUS_SUCCESS; };
  const cublasOperation_t trans = CUBLAS_OP_T, no_trans = CUBLAS_OP_N;
  const uint64_t kp = static_cast<uint64_t>(p.k_pad);
  const uint64_t workspace = kGemmWorkspaceBytes;
  if (ok(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32I, CUDA_R_32I)) &&
      ok(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof(trans))) &&
      ok(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &no_trans, sizeof(no_trans))) &&
      ok(cublasLtMatrixLayoutCreate(&la, CUDA_R_8I, kp, static_cast<uint64_t>(s.n), p.k_pad)) &&
      ok(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8I, kp, static_cast<uint64_t>(s.m), p.k_pad)) &&
      ok(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32I, static_cast<uint64_t>(s.n), static_cast<uint64_t>(s.m),
                                    p.n_pad)) &&
      ok(cublasLtMatmulPreferenceCreate(&pref)) &&
      ok(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                              sizeof(workspace)))) {
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    // The heuristic's first: it depends only on the problem, the GPU and the library (the
    // sums are exact whatever the algorithm, so any gives the same bits).
    if (ok(cublasLtMatmulAlgoGetHeuristic(ctx.handle, op, la, lb, lc, lc, pref, 1, &result, &found)) && found > 0) {
      const int32_t one = 1, zero = 0;
      const cublasStatus_t st = cublasLtMatmul(ctx.handle, op, &one, p.qb, la, p.qa, lb, &zero, p.acc, lc, p.acc, lc,
                                               &result.algo, p.workspace, workspace, ctx.stream);
      if (!ok(st)) {
        cleanup();
        fail<Error>("quantized_matmul: cublasLtMatmul (int8, m={} n={} k={}) failed with status {}", s.m, s.n, s.k,
                    static_cast<int>(st));
      }
      ran = true;
    }
  }
  cleanup();
  return ran;
}

}  // namespace

size_t quantized_gemm_scratch_bytes(const QuantizedGemmShape& shape) { return carve(shape, nullptr).bytes; }

void quantized_gemm(DType dtype, const QuantizedGemmShape& s, const void* a, const void* b, void* c,
                    const DeviceRounding& round_a, const DeviceRounding& round_b, const QuantizedEpilogue& epilogue,
                    const GemmContext& context, void* scratch) {
  if (dtype != DType::Float32 && dtype != DType::BFloat16)
    fail<DTypeError>("quantized_matmul: dtype {} (expected float32 or bfloat16)", name(dtype));
  if (s.m < 0 || s.n < 0 || s.k < 0) fail<ShapeError>("quantized_matmul: negative size m={} n={} k={}", s.m, s.n, s.k);
  if ((round_a.stochastic && round_a.key == nullptr) || (round_b.stochastic && round_b.key == nullptr))
    fail<ValueError>("quantized_matmul: stochastic rounding needs a key input (it has none)");
  if (s.m == 0 || s.n == 0) return;
  if (scratch == nullptr) fail<Error>("quantized_matmul: no device scratch");
  const Pieces p = carve(s, scratch);
  const cudaStream_t stream = context.stream;
  // Rows of op(A): A [m, k], or A [k, m] read by columns; columns of op(B): B [n, k]
  // (trans_b), or B [k, n] read by columns.
  const QuantLines lines_a{a, s.m, s.k, !s.trans_a};
  const QuantLines lines_b{b, s.n, s.k, s.trans_b};
  launch_line_scales(dtype, lines_a, p.sa, p.ia, stream);
  launch_line_scales(dtype, lines_b, p.sb, p.ib, stream);
  launch_quantize_lines(dtype, lines_a, p.ia, round_a, p.qa, p.k_pad, stream);
  launch_quantize_lines(dtype, lines_b, p.ib, round_b, p.qb, p.k_pad, stream);
  if (s.k == 0) {
    TESSERA_CUDA_CHECK(cudaMemsetAsync(p.acc, 0, sizeof(int32_t) * static_cast<size_t>(s.m * p.n_pad), stream));
  } else if (gemm_options().reference_only || !lt_int8_gemm(s, p, context)) {
    launch_int8_gemm_reference(p.qa, p.qb, s.m, s.n, p.k_pad, p.acc, p.n_pad, stream);
  }
  launch_dequantize(dtype, p.acc, p.n_pad, p.sa, p.sb, s.m, s.n, epilogue, c, stream);
}

}  // namespace tessera::cuda
