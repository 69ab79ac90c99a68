// Optimizer update kernels, in place.
#pragma once

#include <cstdint>
#include <optional>

#include "tessera/base/dtype.h"

namespace tessera::cpu {

struct AdamWConfig {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  int64_t step = 1;  // 1-based, for bias correction
  // When set: a scalar of the parameter's dtype, and the update uses the gradient (widened
  // to that dtype) times grad_scale rounded to that dtype (the multiply op's result), so a
  // clip factor costs no pass of its own.
  const void* grad_scale = nullptr;
  // The gradient's dtype (unset: the parameter's): bfloat16 or float16 for float32
  // parameters are read widened, exactly.
  std::optional<DType> grad_dtype;
};

// Decoupled weight decay (Loshchilov & Hutter):
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p -= lr * ( (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + wd * p )
// param and grad have `dtype` (float32, float64, bfloat16, float16); m and v are of
// accumulation_dtype(dtype) (fp32 state for low-precision params). AVX2 for float32.
// config.grad_dtype / grad_scale: see AdamWConfig.
void adamw_update(DType dtype, void* param, const void* grad, void* m, void* v, int64_t n, const AdamWConfig& config);

struct LionConfig {
  double lr = 1e-4, beta1 = 0.9, beta2 = 0.99, weight_decay = 0.0;
};

// Lion (Chen et al. 2023):
//   c = b1 m + (1-b1) g;  p -= lr (sign(c) + wd p);  m = b2 m + (1-b2) g
// with sign(+-0) = +-0 and sign(NaN) = NaN (the sign op's). param and grad have `dtype`
// (float32, float64, bfloat16, float16); m is of accumulation_dtype(dtype). Every dtype
// runs one sequence of fused multiply-adds (optim.cpp), so results do not depend on
// the thread count, the vector width or the build's contraction flags.
void lion_update(DType dtype, void* param, const void* grad, void* m, int64_t n, const LionConfig& config);

}  // namespace tessera::cpu
