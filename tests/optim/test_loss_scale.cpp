// Loss scaling in Optimizer::apply (optim/optimizer.h): gradients of the scaled loss
// are unscaled exactly (a power-of-two scale gives bitwise the unscaled update); a
// non-finite gradient skips the step (params, moments and step count bitwise
// unchanged), halves the dynamic scale and restarts the good-step count; the scale
// doubles after growth_interval good steps; a static scale never changes. The same
// under jit with params and state donated (updated in place), and config errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "optim/optim_test_util.h"
#include "tessera/api/jit.h"

namespace tessera::test {
namespace {

using optim::LossScaling;
using optim::Optimizer;
using optim::OptimizerConfig;

OptimizerConfig scaled(LossScaling mode, const std::string& name = "adamw", int64_t growth_interval = 2000) {
  OptimizerConfig c;
  c.name = name;
  c.loss_scale.mode = mode;
  c.loss_scale.growth_interval = growth_interval;
  c.loss_scale.static_scale = 1024;
  return c;
}

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

// A copy that owns its buffers (donated arguments are overwritten in place).
Tree copy_tree(const Tree& t) {
  return t.map([](const Array& a) {
    Array e = a.eval();
    return Array::from_data(e.raw_data(), e.shape(), e.dtype());
  });
}

Tree without_loss_scale(const Tree& state) {
  Tree out;
  for (const auto& [key, value] : state.items())
    if (key != "loss_scale") out[key] = value;
  return out;
}

double scale_of(const Tree& state) { return state.at("loss_scale").at("scale").leaf().item<double>(); }
int64_t good_steps_of(const Tree& state) { return state.at("loss_scale").at("good_steps").leaf().item<int64_t>(); }
bool skipped(const Optimizer::Update& u) { return u.skipped.item<double>() != 0; }

struct Fixture {
  std::vector<LeafSpec> leaves = test_leaves();
  Tree params = tree_of(leaves, random_values_for(leaves, 11, DType::Float32), DType::Float32);
  Array lr = Array::scalar(1e-2, DType::Float32);

  // Gradients times `factor`, optionally with `bad` (inf/NaN) at one element.
  Tree grads(uint32_t seed, double factor, double bad = 0) const {
    Values g = random_values_for(leaves, seed, DType::Float32);
    for (auto& [path, v] : g)
      for (double& x : v) x *= factor;
    if (bad != 0) g["layers.0.w"][5] = bad;
    return tree_of(leaves, g, DType::Float32);
  }
};

TEST(LossScale, InitAddsScaleAndGoodSteps) {
  Fixture f;
  Tree off = Optimizer(OptimizerConfig{}, specs_of(f.leaves)).init(f.params);
  EXPECT_FALSE(off.items().contains("loss_scale"));
  Tree dynamic = Optimizer(scaled(LossScaling::Dynamic), specs_of(f.leaves)).init(f.params);
  ASSERT_TRUE(dynamic.items().contains("loss_scale"));
  EXPECT_EQ(dynamic.at("loss_scale").at("scale").leaf().dtype(), DType::Float32);
  EXPECT_EQ(dynamic.at("loss_scale").at("good_steps").leaf().dtype(), DType::Int64);
  EXPECT_EQ(scale_of(dynamic), 65536.0);
  EXPECT_EQ(good_steps_of(dynamic), 0);
  EXPECT_EQ(scale_of(Optimizer(scaled(LossScaling::Static), specs_of(f.leaves)).init(f.params)), 1024.0);
  // Moments stay float32, the rest of the state as without scaling.
  expect_bitwise(without_loss_scale(dynamic), off, "state without loss_scale");
}

// Gradients of the loss times 2^16, unscaled by 2^-16: bitwise the unscaled update.
TEST(LossScale, ScaledGradientsGiveTheUnscaledUpdateBitwise) {
  Fixture f;
  for (const std::string name : {"adamw", "sgd"}) {
    OptimizerConfig plain_config;
    plain_config.name = name;
    Optimizer plain(plain_config, specs_of(f.leaves));
    Optimizer dynamic(scaled(LossScaling::Dynamic, name), specs_of(f.leaves));
    Tree plain_state = plain.init(f.params), state = dynamic.init(f.params);
    Tree p_plain = f.params, p = f.params;
    for (int t = 0; t < 3; ++t) {
      // Step 1 clips (large gradients); the others do not.
      const double factor = t == 1 ? 10.0 : 0.1;
      Optimizer::Update want = plain.apply(p_plain, f.grads(100 + t, factor), plain_state, f.lr);
      Optimizer::Update got = dynamic.apply(p, f.grads(100 + t, factor * 65536.0), state, f.lr);
      const std::string what = name + " step " + std::to_string(t);
      expect_bitwise(got.params, want.params, what + " params");
      expect_bitwise(without_loss_scale(got.state), want.state, what + " state");
      expect_bitwise(Tree(got.grad_norm), Tree(want.grad_norm), what + " grad_norm");
      EXPECT_FALSE(skipped(got)) << what;
      EXPECT_EQ(scale_of(got.state), 65536.0) << what;
      EXPECT_EQ(good_steps_of(got.state), t + 1) << what;
      p_plain = want.params;
      plain_state = want.state;
      p = got.params;
      state = got.state;
    }
  }
}

TEST(LossScale, NonFiniteGradientSkipsTheStepAndHalvesTheScale) {
  Fixture f;
  for (const std::string name : {"adamw", "sgd"}) {
    for (double bad : {std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
                       std::numeric_limits<double>::quiet_NaN()}) {
      Optimizer dynamic(scaled(LossScaling::Dynamic, name), specs_of(f.leaves));
      // One good step first, so the moments and the step count are not zeros.
      Optimizer::Update first = dynamic.apply(f.params, f.grads(7, 65536.0), dynamic.init(f.params), f.lr);
      ASSERT_EQ(good_steps_of(first.state), 1);
      Tree params = first.params.map([](const Array& a) { return a.eval(); });
      Tree state = first.state.map([](const Array& a) { return a.eval(); });
      Optimizer::Update u = dynamic.apply(params, f.grads(8, 65536.0, bad), state, f.lr);
      const std::string what = name + " with " + std::to_string(bad);
      EXPECT_TRUE(skipped(u)) << what;
      EXPECT_FALSE(std::isfinite(u.grad_norm.item<double>())) << what;
      expect_bitwise(u.params, params, what + ": params");
      expect_bitwise(without_loss_scale(u.state), without_loss_scale(state), what + ": moments and step");
      EXPECT_EQ(scale_of(u.state), 32768.0) << what;
      EXPECT_EQ(good_steps_of(u.state), 0) << what;
    }
  }
}

TEST(LossScale, ScaleGrowsAfterGrowthIntervalGoodSteps) {
  Fixture f;
  Optimizer dynamic(scaled(LossScaling::Dynamic, "adamw", 3), specs_of(f.leaves));
  Tree params = f.params, state = dynamic.init(f.params);
  // good, good, overflow (count restarts, 2^15), good x3 (grows back to 2^16 at the
  // third), good.
  const std::vector<bool> overflow = {false, false, true, false, false, false, false};
  const std::vector<double> want_scale = {65536, 65536, 32768, 32768, 32768, 65536, 65536};
  const std::vector<int64_t> want_good = {1, 2, 0, 1, 2, 0, 1};
  for (size_t t = 0; t < overflow.size(); ++t) {
    const double bad = overflow[t] ? std::numeric_limits<double>::infinity() : 0;
    Optimizer::Update u = dynamic.apply(params, f.grads(200 + static_cast<uint32_t>(t), 1.0, bad), state, f.lr);
    EXPECT_EQ(skipped(u), overflow[t]) << "step " << t;
    EXPECT_EQ(scale_of(u.state), want_scale[t]) << "step " << t;
    EXPECT_EQ(good_steps_of(u.state), want_good[t]) << "step " << t;
    // The optimizer's step count counts applied updates only.
    params = u.params;
    state = u.state;
  }
  EXPECT_EQ(state.at("step").leaf().item<int64_t>(), 6);
}

TEST(LossScale, GrowthStopsBeforeTheScaleOverflows) {
  Fixture f;
  OptimizerConfig c = scaled(LossScaling::Dynamic, "adamw", 1);
  c.loss_scale.init_scale = 3e38;  // doubling it overflows float32
  Optimizer dynamic(c, specs_of(f.leaves));
  Optimizer::Update u = dynamic.apply(f.params, f.grads(3, 1.0), dynamic.init(f.params), f.lr);
  EXPECT_FALSE(skipped(u));
  EXPECT_EQ(scale_of(u.state), static_cast<double>(3e38f));
  EXPECT_EQ(good_steps_of(u.state), 0);
}

TEST(LossScale, StaticScaleNeverChangesButSkips) {
  Fixture f;
  Optimizer fixed(scaled(LossScaling::Static), specs_of(f.leaves));
  Tree state = fixed.init(f.params);
  Optimizer::Update bad =
      fixed.apply(f.params, f.grads(5, 1024.0, std::numeric_limits<double>::infinity()), state, f.lr);
  EXPECT_TRUE(skipped(bad));
  EXPECT_EQ(scale_of(bad.state), 1024.0);
  expect_bitwise(bad.params, f.params, "static skip params");
  Optimizer::Update good = fixed.apply(f.params, f.grads(5, 1024.0), state, f.lr);
  EXPECT_FALSE(skipped(good));
  EXPECT_EQ(scale_of(good.state), 1024.0);
  EXPECT_EQ(good.state.at("step").leaf().item<int64_t>(), 1);
}

// Under jit with params and state donated: the skip still leaves the old values
// (the select reads the parameters whose buffers the outputs reuse).
TEST(LossScale, JitWithDonationSkipsAndMatchesEager) {
  Fixture f;
  Optimizer dynamic(scaled(LossScaling::Dynamic, "adamw", 2), specs_of(f.leaves));
  auto fn = [dynamic](const Tree& a) {
    Optimizer::Update u = dynamic.apply(a.at("params"), a.at("grads"), a.at("state"), a.at("lr").leaf());
    return Tree{{"params", u.params}, {"state", u.state}, {"skipped", u.skipped}};
  };
  Tree params = copy_tree(f.params), state = copy_tree(dynamic.init(f.params));
  Tree probe{{"grads", f.grads(1, 1.0)}, {"lr", f.lr}, {"params", params}, {"state", state}};
  std::vector<int> donate;
  const std::vector<std::string> paths = probe.paths();
  for (size_t i = 0; i < paths.size(); ++i)
    if (paths[i].starts_with("params.") || paths[i].starts_with("state.")) donate.push_back(static_cast<int>(i));
  JitOptions options;
  options.donate_leaves = donate;
  Jitted step = jit(fn, options);
  Tree eager_params = copy_tree(params), eager_state = copy_tree(state);
  for (int t = 0; t < 5; ++t) {
    const double bad = t == 1 || t == 2 ? std::numeric_limits<double>::infinity() : 0;
    Tree grads = f.grads(40 + static_cast<uint32_t>(t), 65536.0, bad);
    Optimizer::Update eager = dynamic.apply(eager_params, grads, eager_state, f.lr);
    Tree before = copy_tree(params);
    Tree out = step(Tree{{"grads", grads}, {"lr", f.lr}, {"params", params}, {"state", state}});
    params = out.at("params");
    state = out.at("state");
    const std::string what = "step " + std::to_string(t);
    EXPECT_EQ(out.at("skipped").leaf().item<double>() != 0, bad != 0) << what;
    if (bad != 0) expect_bitwise(params, before, what + " params unchanged");
    expect_bitwise(params, eager.params, what + " params vs eager");
    expect_bitwise(state, eager.state, what + " state vs eager");
    eager_params = eager.params;
    eager_state = eager.state;
  }
  // good; two overflows (2^16 -> 2^14); two good steps (the interval) grow it to 2^15.
  EXPECT_EQ(scale_of(state), 32768.0);
  EXPECT_EQ(step.trace_count(), 1);
}

TEST(LossScale, ConfigErrors) {
  Fixture f;
  const nn::ParamSpecs specs = specs_of(f.leaves);
  auto with = [](const std::function<void(OptimizerConfig&)>& edit) {
    OptimizerConfig c = scaled(LossScaling::Dynamic);
    edit(c);
    return c;
  };
  expect_error<ValueError>([&] { Optimizer(with([](auto& c) { c.loss_scale.mode = LossScaling::Auto; }), specs); },
                           {"loss_scale = auto", "compute dtype"});
  expect_error<ValueError>([&] { Optimizer(with([](auto& c) { c.loss_scale.growth_interval = 0; }), specs); },
                           {"loss_scale_growth_interval", "0"});
  expect_error<ValueError>([&] { Optimizer(with([](auto& c) { c.loss_scale.growth_factor = 0.5; }), specs); },
                           {"loss_scale_growth_factor"});
  expect_error<ValueError>([&] { Optimizer(with([](auto& c) { c.loss_scale.backoff_factor = 1.5; }), specs); },
                           {"loss_scale_backoff_factor"});
  expect_error<ValueError>([&] { Optimizer(with([](auto& c) { c.loss_scale.init_scale = 0; }), specs); },
                           {"loss_scale_init"});
  expect_error<ValueError>([&] { Optimizer(with([](auto& c) { c.loss_scale.init_scale = 1e39; }), specs); },
                           {"float32"});
  expect_error<ValueError>(
      [&] {
        Optimizer(with([](auto& c) {
                    c.loss_scale.mode = LossScaling::Static;
                    c.loss_scale.static_scale = -1;
                  }),
                  specs);
      },
      {"loss_scale", "-1"});
  // State without the scaler, or a scaler state given to an optimizer without scaling.
  Optimizer dynamic(scaled(LossScaling::Dynamic), specs), plain(OptimizerConfig{}, specs);
  Tree plain_state = plain.init(f.params), scaled_state = dynamic.init(f.params);
  expect_error<ValueError>([&] { dynamic.apply(f.params, f.grads(1, 1.0), plain_state, f.lr); }, {"loss_scale"});
  expect_error<ValueError>([&] { plain.apply(f.params, f.grads(1, 1.0), scaled_state, f.lr); }, {"loss_scale"});
  expect_error<ValueError>([&] { plain.loss_scale(plain_state); }, {"loss scaling"});
  Tree bad_scale = scaled_state;
  bad_scale["loss_scale"]["scale"] = Array::scalar(1, DType::Float64);
  expect_error<ValueError>([&] { dynamic.apply(f.params, f.grads(1, 1.0), bad_scale, f.lr); },
                           {"loss_scale.scale", "float32"});
}

}  // namespace
}  // namespace tessera::test
