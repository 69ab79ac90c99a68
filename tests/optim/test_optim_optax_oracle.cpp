// tessera's optimizers vs Optax's published update rules (an external reference), in
// float64.
//
// tests/oracles/optax_optimizers.py ran optax 0.2.3 (jax 0.4.30, jax_enable_x64) on a
// small parameter tree for four steps of adamw, lion and adafactor and wrote the
// initial params, the four gradients and the params after every step to
// tests/oracles/goldens/optax_optimizers.json (17 significant digits). Here tessera's
// Optimizer runs the same steps on Float64 parameters with the matching
// OptimizerConfig (no gradient clipping: clip_norm = 0, Optax's rules have none) and
// the result must match.
//
// Convention differences, by design (see the oracle's docstring):
//  - weight decay: the leaves Optax masks are exactly those tessera's default
//    no_decay kinds (norms, biases, embeddings) leave out; the test checks that the
//    golden's mask is what Optimizer::decays() says.
//  - Adafactor runs without weight decay on both sides: Optax's weight_decay_rate adds
//    wd p after the learning rate (p -= lr rms(p) u + wd p) where tessera decays
//    decoupled like AdamW (p -= lr (rms(p) u + wd p)); the float64 reference in
//    test_optim_adafactor.cpp covers tessera's form.
//  - Adafactor's unused state slots are [1] in Optax and 0-d in tessera.
//
// Regenerate / check the golden is current: tests/oracles/run_oracle.sh optax_optimizers
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "optim/optim_test_util.h"
#include "optim/rules.h"

#ifndef TESSERA_SOURCE_DIR
#error "TESSERA_SOURCE_DIR must name the source tree (CMakeLists.txt sets it for test_optim)"
#endif

namespace tessera::test {
namespace {

using nlohmann::json;
using optim::Optimizer;
using optim::OptimizerConfig;

// Both sides compute in float64 (Adafactor's second-moment decay 1 - t^-0.8 is float32
// on both: Optax's _decay_rate_pow makes t a float32 array, tessera's rule follows), so
// what is left is rounding in different evaluation orders. Two measures, per step:
//  - params: max |tessera - Optax| / max(1, |Optax|);
//  - the step's update, p_t - p_{t-1} on each side from its own p_{t-1}, relative to
//    max(lr, the largest Optax update of the leaf): updates are ~lr = 0.01 against
//    params ~1, so a rule that is off by a relative 1e-8 shows up 100x larger here than
//    in the params. Its floor is the rounding of the params the updates are read from,
//    an ulp or two of |p| <= 2.4 over lr: ~5e-14.
// Measured (TESSERA_ORACLE_VERBOSE=1): params <= 1.7e-16, updates <= 2.3e-14 over every
// optimizer and step (Lion, whose fused kernel rounds its multiply-adds once: params
// 2.8e-17, updates 1.2e-15); the bounds leave >= 400x headroom for other
// libm builds. Before this test Adafactor rounded the learning rate to float32 for
// float64 parameters (src/optim/adafactor.cpp): params off by 7.3e-10, updates by 2.3e-8.
constexpr double kParamsRtol = 1e-13;
constexpr double kUpdateRtol = 1e-11;

const char* const kGoldenPath = TESSERA_SOURCE_DIR "/tests/oracles/goldens/optax_optimizers.json";

// The golden, parsed once; a missing or unreadable file fails every test.
const json& golden() {
  static const json parsed = [] {
    std::ifstream f(kGoldenPath);
    if (!f) return json();
    return json::parse(f, nullptr, /*allow_exceptions=*/false);
  }();
  return parsed;
}

bool verbose() {
  const char* v = std::getenv("TESSERA_ORACLE_VERBOSE");
  return v != nullptr && *v != '\0' && std::string(v) != "0";
}

nn::ParamKind kind_of(const std::string& name) {
  for (nn::ParamKind k : {nn::ParamKind::Weight, nn::ParamKind::Bias, nn::ParamKind::Norm, nn::ParamKind::Embedding})
    if (name == nn::to_string(k)) return k;
  ADD_FAILURE() << "golden: unknown parameter kind \"" << name << "\"";
  return nn::ParamKind::Weight;
}

std::vector<LeafSpec> leaves_of(const json& g) {
  std::vector<LeafSpec> leaves;
  for (const json& l : g.at("leaves"))
    leaves.push_back({l.at("path").get<std::string>(), l.at("shape").get<Shape>(), kind_of(l.at("kind"))});
  return leaves;
}

Values values_from(const json& j) {
  Values out;
  for (const auto& [path, data] : j.items()) out[path] = data.get<std::vector<double>>();
  return out;
}

const json& case_of(const std::string& name) {
  for (const json& c : golden().at("cases"))
    if (c.at("name") == name) return c;
  static const json none;
  ADD_FAILURE() << "golden has no case \"" << name << "\"";
  return none;
}

// The OptimizerConfig that mirrors the case's Optax call (every setting it names is
// read from the golden, so the two sides cannot drift apart silently).
OptimizerConfig config_of(const std::string& name, const json& c) {
  OptimizerConfig config;
  config.name = name;
  config.clip_norm = 0;  // Optax's adamw/lion/adafactor clip no global norm
  if (name == "adamw" || name == "lion") {
    config.beta1 = c.at("beta1");
    config.beta2 = c.at("beta2");
    config.weight_decay = c.at("weight_decay");
    if (name == "adamw") config.eps = c.at("eps");
  } else if (name == "adafactor") {
    config.adafactor_decay_rate = c.at("decay_rate");
    config.adafactor_min_dim_to_factor = c.at("min_dim_to_factor");
    config.adafactor_clip_threshold = c.at("clip_threshold");
    config.adafactor_param_scale = c.at("param_scale");
    config.adafactor_eps = c.at("eps");
    config.adafactor_min_scale = c.at("min_scale");  // Optax's scale_by_param_block_rms default
    config.weight_decay = c.at("weight_decay");      // 0: the decay rules differ (header comment)
  }
  return config;
}

// The shape of the leaf at a dotted path of a nested tree.
Shape shape_at(const Tree& tree, const std::string& path) {
  const std::vector<std::string> paths = tree.paths();
  const auto it = std::find(paths.begin(), paths.end(), path);
  if (it == paths.end()) {
    ADD_FAILURE() << "no leaf at " << path;
    return {};
  }
  return tree.leaves()[it - paths.begin()].shape();
}

struct Worst {
  double err = 0;
  std::string where;
  void add(double e, const std::string& at) {
    if (e > err || where.empty()) err = e, where = at;
  }
};

// Runs the case's four steps through tessera's Optimizer and compares each step's
// params and update with Optax's.
void run_case(const std::string& name) {
  ASSERT_FALSE(golden().is_null()) << "cannot read " << kGoldenPath;
  const json& g = golden();
  const json& c = case_of(name);
  ASSERT_FALSE(c.is_null());
  const std::vector<LeafSpec> leaves = leaves_of(g);
  const OptimizerConfig config = config_of(name, c.at("config"));
  Optimizer opt(config, specs_of(leaves));
  const double lr_value = c.at("lr");
  const Array lr = Array::scalar(lr_value, DType::Float64);

  // Each side's params before the step: its update is measured from its own.
  Values optax_before = values_from(g.at("params")), tessera_before = optax_before;
  Tree params = tree_of(leaves, optax_before, DType::Float64);
  Tree state = opt.init(params);
  const json& grads = g.at("grads");
  const json& want_steps = c.at("params_after_step");
  ASSERT_EQ(grads.size(), want_steps.size());
  Worst params_worst, update_worst;
  for (size_t t = 0; t < grads.size(); ++t) {
    const std::string step = name + " step " + std::to_string(t + 1);
    Optimizer::Update u = opt.apply(params, tree_of(leaves, values_from(grads[t]), DType::Float64), state, lr);
    params = u.params;
    state = u.state;
    const Values got = values_of(params), want = values_from(want_steps[t]);
    ASSERT_EQ(got.size(), want.size()) << step;
    for (const auto& [path, w] : want) {
      ASSERT_TRUE(got.count(path)) << step << ": tessera lacks " << path;
      const std::vector<double>&p = got.at(path), &p0 = tessera_before.at(path), &w0 = optax_before.at(path);
      ASSERT_EQ(p.size(), w.size()) << step << " " << path;
      double largest_update = 0;
      for (size_t i = 0; i < w.size(); ++i) largest_update = std::max(largest_update, std::abs(w[i] - w0[i]));
      ASSERT_GT(largest_update, 0) << step << " " << path << ": Optax left the leaf unchanged";
      const double update_scale = std::max(largest_update, lr_value);
      for (size_t i = 0; i < w.size(); ++i) {
        const std::string at = step + " " + path + "[" + std::to_string(i) + "]";
        const double params_err = std::abs(p[i] - w[i]) / std::max(1.0, std::abs(w[i]));
        const double update_err = std::abs((p[i] - p0[i]) - (w[i] - w0[i])) / update_scale;
        params_worst.add(params_err, at);
        update_worst.add(update_err, at);
        EXPECT_LE(params_err, kParamsRtol)
            << at << ": tessera " << p[i] << " vs Optax " << w[i] << " (from " << p0[i] << ")";
        EXPECT_LE(update_err, kUpdateRtol) << at << ": tessera's update " << p[i] - p0[i] << " vs Optax's "
                                           << w[i] - w0[i] << " (scale " << update_scale << ")";
      }
    }
    optax_before = want;
    tessera_before = got;
  }
  if (verbose())
    std::printf("[optax oracle] %s: params max rel err %.3g at %s; update max rel err %.3g at %s\n", name.c_str(),
                params_worst.err, params_worst.where.c_str(), update_worst.err, update_worst.where.c_str());
}

TEST(OptimOptaxOracle, GoldenMaskIsTesserasDefaultNoDecayKinds) {
  ASSERT_FALSE(golden().is_null()) << "cannot read " << kGoldenPath;
  const std::vector<LeafSpec> leaves = leaves_of(golden());
  // The oracle decays exactly the 2-D "weight" leaves; with tessera's default
  // no_decay kinds that is what Optimizer::decays() says, for each optimizer with decay.
  for (const char* name : {"adamw", "lion"}) {
    const Optimizer opt(config_of(name, case_of(name).at("config")), specs_of(leaves));
    for (const json& l : golden().at("leaves"))
      EXPECT_EQ(opt.decays(l.at("path")), l.at("decay").get<bool>()) << name << " " << l.at("path");
  }
  const Optimizer adafactor(config_of("adafactor", case_of("adafactor").at("config")), specs_of(leaves));
  for (const LeafSpec& l : leaves) EXPECT_FALSE(adafactor.decays(l.path)) << "adafactor " << l.path;
}

TEST(OptimOptaxOracle, AdafactorFactorsTheLeavesOptaxFactors) {
  // Optax's _factored_dims (np.argsort of the shape; the second largest dim must be
  // >= min_dim_size_to_factor) against tessera's adafactor_factored_dims, through the
  // state shapes each keeps: rows and columns for a factored leaf, a full moment else.
  ASSERT_FALSE(golden().is_null()) << "cannot read " << kGoldenPath;
  const json& c = case_of("adafactor");
  const std::vector<LeafSpec> leaves = leaves_of(golden());
  const Optimizer opt(config_of("adafactor", c.at("config")), specs_of(leaves));
  const Tree state = opt.init(tree_of(leaves, values_from(golden().at("params")), DType::Float64));
  int factored = 0, full = 0;
  for (const LeafSpec& l : leaves) {
    const json& want = c.at("state_shapes").at(l.path);
    const bool optax_factored = want.at("v") == json::array({1});
    (optax_factored ? factored : full) += 1;
    for (const char* key : {"v", "v_row", "v_col"}) {
      Shape shape = want.at(key).get<Shape>();
      const bool unused = optax_factored == (std::string(key) == "v");
      if (unused) shape = {};  // Optax's [1] placeholder is tessera's 0-d one
      EXPECT_EQ(shape_at(state.at(key), l.path), shape) << l.path << " " << key;
    }
  }
  // The golden exercises both branches.
  EXPECT_GE(factored, 1);
  EXPECT_GE(full, 1);
}

TEST(OptimOptaxOracle, AdamWMatchesOptax) { run_case("adamw"); }

TEST(OptimOptaxOracle, LionMatchesOptax) { run_case("lion"); }

TEST(OptimOptaxOracle, AdafactorMatchesOptax) { run_case("adafactor"); }

}  // namespace
}  // namespace tessera::test
