// The optimizer primitives' composite forms (the references their fused kernels are
// tested against, and what vjp differentiates and vmap batches) and costs.
#include "tessera/ir/primitives/optim.h"

#include <fmt/format.h>

#include <cmath>

#include "tessera/core/ops.h"

namespace tessera {

std::string AdamW::attributes() const {
  const char* scaled = scaled_grad_ ? ", scaled_grad=true" : "";
  if (dynamic_)
    return fmt::format("beta1={}, beta2={}, eps={}, weight_decay={}, dynamic=true{}", config_.beta1, config_.beta2,
                       config_.eps, config_.weight_decay, scaled);
  return fmt::format("lr={}, beta1={}, beta2={}, eps={}, weight_decay={}, step={}{}", config_.lr, config_.beta1,
                     config_.beta2, config_.eps, config_.weight_decay, config_.step, scaled);
}

std::vector<Array> AdamW::composite(const std::vector<Array>& in) const {
  const AdamWConfig& c = config_;
  DType state = accumulation_dtype(in[0].dtype());
  // The gradient in param's dtype (an exact widening), scaled and rounded to that dtype
  // first, as multiply(grad, grad_scale).
  const Array wide = astype(in[1], in[0].dtype());
  const Array grad = scaled_grad_ ? multiply(wide, in[grad_scale_input()]) : wide;
  Array p = astype(in[0], state), g = astype(grad, state);
  Array m = in[2] * c.beta1 + g * (1.0 - c.beta1);
  Array v = in[3] * c.beta2 + square(g) * (1.0 - c.beta2);
  if (dynamic_) {
    // Bias corrections from the traced step: 1 / (1 - beta^t).
    Array t = astype(in[5], state), one = Array::scalar(1.0, state);
    Array c1 = one / (one - power(Array::scalar(c.beta1, state), t));
    Array c2 = one / (one - power(Array::scalar(c.beta2, state), t));
    Array update = (m * c1) / (sqrt(v * c2) + c.eps) + p * c.weight_decay;
    return {astype(p - update * astype(in[4], state), in[0].dtype()), m, v};
  }
  double c1 = 1.0 / (1.0 - std::pow(c.beta1, static_cast<double>(c.step)));
  double c2 = 1.0 / (1.0 - std::pow(c.beta2, static_cast<double>(c.step)));
  Array update = (m * c1) / (sqrt(v * c2) + c.eps) + p * c.weight_decay;
  return {astype(p - update * c.lr, in[0].dtype()), m, v};
}

Cost AdamW::cost(const std::vector<Array>& inputs, const std::vector<Array>& outputs) const {
  Cost c = Primitive::cost(inputs, outputs);
  c.flops = (scaled_grad_ ? 13.0 : 12.0) * static_cast<double>(inputs[0].size());
  return c;
}

std::string Lion::attributes() const {
  if (dynamic_)
    return fmt::format("beta1={}, beta2={}, weight_decay={}, dynamic=true", config_.beta1, config_.beta2,
                       config_.weight_decay);
  return fmt::format("lr={}, beta1={}, beta2={}, weight_decay={}", config_.lr, config_.beta1, config_.beta2,
                     config_.weight_decay);
}

std::vector<Array> Lion::composite(const std::vector<Array>& in) const {
  const LionConfig& c = config_;
  const DType state = accumulation_dtype(in[0].dtype());
  const Array p = astype(in[0], state), g = astype(in[1], state);
  const Array update = sign(in[2] * c.beta1 + g * (1.0 - c.beta1)) + p * c.weight_decay;
  const Array scaled = dynamic_ ? update * astype(in[3], state) : update * c.lr;
  return {astype(p - scaled, in[0].dtype()), in[2] * c.beta2 + g * (1.0 - c.beta2)};
}

// Per element: two interpolations (3 each), the decay and the step (2 each); the sign
// is a comparison.
Cost Lion::cost(const std::vector<Array>& inputs, const std::vector<Array>& outputs) const {
  Cost c = Primitive::cost(inputs, outputs);
  c.flops = 10.0 * static_cast<double>(inputs[0].size());
  return c;
}

}  // namespace tessera
