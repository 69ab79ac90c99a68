// Optimizer update primitives (AdamW, Lion). Functional: they return new parameter
// and state arrays (the compiler's donation makes them in place). Their vjp and vmap go
// through the composite form (meta-gradients work; the fused kernel is first-order
// only).
#pragma once

#include <cstdint>

#include "tessera/base/dtype.h"
#include "tessera/ir/primitive.h"

namespace tessera {

struct AdamWConfig {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  int64_t step = 1;  // 1-based, for bias correction
};

// Inputs: param, grad, m, v, and when `dynamic`: lr (a floating scalar) and step (an
// integer scalar), which then replace config.lr and config.step, so one compiled
// program serves every step and any learning-rate schedule; and last, when
// `scaled_grad`: grad_scale, a scalar of param's dtype, and the update uses
// multiply(grad, grad_scale) (rounded to param's dtype, exactly the multiply op): global-norm
// clipping folded into the update, so the clipped gradients are never written out.
// grad has param's dtype or, for float32 parameters, bfloat16 or float16 (read widened,
// which is exact: the simplify pass folds a gradient's widening convert into the update,
// so mixed-precision training never stores float32 copies of its gradients).
// Outputs: param, m, v (m, v in the accumulation dtype).
class AdamW : public Primitive {
 public:
  explicit AdamW(AdamWConfig config, bool dynamic = false, bool scaled_grad = false)
      : config_(config), dynamic_(dynamic), scaled_grad_(scaled_grad) {}
  const AdamWConfig& config() const { return config_; }
  bool dynamic() const { return dynamic_; }
  bool scaled_grad() const { return scaled_grad_; }
  // The index of grad_scale among the inputs (when scaled_grad).
  size_t grad_scale_input() const { return dynamic_ ? 6 : 4; }
  // Whether a gradient of dtype `grad` may update a parameter of dtype `param`.
  static bool accepts_grad(DType param, DType grad) {
    return grad == param || (param == DType::Float32 && (grad == DType::BFloat16 || grad == DType::Float16));
  }
  std::string name() const override { return "adamw_update"; }
  // param -> new param, m -> new m, v -> new v (the kernel is elementwise).
  bool can_write_in_place(int input, int output) const override { return input == (output == 0 ? 0 : output + 1); }
  std::string attributes() const override;
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_COMPOSITE
  TESSERA_PRIMITIVE_COST

 private:
  AdamWConfig config_;
  bool dynamic_;
  bool scaled_grad_;
};

struct LionConfig {
  double lr = 1e-4, beta1 = 0.9, beta2 = 0.99, weight_decay = 0.0;
};

// Lion (Chen et al. 2023), the sign of an interpolated momentum:
//   c = b1 m + (1-b1) g;  p' = p - lr (sign(c) + wd p);  m' = b2 m + (1-b2) g
// sign as the sign op (sign(+-0) = +-0, sign(NaN) = NaN). Inputs: param, grad, m, and
// when `dynamic`: lr (a floating scalar, replacing config.lr; Lion has no step count).
// Outputs: param, m (m in the accumulation dtype).
class Lion : public Primitive {
 public:
  explicit Lion(LionConfig config, bool dynamic = false) : config_(config), dynamic_(dynamic) {}
  const LionConfig& config() const { return config_; }
  bool dynamic() const { return dynamic_; }
  std::string name() const override { return "lion_update"; }
  // param -> new param, m -> new m (the kernel is elementwise).
  bool can_write_in_place(int input, int output) const override { return input == (output == 0 ? 0 : 2); }
  std::string attributes() const override;
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_COMPOSITE
  TESSERA_PRIMITIVE_COST

 private:
  LionConfig config_;
  bool dynamic_;
};

}  // namespace tessera
