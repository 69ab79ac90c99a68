// Sharding rules for the fused optimizer updates.
#include "spmd/rules.h"

namespace tessera::spmd::rules {

void register_optim() {
  // AdamW: param, grad, m, v elementwise ([lr, step] scalars replicated). The update
  // follows the parameter's layout: a partial gradient is reduce-scattered onto it
  // (FSDP) or all-reduced (data parallel).
  add("adamw_update", [](const Context& c) {
    Decision d;
    Sharding target = c.in.at(0).without_partial();
    for (size_t i = 0; i < c.in.size(); ++i)
      d.inputs.push_back(i < 4 ? target : Sharding::replicated(c.mesh, static_cast<int>(c.in_types[i].shape.size())));
    d.outputs.assign(c.out_types.size(), target);
    return d;
  });
  // Lion: param, grad, m elementwise ([lr] replicated), the same way as AdamW.
  add("lion_update", [](const Context& c) {
    Decision d;
    Sharding target = c.in.at(0).without_partial();
    for (size_t i = 0; i < c.in.size(); ++i)
      d.inputs.push_back(i < 3 ? target : Sharding::replicated(c.mesh, static_cast<int>(c.in_types[i].shape.size())));
    d.outputs.assign(c.out_types.size(), target);
    return d;
  });
}

}  // namespace tessera::spmd::rules
