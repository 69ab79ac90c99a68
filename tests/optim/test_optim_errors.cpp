// Bad input to the optimizer: config fields, parameters missing from the specs, and
// gradients or state that do not match the parameters. Every message names the field
// or path.
#include <gtest/gtest.h>

#include "optim/optim_test_util.h"

namespace tessera::test {
namespace {

using optim::Optimizer;
using optim::OptimizerConfig;

OptimizerConfig with(const std::function<void(OptimizerConfig&)>& edit) {
  OptimizerConfig c;
  edit(c);
  return c;
}

TEST(OptimErrors, ConfigValidateNamesTheField) {
  EXPECT_NO_THROW(OptimizerConfig{}.validate());
  expect_error<ValueError>([] { with([](auto& c) { c.name = "adam"; }).validate(); }, {"name", "adam", "adamw, sgd"});
  expect_error<ValueError>([] { with([](auto& c) { c.beta1 = 1; }).validate(); }, {"beta1"});
  expect_error<ValueError>([] { with([](auto& c) { c.beta2 = -0.1; }).validate(); }, {"beta2"});
  expect_error<ValueError>([] { with([](auto& c) { c.eps = 0; }).validate(); }, {"eps"});
  expect_error<ValueError>([] { with([](auto& c) { c.weight_decay = -1; }).validate(); }, {"weight_decay"});
  expect_error<ValueError>([] { with([](auto& c) { c.clip_norm = -1; }).validate(); }, {"clip_norm"});
  expect_error<ValueError>([] { with([](auto& c) { c.clip_norm = std::nan(""); }).validate(); }, {"clip_norm"});
  expect_error<ValueError>(
      [] {
        with([](auto& c) {
          c.name = "sgd";
          c.momentum = 1.5;
        }).validate();
      },
      {"momentum"});
  expect_error<ValueError>(
      [] {
        with([](auto& c) {
          c.name = "sgd";
          c.momentum = 0;
          c.nesterov = true;
        }).validate();
      },
      {"nesterov", "momentum"});
  // The constructor validates too.
  expect_error<ValueError>([] { Optimizer(with([](auto& c) { c.name = "lamb"; }), {}); }, {"name", "lamb", "muon"});
}

TEST(OptimErrors, ParamMissingFromSpecsIsNamed) {
  std::vector<LeafSpec> leaves = test_leaves();
  Optimizer opt(OptimizerConfig{}, specs_of(leaves));
  Tree params = tree_of(leaves, random_values_for(leaves, 1, DType::Float32), DType::Float32);
  Tree state = opt.init(params);
  Tree extra = params;
  extra["adapter"]["lora_a"] = zeros({2, 2});
  expect_error<ValueError>([&] { opt.init(extra); }, {"adapter.lora_a", "specs"});
  Tree extra_state{{"m", state.at("m")}, {"v", state.at("v")}, {"step", state.at("step")}};
  extra_state["m"]["adapter"]["lora_a"] = zeros({2, 2});
  extra_state["v"]["adapter"]["lora_a"] = zeros({2, 2});
  expect_error<ValueError>([&] { opt.apply(extra, extra, extra_state, Array::scalar(1e-3)); }, {"adapter.lora_a"});
  expect_error<ValueError>([&] { opt.decays("nope.w"); }, {"nope.w"});
}

TEST(OptimErrors, MismatchedGradsStateAndLr) {
  std::vector<LeafSpec> leaves = test_leaves();
  Optimizer opt(OptimizerConfig{}, specs_of(leaves));
  Tree params = tree_of(leaves, random_values_for(leaves, 1, DType::Float32), DType::Float32);
  Tree state = opt.init(params);
  Array lr = Array::scalar(1e-3);

  Tree bad_shape = params;
  bad_shape["head"] = zeros({2, 3});
  expect_error<ValueError>([&] { opt.apply(params, bad_shape, state, lr); }, {"grads", "head", "[3, 2]"});
  Tree bad_dtype = params;
  bad_dtype["head"] = zeros({3, 2}, DType::Float64);
  expect_error<ValueError>([&] { opt.apply(params, bad_dtype, state, lr); }, {"grads", "head"});
  Tree missing = params;
  missing["ln"] = Tree{};
  expect_error<ValueError>([&] { opt.apply(params, missing, state, lr); }, {"grads", "ln.scale"});

  OptimizerConfig sgd;
  sgd.name = "sgd";
  Tree sgd_state = Optimizer(sgd, specs_of(leaves)).init(params);
  expect_error<ValueError>([&] { opt.apply(params, params, sgd_state, lr); }, {"adamw", "momentum", "\"m\""});
  Tree float_step = state;
  float_step["step"] = Array::scalar(0);
  expect_error<ValueError>([&] { opt.apply(params, params, float_step, lr); }, {"step", "int64"});

  expect_error<ValueError>([&] { opt.apply(params, params, state, Array::scalar(1, DType::Int32)); }, {"lr"});
  expect_error<ValueError>([&] { opt.apply(params, params, state, zeros({1})); }, {"lr"});
  Tree int_params{{"head", zeros({3, 2}, DType::Int32)}};
  expect_error<ValueError>([&] { opt.init(int_params); }, {"head", "floating"});
}

}  // namespace
}  // namespace tessera::test

namespace tessera::test {
namespace {

TEST(OptimErrors, NewOptimizersValidateTheirFields) {
  using optim::OptimizerConfig;
  auto with = [](auto edit) {
    OptimizerConfig c;
    edit(c);
    return c;
  };
  expect_error<ValueError>([&] { with([](auto& c) { c.name = "lion", c.beta2 = 1; }).validate(); }, {"beta2"});
  expect_error<ValueError>([&] { with([](auto& c) { c.name = "muon", c.muon_momentum = 1; }).validate(); },
                           {"muon_momentum"});
  expect_error<ValueError>([&] { with([](auto& c) { c.name = "muon", c.muon_ns_steps = 0; }).validate(); },
                           {"muon_ns_steps"});
  expect_error<ValueError>([&] { with([](auto& c) { c.name = "adafactor", c.adafactor_decay_rate = 0; }).validate(); },
                           {"adafactor_decay_rate"});
  expect_error<ValueError>(
      [&] { with([](auto& c) { c.name = "adafactor", c.adafactor_min_dim_to_factor = 0; }).validate(); },
      {"adafactor_min_dim_to_factor"});
}

TEST(OptimErrors, StateOfAnotherOptimizerIsRefusedByName) {
  std::vector<LeafSpec> leaves = test_leaves();
  optim::OptimizerConfig adamw, lion;
  lion.name = "lion";
  Tree params = tree_of(leaves, random_values_for(leaves, 1, DType::Float32), DType::Float32);
  Tree adamw_state = optim::Optimizer(adamw, specs_of(leaves)).init(params);
  expect_error<ValueError>(
      [&] { optim::Optimizer(lion, specs_of(leaves)).apply(params, params, adamw_state, Array::scalar(0.1)); },
      {"lion", "keys"});
}

}  // namespace
}  // namespace tessera::test
