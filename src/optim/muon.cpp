// Muon (optim/rules.h): momentum orthogonalized by a Newton-Schulz iteration for the
// hidden 2-D weight matrices, AdamW for everything else (embeddings, heads, norms,
// biases), as the GPT-2 speedrun recipes do. The orthogonal update is scaled by
// 0.2 sqrt(max(rows, cols)) (Moonlight, "Muon is Scalable for LLM Training"): its RMS
// then matches AdamW's, so both groups share one learning rate and weight decay.
#include <algorithm>
#include <cmath>

#include "optim/rules.h"
#include "tessera/core/ops.h"
#include "tessera/ir/primitives/linalg.h"

namespace tessera::optim::detail {

bool muon_param(const nn::ParamInfo& info, const Shape& shape) {
  if (info.kind != nn::ParamKind::Weight || shape.size() != 2) return false;
  return std::find(info.axes.begin(), info.axes.end(), "vocab") == info.axes.end();
}

Array newton_schulz(const Array& g, int steps, DType dtype) {
  const double a = 3.4445, b = -4.7750, c = 2.0315;
  Array x = astype(g, DType::Float32);
  const bool tall = x.shape(0) > x.shape(1);
  if (tall) x = transpose(x);
  // Normalized (in float32) so every singular value is at most 1 (the Frobenius norm
  // bounds them), then rounded to the iteration's dtype.
  x = astype(x / (sqrt(sum(square(x))) + 1e-7), dtype);
  // One step X <- a X + (b S + c S^2) X with S = X X^T, regrouped as Q X with
  // Q = a I + S (b I + c S): the elementwise work is on the small m x m matrices, X X^T
  // reads X in place (trans_b), and the three GEMMs are those of the plain form.
  const int64_t m = x.shape(0);
  std::vector<float> identity(static_cast<size_t>(m * m), 0.0f);
  for (int64_t i = 0; i < m; ++i) identity[static_cast<size_t>(i * m + i)] = 1.0f;
  const Array eye = astype(Array::from_vector(identity, {m, m}), dtype);
  for (int i = 0; i < steps; ++i) {
    const Array s = matmul_op(x, x, false, true);
    const Array q = matmul(s, eye * b + s * c) + eye * a;
    x = matmul(q, x);
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
    const DType ns_dtype = c.muon_ns_dtype == "bfloat16" ? DType::BFloat16 : DType::Float32;
    Array u =
        astype(newton_schulz(direction, c.muon_ns_steps, ns_dtype), acc) * (0.2 * std::sqrt(std::max(rows, cols)));
    if (in.decay[i]) u = u + p * c.weight_decay;
    new_p[i] = astype(subtract(p, multiply(astype(in.lr, acc), u)), in.params[i].dtype());
  }
  new_state = Tree{{"m", state.at("m").with_leaves(m)}, {"v", state.at("v").with_leaves(v)}};
  return new_p;
}

}  // namespace tessera::optim::detail
