// Cross-entropy over the rows of logits [rows, stride] (dense, row-major) on the device,
// forward and backward (the CUDA twins of backend/cpu/kernels/cross_entropy.cpp). The
// first `vocab` columns of a row are the classes; the rest are vocabulary padding,
// outside the softmax, and the backward writes them 0 (j below runs over [0, vocab)):
//
//   forward:  lse_r = m_r + log(sum_j exp(x_rj - m_r)), m_r = max_j x_rj
//             loss_r = (m_r - x_r,t_r) + log(sum_j exp(x_rj - m_r)), 0 where t_r == ignore_index
//   backward: dx_rj = dloss_r * exp(x_rj - lse_r) - [j == t_r] dloss_r, 0 rows where ignored
//
// logits / dlogits: float32, bfloat16, float16 or float64; targets: int64 [rows];
// loss, lse, dloss: [rows] of the accumulation dtype (float32, float64 for float64).
// One block per row; the forward makes one pass (online max / sum) and never stores
// probabilities; the backward recomputes them from lse in one read and one write. Any
// vocabulary size (50257 included): 16-byte vectors between a scalar head and tail.
//
// A target outside [0, vocab) that is not ignore_index cannot raise an error on the
// device without a host synchronization: its loss is NaN and its dlogits row is NaN
// (the CPU backend throws ValueError instead). Queued on `stream`; no synchronization.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tessera/base/dtype.h"

namespace tessera::cuda {

void cross_entropy_forward(DType dtype, const void* logits, const int64_t* targets, int64_t rows, int64_t stride,
                           int64_t vocab, int64_t ignore_index, void* loss, void* lse, cudaStream_t stream);

void cross_entropy_backward(DType dtype, const void* logits, const int64_t* targets, const void* lse, const void* dloss,
                            void* dlogits, int64_t rows, int64_t stride, int64_t vocab, int64_t ignore_index,
                            cudaStream_t stream);

// Both (ir/primitives/nn.h's cross_entropy_with_grad, made by the classifier-fusion
// pass): loss and lse as the forward writes them and dlogits as the backward writes them
// for `dloss`. dlogits may be the logits buffer.
void cross_entropy_with_grad(DType dtype, const void* logits, const int64_t* targets, const void* dloss, int64_t rows,
                             int64_t stride, int64_t vocab, int64_t ignore_index, void* loss, void* lse, void* dlogits,
                             cudaStream_t stream);

}  // namespace tessera::cuda
