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
  cpu::adamw_update(inputs[0].dtype(), outputs[0].mutable_raw_data(), inputs[1].raw_data(),
                    outputs[1].mutable_raw_data(), outputs[2].mutable_raw_data(), inputs[0].size(), c);
}

}  // namespace tessera
