// Adafactor through Optimizer against a float64 reference of Optax's adafactor
// (factored second moments, block-RMS clipping, parameter-scaled steps), with factored
// and unfactored leaves, over several steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "optim/optim_test_util.h"
#include "optim/rules.h"

namespace tessera::test {
namespace {

using optim::Optimizer;
using optim::OptimizerConfig;

struct RefState {
  Values v, row, col;
};

double rms(const std::vector<double>& x) {
  double s = 0;
  for (double v : x) s += v * v;
  return std::sqrt(s / static_cast<double>(x.size()));
}

void ref_adafactor_step(Values& p, RefState& st, Values g, const std::vector<LeafSpec>& leaves,
                        const OptimizerConfig& c, double lr, int64_t t) {
  ref_clip(g, c.clip_norm);
  const double decay = 1 - std::pow(static_cast<double>(t), -c.adafactor_decay_rate);
  for (const LeafSpec& l : leaves) {
    std::vector<double>& pl = p[l.path];
    const std::vector<double>& gl = g.at(l.path);
    std::vector<double> g2(gl.size()), u(gl.size());
    for (size_t i = 0; i < gl.size(); ++i) g2[i] = gl[i] * gl[i] + c.adafactor_eps;
    auto [d1, d0] = optim::detail::adafactor_factored_dims(c, l.shape);
    if (d1 >= 0) {
      ASSERT_EQ(l.shape.size(), 2u);
      const int64_t rows = l.shape[0], cols = l.shape[1];
      auto coord = [&](int64_t i, int64_t j, int d) { return d == 0 ? i : j; };
      const int64_t n_d1 = l.shape[d1], n_d0 = l.shape[d0];
      std::vector<double> mean_over_d0(n_d1, 0), mean_over_d1(n_d0, 0);
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) {
          mean_over_d0[coord(i, j, d1)] += g2[i * cols + j] / static_cast<double>(n_d0);
          mean_over_d1[coord(i, j, d0)] += g2[i * cols + j] / static_cast<double>(n_d1);
        }
      std::vector<double>&row = st.row[l.path], &col = st.col[l.path];
      for (int64_t k = 0; k < n_d1; ++k) row[k] = decay * row[k] + (1 - decay) * mean_over_d0[k];
      for (int64_t k = 0; k < n_d0; ++k) col[k] = decay * col[k] + (1 - decay) * mean_over_d1[k];
      double row_mean = 0;
      for (double r : row) row_mean += r / static_cast<double>(row.size());
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j)
          u[i * cols + j] =
              gl[i * cols + j] / std::sqrt(row[coord(i, j, d1)] / row_mean) / std::sqrt(col[coord(i, j, d0)]);
    } else {
      std::vector<double>& v = st.v[l.path];
      for (size_t i = 0; i < gl.size(); ++i) {
        v[i] = decay * v[i] + (1 - decay) * g2[i];
        u[i] = gl[i] / std::sqrt(v[i]);
      }
    }
    const double clip = std::max(1.0, rms(u) / c.adafactor_clip_threshold);
    const double scale = std::max(rms(pl), c.adafactor_min_scale);
    const double wd = ref_decays(l.kind) ? c.weight_decay : 0.0;
    for (size_t i = 0; i < pl.size(); ++i) pl[i] -= lr * (u[i] / clip * scale + wd * pl[i]);
  }
}

TEST(OptimAdafactor, MatchesReferenceWithFactoredAndUnfactoredLeaves) {
  std::vector<LeafSpec> leaves = test_leaves();  // emb [5, 3], head [3, 2], layers.0.w [3, 4], 1-D b and scale
  OptimizerConfig config;
  config.name = "adafactor";
  config.adafactor_min_dim_to_factor = 3;  // emb and layers.0.w factored; head ([3, 2]) not
  config.weight_decay = 0.1;
  config.clip_norm = 0;
  config.adafactor_clip_threshold = 0.5;  // low enough to clip
  Optimizer opt(config, specs_of(leaves));
  Values p = random_values_for(leaves, 7, DType::Float64);
  RefState st;
  for (const LeafSpec& l : leaves) {
    auto [d1, d0] = optim::detail::adafactor_factored_dims(config, l.shape);
    st.v[l.path] = std::vector<double>(d1 >= 0 ? 1 : numel(l.shape), 0.0);
    st.row[l.path] = std::vector<double>(d1 >= 0 ? l.shape[d1] : 1, 0.0);
    st.col[l.path] = std::vector<double>(d1 >= 0 ? l.shape[d0] : 1, 0.0);
  }
  Tree params = tree_of(leaves, p, DType::Float64);
  Tree state = opt.init(params);
  // Factored leaves keep rows + columns, not a full moment.
  EXPECT_EQ(state.at("v").at("emb").leaf().shape(), Shape{});
  EXPECT_EQ(state.at("v_row").at("emb").leaf().shape(), Shape{3});
  EXPECT_EQ(state.at("v_col").at("emb").leaf().shape(), Shape{5});
  EXPECT_EQ(state.at("v").at("head").leaf().shape(), (Shape{3, 2}));
  for (int t = 1; t <= 4; ++t) {
    const double lr = 0.05;
    Values g = random_values_for(leaves, 400 + 10 * t, DType::Float64);
    Optimizer::Update u =
        opt.apply(params, tree_of(leaves, g, DType::Float64), state, Array::scalar(lr, DType::Float64));
    ref_adafactor_step(p, st, g, leaves, config, lr, t);
    params = u.params;
    state = u.state;
    expect_close(values_of(params), p, 1e-6, "step " + std::to_string(t) + " params");
  }
}

TEST(OptimAdafactor, FactoredDimsAreTheTwoLargest) {
  OptimizerConfig c;
  c.adafactor_min_dim_to_factor = 128;
  EXPECT_EQ(optim::detail::adafactor_factored_dims(c, {768, 3072}), (std::pair<int, int>{0, 1}));
  EXPECT_EQ(optim::detail::adafactor_factored_dims(c, {3072, 768}), (std::pair<int, int>{1, 0}));
  EXPECT_EQ(optim::detail::adafactor_factored_dims(c, {4, 768, 256}), (std::pair<int, int>{2, 1}));
  EXPECT_EQ(optim::detail::adafactor_factored_dims(c, {768, 64}), (std::pair<int, int>{-1, -1}));
  EXPECT_EQ(optim::detail::adafactor_factored_dims(c, {768}), (std::pair<int, int>{-1, -1}));
}

TEST(OptimAdafactor, StateIsAFractionOfAdamWs) {
  // One [1024, 1024] matrix: AdamW keeps 2 x 1M floats, Adafactor 2 x 1024.
  std::vector<LeafSpec> leaves = {{"w", {1024, 1024}, nn::ParamKind::Weight}};
  OptimizerConfig config;
  config.name = "adafactor";
  Tree params = Tree{{"w", zeros({1024, 1024})}};
  Tree state = Optimizer(config, specs_of(leaves)).init(params);
  int64_t elements = 0;
  for (const Array& a : state.leaves()) elements += a.size();
  EXPECT_EQ(elements, 1024 + 1024 + 1 + 1);  // rows, columns, the unused full slot (0-d), the step
}

}  // namespace
}  // namespace tessera::test
