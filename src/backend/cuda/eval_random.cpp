// CUDA kernels of the random primitives (ir/primitives/random.h): random_split,
// random_uniform, random_normal, random_bernoulli. The key (uint32[2]) stays on the
// device; the kernels produce the CPU's streams (kernels/random.h), so a program gives
// the same random numbers on either backend.
#include <string>

#include "backend/cuda/kernel_registry.h"
#include "backend/cuda/kernels/random.h"
#include "tessera/base/error.h"
#include "tessera/ir/attributes.h"
#include "tessera/ir/primitives/random.h"

namespace tessera::cuda {
namespace {

const uint32_t* key_of(const char* op, const DeviceTensor& key) {
  if (key.dtype != DType::UInt32 || key.numel() != 2)
    fail<ValueError>("{}: key is {} with {} elements (expected uint32[2])", op, name(key.dtype), key.numel());
  return key.as<const uint32_t>();
}

void check_counts(const char* op, const std::vector<DeviceTensor>& inputs, const std::vector<DeviceTensor>& outputs,
                  size_t want_in) {
  if (inputs.size() != want_in || outputs.size() != 1)
    fail<ValueError>("{}: called with {} inputs and {} outputs (expected {} and 1)", op, inputs.size(), outputs.size(),
                     want_in);
}

void split_kernel(const Primitive& primitive, const std::vector<DeviceTensor>& inputs,
                  const std::vector<DeviceTensor>& outputs, KernelContext& ctx) {
  check_counts("random_split", inputs, outputs, 1);
  const DeviceTensor& out = outputs[0];
  if (out.dtype != DType::UInt32 || out.shape.size() != 2 || out.shape[1] != 2)
    fail<ShapeError>("random_split: output is {}{} (expected uint32[num, 2])", name(out.dtype), to_string(out.shape));
  split_key(key_of("random_split", inputs[0]), out.as<uint32_t>(), out.shape[0], ctx.stream);
}

// RandomSample keeps its parameters private; its attributes() text is their exact
// round-trip spelling (the IR parser rebuilds primitives from it).
void sample_kernel(const Primitive& primitive, const std::vector<DeviceTensor>& inputs,
                   const std::vector<DeviceTensor>& outputs, KernelContext& ctx) {
  if (dynamic_cast<const RandomSample*>(&primitive) == nullptr)
    fail<Error>("random_uniform/normal: kernel called with primitive '{}'", primitive.name());
  const std::string op = primitive.name();
  check_counts(op.c_str(), inputs, outputs, 1);
  const AttributeMap attributes(op, primitive.attributes());
  const DeviceTensor& out = outputs[0];
  const uint32_t* key = key_of(op.c_str(), inputs[0]);
  if (op == "random_uniform") {
    random_uniform(key, out.dtype, attributes.get_double("low"), attributes.get_double("high"), out.data, out.numel(),
                   ctx.stream);
  } else {
    random_normal(key, out.dtype, attributes.get_double("mean"), attributes.get_double("stddev"), out.data, out.numel(),
                  ctx.stream);
  }
}

void bernoulli_kernel(const Primitive& primitive, const std::vector<DeviceTensor>& inputs,
                      const std::vector<DeviceTensor>& outputs, KernelContext& ctx) {
  check_counts("random_bernoulli", inputs, outputs, 2);
  const DeviceTensor& out = outputs[0];
  const DeviceTensor& p = inputs[1];
  if (out.dtype != DType::Bool) fail<DTypeError>("random_bernoulli: output is {} (expected bool)", name(out.dtype));
  // As the CPU: a one-element p serves every output; otherwise p has the output's size.
  const bool p_scalar = p.numel() == 1 && out.numel() != 1;
  if (!p_scalar && p.numel() != out.numel())
    fail<ShapeError>("random_bernoulli: p has {} elements for {} outputs (expected 1 or {})", p.numel(), out.numel(),
                     out.numel());
  random_bernoulli(key_of("random_bernoulli", inputs[0]), p.dtype, p.data, p_scalar, out.as<bool>(), out.numel(),
                   ctx.stream);
}

}  // namespace

void register_random_kernels() {
  register_kernel("random_split", split_kernel);
  register_kernel("random_uniform", sample_kernel);
  register_kernel("random_normal", sample_kernel);
  register_kernel("random_bernoulli", bernoulli_kernel);
}

}  // namespace tessera::cuda
