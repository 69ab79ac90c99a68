// CUDA kernels of the optimizer update primitives (ir/primitives/optim.h): adamw_update
// (inputs param, grad, m, v, lr and step when dynamic, grad_scale when scaled_grad;
// outputs param, m, v) and
// lion_update (inputs param, grad, m, and lr when dynamic; outputs param, m), as in the
// CPU eval (backend/cpu/eval_optim.cpp). The kernels read the inputs and write the
// outputs, so they need no copies whether or not the executable donated the buffers
// (can_write_in_place). A dynamic lr/step stays on the device: the kernel reads it, so
// one captured step serves every step of a schedule.
#include <algorithm>
#include <utility>
#include <vector>

#include "backend/cuda/kernel_registry.h"
#include "backend/cuda/kernels/optim.h"
#include "tessera/base/error.h"
#include "tessera/ir/primitives/optim.h"

namespace tessera::cuda {
namespace {

// Checks one application's operands and returns its hyperparameters.
AdamWHyper checked_hyper(const AdamW& p, const std::vector<DeviceTensor>& inputs,
                         const std::vector<DeviceTensor>& outputs) {
  const size_t want_in = (p.dynamic() ? 6 : 4) + (p.scaled_grad() ? 1 : 0);
  if (inputs.size() != want_in || outputs.size() != 3)
    fail<ValueError>("adamw_update: called with {} inputs and {} outputs (expected {} and 3)", inputs.size(),
                     outputs.size(), want_in);
  const DeviceTensor& param = inputs[0];
  const DType state = accumulation_dtype(param.dtype);
  for (int i = 0; i < 4; ++i) {
    const DType want = i == 0 ? param.dtype : i == 1 ? inputs[1].dtype : state;
    if (inputs[i].numel() != param.numel() || inputs[i].dtype != want ||
        (i == 1 && !AdamW::accepts_grad(param.dtype, want)))
      fail<ShapeError>("adamw_update: input {} has {} elements of {} (expected {} of {})", i, inputs[i].numel(),
                       name(inputs[i].dtype), param.numel(), i == 1 ? "the parameter's dtype" : name(want));
  }
  for (int o = 0; o < 3; ++o) {
    const DType want = o == 0 ? param.dtype : state;
    if (outputs[o].numel() != param.numel() || outputs[o].dtype != want)
      fail<ShapeError>("adamw_update: output {} has {} elements of {} (expected {} of {})", o, outputs[o].numel(),
                       name(outputs[o].dtype), param.numel(), name(want));
  }
  const AdamWConfig& c = p.config();
  AdamWHyper h;
  h.lr = c.lr;
  h.beta1 = c.beta1;
  h.beta2 = c.beta2;
  h.eps = c.eps;
  h.weight_decay = c.weight_decay;
  h.step = c.step;
  h.grad_dtype = inputs[1].dtype;
  if (p.dynamic()) {
    const DeviceTensor& lr = inputs[4];
    const DeviceTensor& step = inputs[5];
    if (lr.numel() != 1 || !is_floating(lr.dtype) || step.numel() != 1 || is_floating(step.dtype))
      fail<ValueError>("adamw_update: lr is {}[{}] and step {}[{}] (expected a floating and an integer scalar)",
                       name(lr.dtype), lr.numel(), name(step.dtype), step.numel());
    h.lr_device = lr.data;
    h.lr_dtype = lr.dtype;
    h.step_device = step.data;
    h.step_dtype = step.dtype;
  }
  if (p.scaled_grad()) {
    const DeviceTensor& scale = inputs[p.grad_scale_input()];
    if (scale.numel() != 1 || scale.dtype != param.dtype)
      fail<ValueError>("adamw_update: grad_scale is {}[{}] (expected a scalar of the parameter's dtype, {})",
                       name(scale.dtype), scale.numel(), name(param.dtype));
    h.grad_scale_device = scale.data;
  }
  return h;
}

const AdamW& as_adamw(const Primitive& primitive) { return primitive_as<AdamW>(primitive, "adamw_update"); }

void adamw_kernel(const Primitive& primitive, const std::vector<DeviceTensor>& inputs,
                  const std::vector<DeviceTensor>& outputs, KernelContext& ctx) {
  const AdamWHyper h = checked_hyper(as_adamw(primitive), inputs, outputs);
  adamw_update(inputs[0].dtype, inputs[0].data, inputs[1].data, inputs[2].data, inputs[3].data, outputs[0].data,
               outputs[1].data, outputs[2].data, inputs[0].numel(), h, ctx.stream);
}

// Every parameter's update in multi-tensor launches (apex's multi_tensor_apply), one
// series per gradient dtype (float32 parameters may have bfloat16 and float32
// gradients), when the memory plan updated them all in place (donated parameters and
// state: the training step) with one parameter dtype; otherwise one launch per tensor.
// Bitwise the same: every update is elementwise and independent of the others.
void adamw_group_kernel(const Primitive& primitive, const std::vector<std::vector<DeviceTensor>>& inputs,
                        const std::vector<std::vector<DeviceTensor>>& outputs, KernelContext& ctx) {
  const AdamW& p = as_adamw(primitive);
  bool in_place = true;
  std::vector<std::pair<DType, std::vector<AdamWTensor>>> by_grad_dtype;
  AdamWHyper h;
  for (size_t t = 0; t < inputs.size(); ++t) {
    h = checked_hyper(p, inputs[t], outputs[t]);
    const auto& in = inputs[t];
    const auto& out = outputs[t];
    in_place = in_place && out[0].data == in[0].data && out[1].data == in[2].data && out[2].data == in[3].data &&
               in[0].dtype == inputs[0][0].dtype &&
               (in[0].dtype == DType::Float32 || in[0].dtype == DType::BFloat16 || in[0].dtype == DType::Float16);
    auto series =
        std::find_if(by_grad_dtype.begin(), by_grad_dtype.end(), [&](const auto& s) { return s.first == in[1].dtype; });
    if (series == by_grad_dtype.end()) series = by_grad_dtype.insert(by_grad_dtype.end(), {in[1].dtype, {}});
    series->second.push_back({in[0].data, in[1].data, in[2].data, in[3].data, in[0].numel()});
  }
  if (in_place) {
    for (const auto& [grad_dtype, tensors] : by_grad_dtype) {
      h.grad_dtype = grad_dtype;
      adamw_multi_tensor(inputs[0][0].dtype, tensors, h, ctx.stream);
    }
    return;
  }
  for (size_t t = 0; t < inputs.size(); ++t) adamw_kernel(primitive, inputs[t], outputs[t], ctx);
}

// Lion: checks one application's operands and returns its hyperparameters.
LionHyper checked_hyper(const Lion& p, const std::vector<DeviceTensor>& inputs,
                        const std::vector<DeviceTensor>& outputs) {
  const size_t want_in = p.dynamic() ? 4 : 3;
  if (inputs.size() != want_in || outputs.size() != 2)
    fail<ValueError>("lion_update: called with {} inputs and {} outputs (expected {} and 2)", inputs.size(),
                     outputs.size(), want_in);
  const DeviceTensor& param = inputs[0];
  const DType state = accumulation_dtype(param.dtype);
  for (int i = 0; i < 3; ++i) {
    const DType want = i < 2 ? param.dtype : state;
    if (inputs[i].numel() != param.numel() || inputs[i].dtype != want)
      fail<ShapeError>("lion_update: input {} has {} elements of {} (expected {} of {})", i, inputs[i].numel(),
                       name(inputs[i].dtype), param.numel(), name(want));
  }
  for (int o = 0; o < 2; ++o) {
    const DType want = o == 0 ? param.dtype : state;
    if (outputs[o].numel() != param.numel() || outputs[o].dtype != want)
      fail<ShapeError>("lion_update: output {} has {} elements of {} (expected {} of {})", o, outputs[o].numel(),
                       name(outputs[o].dtype), param.numel(), name(want));
  }
  const LionConfig& c = p.config();
  LionHyper h;
  h.lr = c.lr;
  h.beta1 = c.beta1;
  h.beta2 = c.beta2;
  h.weight_decay = c.weight_decay;
  if (p.dynamic()) {
    const DeviceTensor& lr = inputs[3];
    if (lr.numel() != 1 || !is_floating(lr.dtype))
      fail<ValueError>("lion_update: lr is {}[{}] (expected a floating scalar)", name(lr.dtype), lr.numel());
    h.lr_device = lr.data;
    h.lr_dtype = lr.dtype;
  }
  return h;
}

const Lion& as_lion(const Primitive& primitive) { return primitive_as<Lion>(primitive, "lion_update"); }

void lion_kernel(const Primitive& primitive, const std::vector<DeviceTensor>& inputs,
                 const std::vector<DeviceTensor>& outputs, KernelContext& ctx) {
  const LionHyper h = checked_hyper(as_lion(primitive), inputs, outputs);
  lion_update(inputs[0].dtype, inputs[0].data, inputs[1].data, inputs[2].data, outputs[0].data, outputs[1].data,
              inputs[0].numel(), h, ctx.stream);
}

// As adamw_group_kernel: one multi-tensor launch when every update is in place with one
// 16/32-bit parameter dtype, else one launch per tensor (bitwise the same).
void lion_group_kernel(const Primitive& primitive, const std::vector<std::vector<DeviceTensor>>& inputs,
                       const std::vector<std::vector<DeviceTensor>>& outputs, KernelContext& ctx) {
  const Lion& p = as_lion(primitive);
  bool in_place = true;
  std::vector<LionTensor> tensors;
  LionHyper h;
  for (size_t t = 0; t < inputs.size(); ++t) {
    h = checked_hyper(p, inputs[t], outputs[t]);
    const auto& in = inputs[t];
    const auto& out = outputs[t];
    in_place = in_place && out[0].data == in[0].data && out[1].data == in[2].data &&
               in[0].dtype == inputs[0][0].dtype &&
               (in[0].dtype == DType::Float32 || in[0].dtype == DType::BFloat16 || in[0].dtype == DType::Float16);
    tensors.push_back({in[0].data, in[1].data, in[2].data, in[0].numel()});
  }
  if (in_place) {
    lion_multi_tensor(inputs[0][0].dtype, tensors, h, ctx.stream);
    return;
  }
  for (size_t t = 0; t < inputs.size(); ++t) lion_kernel(primitive, inputs[t], outputs[t], ctx);
}

}  // namespace

void register_optim_kernels() {
  register_kernel("adamw_update", adamw_kernel);
  // Inputs from 4 on (a dynamic lr and step, a grad_scale) must be the same values across
  // the group.
  register_group_kernel("adamw_update", adamw_group_kernel, 4);
  register_kernel("lion_update", lion_kernel);
  // Input 3 (a dynamic lr) must be the same value across the group.
  register_group_kernel("lion_update", lion_group_kernel, 3);
}

}  // namespace tessera::cuda
