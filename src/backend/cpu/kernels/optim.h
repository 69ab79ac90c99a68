// Optimizer update kernels, in place.
#pragma once

#include <cstdint>

#include "tessera/base/dtype.h"

namespace tessera::cpu {

struct AdamWConfig {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  int64_t step = 1;  // 1-based, for bias correction
};

// Decoupled weight decay (Loshchilov & Hutter):
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p -= lr * ( (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + wd * p )
// param and grad have `dtype` (float32, float64, bfloat16, float16); m and v are of
// accumulation_dtype(dtype) (fp32 state for low-precision params). AVX2 for float32.
void adamw_update(DType dtype, void* param, const void* grad, void* m, void* v, int64_t n, const AdamWConfig& config);

}  // namespace tessera::cpu
