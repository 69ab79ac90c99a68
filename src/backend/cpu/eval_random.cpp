// eval_cpu of the random family (ir/primitives/random.h): Philox keys, samples and
// Bernoulli masks.
#include "backend/cpu/kernels/random.h"
#include "tessera/core/array.h"
#include "tessera/ir/primitives/random.h"

namespace tessera {

namespace {
cpu::PhiloxKey philox_key(const Array& key) {
  const uint32_t* k = key.data<uint32_t>();
  return {k[0], k[1]};
}
}  // namespace

void RandomSplit::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  outputs[0].allocate();
  cpu::split_key(philox_key(inputs[0]), outputs[0].mutable_data<uint32_t>(), num_);
}

void RandomSample::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  Array& out = outputs[0];
  out.allocate();
  if (dist_ == Distribution::Uniform) {
    cpu::random_uniform(philox_key(inputs[0]), out.dtype(), a_, b_, out.mutable_raw_data(), out.size());
  } else {
    cpu::random_normal(philox_key(inputs[0]), out.dtype(), a_, b_, out.mutable_raw_data(), out.size());
  }
}

void RandomBernoulli::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  Array& out = outputs[0];
  out.allocate();
  const Array& p = inputs[1];
  cpu::random_bernoulli(philox_key(inputs[0]), p.dtype(), p.raw_data(), p.size() == 1 && out.size() != 1,
                        static_cast<bool*>(out.mutable_raw_data()), out.size());
}

}  // namespace tessera
