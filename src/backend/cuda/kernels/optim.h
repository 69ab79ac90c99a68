// Optimizer updates on raw device pointers: AdamW and Lion, one tensor per launch or many
// tensors per launch (multi_tensor_apply style).
//
// AdamW's math is the CPU kernel's (backend/cpu/kernels/optim.h), operation for operation:
//   m' = b1 m + (1-b1) g;  v' = b2 v + (1-b2) g^2
//   p' = p - lr ((m' c1) / (sqrt(v' c2) + eps) + wd p),  c1 = 1/(1-b1^t), c2 = 1/(1-b2^t)
// with the coefficients computed in double and rounded to the state type. float32 (and
// bfloat16/float16 parameters, widened to float32) use the CPU's AVX2 sequence of fused
// multiply-adds (fma(b1, m, (1-b1) g), fma(b2, v, ((1-b2) g) g), fma(wd, p, m' c1 / den),
// fma(-lr, upd, p)) with correctly rounded division and square root, so results are
// bitwise the CPU's; float64 runs the same sequence in double (the CPU's scalar loop,
// which GCC -O3 -mfma contracts into these FMAs). Parameters and gradients
// share a dtype (float32, bfloat16, float16, float64), or float32 parameters take
// bfloat16/float16 gradients (AdamWHyper::grad_dtype); m and v are float32 (float64 for
// float64 parameters).
//
// Lion's is the CPU kernel's sequence too, for every dtype (float32 and widened 16-bit
// parameters in float, float64 in double):
//   c = fma(b1, m, (1-b1) g);  m' = fma(b2, m, (1-b2) g);  p' = fma(-lr, fma(wd, p, sign(c)), p)
// with the coefficients rounded from double and sign(+-0) = +-0, sign(NaN) = NaN: results
// are bitwise the CPU's, a dynamic lr included (no device-side math on it).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "tessera/base/dtype.h"

namespace tessera::cuda {

struct AdamWHyper {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  int64_t step = 1;  // 1-based, for bias correction
  // Dynamic schedules (one captured program for every step): when lr_device is set, lr
  // and step are read on the device from these scalars (lr: any floating dtype; step:
  // any integer dtype) and the fields above are ignored. A step < 1 or an lr that is not
  // >= 0 (the CPU throws for both) makes every updated parameter NaN, so the run shows it.
  const void* lr_device = nullptr;
  DType lr_dtype = DType::Float32;
  const void* step_device = nullptr;
  DType step_dtype = DType::Int64;
  // When set: a device scalar of the parameters' dtype, and the update uses the gradient
  // (widened to that dtype) times grad_scale, rounded to that dtype (the multiply op's
  // result, bitwise): a clip factor costs no pass.
  const void* grad_scale_device = nullptr;
  // The gradients' dtype (unset: the parameters'): bfloat16 or float16 for float32
  // parameters are read widened, exactly.
  std::optional<DType> grad_dtype;
};

// One tensor of n elements: reads param, grad, m, v and writes param_out, m_out, v_out
// (each output may be its input: the update is elementwise, each element read before
// it is written by the same thread).
void adamw_update(DType dtype, const void* param, const void* grad, const void* m, const void* v, void* param_out,
                  void* m_out, void* v_out, int64_t n, const AdamWHyper& hyper, cudaStream_t stream);

// One tensor of a multi-tensor update, updated in place.
struct AdamWTensor {
  void* param = nullptr;
  const void* grad = nullptr;
  void* m = nullptr;
  void* v = nullptr;
  int64_t n = 0;
};

// Updates every tensor in place with the same hyperparameters, in as few launches as
// the parameter space allows: tensors are cut into chunks of 64K elements, one block per
// chunk, and each launch carries up to 36 tensors' pointers and 320 chunks' (tensor,
// chunk) pairs by value (apex / PyTorch multi_tensor_apply). A later graph pass can
// replace one adamw_update node per parameter by one call here. float32, bfloat16 and
// float16 parameters (all of one dtype; m and v float32). Results are bitwise those of
// adamw_update.
void adamw_multi_tensor(DType dtype, const std::vector<AdamWTensor>& tensors, const AdamWHyper& hyper,
                        cudaStream_t stream);

struct LionHyper {
  double lr = 1e-4, beta1 = 0.9, beta2 = 0.99, weight_decay = 0.0;
  // Dynamic schedules: when lr_device is set, lr is read on the device from this scalar
  // (any floating dtype) and the field above is ignored. An lr that is not >= 0 (the CPU
  // throws) makes every updated parameter NaN.
  const void* lr_device = nullptr;
  DType lr_dtype = DType::Float32;
};

// One tensor of n elements: reads param, grad, m and writes param_out, m_out (each
// output may be its input).
void lion_update(DType dtype, const void* param, const void* grad, const void* m, void* param_out, void* m_out,
                 int64_t n, const LionHyper& hyper, cudaStream_t stream);

// One tensor of a multi-tensor Lion update, updated in place.
struct LionTensor {
  void* param = nullptr;
  const void* grad = nullptr;
  void* m = nullptr;
  int64_t n = 0;
};

// Every tensor in place with the same hyperparameters, packed into launches as
// adamw_multi_tensor's. float32, bfloat16 and float16 parameters (all of one dtype; m
// float32). Results are bitwise those of lion_update.
void lion_multi_tensor(DType dtype, const std::vector<LionTensor>& tensors, const LionHyper& hyper,
                       cudaStream_t stream);

}  // namespace tessera::cuda
