// A GPT-style decoder and its AdamW training step, written with tessera's public ops
// only: the model bench_jit times and the compiler tests check jit against eager on.
//
//   x = wte[tokens] + wpe[:T]
//   per layer:  x += attn_out(causal_attention(split_heads(ln1(x) @ qkv_w + qkv_b)))
//               x += proj(gelu(ln2(x) @ fc_w + fc_b))
//   logits = lnf(x) @ (wte^T or head_w);  loss = mean cross-entropy(logits, targets)
//
// Everything is a plain function of (params Tree, opt-state Tree, tokens, targets), so
// the same code runs eagerly or under jit. The Trainer issue generalizes train_step.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tessera/tessera.h"

namespace tessera::bench {

struct TransformerConfig {
  int64_t vocab = 1024;
  int64_t dim = 256;
  int64_t heads = 4;
  int64_t layers = 4;
  int64_t seq = 256;  // tokens per sequence (also the size of the position table)
  int64_t batch = 8;
  bool tied_head = true;  // logits = x @ wte^T (GPT-2); false: a separate head_w [dim, vocab]
  double init_std = 0.02;
};

// Random normal weights (std init_std; the residual projections scaled by
// 1/sqrt(2 * layers) as in GPT-2), zero biases, unit norm weights. Deterministic in
// `seed`: every tensor draws from its own key split off the seed's key.
inline Tree init_params(const TransformerConfig& c, uint64_t seed) {
  if (c.dim % c.heads != 0) fail<ValueError>("init_params: dim {} is not a multiple of heads {}", c.dim, c.heads);
  const int kTensorsPerLayer = 4;  // qkv, attn_out, fc, proj
  std::vector<Array> keys = random::split_keys(key(seed), 3 + kTensorsPerLayer * c.layers);
  size_t next_key = 0;
  auto normal = [&](const Shape& shape, double std) {
    return random::normal(keys.at(next_key++), shape, DType::Float32, 0, std).eval();
  };
  auto zeros_of = [](const Shape& shape) { return zeros(shape).eval(); };
  auto ones_of = [](const Shape& shape) { return ones(shape).eval(); };
  const double residual_std = c.init_std / std::sqrt(2.0 * static_cast<double>(c.layers));
  const int64_t d = c.dim;

  Tree params;
  params["wte"] = normal({c.vocab, d}, c.init_std);
  params["wpe"] = normal({c.seq, d}, c.init_std);
  Tree head_w = normal({d, c.vocab}, c.init_std);  // drawn even when tied, so the layer keys do not shift
  if (!c.tied_head) params["head_w"] = head_w;
  std::vector<Tree> layers;
  for (int64_t l = 0; l < c.layers; ++l) {
    Tree layer;
    layer["ln1_w"] = ones_of({d});
    layer["ln1_b"] = zeros_of({d});
    layer["qkv_w"] = normal({d, 3 * d}, c.init_std);
    layer["qkv_b"] = zeros_of({3 * d});
    layer["attn_out_w"] = normal({d, d}, residual_std);
    layer["attn_out_b"] = zeros_of({d});
    layer["ln2_w"] = ones_of({d});
    layer["ln2_b"] = zeros_of({d});
    layer["fc_w"] = normal({d, 4 * d}, c.init_std);
    layer["fc_b"] = zeros_of({4 * d});
    layer["proj_w"] = normal({4 * d, d}, residual_std);
    layer["proj_b"] = zeros_of({d});
    layers.push_back(std::move(layer));
  }
  params["layers"] = Tree::list(std::move(layers));
  params["lnf_w"] = ones_of({d});
  params["lnf_b"] = zeros_of({d});
  return params;
}

// AdamW state: moments, zero, in the parameters' structure, and the number of steps
// taken (an int64 scalar, so a jitted step compiles once for every step):
// {"m": ..., "step": 0, "v": ...}.
inline Tree init_opt_state(const Tree& params) {
  auto zero = [](const Array& p) { return zeros_like(p).eval(); };
  return Tree{{"m", params.map(zero)}, {"v", params.map(zero)}, {"step", Array::scalar(0, DType::Int64)}};
}

// Random token ids in [0, vocab) of shape [batch, seq] (host RNG: deterministic).
inline Array random_tokens(const TransformerConfig& c, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> dist(0, static_cast<int32_t>(c.vocab - 1));
  std::vector<int32_t> ids(static_cast<size_t>(c.batch * c.seq));
  for (auto& id : ids) id = dist(gen);
  return Array::from_vector<int32_t>(ids, {c.batch, c.seq});
}

// Causal self-attention of one layer: x [B, T, D] -> [B, T, D].
inline Array attention_block(const TransformerConfig& c, const Tree& layer, const Array& x) {
  const int64_t b = x.shape(0), t = x.shape(1), d = c.dim, h = c.heads, dh = d / h;
  Array qkv = matmul(x, layer.at("qkv_w").leaf()) + layer.at("qkv_b").leaf();  // [B, T, 3D]
  // Columns grouped per head, [H, 3, Dh] (q, k, v of head 0, then of head 1, ...): the
  // layout nn::Attention uses, which tensor parallelism splits by whole heads.
  Array groups = reshape(qkv, {b, t, h, 3, dh});
  auto part = [&](int64_t i) {
    return transpose(reshape(slice_axis(groups, 3, i, i + 1), {b, t, h, dh}), {0, 2, 1, 3});  // [B, H, T, Dh]
  };
  Array q = part(0), k = part(1), v = part(2);
  Array out = scaled_dot_product_attention(q, k, v, /*causal=*/true);  // [B, H, T, Dh]
  Array merged = reshape(transpose(out, {0, 2, 1, 3}), {b, t, d});
  return matmul(merged, layer.at("attn_out_w").leaf()) + layer.at("attn_out_b").leaf();
}

inline Array mlp_block(const Tree& layer, const Array& x) {
  Array hidden = gelu(matmul(x, layer.at("fc_w").leaf()) + layer.at("fc_b").leaf());
  return matmul(hidden, layer.at("proj_w").leaf()) + layer.at("proj_b").leaf();
}

// Logits [B, T, vocab] of int tokens [B, T] (T <= c.seq).
inline Array forward(const TransformerConfig& c, const Tree& params, const Array& tokens) {
  const int64_t t = tokens.shape(1);
  Array positions = slice_axis(params.at("wpe").leaf(), 0, 0, t);  // [T, D], broadcast over B
  Array x = take(params.at("wte").leaf(), tokens, 0) + positions;
  for (const Tree& layer : params.at("layers").elements()) {
    x = x + attention_block(c, layer, layer_norm(x, layer.at("ln1_w").leaf(), layer.at("ln1_b").leaf()));
    x = x + mlp_block(layer, layer_norm(x, layer.at("ln2_w").leaf(), layer.at("ln2_b").leaf()));
  }
  x = layer_norm(x, params.at("lnf_w").leaf(), params.at("lnf_b").leaf());
  const Array head = c.tied_head ? transpose(params.at("wte").leaf()) : params.at("head_w").leaf();
  return matmul(x, head);
}

// Scalar mean next-token cross-entropy.
inline Array loss(const TransformerConfig& c, const Tree& params, const Array& tokens, const Array& targets) {
  return cross_entropy(forward(c, params, tokens), targets);
}

struct StepResult {
  Tree params;
  Tree opt_state;
  Array loss;
};

// AdamW applied leaf by leaf: new (params, {"m", "step", "v"}) from the gradient tree.
// The step count and learning rate are arrays (config.step is ignored; config.lr is
// the rate), so the update is the same program at every step.
inline std::pair<Tree, Tree> adamw_tree(const Tree& params, const Tree& grads, const Tree& opt_state,
                                        const AdamWConfig& config) {
  std::vector<Array> p = params.leaves(), g = grads.leaves();
  std::vector<Array> m = opt_state.at("m").leaves(), v = opt_state.at("v").leaves();
  Array step = add(opt_state.at("step").leaf(), Array::scalar(1, DType::Int64));
  Array lr = Array::scalar(config.lr, DType::Float32);
  std::vector<Array> new_p, new_m, new_v;
  for (size_t i = 0; i < p.size(); ++i) {
    std::vector<Array> updated = adamw_update(p[i], g[i], m[i], v[i], lr, step, config);
    new_p.push_back(updated[0]);
    new_m.push_back(updated[1]);
    new_v.push_back(updated[2]);
  }
  Tree opt{{"m", opt_state.at("m").with_leaves(new_m)}, {"v", opt_state.at("v").with_leaves(new_v)}, {"step", step}};
  return {params.with_leaves(new_p), std::move(opt)};
}

// One training step (lazy: nothing runs until the results are evaluated).
inline StepResult train_step(const TransformerConfig& c, const Tree& params, const Tree& opt_state, const Array& tokens,
                             const Array& targets, const AdamWConfig& adamw = {}) {
  auto [value, grads] = value_and_grad([&](const Tree& p) { return loss(c, p, tokens, targets); })(params);
  auto [new_params, new_opt] = adamw_tree(params, grads, opt_state, adamw);
  return {std::move(new_params), std::move(new_opt), value};
}

// ---- the step as one Tree -> Tree function (what jit takes) ----
//
// args = {"opt": ..., "params": ..., "targets": ..., "tokens": ...}; no static arguments
// (the step count lives in opt.step).
// Returns {"loss": ..., "opt": ..., "params": ...}.
inline Tree step_args(const Tree& params, const Tree& opt_state, const Array& tokens, const Array& targets) {
  return Tree{{"params", params}, {"opt", opt_state}, {"tokens", tokens}, {"targets", targets}};
}

// A step function over step_args trees (any model: `step` does the work).
template <typename Step>
auto tree_step_fn(Step step) {
  return [step](const Tree& args, const std::vector<int64_t>& statics) -> Tree {
    if (!statics.empty())
      fail<ValueError>("train step: takes no static arguments (got {}; the step count is opt.step)", statics.size());
    StepResult r = step(args.at("params"), args.at("opt"), args.at("tokens").leaf(), args.at("targets").leaf());
    return Tree{{"params", r.params}, {"opt", r.opt_state}, {"loss", r.loss}};
  };
}

inline auto transformer_step_fn(const TransformerConfig& c, AdamWConfig adamw = {}) {
  return tree_step_fn([c, adamw](const Tree& p, const Tree& o, const Array& tokens, const Array& targets) {
    return train_step(c, p, o, tokens, targets, adamw);
  });
}

// Indices (in Tree::leaves() order of step_args) of the params and opt-state leaves:
// JitOptions::donate_leaves for a step that updates them in place.
inline std::vector<int> state_leaf_indices(const Tree& args) {
  std::vector<int> indices;
  std::vector<std::string> paths = args.paths();
  for (size_t i = 0; i < paths.size(); ++i)
    if (paths[i].starts_with("params.") || paths[i].starts_with("opt.")) indices.push_back(static_cast<int>(i));
  return indices;
}

// Runs fn with every op evaluated as it is created (PyTorch-style execution: the
// baseline jit is measured and checked against). Inside a transform (value_and_grad)
// ops still evaluate as soon as their inputs have values.
template <typename F>
auto run_eager(F&& fn) {
  detail::EagerScope scope;
  auto result = fn();
  if constexpr (std::is_same_v<std::decay_t<decltype(result)>, Tree>) {
    eval(result.leaves());
  } else if constexpr (std::is_same_v<std::decay_t<decltype(result)>, std::vector<Array>>) {
    eval(result);
  } else {
    result.eval();
  }
  return result;
}

}  // namespace tessera::bench
