// eval_cpu of attention (ir/primitives/nn.h): the flash-style CPU kernels, forward and
// backward (CUDA: backend/cuda/eval_attention.cpp).
#include "backend/cpu/kernels/attention.h"
#include "tessera/core/array.h"
#include "tessera/ir/primitives/nn.h"

namespace tessera {

namespace {
cpu::AttentionShape attention_shape(const AttentionConfig& c, const std::vector<Array>& inputs) {
  const Array& q = inputs[0];
  const Array& k = inputs[1];
  cpu::AttentionShape s;
  s.batch = q.shape(0);
  s.heads = q.shape(1);
  s.q_len = q.shape(2);
  s.head_dim = q.shape(3);
  s.kv_heads = k.shape(1);
  s.kv_len = k.shape(2);
  s.causal = c.causal;
  s.scale = c.scale;
  if (c.has_mask) {
    const Array& m = inputs[3];  // [mb, mh, T, S], mb/mh are 1 or full
    s.mask = m.raw_data();
    int64_t plane = s.q_len * s.kv_len;
    s.mask_h_stride = m.shape(1) == 1 ? 0 : plane;
    s.mask_b_stride = m.shape(0) == 1 ? 0 : m.shape(1) * plane;
  }
  if (c.has_segments) s.segments = static_cast<const int32_t*>(inputs[c.segments_index()].raw_data());  // [B, T]
  return s;
}
}  // namespace

void Attention::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  for (Array& o : outputs) o.allocate();
  cpu::AttentionShape s = attention_shape(config_, inputs);
  cpu::attention_forward(inputs[0].dtype(), s, inputs[0].raw_data(), inputs[1].raw_data(), inputs[2].raw_data(),
                         outputs[0].mutable_raw_data(), outputs[1].mutable_raw_data());
}

void AttentionGrad::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  for (Array& o : outputs) o.allocate();
  const size_t m = config_.optional_inputs();
  cpu::AttentionShape s = attention_shape(config_, inputs);
  cpu::attention_backward(inputs[0].dtype(), s, inputs[0].raw_data(), inputs[1].raw_data(), inputs[2].raw_data(),
                          inputs[3 + m].raw_data(), inputs[4 + m].raw_data(), inputs[5 + m].raw_data(),
                          outputs[0].mutable_raw_data(), outputs[1].mutable_raw_data(), outputs[2].mutable_raw_data());
}

}  // namespace tessera
