// Lion: the sign of an interpolated momentum (optim/rules.h).
#include "optim/rules.h"
#include "tessera/core/ops.h"

namespace tessera::optim::detail {

Tree lion_init(const Tree& params) {
  return Tree{{"m", params.map([](const Array& p) { return zeros(p.shape(), accumulation_dtype(p.dtype())); })}};
}

void lion_check(const Tree& params, const Tree& state) {
  check_state_leaves("state m", params, state.at("m"), [](const Array& p, size_t) { return p.shape(); });
}

std::vector<Array> lion_apply(const StepInputs& in, const Tree& state, Tree& new_state) {
  const OptimizerConfig& c = in.config;
  std::vector<Array> m = state.at("m").leaves(), new_p(in.params.size());
  for (size_t i = 0; i < in.params.size(); ++i) {
    const DType acc = m[i].dtype();
    const Array g = astype(in.grads[i], acc), p = astype(in.params[i], acc);
    const Array interpolated = m[i] * c.beta1 + g * (1 - c.beta1);
    Array d = sign(interpolated);
    if (in.decay[i]) d = d + p * c.weight_decay;
    new_p[i] = astype(subtract(p, multiply(astype(in.lr, acc), d)), in.params[i].dtype());
    m[i] = m[i] * c.beta2 + g * (1 - c.beta2);
  }
  new_state = Tree{{"m", state.at("m").with_leaves(m)}};
  return new_p;
}

}  // namespace tessera::optim::detail
