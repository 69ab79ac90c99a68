// Lion: the sign of an interpolated momentum (optim/rules.h), one fused lion_update per
// parameter (as AdamW's adamw_update).
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
  const LionConfig with_decay{.beta1 = c.beta1, .beta2 = c.beta2, .weight_decay = c.weight_decay};
  LionConfig without_decay = with_decay;
  without_decay.weight_decay = 0;
  std::vector<Array> m = state.at("m").leaves(), new_p(in.params.size());
  for (size_t i = 0; i < in.params.size(); ++i) {
    std::vector<Array> r =
        lion_update(in.params[i], in.grads[i], m[i], in.lr, in.decay[i] ? with_decay : without_decay);
    new_p[i] = r[0];
    m[i] = r[1];
  }
  new_state = Tree{{"m", state.at("m").with_leaves(m)}};
  return new_p;
}

}  // namespace tessera::optim::detail
