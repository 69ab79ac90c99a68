// Optimizer::apply under jit: bitwise the same as the lazy eager path over several
// steps with a changing learning rate, traced once (the rate and the step count are
// arrays, not constants).
#include <gtest/gtest.h>

#include <cstring>

#include "optim/optim_test_util.h"
#include "tessera/api/jit.h"

namespace tessera::test {
namespace {

using optim::Optimizer;
using optim::OptimizerConfig;

void expect_bitwise(const Tree& a, const Tree& b, const std::string& what) {
  ASSERT_EQ(a.paths(), b.paths()) << what;
  std::vector<Array> x = a.leaves(), y = b.leaves();
  eval(x);
  eval(y);
  std::vector<std::string> paths = a.paths();
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(x[i].shape(), y[i].shape()) << what << " " << paths[i];
    ASSERT_EQ(x[i].dtype(), y[i].dtype()) << what << " " << paths[i];
    EXPECT_EQ(std::memcmp(x[i].raw_data(), y[i].raw_data(), x[i].nbytes()), 0)
        << what << " " << paths[i] << ": values differ";
  }
}

void check_jit_matches_eager(const OptimizerConfig& config, DType dtype) {
  std::vector<LeafSpec> leaves = test_leaves();
  Optimizer opt(config, specs_of(leaves));
  auto step = jit([opt](const Tree& args) {
    Optimizer::Update u = opt.apply(args.at("params"), args.at("grads"), args.at("state"), args.at("lr").leaf());
    return Tree{{"params", u.params}, {"state", u.state}, {"grad_norm", u.grad_norm}};
  });
  Tree params = tree_of(leaves, random_values_for(leaves, 31, dtype), dtype);
  Tree state = opt.init(params);
  Tree jit_params = params, jit_state = state;
  for (int t = 0; t < 3; ++t) {
    // Large gradients in step 1, so clipping is active in one step and not the others.
    const double scale = t == 1 ? 10.0 : 0.1;
    Values g = random_values_for(leaves, 300 + 10 * t, dtype);
    for (auto& [path, v] : g)
      for (double& x : v) x *= scale;
    Tree grads = tree_of(leaves, g, dtype);
    Array lr = Array::scalar(1e-2 * (t + 1), DType::Float32);
    Optimizer::Update eager = opt.apply(params, grads, state, lr);
    Tree out = step(Tree{{"params", jit_params}, {"grads", grads}, {"state", jit_state}, {"lr", lr}});
    std::string what = config.name + " step " + std::to_string(t);
    expect_bitwise(out.at("params"), eager.params, what + " params");
    expect_bitwise(out.at("state"), eager.state, what + " state");
    expect_bitwise(out.at("grad_norm"), Tree(eager.grad_norm), what + " grad_norm");
    params = eager.params;
    state = eager.state;
    jit_params = out.at("params");
    jit_state = out.at("state");
  }
  EXPECT_EQ(step.trace_count(), 1) << "lr and step are arrays: one trace serves every step";
  EXPECT_EQ(state.at("step").leaf().item<int64_t>(), 3);
}

TEST(OptimJit, AdamWMatchesEagerBitwiseAndTracesOnce) {
  OptimizerConfig config;
  config.clip_norm = 1.0;
  check_jit_matches_eager(config, DType::Float32);
}

TEST(OptimJit, AdamWBFloat16MatchesEager) { check_jit_matches_eager(OptimizerConfig{}, DType::BFloat16); }

TEST(OptimJit, SgdNesterovMatchesEagerBitwiseAndTracesOnce) {
  OptimizerConfig config;
  config.name = "sgd";
  config.nesterov = true;
  config.clip_norm = 1.0;
  check_jit_matches_eager(config, DType::Float32);
}

TEST(OptimJit, NoClipStillReturnsTheNorm) {
  OptimizerConfig config;
  config.clip_norm = 0;
  check_jit_matches_eager(config, DType::Float32);
}

}  // namespace
}  // namespace tessera::test
