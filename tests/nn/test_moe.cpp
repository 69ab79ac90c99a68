// The mixture-of-experts block (nn/moe.h) against a float64 reference written from the
// definition (a loop over tokens: router softmax, top k, renormalized gates, SwiGLU
// experts; with a capacity, slots granted in token order): outputs, the router's token
// counts per expert, dropped assignments, the load-balancing loss; gradients by finite
// differences; jit equals eager; the model family with experts (loss = cross-entropy +
// coef x aux, FLOPs of the active experts) and its errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/test_util.h"
#include "tessera/models/model.h"
#include "tessera/nn/moe.h"
#include "tessera/tessera.h"

namespace tessera::nn {
namespace {

constexpr int64_t kDim = 8, kHidden = 12, kExperts = 4, kTokens = 10;

struct Reference {
  std::vector<double> y;       // [tokens, dim]
  std::vector<double> counts;  // [experts] assignments routed to each
  double dropped = 0;
  double aux = 0;  // E * sum_je f[j,e] P[e]
};

// x [t, dim], router [dim, E], gate/up [E, dim, hidden], down [E, hidden, dim], row-major.
Reference reference(const std::vector<double>& x, const std::vector<double>& router, const std::vector<double>& gate,
                    const std::vector<double>& up, const std::vector<double>& down, int64_t t, int64_t k,
                    int64_t capacity, int64_t groups = 1) {
  Reference r;
  r.y.assign(static_cast<size_t>(t * kDim), 0.0);
  r.counts.assign(kExperts, 0.0);
  std::vector<int64_t> used(kExperts, 0);
  std::vector<double> share(static_cast<size_t>(k * kExperts), 0.0), mean_prob(kExperts, 0.0);
  for (int64_t i = 0; i < t; ++i) {
    if (i % (t / groups) == 0) std::fill(used.begin(), used.end(), 0);  // a new group: its own slots
    std::vector<double> logits(kExperts, 0.0);
    for (int64_t e = 0; e < kExperts; ++e)
      for (int64_t d = 0; d < kDim; ++d) logits[e] += x[i * kDim + d] * router[d * kExperts + e];
    const double top = *std::max_element(logits.begin(), logits.end());
    double z = 0;
    for (double& l : logits) z += (l = std::exp(l - top));
    for (double& l : logits) l /= z;  // now probabilities
    for (int64_t e = 0; e < kExperts; ++e) mean_prob[e] += logits[e] / static_cast<double>(t);
    std::vector<int64_t> order(kExperts);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
    double norm = 0;
    for (int64_t j = 0; j < k; ++j) norm += logits[order[j]];
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = order[j];
      r.counts[e] += 1;
      share[j * kExperts + e] += 1.0 / static_cast<double>(t);
      if (used[e]++ >= capacity) {
        r.dropped += 1;
        continue;
      }
      std::vector<double> h(kHidden);
      for (int64_t f = 0; f < kHidden; ++f) {
        double g = 0, u = 0;
        for (int64_t d = 0; d < kDim; ++d) {
          g += x[i * kDim + d] * gate[(e * kDim + d) * kHidden + f];
          u += x[i * kDim + d] * up[(e * kDim + d) * kHidden + f];
        }
        h[f] = g / (1 + std::exp(-g)) * u;
      }
      for (int64_t d = 0; d < kDim; ++d) {
        double o = 0;
        for (int64_t f = 0; f < kHidden; ++f) o += h[f] * down[(e * kHidden + f) * kDim + d];
        r.y[i * kDim + d] += logits[e] / norm * o;
      }
    }
  }
  for (int64_t j = 0; j < k; ++j)
    for (int64_t e = 0; e < kExperts; ++e) r.aux += share[j * kExperts + e] * mean_prob[e];
  r.aux *= kExperts;
  return r;
}

struct Fixture {
  MoE moe;
  Tree params;
  Array x;
};

Fixture make(int64_t k, double capacity_factor, DType dtype = DType::Float32, int64_t groups = 0) {
  Fixture f;
  f.moe = MoE{.dim = kDim,
              .hidden = kHidden,
              .experts = kExperts,
              .top_k = k,
              .groups = groups,
              .capacity_factor = capacity_factor,
              .init_std = 0.5,
              .out_std = 0.5};
  f.params = f.moe.init(ParamScope(7, dtype));
  f.x = test::random_array({2, kTokens / 2, kDim}, 3, dtype);
  return f;
}

Reference reference_of(const Fixture& f) {
  auto v = [&](const char* name) { return f.params.at(name).at("w").leaf().to_vector<double>(); };
  const int64_t groups = f.moe.resolved_groups(kTokens);
  return reference(f.x.to_vector<double>(), v("router"), v("gate"), v("up"), v("down"), kTokens, f.moe.top_k,
                   f.moe.capacity(kTokens / groups), groups);
}

TEST(MoE, DroplessMatchesTheReference) {
  for (int64_t k : {1, 2, 3}) {
    const Fixture f = make(k, 0);
    const MoE::Output out = f.moe(f.params, f.x);
    const Reference want = reference_of(f);
    EXPECT_EQ(out.y.shape(), f.x.shape());
    EXPECT_TRUE(test::all_close(out.y, want.y, 1e-5, 1e-5)) << "k " << k;
    EXPECT_EQ(out.tokens_per_expert.to_vector<double>(), want.counts) << "k " << k;
    EXPECT_EQ(out.dropped.item<double>(), 0) << "k " << k;
    std::vector<MoE::Output> one{out};
    EXPECT_NEAR(load_balancing_loss(one, kExperts).item<double>(), want.aux, 1e-6) << "k " << k;
  }
}

TEST(MoE, CapacityDropsTheAssignmentsPastItInTokenOrder) {
  for (double factor : {0.5, 1.0, 1.25}) {
    const Fixture f = make(2, factor);
    const MoE::Output out = f.moe(f.params, f.x);
    const Reference want = reference_of(f);
    EXPECT_EQ(f.moe.capacity(kTokens), static_cast<int64_t>(std::ceil(factor * kTokens * 2 / kExperts)));
    EXPECT_TRUE(test::all_close(out.y, want.y, 1e-5, 1e-5)) << "factor " << factor;
    EXPECT_EQ(out.dropped.item<double>(), want.dropped) << "factor " << factor;
    EXPECT_EQ(out.tokens_per_expert.to_vector<double>(), want.counts) << "factor " << factor;
  }
  EXPECT_GT(reference_of(make(2, 0.5)).dropped, 0);  // the case above does drop some
}

TEST(MoE, GroupsHaveTheirOwnSlots) {
  // Two groups of 5 tokens: with a capacity each has its own slots (GShard); dropless,
  // grouping changes nothing.
  const Fixture grouped = make(2, 1.0, DType::Float32, 2);
  EXPECT_EQ(grouped.moe.capacity(kTokens / 2), 3);  // ceil(1.0 * 5 * 2 / 4)
  const MoE::Output out = grouped.moe(grouped.params, grouped.x);
  const Reference want = reference_of(grouped);
  EXPECT_TRUE(test::all_close(out.y, want.y, 1e-5, 1e-5));
  EXPECT_EQ(out.dropped.item<double>(), want.dropped);
  const Fixture one = make(2, 0, DType::Float32, 1), two = make(2, 0, DType::Float32, 2);
  EXPECT_TRUE(
      test::all_close(two.moe(two.params, two.x).y, one.moe(one.params, one.x).y.to_vector<double>(), 1e-6, 1e-6));
  MoE bad = grouped.moe;
  bad.groups = 3;
  EXPECT_THROW(bad(grouped.params, grouped.x), ShapeError);  // 10 tokens in 3 groups
}

TEST(MoE, GradientsMatchFiniteDifferences) {
  for (double factor : {0.0, 0.75}) {
    const Fixture f = make(2, factor, DType::Float64);
    const std::vector<std::string> names{"router", "gate", "up", "down"};
    std::vector<Array> inputs{f.x};
    for (const std::string& n : names) inputs.push_back(f.params.at(n).at("w").leaf());
    auto fn = [&](const std::vector<Array>& in) {
      Tree p;
      for (size_t i = 0; i < names.size(); ++i) p[names[i]]["w"] = in[i + 1];
      const MoE::Output out = f.moe(p, in[0]);
      return std::vector<Array>{out.y, load_balancing_loss({out}, kExperts)};
    };
    EXPECT_TRUE(test::check_vjp_fd(fn, inputs, 1e-6, 1e-5)) << "factor " << factor;
  }
}

// Dropless routing on grouped GEMMs (the default with the experts on every device) gives
// the capacity buffers' outputs and gradients, at top_k / experts of their expert FLOPs.
TEST(MoE, DroplessGroupedGemmsEqualTheCapacityBuffersAtTheActiveFlops) {
  for (int64_t k : {1, 2}) {
    const Fixture f = make(k, 0);
    MoE buffers = f.moe;
    buffers.grouped_gemm = false;
    auto loss = [&](const MoE& moe) {
      return [&moe](const Tree& a) { return sum(square(moe(a.at("p"), a.at("x").leaf()).y)); };
    };
    const Tree args{{"p", f.params}, {"x", Tree(f.x)}};
    const auto [got_loss, got_grads] = value_and_grad(loss(f.moe))(args);
    const auto [want_loss, want_grads] = value_and_grad(loss(buffers))(args);
    EXPECT_NEAR(got_loss.item<double>(), want_loss.item<double>(), 1e-6 * want_loss.item<double>()) << "k " << k;
    const std::vector<Array> g = got_grads.leaves(), w = want_grads.leaves();
    for (size_t i = 0; i < g.size(); ++i)
      EXPECT_TRUE(test::all_close(g[i], w[i], 1e-5, 1e-6)) << "k " << k << " leaf " << i;
    // The expert GEMMs' FLOPs in the compiled forward: 3 x 2 x assignments x dim x hidden
    // against 3 x 2 x experts x tokens x dim x hidden for dropless buffers.
    auto expert_flops = [&](const MoE& moe, const char* op) {
      Jitted forward = jit([&moe](const Tree& a) -> Tree { return Tree(moe(a.at("p"), a.at("x").leaf()).y); });
      const auto& by_op = forward.lowered(args).executable().stats().flops_by_op;
      const auto it = by_op.find(op);
      return it == by_op.end() ? 0.0 : it->second;
    };
    const double active = 3.0 * 2 * static_cast<double>(kTokens * k * kDim * kHidden);
    EXPECT_DOUBLE_EQ(expert_flops(f.moe, "grouped_matmul"), active) << "k " << k;
    EXPECT_EQ(expert_flops(buffers, "grouped_matmul"), 0.0) << "k " << k;
  }
}

TEST(MoE, JitEqualsEager) {
  const Fixture f = make(2, 1.0);
  const Array eager = f.moe(f.params, f.x).y;
  Jitted jitted = jit([&](const Tree& a) -> Tree { return Tree(f.moe(a.at("p"), a.at("x").leaf()).y); });
  const Array got = jitted(Tree{{"p", f.params}, {"x", Tree(f.x)}}).leaf();
  EXPECT_TRUE(test::all_close(got, eager.to_vector<double>(), 1e-6, 1e-6));
}

TEST(MoE, BadShapesAreClearErrors) {
  const Fixture f = make(2, 0);
  EXPECT_THROW(
      {
        try {
          f.moe(f.params, zeros({3, 5}));
        } catch (const ShapeError& e) {
          EXPECT_NE(std::string(e.what()).find("MoE: input [3, 5] must end in the model width 8"), std::string::npos);
          throw;
        }
      },
      ShapeError);
  MoE bad = f.moe;
  bad.top_k = 5;
  EXPECT_THROW(bad.init(ParamScope(1)), ValueError);
  // The load-balancing loss from summed figures needs the count they were summed over.
  try {
    load_balancing_loss(zeros({2, 4}), zeros({4}), 0, 4);
    FAIL() << "expected a ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("figures summed over 0 layers (expected >= 1)"), std::string::npos)
        << e.what();
  }
}

TEST(MoEModel, LossAddsTheLoadBalancingTermAndFlopsCountActiveExperts) {
  models::ModelConfig c = models::preset("mixtral-tiny");
  c.context = 16;
  const models::Model model(c);
  const Tree params = model.init(1);
  EXPECT_TRUE(params.at("layers").elements()[0].items().count("moe"));
  const Array tokens = astype(test::random_array({2, 16}, 5, DType::Float64, 0, 255), DType::Int32);
  const Array targets = astype(test::random_array({2, 16}, 6, DType::Float64, 0, 255), DType::Int32);
  const double with_aux = model.loss(params, tokens, targets).item<double>();
  models::ModelConfig no_aux = c;
  no_aux.moe_aux_loss_coef = 0;
  const double ce = models::Model(no_aux).loss(params, tokens, targets).item<double>();
  // The aux term is E * sum(f P) >= 1 (equality at perfect balance), times 0.02.
  EXPECT_GT(with_aux - ce, 0.02 * 0.99);
  EXPECT_LT(with_aux - ce, 0.02 * c.moe_experts);
  // FLOPs: 6 x (parameters less the experts a token skips) + attention.
  const int64_t skipped = c.layers * (c.moe_experts - c.moe_top_k) * 3 * c.dim * c.resolved_mlp_dim();
  EXPECT_DOUBLE_EQ(model.flops_per_token(16),
                   6.0 * static_cast<double>(model.parameter_count() - skipped) + 12.0 * c.layers * 16 * c.dim);
  // Gradients reach every expert's weights that got tokens, and the router.
  const Tree grads = value_and_grad([&](const Tree& p) { return model.loss(p, tokens, targets); })(params).second;
  const Array router_grad = grads.at("layers").elements()[0].at("moe").at("router").at("w").leaf();
  EXPECT_GT(sum(abs(router_grad)).item<double>(), 0);
}

TEST(MoEModel, ConfigErrors) {
  models::ModelConfig c = models::preset("mixtral-tiny");
  c.family = "gpt2";
  EXPECT_THROW(c.validate(), ValueError);
  c = models::preset("mixtral-tiny");
  c.moe_top_k = 5;
  EXPECT_THROW(c.validate(), ValueError);
  c = models::preset("mixtral-tiny");
  c.remat = "full";
  EXPECT_THROW(c.validate(), ValueError);
  c = models::preset("mixtral-tiny");
  c.moe_capacity_factor = -1;
  EXPECT_THROW(c.validate(), ValueError);
}

}  // namespace
}  // namespace tessera::nn
