// Optimizer update ops: validation and node construction.
#include <cmath>

#include "tessera/core/ops.h"

namespace tessera {

namespace {

// Checks what both forms share; returns the moments' dtype.
DType check_adamw(const Array& param, const Array& grad, const Array& m, const Array& v, const AdamWConfig& config,
                  bool check_lr_and_step) {
  const char* op = "adamw_update";
  if (!is_floating(param.dtype()))
    fail<DTypeError>("{}: param has dtype {} (expected a floating dtype)", op, name(param.dtype()));
  DType state = accumulation_dtype(param.dtype());
  if (!AdamW::accepts_grad(param.dtype(), grad.dtype()) || m.dtype() != state || v.dtype() != state)
    fail<DTypeError>(
        "{}: dtypes param {}, grad {}, m {}, v {} (expected grad = param dtype, or bfloat16/float16 for float32 "
        "params; m and v {})",
        op, name(param.dtype()), name(grad.dtype()), name(m.dtype()), name(v.dtype()), name(state));
  if (grad.shape() != param.shape() || m.shape() != param.shape() || v.shape() != param.shape())
    fail<ShapeError>("{}: shapes param {}, grad {}, m {}, v {} (expected all equal)", op, to_string(param.shape()),
                     to_string(grad.shape()), to_string(m.shape()), to_string(v.shape()));
  if (check_lr_and_step && config.step < 1)
    fail<ValueError>("{}: step {} (expected >= 1, it is 1-based)", op, config.step);
  if ((check_lr_and_step && !(config.lr >= 0)) || !(config.eps > 0) || !(config.beta1 >= 0 && config.beta1 < 1) ||
      !(config.beta2 >= 0 && config.beta2 < 1) || !(config.weight_decay >= 0))
    fail<ValueError>(
        "{}: lr={}, beta1={}, beta2={}, eps={}, weight_decay={} (expected lr >= 0, 0 <= betas < 1, "
        "eps > 0, weight_decay >= 0)",
        op, config.lr, config.beta1, config.beta2, config.eps, config.weight_decay);
  return state;
}

// The dynamic forms' checks: the shared ones and a floating lr and integer step scalar.
DType check_adamw_dynamic(const Array& param, const Array& grad, const Array& m, const Array& v, const Array& lr,
                          const Array& step, const AdamWConfig& config) {
  const DType state = check_adamw(param, grad, m, v, config, false);
  if (lr.ndim() != 0 || !is_floating(lr.dtype()))
    fail<ValueError>("adamw_update: lr is {} (expected a floating scalar)", type_string(lr));
  if (step.ndim() != 0 || is_floating(step.dtype()) || step.dtype() == DType::Bool)
    fail<ValueError>("adamw_update: step is {} (expected an integer scalar)", type_string(step));
  return state;
}

// Lion's checks shared by both forms; returns m's dtype.
DType check_lion(const Array& param, const Array& grad, const Array& m, const LionConfig& config, bool check_lr) {
  const char* op = "lion_update";
  if (!is_floating(param.dtype()))
    fail<DTypeError>("{}: param has dtype {} (expected a floating dtype)", op, name(param.dtype()));
  DType state = accumulation_dtype(param.dtype());
  if (grad.dtype() != param.dtype() || m.dtype() != state)
    fail<DTypeError>("{}: dtypes param {}, grad {}, m {} (expected grad = param dtype, m {})", op, name(param.dtype()),
                     name(grad.dtype()), name(m.dtype()), name(state));
  if (grad.shape() != param.shape() || m.shape() != param.shape())
    fail<ShapeError>("{}: shapes param {}, grad {}, m {} (expected all equal)", op, to_string(param.shape()),
                     to_string(grad.shape()), to_string(m.shape()));
  if ((check_lr && !(config.lr >= 0)) || !(config.beta1 >= 0 && config.beta1 < 1) ||
      !(config.beta2 >= 0 && config.beta2 < 1) || !(config.weight_decay >= 0))
    fail<ValueError>(
        "{}: lr={}, beta1={}, beta2={}, weight_decay={} (expected lr >= 0, 0 <= betas < 1, weight_decay >= 0)", op,
        config.lr, config.beta1, config.beta2, config.weight_decay);
  return state;
}

}  // namespace

std::vector<Array> adamw_update(const Array& param, const Array& grad, const Array& m, const Array& v,
                                const AdamWConfig& config) {
  DType state = check_adamw(param, grad, m, v, config, true);
  return Array::make({param.shape(), param.shape(), param.shape()}, {param.dtype(), state, state},
                     std::make_shared<AdamW>(config), {param, grad, m, v});
}

std::vector<Array> adamw_update(const Array& param, const Array& grad, const Array& m, const Array& v, const Array& lr,
                                const Array& step, const AdamWConfig& config) {
  const DType state = check_adamw_dynamic(param, grad, m, v, lr, step, config);
  return Array::make({param.shape(), param.shape(), param.shape()}, {param.dtype(), state, state},
                     std::make_shared<AdamW>(config, true), {param, grad, m, v, lr, step});
}

std::vector<Array> adamw_update(const Array& param, const Array& grad, const Array& m, const Array& v, const Array& lr,
                                const Array& step, const Array& grad_scale, const AdamWConfig& config) {
  if (grad_scale.ndim() != 0 || grad_scale.dtype() != param.dtype())
    fail<ValueError>("adamw_update: grad_scale is {} (expected a scalar of the parameter's dtype, {})",
                     type_string(grad_scale), name(param.dtype()));
  const DType state = check_adamw_dynamic(param, grad, m, v, lr, step, config);
  return Array::make({param.shape(), param.shape(), param.shape()}, {param.dtype(), state, state},
                     std::make_shared<AdamW>(config, true, true), {param, grad, m, v, lr, step, grad_scale});
}

std::vector<Array> lion_update(const Array& param, const Array& grad, const Array& m, const LionConfig& config) {
  DType state = check_lion(param, grad, m, config, true);
  return Array::make({param.shape(), param.shape()}, {param.dtype(), state}, std::make_shared<Lion>(config),
                     {param, grad, m});
}

std::vector<Array> lion_update(const Array& param, const Array& grad, const Array& m, const Array& lr,
                               const LionConfig& config) {
  DType state = check_lion(param, grad, m, config, false);
  if (lr.ndim() != 0 || !is_floating(lr.dtype()))
    fail<ValueError>("lion_update: lr is {} (expected a floating scalar)", type_string(lr));
  return Array::make({param.shape(), param.shape()}, {param.dtype(), state}, std::make_shared<Lion>(config, true),
                     {param, grad, m, lr});
}

}  // namespace tessera
