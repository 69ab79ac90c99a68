// Muon (optim/rules.h): momentum orthogonalized by a Newton-Schulz iteration for the
// hidden 2-D weight matrices, AdamW for everything else (embeddings, heads, norms,
// biases), as the GPT-2 speedrun recipes do. The orthogonal update is scaled by
// 0.2 sqrt(max(rows, cols)) (Moonlight, "Muon is Scalable for LLM Training"): its RMS
// then matches AdamW's, so both groups share one learning rate and weight decay.
#include <algorithm>
#include <cmath>

#include "optim/rules.h"
#include "tessera/core/ops.h"

namespace tessera::optim::detail {

bool muon_param(const nn::ParamInfo& info, const Shape& shape) {
  if (info.kind != nn::ParamKind::Weight || shape.size() != 2) return false;
  return std::find(info.axes.begin(), info.axes.end(), "vocab") == info.axes.end();
}

Array newton_schulz(const Array& g, int steps) {
  const double a = 3.4445, b = -4.7750, c = 2.0315;
  Array x = astype(g, DType::Float32);
  const bool tall = x.shape(0) > x.shape(1);
  if (tall) x = transpose(x);
  // Normalized so every singular value is at most 1 (the Frobenius norm bounds them).
  x = x / (sqrt(sum(square(x))) + 1e-7);
  for (int i = 0; i < steps; ++i) {
    const Array s = matmul(x, transpose(x));
    const Array poly = s * b + matmul(s, s) * c;
    x = x * a + matmul(poly, x);
  }
  return tall ? transpose(x) : x;
}

Tree muon_init(const Tree& params, const std::vector<bool>& muon) {
  size_t i = 0;
  Tree v = params.map([&](const Array& p) {
    const bool orthogonal = muon[i++];
    return orthogonal ? zeros({}, accumulation_dtype(p.dtype())) : zeros(p.shape(), accumulation_dtype(p.dtype()));
  });
  return Tree{{"m", params.map([](const Array& p) { return zeros(p.shape(), accumulation_dtype(p.dtype())); })},
              {"v", v}};
}

void muon_check(const Tree& params, const Tree& state, const std::vector<bool>& muon) {
  check_state_leaves("state m", params, state.at("m"), [](const Array& p, size_t) { return p.shape(); });
  check_state_leaves("state v", params, state.at("v"),
                     [&](const Array& p, size_t i) { return muon[i] ? Shape{} : p.shape(); });
}

std::vector<Array> muon_apply(const StepInputs& in, const Tree& state, Tree& new_state) {
  const OptimizerConfig& c = in.config;
  std::vector<Array> m = state.at("m").leaves(), v = state.at("v").leaves(), new_p(in.params.size());
  AdamWConfig adamw{.beta1 = c.beta1, .beta2 = c.beta2, .eps = c.eps, .weight_decay = c.weight_decay};
  AdamWConfig adamw_no_decay = adamw;
  adamw_no_decay.weight_decay = 0;
  for (size_t i = 0; i < in.params.size(); ++i) {
    if (!muon_param(*in.infos[i], in.params[i].shape())) {
      std::vector<Array> r =
          adamw_update(in.params[i], in.grads[i], m[i], v[i], in.lr, in.step, in.decay[i] ? adamw : adamw_no_decay);
      new_p[i] = r[0];
      m[i] = r[1];
      v[i] = r[2];
      continue;
    }
    const DType acc = m[i].dtype();
    const Array g = astype(in.grads[i], acc), p = astype(in.params[i], acc);
    m[i] = m[i] * c.muon_momentum + g;
    const Array direction = c.muon_nesterov ? g + m[i] * c.muon_momentum : m[i];
    const double rows = static_cast<double>(p.shape(0)), cols = static_cast<double>(p.shape(1));
    Array u = astype(newton_schulz(direction, c.muon_ns_steps), acc) * (0.2 * std::sqrt(std::max(rows, cols)));
    if (in.decay[i]) u = u + p * c.weight_decay;
    new_p[i] = astype(subtract(p, multiply(astype(in.lr, acc), u)), in.params[i].dtype());
  }
  new_state = Tree{{"m", state.at("m").with_leaves(m)}, {"v", state.at("v").with_leaves(v)}};
  return new_p;
}

}  // namespace tessera::optim::detail
