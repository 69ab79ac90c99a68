// Softmax and log-softmax over the rows of a dense row-major [rows, cols] buffer on the
// device, forward and backward (the CUDA twins of backend/cpu/kernels/softmax.cpp):
//
//   softmax:     y_j = exp(x_j - m) / s,   m = max_j x_j, s = sum_j exp(x_j - m)
//   log_softmax: y_j = (x_j - m) - log(s)
//   backward:    softmax: dx = y * (dy - sum(dy * y));  log: dx = dy - exp(y) * sum(dy)
//
// dtypes: float32, bfloat16, float16 (arithmetic in float32) and float64; all buffers
// of `dtype`. One block per row; m and s are computed in one pass (online softmax:
// the running sum is rescaled when the max grows), the output in a second. 16-byte
// vector accesses when the buffers are congruent modulo 16 bytes (any row length: a
// scalar head and tail frame the vectors). Queued on `stream`; no synchronization.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tessera/base/dtype.h"

namespace tessera::cuda {

void softmax_forward(DType dtype, const void* x, void* y, int64_t rows, int64_t cols, bool log, cudaStream_t stream);
// y is the forward's output.
void softmax_backward(DType dtype, const void* y, const void* dy, void* dx, int64_t rows, int64_t cols, bool log,
                      cudaStream_t stream);

}  // namespace tessera::cuda
