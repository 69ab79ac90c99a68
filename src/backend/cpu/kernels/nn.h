// Fused neural-network kernels over rows of a [rows, cols] buffer: softmax,
// log-softmax, layer norm, RMS norm, cross-entropy, each forward and backward.
//
// dtypes: float64, float32, bfloat16, float16 (others are rejected by the op layer).
// "stat" buffers (mean, rstd, lse, loss) are of accumulation_dtype(dtype): float64
// for float64 inputs, else float32. Rows are processed in parallel; each row's
// arithmetic order is fixed, so results do not depend on the thread count.
#pragma once

#include <cstdint>

#include "tessera/base/dtype.h"

namespace tessera::cpu {

// y = softmax(x) (or log_softmax when `log`) along each row.
void softmax_rows(DType dtype, const void* x, void* y, int64_t rows, int64_t cols, bool log);
// dx from y (the forward output) and dy: softmax: y*(dy - sum(dy*y)); log: dy - exp(y)*sum(dy).
void softmax_rows_backward(DType dtype, const void* y, const void* dy, void* dx, int64_t rows, int64_t cols, bool log);

// y = (x - mean) * rstd * w + b; w, b nullable (treated as 1 and 0). mean/rstd: [rows].
void layer_norm_rows(DType dtype, const void* x, const void* w, const void* b, void* y, void* mean, void* rstd,
                     int64_t rows, int64_t cols, double eps);
// dx always; dw, db when non-null (summed over rows, deterministic order).
void layer_norm_rows_backward(DType dtype, const void* x, const void* w, const void* mean, const void* rstd,
                              const void* dy, void* dx, void* dw, void* db, int64_t rows, int64_t cols);

// y = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps); w nullable.
void rms_norm_rows(DType dtype, const void* x, const void* w, void* y, void* rstd, int64_t rows, int64_t cols,
                   double eps);
void rms_norm_rows_backward(DType dtype, const void* x, const void* w, const void* rstd, const void* dy, void* dx,
                            void* dw, int64_t rows, int64_t cols);

// Rows of `stride` logits whose first `vocab` are the classes (the rest: vocabulary
// padding, outside the softmax). loss[r] = logsumexp(logits[r, :vocab]) -
// logits[r, target[r]], and 0 where target[r] == ignore_index. lse[r] is saved for the
// backward. A target outside [0, vocab) that is not ignore_index throws ValueError naming
// the row and the value.
void cross_entropy_rows(DType dtype, const void* logits, const int64_t* targets, int64_t rows, int64_t stride,
                        int64_t vocab, int64_t ignore_index, void* loss, void* lse);
// dlogits[r, :vocab] = dloss[r] * (softmax(logits[r, :vocab]) - onehot(target[r])), 0 for
// ignored rows and padding columns. The probabilities are recomputed from lse (never stored).
void cross_entropy_rows_backward(DType dtype, const void* logits, const int64_t* targets, const void* lse,
                                 const void* dloss, void* dlogits, int64_t rows, int64_t stride, int64_t vocab,
                                 int64_t ignore_index);

}  // namespace tessera::cpu
