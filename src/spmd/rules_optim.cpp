// Sharding rules for the fused optimizer updates.
#include "spmd/rules.h"

namespace tessera::spmd::rules {

namespace {

// The first `per_element` inputs (param, grad, moments) are elementwise and the rest
// (lr, step) replicated scalars. The update follows the parameter's layout: a partial
// gradient is reduce-scattered onto it (FSDP) or all-reduced (data parallel).
RuleFn follows_the_parameter(size_t per_element) {
  return [per_element](const Context& c) {
    Decision d;
    Sharding target = c.in.at(0).without_partial();
    for (size_t i = 0; i < c.in.size(); ++i)
      d.inputs.push_back(i < per_element ? target
                                         : Sharding::replicated(c.mesh, static_cast<int>(c.in_types[i].shape.size())));
    d.outputs.assign(c.out_types.size(), target);
    return d;
  };
}

}  // namespace

void register_optim() {
  add("adamw_update", follows_the_parameter(4));  // param, grad, m, v; [lr, step]
  add("lion_update", follows_the_parameter(3));   // param, grad, m; [lr]
}

}  // namespace tessera::spmd::rules
