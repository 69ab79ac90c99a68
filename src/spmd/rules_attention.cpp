// Sharding rules for attention: the sequence and head dims must be whole on every
// device (gathered); batch and heads may be split (GQA needs the kv heads split by the
// same count). lse [B, H, T] follows q's batch and head splits.
#include "spmd/rules.h"
#include "tessera/ir/primitives/nn.h"

namespace tessera::spmd::rules {

namespace {

// q [B,H,T,D], k/v [B,Hkv,S,D]: batch and head splits merged over q, k, v.
Sharding attention_layout(const Context& c, int operands) {
  Sharding q = c.in[0].without_partial();
  std::vector<int> batch, heads;
  for (int i = 0; i < operands; ++i) {
    const Sharding& s = c.in[static_cast<size_t>(i)];
    if (batch.empty()) batch = s.dim_axes(0);
    if (heads.empty()) heads = s.dim_axes(1);
  }
  for (int a : batch)
    if (std::find(heads.begin(), heads.end(), a) != heads.end()) heads.clear();
  int64_t n_heads = 1;
  for (int a : heads) n_heads *= c.mesh.axis_size(a);
  for (int i = 0; i < operands; ++i)
    if (c.in_types[static_cast<size_t>(i)].shape[1] % n_heads != 0) heads.clear();
  Sharding s = Sharding::replicated(c.mesh, 4).with_dim_axes(0, batch).with_dim_axes(1, heads);
  return s;
}

Sharding mask_layout(const Context& c, size_t mask, const Sharding& layout) {
  Shape full = c.in_types[0].shape;  // [B, H, T, D]
  full[3] = c.in_types[1].shape[2];  // [B, H, T, S]
  return project(layout, c.in_types[mask].shape, full);
}

// Segment ids [B, T] follow q's batch split; the sequence stays whole.
Sharding segments_layout(const Context& c, const Sharding& layout) {
  return Sharding::replicated(c.mesh, 2).with_dim_axes(0, layout.dim_axes(0));
}

Decision attention_rule(const Context& c) {
  const auto& p = static_cast<const Attention&>(c.primitive);
  Sharding layout = attention_layout(c, 3);
  Decision dec;
  dec.inputs = {layout, layout, layout};
  if (p.config().has_mask) dec.inputs.push_back(mask_layout(c, 3, layout));
  if (p.config().has_segments) dec.inputs.push_back(segments_layout(c, layout));
  // lse is [B, H, T].
  Sharding lse =
      Sharding::replicated(c.mesh, 3).with_dim_axes(0, layout.dim_axes(0)).with_dim_axes(1, layout.dim_axes(1));
  dec.outputs = {layout, lse};
  return dec;
}

Decision attention_grad_rule(const Context& c) {
  // Inputs: q, k, v, [mask], [segments], out, lse, dout.
  const auto& p = static_cast<const AttentionGrad&>(c.primitive);
  Sharding layout = attention_layout(c, 3);
  Sharding lse =
      Sharding::replicated(c.mesh, 3).with_dim_axes(0, layout.dim_axes(0)).with_dim_axes(1, layout.dim_axes(1));
  Decision dec;
  dec.inputs = {layout, layout, layout};
  if (p.config().has_mask) dec.inputs.push_back(mask_layout(c, 3, layout));
  if (p.config().has_segments) dec.inputs.push_back(segments_layout(c, layout));
  dec.inputs.push_back(layout);  // out
  dec.inputs.push_back(lse);
  dec.inputs.push_back(layout);  // dout
  dec.outputs = {layout, layout, layout};
  return dec;
}

}  // namespace

void register_attention() {
  add("attention", attention_rule);
  add("attention_grad", attention_grad_rule);
}

}  // namespace tessera::spmd::rules
