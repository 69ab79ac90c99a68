// Layer norm and RMS norm over the rows of a dense row-major [rows, cols] buffer on the
// device, forward and backward (the CUDA twins of backend/cpu/kernels/norm.cpp):
//
//   layer norm: mu = mean(x), rstd = 1/sqrt(mean((x - mu)^2) + eps), xhat = (x - mu) rstd,
//               y = xhat * w + b
//   RMS norm:   rstd = 1/sqrt(mean(x^2) + eps), xhat = x rstd, y = xhat * w
//   backward (g = dy * w):
//     layer norm: dx = rstd (g - mean(g) - xhat mean(g xhat))
//     RMS norm:   dx = rstd (g - xhat mean(g xhat))
//     dw = sum over rows of dy xhat, db = sum over rows of dy
//
// dtypes: float32, bfloat16, float16 (storage; arithmetic and statistics in float32)
// and float64. x, y, dx, dy, w, b, dw, db are of `dtype`; mean and rstd ([rows]) of its
// accumulation dtype (float32, or float64 for float64). w and b may be null (1 and 0).
//
// One block per row; 16-byte vector accesses when every row pointer is 16-byte aligned
// (cols a multiple of 16 / itemsize, aligned bases), scalar otherwise. The weight and
// bias gradients are deterministic without atomics: rows are split into fixed chunks
// (a function of rows and cols only); each chunk's block sums its rows, in order, into
// its own partial row of `scratch`, and a second kernel adds the partials in chunk
// order. Everything is queued on `stream`; nothing synchronizes or allocates.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "tessera/base/dtype.h"

namespace tessera::cuda {

// Forward. mean may be null (RMS norm has none); rstd may be null.
void layer_norm_forward(DType dtype, const void* x, const void* w, const void* b, void* y, void* mean, void* rstd,
                        int64_t rows, int64_t cols, double eps, cudaStream_t stream);
void rms_norm_forward(DType dtype, const void* x, const void* w, void* y, void* rstd, int64_t rows, int64_t cols,
                      double eps, cudaStream_t stream);

// Scratch bytes the backward needs for its dw/db partials (0 when neither is wanted).
size_t norm_backward_scratch_bytes(DType dtype, int64_t rows, int64_t cols, bool want_dw, bool want_db);

// Backward. dx always; dw / db when non-null (db only for layer norm). `scratch` holds
// at least norm_backward_scratch_bytes(...) bytes (256-byte aligned device memory).
void layer_norm_backward(DType dtype, const void* x, const void* w, const void* mean, const void* rstd, const void* dy,
                         void* dx, void* dw, void* db, int64_t rows, int64_t cols, void* scratch, size_t scratch_bytes,
                         cudaStream_t stream);
void rms_norm_backward(DType dtype, const void* x, const void* w, const void* rstd, const void* dy, void* dx, void* dw,
                       int64_t rows, int64_t cols, void* scratch, size_t scratch_bytes, cudaStream_t stream);

}  // namespace tessera::cuda
