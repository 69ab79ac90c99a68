// A model's update split into parts (pipeline stages on different processes each update
// their own parameters): each part applied with the whole model's squared gradient norm
// (the sum of the parts' Optimizer::squared_norm) equals that part of the whole update,
// for every optimizer, with clipping active and with loss scaling, whose skip decision a
// non-finite gradient in one part must make for every part.
#include <gtest/gtest.h>

#include <cmath>

#include "optim/optim_test_util.h"

namespace tessera::test {
namespace {

// The leaves of the split: part 0 the embedding and head, part 1 the layer and the norm.
bool in_first_part(const std::string& path) { return path == "emb" || path == "head"; }

std::vector<LeafSpec> part_leaves(size_t part) {
  std::vector<LeafSpec> out;
  for (const LeafSpec& l : test_leaves())
    if (in_first_part(l.path) == (part == 0)) out.push_back(l);
  return out;
}

// The values of `all` at the paths of one part.
Values part_values(const Values& all, size_t part) {
  Values out;
  for (const LeafSpec& l : part_leaves(part)) out[l.path] = all.at(l.path);
  return out;
}

// A state's moments (every subtree keyed like the parameters) by "<slot>.<path>".
Values moments_of(const Tree& state) {
  Values out;
  for (const auto& [slot, subtree] : state.items()) {
    if (subtree.is_leaf() || slot == "loss_scale") continue;
    for (const auto& [path, v] : values_of(subtree)) out[slot + "." + path] = v;
  }
  return out;
}

struct Case {
  std::string optimizer;
  bool scaled = false;
};

class OptimParts : public ::testing::TestWithParam<Case> {};

TEST_P(OptimParts, PartsWithTheWholeSquaredNormUpdateAsTheWhole) {
  const Case& c = GetParam();
  optim::OptimizerConfig config;
  config.name = c.optimizer;
  config.clip_norm = 0.5;  // below the gradients' norm: the clip factor matters
  config.adafactor_min_dim_to_factor = 2;
  if (c.scaled) {
    config.loss_scale.mode = optim::LossScaling::Dynamic;
    config.loss_scale.init_scale = 1024;
  }
  const std::vector<LeafSpec> leaves = test_leaves();
  const optim::Optimizer whole_opt(config, specs_of(leaves));
  const Values p = random_values_for(leaves, 3, DType::Float32);
  Values g = random_values_for(leaves, 40, DType::Float32);
  for (auto& [path, v] : g)
    for (double& x : v) x *= c.scaled ? 1024.0 * 4 : 4;  // the scaled loss's gradients, norm ~4 x clip
  const Array lr = Array::scalar(1e-2);

  // Two steps, so the moments the first step leaves are used by the second.
  Tree whole_p = tree_of(leaves, p, DType::Float32), whole_s = whole_opt.init(whole_p);
  std::vector<Tree> part_p, part_s;
  std::vector<optim::Optimizer> part_opt;
  for (size_t part = 0; part < 2; ++part) {
    part_opt.emplace_back(config, specs_of(part_leaves(part)));
    part_p.push_back(tree_of(part_leaves(part), part_values(p, part), DType::Float32));
    part_s.push_back(part_opt.back().init(part_p.back()));
  }
  for (size_t step = 0; step < 2; ++step) {
    const optim::Optimizer::Update want = whole_opt.apply(whole_p, tree_of(leaves, g, DType::Float32), whole_s, lr);
    std::vector<Tree> part_g;
    Array squared = Array::scalar(0);
    for (size_t part = 0; part < 2; ++part) {
      part_g.push_back(tree_of(part_leaves(part), part_values(g, part), DType::Float32));
      squared = add(squared, part_opt[part].squared_norm(part_g.back(), part_s[part]));
    }
    for (size_t part = 0; part < 2; ++part) {
      const optim::Optimizer::Update got = part_opt[part].apply(part_p[part], part_g[part], part_s[part], lr, squared);
      const std::string what = c.optimizer + " part " + std::to_string(part) + " step " + std::to_string(step);
      EXPECT_NEAR(got.grad_norm.item<double>(), want.grad_norm.item<double>(), 1e-6 * want.grad_norm.item<double>())
          << what << ": the reported norm is the whole model's";
      expect_close(values_of(got.params), part_values(values_of(want.params), part), 1e-6, what + " params");
      const Values want_moments = moments_of(want.state), got_moments = moments_of(got.state);
      for (const auto& [key, v] : got_moments) {
        ASSERT_TRUE(want_moments.count(key)) << what << ": " << key;
        expect_close({{key, v}}, {{key, want_moments.at(key)}}, 1e-6, what + " state");
      }
      part_p[part] = got.params;
      part_s[part] = got.state;
    }
    whole_p = want.params;
    whole_s = want.state;
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, OptimParts,
                         ::testing::Values(Case{"adamw"}, Case{"sgd"}, Case{"lion"}, Case{"adafactor"}, Case{"muon"},
                                           Case{"adamw", true}, Case{"sgd", true}),
                         [](const auto& info) { return info.param.optimizer + (info.param.scaled ? "_scaled" : ""); });

// A gradient that overflowed in one part: the whole model's squared norm is not finite,
// so the other part (whose own gradients are fine) skips its update too and backs off
// the scale, as the whole model's update does.
TEST(OptimParts, AnOverflowInOnePartSkipsEveryPart) {
  optim::OptimizerConfig config;
  config.loss_scale.mode = optim::LossScaling::Dynamic;
  config.loss_scale.init_scale = 1024;
  std::vector<optim::Optimizer> opt;
  std::vector<Tree> params, grads, state;
  Array squared = Array::scalar(0);
  for (size_t part = 0; part < 2; ++part) {
    opt.emplace_back(config, specs_of(part_leaves(part)));
    params.push_back(tree_of(part_leaves(part), part_values(random_values_for(test_leaves(), 3, DType::Float32), part),
                             DType::Float32));
    Values g = part_values(random_values_for(test_leaves(), 40, DType::Float32), part);
    if (part == 1) g.begin()->second[0] = INFINITY;
    grads.push_back(tree_of(part_leaves(part), g, DType::Float32));
    state.push_back(opt.back().init(params.back()));
    squared = add(squared, opt.back().squared_norm(grads.back(), state.back()));
  }
  const optim::Optimizer::Update without = opt[0].apply(params[0], grads[0], state[0], Array::scalar(1e-2));
  EXPECT_FALSE(without.skipped.item<bool>()) << "part 0's own gradients are finite";
  const optim::Optimizer::Update got = opt[0].apply(params[0], grads[0], state[0], Array::scalar(1e-2), squared);
  EXPECT_TRUE(got.skipped.item<bool>()) << "the whole model's norm is not finite";
  expect_close(values_of(got.params), values_of(params[0]), 0, "skipped part 0");
  EXPECT_EQ(got.state.at("loss_scale").at("scale").leaf().item<double>(), 512) << "the scale backs off";
}

TEST(OptimParts, ASquaredNormThatIsNotAFloatScalarIsAnError) {
  const optim::Optimizer opt(optim::OptimizerConfig{}, specs_of(test_leaves()));
  const Tree p = tree_of(test_leaves(), random_values_for(test_leaves(), 3, DType::Float32), DType::Float32);
  expect_error<ValueError>([&] { opt.apply(p, p, opt.init(p), Array::scalar(1e-2), zeros({2}, DType::Float32)); },
                           {"squared norm", "floating scalar"});
}

}  // namespace
}  // namespace tessera::test
