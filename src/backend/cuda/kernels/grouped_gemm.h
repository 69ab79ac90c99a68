// The grouped GEMMs of a mixture of experts' dropless path on raw device pointers
// (ir/primitives/grouped_matmul.h has the math). sizes [batches, groups] (int32 or int64)
// is read on the device, so nothing synchronizes with the host and the launches can be
// captured in a CUDA graph.
//
// One thread per output element, finding its group by a scan of its batch's sizes and
// summing over the contraction in index order, accumulating in float32 (float64 for
// float64) and rounding once: deterministic, not tuned (a correct path for now; cuBLAS'
// grouped GEMMs need the sizes on the host). Rows past a batch's groups are zeros; sizes
// that are negative or overrun the rows are clamped here (the CPU reports them).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tessera/base/dtype.h"

namespace tessera::cuda {

// out[g, n, :] = a[g, n, :] W_e for the group e of batch g holding row n, W_e = w[e]
// ([k, m]) or w[e]^T (trans_w: w[e] is [m, k]). a [batches, rows, k], out [batches, rows, m].
void grouped_gemm(DType dtype, const void* a, const void* w, const void* sizes, DType sizes_dtype, int64_t batches,
                  int64_t rows, int64_t k, int64_t m, int64_t groups, bool trans_w, void* out, cudaStream_t stream);

// out[e] = sum over g of x[g, rows(g, e)]^T y[g, rows(g, e)] ([k, m]), or its transpose
// ([m, k], trans_out). x [batches, rows, k], y [batches, rows, m].
void grouped_gemm_weight_grad(DType dtype, const void* x, const void* y, const void* sizes, DType sizes_dtype,
                              int64_t batches, int64_t rows, int64_t k, int64_t m, int64_t groups, bool trans_out,
                              void* out, cudaStream_t stream);

}  // namespace tessera::cuda
