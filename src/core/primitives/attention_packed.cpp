// attention_packed and attention_packed_grad (ir/primitives/nn.h): attributes, cost, and
// the composites, which unpack qkv and call attention's, so the packed primitives equal the
// attention they replace by construction.
#include <fmt/format.h>

#include <vector>

#include "tessera/base/error.h"
#include "tessera/core/ops.h"
#include "tessera/ir/primitives/nn.h"

namespace tessera {

PackedQkvShape packed_qkv_shape(const char* op, const Shape& qkv) {
  if (qkv.size() != 5 || qkv[3] < 3)
    fail<ShapeError>("{}: qkv has shape {} (expected [batch, seq, kv_heads, group + 2, head_dim], group >= 1)", op,
                     to_string(qkv));
  return {qkv[0], qkv[1], qkv[2], qkv[3] - 2, qkv[4]};
}

namespace {

std::string packed_attributes(const AttentionConfig& c) {
  std::string text = fmt::format("causal={}, scale={}, mask={}", c.causal, c.scale, c.has_mask);
  if (c.has_segments) text += ", segments=true";
  return text;
}

// q [B, H, T, D], k and v [B, Hkv, T, D] from qkv [B, T, Hkv, G + 2, D].
std::vector<Array> unpack_qkv(const char* op, const Array& qkv) {
  const PackedQkvShape s = packed_qkv_shape(op, qkv.shape());
  auto heads_first = [&](int64_t start, int64_t stop, int64_t heads) {
    return transpose(reshape(slice_axis(qkv, 3, start, stop), {s.batch, s.seq, heads, s.head_dim}), {0, 2, 1, 3});
  };
  return {heads_first(0, s.group, s.heads()), heads_first(s.group, s.group + 1, s.kv_heads),
          heads_first(s.group + 1, s.group + 2, s.kv_heads)};
}

Cost packed_cost(const Primitive& p, const AttentionConfig& c, const std::vector<Array>& inputs,
                 const std::vector<Array>& outputs, double matmuls) {
  const PackedQkvShape s = packed_qkv_shape(p.name().c_str(), inputs[0].shape());
  Cost cost = p.Primitive::cost(inputs, outputs);
  // 2 D flops per visible pair and matmul, per (batch, head): 2 matmuls forward, 5 in
  // the flash-attention-2 backward (attention's count).
  cost.flops = 2.0 * matmuls * static_cast<double>(s.batch * s.heads()) *
               attention_visible_pairs(s.seq, s.seq, c.causal) * static_cast<double>(s.head_dim);
  return cost;
}

}  // namespace

std::string AttentionPacked::attributes() const { return packed_attributes(config_); }
std::string AttentionPackedGrad::attributes() const { return packed_attributes(config_); }

std::vector<Array> AttentionPacked::composite(const std::vector<Array>& in) const {
  std::vector<Array> unpacked = unpack_qkv("attention_packed", in[0]);
  for (size_t i = 1; i < in.size(); ++i) unpacked.push_back(in[i]);  // mask, segments
  const std::vector<Array> outs = Attention(config_).composite(unpacked);
  return {transpose(outs[0], {0, 2, 1, 3}), outs[1]};
}

std::vector<Array> AttentionPackedGrad::composite(const std::vector<Array>& in) const {
  const size_t m = config_.optional_inputs();
  if (in.size() != 4 + m)
    fail<ValueError>("attention_packed_grad: {} inputs (expected qkv, {} optional, out, lse, dout)", in.size(), m);
  const PackedQkvShape s = packed_qkv_shape("attention_packed_grad", in[0].shape());
  std::vector<Array> unpacked = unpack_qkv("attention_packed_grad", in[0]);
  for (size_t i = 1; i <= m; ++i) unpacked.push_back(in[i]);
  unpacked.push_back(transpose(in[1 + m], {0, 2, 1, 3}));  // out
  unpacked.push_back(in[2 + m]);                           // lse
  unpacked.push_back(transpose(in[3 + m], {0, 2, 1, 3}));  // dout
  const std::vector<Array> grads = AttentionGrad(config_).composite(unpacked);
  auto heads_last = [&](const Array& g, int64_t slots) {
    return reshape(transpose(g, {0, 2, 1, 3}), {s.batch, s.seq, s.kv_heads, slots, s.head_dim});
  };
  return {concatenate({heads_last(grads[0], s.group), heads_last(grads[1], 1), heads_last(grads[2], 1)}, 3)};
}

Cost AttentionPacked::cost(const std::vector<Array>& inputs, const std::vector<Array>& outputs) const {
  return packed_cost(*this, config_, inputs, outputs, 2.0);
}

Cost AttentionPackedGrad::cost(const std::vector<Array>& inputs, const std::vector<Array>& outputs) const {
  return packed_cost(*this, config_, inputs, outputs, 5.0);
}

}  // namespace tessera
