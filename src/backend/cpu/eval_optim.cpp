// CPU evaluation of optimizer updates.
#include <cstring>

#include "backend/cpu/kernels/optim.h"
#include "tessera/core/array.h"
#include "tessera/ir/primitives/optim.h"

namespace tessera {

void AdamW::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  // The kernel updates in place: start the outputs as copies of param, m, v.
  // (The compiler's donation will hand the input buffers over instead.)
  for (int i = 0; i < 3; ++i) {
    const Array& src = inputs[i == 0 ? 0 : i + 1];
    outputs[i].allocate();
    if (src.nbytes() > 0 && outputs[i].mutable_raw_data() != src.raw_data())
      std::memcpy(outputs[i].mutable_raw_data(), src.raw_data(), src.nbytes());
  }
  cpu::AdamWConfig c;
  c.lr = config_.lr;
  c.beta1 = config_.beta1;
  c.beta2 = config_.beta2;
  c.eps = config_.eps;
  c.weight_decay = config_.weight_decay;
  c.step = config_.step;
  if (dynamic_) {
    // Read in place (item() would allocate: compiled programs run allocation-free).
    c.lr = load_as_double(inputs[4].dtype(), inputs[4].raw_data(), 0);
    c.step = static_cast<int64_t>(load_as_double(inputs[5].dtype(), inputs[5].raw_data(), 0));
    if (c.step < 1) fail<ValueError>("adamw_update: step {} (expected >= 1, it is 1-based)", c.step);
    if (!(c.lr >= 0)) fail<ValueError>("adamw_update: lr {} (expected >= 0)", c.lr);
  }
  if (scaled_grad_) c.grad_scale = inputs[grad_scale_input()].raw_data();
  c.grad_dtype = inputs[1].dtype();
  cpu::adamw_update(inputs[0].dtype(), outputs[0].mutable_raw_data(), inputs[1].raw_data(),
                    outputs[1].mutable_raw_data(), outputs[2].mutable_raw_data(), inputs[0].size(), c);
}

void Lion::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  // In place on copies of param and m, as AdamW's.
  for (int i = 0; i < 2; ++i) {
    const Array& src = inputs[i == 0 ? 0 : 2];
    outputs[i].allocate();
    if (src.nbytes() > 0 && outputs[i].mutable_raw_data() != src.raw_data())
      std::memcpy(outputs[i].mutable_raw_data(), src.raw_data(), src.nbytes());
  }
  cpu::LionConfig c;
  c.lr = config_.lr;
  c.beta1 = config_.beta1;
  c.beta2 = config_.beta2;
  c.weight_decay = config_.weight_decay;
  if (dynamic_) {
    c.lr = load_as_double(inputs[3].dtype(), inputs[3].raw_data(), 0);
    if (!(c.lr >= 0)) fail<ValueError>("lion_update: lr {} (expected >= 0)", c.lr);
  }
  cpu::lion_update(inputs[0].dtype(), outputs[0].mutable_raw_data(), inputs[1].raw_data(),
                   outputs[1].mutable_raw_data(), inputs[0].size(), c);
}

}  // namespace tessera
