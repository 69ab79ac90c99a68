// SGD with momentum (heavy ball and Nesterov) through Optimizer, against a float64
// reference over several steps, with the weight-decay mask and clipping.
#include <gtest/gtest.h>

#include "optim/optim_test_util.h"

namespace tessera::test {
namespace {

using optim::Optimizer;
using optim::OptimizerConfig;

// buf = momentum buf + g;  d = buf (Nesterov: g + momentum buf);  p -= lr (d + wd p).
double ref_sgd_step(Values& p, Values& buf, Values g, const std::vector<LeafSpec>& leaves, const OptimizerConfig& c,
                    double lr) {
  double norm = ref_clip(g, c.clip_norm);
  for (const LeafSpec& l : leaves) {
    const double wd = ref_decays(l.kind) ? c.weight_decay : 0.0;
    std::vector<double>&pl = p[l.path], &bl = buf[l.path];
    const std::vector<double>& gl = g.at(l.path);
    for (size_t i = 0; i < pl.size(); ++i) {
      bl[i] = c.momentum * bl[i] + gl[i];
      const double d = c.nesterov ? gl[i] + c.momentum * bl[i] : bl[i];
      pl[i] -= lr * (d + wd * pl[i]);
    }
  }
  return norm;
}

void run_sgd_against_reference(DType dtype, bool nesterov, double clip_norm, double tol) {
  std::vector<LeafSpec> leaves = test_leaves();
  OptimizerConfig config;
  config.name = "sgd";
  config.momentum = 0.8;
  config.nesterov = nesterov;
  config.weight_decay = 0.3;
  config.clip_norm = clip_norm;
  Optimizer opt(config, specs_of(leaves));

  Values p = random_values_for(leaves, 11, dtype), buf;
  for (const LeafSpec& l : leaves) buf[l.path] = std::vector<double>(numel(l.shape), 0.0);
  Tree params = tree_of(leaves, p, dtype);
  Tree state = opt.init(params);
  for (int t = 0; t < 4; ++t) {
    const double lr = 0.05 / (t + 1);
    Values g = random_values_for(leaves, 200 + 10 * t, dtype);
    Optimizer::Update u = opt.apply(params, tree_of(leaves, g, dtype), state, Array::scalar(lr, dtype));
    double norm = ref_sgd_step(p, buf, g, leaves, config, lr);
    EXPECT_NEAR(u.grad_norm.item<float>(), norm, 1e-6 * norm) << "step " << t;
    params = u.params;
    state = u.state;
    std::string what = "step " + std::to_string(t);
    expect_close(values_of(params), p, tol, what + " params");
    expect_close(values_of(state.at("momentum")), buf, tol, what + " momentum");
    EXPECT_EQ(state.at("step").leaf().item<int64_t>(), t + 1);
  }
}

TEST(OptimSgd, MomentumMatchesReference) { run_sgd_against_reference(DType::Float64, false, 0, 1e-12); }
TEST(OptimSgd, NesterovMatchesReference) { run_sgd_against_reference(DType::Float64, true, 0, 1e-12); }
TEST(OptimSgd, Float32MatchesReference) { run_sgd_against_reference(DType::Float32, true, 0, 1e-6); }
TEST(OptimSgd, ClipsBeforeTheUpdate) { run_sgd_against_reference(DType::Float64, false, 0.5, 1e-12); }

TEST(OptimSgd, StateLayoutAndFloat32MomentumForBFloat16) {
  std::vector<LeafSpec> leaves = test_leaves();
  OptimizerConfig config;
  config.name = "sgd";
  Optimizer opt(config, specs_of(leaves));
  Tree params = tree_of(leaves, random_values_for(leaves, 3, DType::BFloat16), DType::BFloat16);
  Tree state = opt.init(params);
  EXPECT_EQ(state.size(), 2u);
  EXPECT_EQ(state.at("momentum").paths(), params.paths());
  for (const Array& b : state.at("momentum").leaves()) EXPECT_EQ(b.dtype(), DType::Float32);
  Optimizer::Update u = opt.apply(params, params, state, Array::scalar(1e-2));
  for (const Array& p : u.params.leaves()) EXPECT_EQ(p.dtype(), DType::BFloat16);
  for (const Array& b : u.state.at("momentum").leaves()) EXPECT_EQ(b.dtype(), DType::Float32);
}

}  // namespace
}  // namespace tessera::test
