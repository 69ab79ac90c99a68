// AdamW through Optimizer: several steps against a float64 reference, with the
// weight-decay mask by parameter kind, bias correction from step 1, clipping, and
// float32 moments for bfloat16 parameters.
#include <gtest/gtest.h>

#include <cmath>

#include "optim/optim_test_util.h"

namespace tessera::test {
namespace {

using optim::Optimizer;
using optim::OptimizerConfig;

struct RefAdamW {
  Values p, m, v;
  int64_t step = 0;
};

// One AdamW step in float64 (Loshchilov & Hutter, decoupled decay), clipping first.
double ref_adamw_step(RefAdamW& s, Values g, const std::vector<LeafSpec>& leaves, const OptimizerConfig& c, double lr) {
  double norm = ref_clip(g, c.clip_norm);
  ++s.step;
  const double c1 = 1 - std::pow(c.beta1, static_cast<double>(s.step));
  const double c2 = 1 - std::pow(c.beta2, static_cast<double>(s.step));
  for (const LeafSpec& l : leaves) {
    const double wd = ref_decays(l.kind) ? c.weight_decay : 0.0;
    std::vector<double>&p = s.p[l.path], &m = s.m[l.path], &v = s.v[l.path];
    const std::vector<double>& gl = g.at(l.path);
    for (size_t i = 0; i < p.size(); ++i) {
      m[i] = c.beta1 * m[i] + (1 - c.beta1) * gl[i];
      v[i] = c.beta2 * v[i] + (1 - c.beta2) * gl[i] * gl[i];
      p[i] -= lr * ((m[i] / c1) / (std::sqrt(v[i] / c2) + c.eps) + wd * p[i]);
    }
  }
  return norm;
}

void run_adamw_against_reference(DType dtype, double clip_norm, double tol) {
  std::vector<LeafSpec> leaves = test_leaves();
  OptimizerConfig config;
  config.weight_decay = 0.5;  // large, so a wrong mask is far outside the tolerance
  config.clip_norm = clip_norm;
  Optimizer opt(config, specs_of(leaves));

  RefAdamW ref;
  ref.p = random_values_for(leaves, 1, dtype);
  for (const LeafSpec& l : leaves) ref.m[l.path] = ref.v[l.path] = std::vector<double>(numel(l.shape), 0.0);
  Tree params = tree_of(leaves, ref.p, dtype);
  Tree state = opt.init(params);
  for (int t = 0; t < 5; ++t) {
    const double lr = 0.01 * (t + 1);
    Values g = random_values_for(leaves, 100 + 10 * t, dtype);
    Optimizer::Update u = opt.apply(params, tree_of(leaves, g, dtype), state, Array::scalar(lr, DType::Float32));
    // The kernel gets lr as float32: the reference uses the same rounded rate.
    double norm = ref_adamw_step(ref, g, leaves, config, static_cast<float>(lr));
    ASSERT_EQ(u.grad_norm.dtype(), DType::Float32);
    ASSERT_EQ(u.grad_norm.ndim(), 0);
    EXPECT_NEAR(u.grad_norm.item<float>(), norm, 1e-6 * norm) << "step " << t;
    params = u.params;
    state = u.state;
    std::string what = "step " + std::to_string(t);
    expect_close(values_of(params), ref.p, tol, what + " params");
    expect_close(values_of(state.at("m")), ref.m, tol, what + " m");
    expect_close(values_of(state.at("v")), ref.v, tol, what + " v");
    EXPECT_EQ(state.at("step").leaf().item<int64_t>(), t + 1);
  }
}

TEST(OptimAdamW, Float64MatchesReferenceWithDecayMaskAndBiasCorrection) {
  run_adamw_against_reference(DType::Float64, 0, 1e-12);
}

TEST(OptimAdamW, Float32MatchesReference) { run_adamw_against_reference(DType::Float32, 0, 2e-6); }

TEST(OptimAdamW, ClipsBeforeTheUpdate) {
  // The random gradients have norms of about 3: a threshold of 0.5 scales every step.
  run_adamw_against_reference(DType::Float64, 0.5, 1e-12);
}

TEST(OptimAdamW, FoldedClipIsBitwiseTheClippedGradientsUpdate) {
  // apply() hands AdamW the clip factor as its grad_scale instead of clipped gradients:
  // the same bits as clip_by_global_norm followed by the plain update.
  std::vector<LeafSpec> leaves = test_leaves();
  for (DType dtype : {DType::Float32, DType::BFloat16}) {
    OptimizerConfig config;
    config.clip_norm = 0.5;
    Optimizer opt(config, specs_of(leaves));
    Tree params = tree_of(leaves, random_values_for(leaves, 1, dtype), dtype);
    Tree grads = tree_of(leaves, random_values_for(leaves, 2, dtype), dtype);
    Tree state = opt.init(params);
    const Array lr = Array::scalar(3e-3, DType::Float32);
    Optimizer::Update u = opt.apply(params, grads, state, lr);
    auto [clipped, norm] = optim::clip_by_global_norm(grads, config.clip_norm);
    EXPECT_EQ(u.grad_norm.item<float>(), norm.item<float>());
    const std::vector<std::string> paths = params.paths();
    const std::vector<Array> p = params.leaves(), g = clipped.leaves(), m = state.at("m").leaves(),
                             v = state.at("v").leaves(), new_p = u.params.leaves(), new_m = u.state.at("m").leaves();
    for (size_t i = 0; i < p.size(); ++i) {
      AdamWConfig c{.beta1 = config.beta1,
                    .beta2 = config.beta2,
                    .eps = config.eps,
                    .weight_decay = opt.decays(paths[i]) ? config.weight_decay : 0.0};
      std::vector<Array> r = adamw_update(p[i], g[i], m[i], v[i], lr, Array::scalar(1, DType::Int64), c);
      EXPECT_EQ(new_p[i].to_vector<double>(), r[0].to_vector<double>()) << name(dtype) << " " << paths[i];
      EXPECT_EQ(new_m[i].to_vector<double>(), r[1].to_vector<double>()) << name(dtype) << " " << paths[i];
    }
  }
}

TEST(OptimAdamW, InitStateLayoutAndDtypes) {
  std::vector<LeafSpec> leaves = test_leaves();
  Optimizer opt(OptimizerConfig{}, specs_of(leaves));
  Tree params = tree_of(leaves, random_values_for(leaves, 3, DType::BFloat16), DType::BFloat16);
  Tree state = opt.init(params);
  ASSERT_TRUE(state.is_dict());
  EXPECT_EQ(state.size(), 3u);
  EXPECT_EQ(state.at("m").paths(), params.paths());
  EXPECT_EQ(state.at("v").paths(), params.paths());
  for (const Array& m : state.at("m").leaves()) {
    EXPECT_EQ(m.dtype(), DType::Float32) << "low-precision parameters keep float32 moments";
    for (double x : m.to_vector<double>()) EXPECT_EQ(x, 0.0);
  }
  const Array& step = state.at("step").leaf();
  EXPECT_EQ(step.dtype(), DType::Int64);
  EXPECT_EQ(step.ndim(), 0);
  EXPECT_EQ(step.item<int64_t>(), 0);
  // One bf16 step runs and keeps the parameter dtype.
  Optimizer::Update u = opt.apply(params, params, state, Array::scalar(1e-3));
  for (const Array& p : u.params.leaves()) EXPECT_EQ(p.dtype(), DType::BFloat16);
  EXPECT_EQ(u.state.at("step").leaf().item<int64_t>(), 1);
}

TEST(OptimAdamW, DecaysFollowsKindsAndConfig) {
  std::vector<LeafSpec> leaves = test_leaves();
  Optimizer opt(OptimizerConfig{}, specs_of(leaves));
  for (const LeafSpec& l : leaves) EXPECT_EQ(opt.decays(l.path), ref_decays(l.kind)) << l.path;
  OptimizerConfig all;
  all.no_decay = {};
  Optimizer opt_all(all, specs_of(leaves));
  for (const LeafSpec& l : leaves) EXPECT_TRUE(opt_all.decays(l.path)) << l.path;
  OptimizerConfig none;
  none.weight_decay = 0;
  Optimizer opt_none(none, specs_of(leaves));
  for (const LeafSpec& l : leaves) EXPECT_FALSE(opt_none.decays(l.path)) << l.path;
}

TEST(OptimAdamW, ResumesFromAStoredStepCount) {
  // Bias correction uses the stored count: a state at step 7 gives the 8th update.
  std::vector<LeafSpec> leaves = {{"w", {6}, nn::ParamKind::Weight}};
  OptimizerConfig config;
  config.clip_norm = 0;
  Optimizer opt(config, specs_of(leaves));
  Values p = random_values_for(leaves, 5, DType::Float64), g = random_values_for(leaves, 6, DType::Float64);
  Values m = random_values_for(leaves, 7, DType::Float64), v = random_values_for(leaves, 8, DType::Float64);
  for (double& x : v["w"]) x = std::abs(x);
  Tree state{{"m", tree_of(leaves, m, DType::Float64)},
             {"v", tree_of(leaves, v, DType::Float64)},
             {"step", Array::scalar(7, DType::Int64)}};
  Optimizer::Update u = opt.apply(tree_of(leaves, p, DType::Float64), tree_of(leaves, g, DType::Float64), state,
                                  Array::scalar(0.01, DType::Float64));
  RefAdamW ref{p, m, v, 7};
  ref_adamw_step(ref, g, leaves, config, 0.01);
  expect_close(values_of(u.params), ref.p, 1e-12, "params");
  EXPECT_EQ(u.state.at("step").leaf().item<int64_t>(), 8);
}

}  // namespace
}  // namespace tessera::test
