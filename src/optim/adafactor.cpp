// Adafactor (optim/rules.h), following Optax's adafactor: scale_by_factored_rms, then
// clip_by_block_rms, then the parameter-scale step (scale_by_param_block_rms). Weight
// decay is tessera's decoupled form, p -= lr (u + wd p), as for AdamW (Optax adds wd p
// after the learning rate).
#include <algorithm>
#include <cmath>

#include "optim/rules.h"
#include "tessera/core/ops.h"

namespace tessera::optim::detail {

namespace {

Shape without(const Shape& shape, int dim) {
  Shape out = shape;
  out.erase(out.begin() + dim);
  return out;
}

Array rms(const Array& x) { return sqrt(mean(square(x))); }

}  // namespace

std::pair<int, int> adafactor_factored_dims(const OptimizerConfig& config, const Shape& shape) {
  if (shape.size() < 2) return {-1, -1};
  // Optax: the two largest dims (the later one first among equals), if the smaller of
  // them is at least min_dim_size_to_factor.
  std::vector<int> order(shape.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return shape[a] < shape[b]; });
  const int largest = order[order.size() - 1], second = order[order.size() - 2];
  if (shape[second] < config.adafactor_min_dim_to_factor) return {-1, -1};
  return {second, largest};
}

Tree adafactor_init(const OptimizerConfig& config, const Tree& params) {
  auto factored = [&](const Array& p) { return adafactor_factored_dims(config, p.shape()).first >= 0; };
  Tree v = params.map([&](const Array& p) {
    return factored(p) ? zeros({}, accumulation_dtype(p.dtype())) : zeros(p.shape(), accumulation_dtype(p.dtype()));
  });
  Tree row = params.map([&](const Array& p) {
    auto [d1, d0] = adafactor_factored_dims(config, p.shape());
    return zeros(d1 >= 0 ? without(p.shape(), d0) : Shape{}, accumulation_dtype(p.dtype()));
  });
  Tree col = params.map([&](const Array& p) {
    auto [d1, d0] = adafactor_factored_dims(config, p.shape());
    return zeros(d1 >= 0 ? without(p.shape(), d1) : Shape{}, accumulation_dtype(p.dtype()));
  });
  return Tree{{"v", v}, {"v_row", row}, {"v_col", col}};
}

void adafactor_check(const OptimizerConfig& config, const Tree& params, const Tree& state) {
  check_state_leaves("state v", params, state.at("v"), [&](const Array& p, size_t) {
    return adafactor_factored_dims(config, p.shape()).first >= 0 ? Shape{} : p.shape();
  });
  check_state_leaves("state v_row", params, state.at("v_row"), [&](const Array& p, size_t) {
    auto [d1, d0] = adafactor_factored_dims(config, p.shape());
    return d1 >= 0 ? without(p.shape(), d0) : Shape{};
  });
  check_state_leaves("state v_col", params, state.at("v_col"), [&](const Array& p, size_t) {
    auto [d1, d0] = adafactor_factored_dims(config, p.shape());
    return d1 >= 0 ? without(p.shape(), d1) : Shape{};
  });
}

std::vector<Array> adafactor_apply(const StepInputs& in, const Tree& state, Tree& new_state) {
  const OptimizerConfig& c = in.config;
  std::vector<Array> v = state.at("v").leaves(), row = state.at("v_row").leaves(), col = state.at("v_col").leaves();
  std::vector<Array> new_p(in.params.size());
  // The second-moment decay of step t (1-based): 1 - t^(-decay_rate) (0 at the first step),
  // in float32 whatever the parameters' dtype, as Optax's _decay_rate_pow computes it
  // (tests/optim/test_optim_optax_oracle.cpp matches Optax's float64 steps to ~1e-14).
  const Array t = astype(in.step, DType::Float32);
  const Array decay = 1.0 - power(t, scalar_like(-c.adafactor_decay_rate, t));
  for (size_t i = 0; i < in.params.size(); ++i) {
    const DType acc = accumulation_dtype(in.params[i].dtype());
    // The step size in the moments' dtype (a float64 parameter takes a float64 learning
    // rate unrounded): the schedule's, or the paper's relative step min(1e-2, 1 / sqrt(t)).
    const Array t_acc = astype(in.step, acc);
    const Array lr = c.adafactor_relative_step ? minimum(scalar_like(1e-2, t_acc), rsqrt(t_acc)) : astype(in.lr, acc);
    const Array g = astype(in.grads[i], acc), p = astype(in.params[i], acc);
    const Array d = astype(decay, acc);
    const Array g2 = square(g) + c.adafactor_eps;
    Array u;
    auto [d1, d0] = adafactor_factored_dims(c, p.shape());
    if (d1 >= 0) {
      row[i] = d * row[i] + (1.0 - d) * mean(g2, {d0});
      col[i] = d * col[i] + (1.0 - d) * mean(g2, {d1});
      const int reduced_d1 = d1 > d0 ? d1 - 1 : d1;
      const Array row_factor = rsqrt(row[i] / mean(row[i], {reduced_d1}, true));
      const Array col_factor = rsqrt(col[i]);
      u = g * expand_dims(row_factor, d0) * expand_dims(col_factor, d1);
    } else {
      v[i] = d * v[i] + (1.0 - d) * g2;
      u = g * rsqrt(v[i]);
    }
    if (c.adafactor_clip_threshold > 0) u = u / maximum(scalar_like(1, u), rms(u) / c.adafactor_clip_threshold);
    if (c.adafactor_param_scale) u = u * maximum(rms(p), scalar_like(c.adafactor_min_scale, p));
    if (in.decay[i]) u = u + p * c.weight_decay;
    new_p[i] = astype(subtract(p, multiply(lr, u)), in.params[i].dtype());
  }
  new_state = Tree{{"v", state.at("v").with_leaves(v)},
                   {"v_row", state.at("v_row").with_leaves(row)},
                   {"v_col", state.at("v_col").with_leaves(col)}};
  return new_p;
}

}  // namespace tessera::optim::detail
