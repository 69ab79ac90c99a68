// Lion through Optimizer against a float64 reference over several steps, with the
// weight-decay mask and clipping.
#include <gtest/gtest.h>

#include <cmath>

#include "optim/optim_test_util.h"

namespace tessera::test {
namespace {

using optim::Optimizer;
using optim::OptimizerConfig;

// c = b1 m + (1 - b1) g;  p -= lr (sign(c) + wd p);  m = b2 m + (1 - b2) g.
void ref_lion_step(Values& p, Values& m, Values g, const std::vector<LeafSpec>& leaves, const OptimizerConfig& c,
                   double lr) {
  ref_clip(g, c.clip_norm);
  for (const LeafSpec& l : leaves) {
    const double wd = ref_decays(l.kind) ? c.weight_decay : 0.0;
    std::vector<double>&pl = p[l.path], &ml = m[l.path];
    const std::vector<double>& gl = g.at(l.path);
    for (size_t i = 0; i < pl.size(); ++i) {
      const double interpolated = c.beta1 * ml[i] + (1 - c.beta1) * gl[i];
      const double sign = interpolated > 0 ? 1.0 : interpolated < 0 ? -1.0 : 0.0;
      pl[i] -= lr * (sign + wd * pl[i]);
      ml[i] = c.beta2 * ml[i] + (1 - c.beta2) * gl[i];
    }
  }
}

void run_lion(double clip_norm) {
  std::vector<LeafSpec> leaves = test_leaves();
  OptimizerConfig config;
  config.name = "lion";
  config.beta1 = 0.9;
  config.beta2 = 0.99;
  config.weight_decay = 0.2;
  config.clip_norm = clip_norm;
  Optimizer opt(config, specs_of(leaves));
  Values p = random_values_for(leaves, 5, DType::Float64), m;
  for (const LeafSpec& l : leaves) m[l.path] = std::vector<double>(numel(l.shape), 0.0);
  Tree params = tree_of(leaves, p, DType::Float64);
  Tree state = opt.init(params);
  EXPECT_EQ(state.paths().size(), leaves.size() + 1) << "lion keeps one moment per parameter and the step";
  for (int t = 0; t < 4; ++t) {
    const double lr = 0.01 / (t + 1);
    Values g = random_values_for(leaves, 300 + 10 * t, DType::Float64);
    Optimizer::Update u =
        opt.apply(params, tree_of(leaves, g, DType::Float64), state, Array::scalar(lr, DType::Float64));
    ref_lion_step(p, m, g, leaves, config, lr);
    params = u.params;
    state = u.state;
    expect_close(values_of(params), p, 1e-12, "step " + std::to_string(t) + " params");
    expect_close(values_of(state.at("m")), m, 1e-12, "step " + std::to_string(t) + " m");
    EXPECT_EQ(state.at("step").leaf().item<int64_t>(), t + 1);
  }
}

TEST(OptimLion, MatchesReference) { run_lion(0); }
TEST(OptimLion, MatchesReferenceWithClipping) { run_lion(0.5); }

TEST(OptimLion, BFloat16ParamsKeepFloat32Moments) {
  std::vector<LeafSpec> leaves = test_leaves();
  OptimizerConfig config;
  config.name = "lion";
  Optimizer opt(config, specs_of(leaves));
  Tree params = tree_of(leaves, random_values_for(leaves, 1, DType::BFloat16), DType::BFloat16);
  Tree state = opt.init(params);
  for (const Array& m : state.at("m").leaves()) EXPECT_EQ(m.dtype(), DType::Float32);
  Optimizer::Update u = opt.apply(params, params, state, Array::scalar(1e-2, DType::Float32));
  for (const Array& p : u.params.leaves()) EXPECT_EQ(p.dtype(), DType::BFloat16);
}

}  // namespace
}  // namespace tessera::test
