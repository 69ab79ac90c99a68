// jit against eager on whole models and on a zoo of small functions. Eager is the
// reference: every op evaluated as it is created (bench::run_eager, detail::EagerScope),
// by the per-op kernels the core tests check against float64. The jitted program
// (fusion, CSE, scheduling, a static arena, donation) must agree to kRtol relative
// per element (integer and boolean outputs exactly), for training steps including the
// parameters and moments after AdamW, over 3 consecutive steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/test_util.h"
#include "tessera/api/jit.h"
#include "tessera/tessera.h"
#include "transformer_step.h"

namespace tessera {
namespace {

namespace tb = tessera::bench;

constexpr double kRtol = 1e-5;

// |got - want| <= kRtol * max(|want|, 1e-3 * max|want|) elementwise; integer and
// bool arrays bitwise. The floor keeps elements that cancel to ~0 (a bias after its
// first update) from demanding more than float32 rounding of the array's scale.
void expect_matches(const Array& got, const Array& want, const std::string& what) {
  ASSERT_EQ(to_string(got.shape()), to_string(want.shape())) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  std::vector<double> g = got.to_vector<double>(), w = want.to_vector<double>();
  if (!is_floating(want.dtype())) {
    for (size_t i = 0; i < w.size(); ++i) ASSERT_EQ(g[i], w[i]) << what << " element " << i;
    return;
  }
  double scale = 0;
  for (double x : w) scale = std::max(scale, std::abs(x));
  int bad = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    double tol = kRtol * std::max(std::abs(w[i]), 1e-3 * scale);
    if (!(std::abs(g[i] - w[i]) <= tol) && ++bad <= 3)
      ADD_FAILURE() << what << " element " << i << ": jit " << g[i] << ", eager " << w[i] << " (tolerance " << tol
                    << ")";
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << w.size() << " elements differ";
}

void expect_trees_match(const Tree& got, const Tree& want, const std::string& what) {
  ASSERT_TRUE(got.same_structure(want)) << what;
  std::vector<Array> g = got.leaves(), w = want.leaves();
  std::vector<std::string> paths = want.paths();
  for (size_t i = 0; i < w.size(); ++i) expect_matches(g[i], w[i], what + " " + paths[i]);
}

int64_t got_step_count(const Tree& opt) { return opt.at("step").leaf().item<int64_t>(); }

// Runs `steps` training steps twice from the same state, eagerly and jitted (params and
// optimizer state donated), comparing loss, params and moments after every step.
void check_training_matches(const JitFn& step_fn, const Tree& params, const Tree& opt, const Array& inputs,
                            const Array& targets, int steps = 3) {
  Tree eager_params = params, eager_opt = opt;
  // jit gets its own buffers: donation may overwrite them in place.
  auto copy = [](const Array& a) { return Array::from_data(a.raw_data(), a.shape(), a.dtype()); };
  Tree jit_params = params.map(copy), jit_opt = opt.map(copy);
  JitOptions options;
  options.donate_leaves = tb::state_leaf_indices(tb::step_args(params, opt, inputs, targets));
  ASSERT_FALSE(options.donate_leaves.empty());
  Jitted jitted = jit(step_fn, options);
  for (int64_t step = 1; step <= steps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    Tree want = tb::run_eager([&] { return step_fn(tb::step_args(eager_params, eager_opt, inputs, targets), {}); });
    Tree got;
    {
      // The donated state is held by the args tree only; it is invalid after the call.
      Tree args = tb::step_args(std::move(jit_params), std::move(jit_opt), inputs, targets);
      jit_params = Tree();
      jit_opt = Tree();
      got = jitted(args);
    }
    expect_matches(got.at("loss").leaf(), want.at("loss").leaf(), "loss");
    expect_trees_match(got.at("params"), want.at("params"), "params");
    expect_trees_match(got.at("opt"), want.at("opt"), "opt");
    EXPECT_TRUE(std::isfinite(want.at("loss").leaf().item<double>()));
    eager_params = want.at("params");
    eager_opt = want.at("opt");
    jit_params = got.at("params");
    jit_opt = got.at("opt");
  }
  // The step count is an array in the optimizer state: one trace serves every step.
  EXPECT_EQ(jitted.trace_count(), 1);
  EXPECT_EQ(got_step_count(jit_opt), steps);
}

// ---- (a) MLP ----

Tree mlp_params(int64_t in, int64_t hidden, int64_t classes, uint64_t seed) {
  std::vector<Array> k = random::split_keys(key(seed), 4);
  return Tree{{"w1", random::normal(k[0], {in, hidden}, DType::Float32, 0, 0.3).eval()},
              {"b1", random::normal(k[1], {hidden}, DType::Float32, 0, 0.1).eval()},
              {"w2", random::normal(k[2], {hidden, classes}, DType::Float32, 0, 0.3).eval()},
              {"b2", zeros({classes}).eval()}};
}

Array mlp_loss(const Tree& p, const Array& x, const Array& y) {
  Array h = gelu(matmul(x, p.at("w1").leaf()) + p.at("b1").leaf());
  return cross_entropy(matmul(h, p.at("w2").leaf()) + p.at("b2").leaf(), y);
}

TEST(JitModels, MlpTrainingStepMatchesEager) {
  Tree params = mlp_params(16, 32, 10, 3);
  Tree opt = tb::init_opt_state(params);
  Array x = random::normal(key(5), {8, 16}).eval();
  Array y = test::make_array(std::vector<double>{0, 3, 9, 1, 1, 7, 2, 5}, {8}, DType::Int32);
  AdamWConfig adamw{.lr = 1e-2, .weight_decay = 0.1};
  JitFn step_fn = tb::tree_step_fn([adamw](const Tree& p, const Tree& o, const Array& xs, const Array& ys) {
    auto [value, grads] = value_and_grad([&](const Tree& q) { return mlp_loss(q, xs, ys); })(p);
    auto [new_p, new_o] = tb::adamw_tree(p, grads, o, adamw);
    return tb::StepResult{new_p, new_o, value};
  });
  check_training_matches(step_fn, params, opt, x, y);
}

// ---- (b) transformer ----

tb::TransformerConfig small_transformer(bool tied) {
  tb::TransformerConfig c;
  c.vocab = 64;
  c.dim = 32;
  c.heads = 4;
  c.layers = 2;
  c.seq = 16;
  c.batch = 2;
  c.tied_head = tied;
  return c;
}

TEST(JitModels, TransformerTrainingStepMatchesEager) {
  for (bool tied : {true, false}) {
    SCOPED_TRACE(tied ? "tied head" : "separate head");
    tb::TransformerConfig c = small_transformer(tied);
    Tree params = tb::init_params(c, 11);
    Tree opt = tb::init_opt_state(params);
    Array tokens = tb::random_tokens(c, 1), targets = tb::random_tokens(c, 2);
    check_training_matches(tb::transformer_step_fn(c, AdamWConfig{.lr = 3e-3, .weight_decay = 0.01}), params, opt,
                           tokens, targets);
  }
}

TEST(JitModels, TransformerLossMatchesEager) {
  tb::TransformerConfig c = small_transformer(true);
  Tree params = tb::init_params(c, 4);
  Array tokens = tb::random_tokens(c, 7), targets = tb::random_tokens(c, 8);
  Tree args{{"params", params}, {"tokens", tokens}, {"targets", targets}};
  auto loss_fn = [c](const Tree& a) {
    return Tree(tb::loss(c, a.at("params"), a.at("tokens").leaf(), a.at("targets").leaf()));
  };
  Array want = tb::run_eager([&] { return loss_fn(args); }).leaf();
  // Untrained, the loss is near log(vocab): the model is wired, not just consistent.
  EXPECT_NEAR(want.item<double>(), std::log(static_cast<double>(c.vocab)), 0.5);
  Jitted jitted = jit(loss_fn);
  expect_matches(jitted(args).leaf(), want, "loss");
  expect_matches(jitted(args).leaf(), want, "loss (cached)");
  EXPECT_EQ(jitted.trace_count(), 1);
}

// ---- (c) a zoo of small functions ----

using ZooFn = std::function<std::vector<Array>(const std::vector<Array>&)>;

struct ZooCase {
  std::string name;
  ZooFn fn;
  std::vector<Array> inputs;
};

Array f32(const Shape& shape, uint32_t seed) { return test::random_array(shape, seed, DType::Float32); }
Array i32(const Shape& shape, uint32_t seed, int64_t lo, int64_t hi) {
  std::vector<int64_t> v = test::random_ints(numel(shape), seed, lo, hi);
  return test::make_array(std::vector<double>(v.begin(), v.end()), shape, DType::Int32);
}

std::vector<ZooCase> zoo() {
  std::vector<ZooCase> cases;
  cases.push_back({"elementwise_broadcast_chain",
                   [](const std::vector<Array>& a) {
                     const Array &x = a[0], &y = a[1], &z = a[2];
                     Array t = exp(x * y - z) / (1.0 + abs(x)) + tanh(y);
                     return std::vector<Array>{sqrt(square(t) + 1.0) * sigmoid(z) - log1p(abs(x))};
                   },
                   {f32({4, 5}, 1), f32({5}, 2), f32({4, 1}, 3)}});
  cases.push_back(
      {"scalar_broadcast_and_rank_3",
       [](const std::vector<Array>& a) { return std::vector<Array>{maximum(a[0] * 2.0 + a[1], a[0] - 0.25) * 0.5}; },
       {f32({3, 1, 6}, 4), f32({2, 1}, 5)}});
  cases.push_back({"reductions",
                   [](const std::vector<Array>& a) {
                     const Array& x = a[0];
                     return std::vector<Array>{sum(x, {1}),         mean(x, {0}, true), max(x),
                                               min(x, {-1}),        var(x, {1}),        logsumexp(x, {1}),
                                               prod(x * 0.5 + 1.0), argmax(x, 1),       sum(exp(x) * x, {0, 1})};
                   },
                   {f32({6, 7}, 6)}});
  cases.push_back({"softmax_family",
                   [](const std::vector<Array>& a) {
                     return std::vector<Array>{softmax(a[0]), log_softmax(a[0], 0), softmax(a[0] * 3.0 + a[1], -1)};
                   },
                   {f32({5, 8}, 7), f32({8}, 8)}});
  cases.push_back({"matmul_bias_gelu",
                   [](const std::vector<Array>& a) {
                     Array h = gelu(matmul(a[0], a[1]) + a[2]);
                     return std::vector<Array>{h, gelu(matmul(h, transpose(a[1])), /*approximate=*/false)};
                   },
                   {f32({2, 6, 9}, 9), f32({9, 12}, 10), f32({12}, 11)}});
  cases.push_back({"norms",
                   [](const std::vector<Array>& a) {
                     return std::vector<Array>{layer_norm(a[0], a[1], a[2]), rms_norm(a[0] * 2.0, a[1])};
                   },
                   {f32({3, 4, 16}, 12), f32({16}, 13), f32({16}, 14)}});
  cases.push_back(
      {"slice_concat_stack_reshape",
       [](const std::vector<Array>& a) {
         const Array& x = a[0];
         Array left = slice_axis(x, 1, 0, 2), right = slice_axis(x, 1, 3, 6) * 2.0;
         Array cat = concatenate({left, right, exp(slice_axis(x, 1, 1, 7, 3))}, 1);
         Array st = stack({slice_axis(x, 0, 0, 2), slice_axis(x, 0, 2, 4) + 1.0}, 2);
         return std::vector<Array>{cat, st, reshape(transpose(x), {2, -1}), slice(x, {1, 0}, {4, 7}, {2, 3})};
       },
       {f32({4, 7}, 15)}});
  cases.push_back({"where_and_comparisons",
                   [](const std::vector<Array>& a) {
                     const Array &x = a[0], &y = a[1];
                     Array mask = logical_and(greater(x, zeros_like(x)), less_equal(y, x + 0.5));
                     return std::vector<Array>{where(mask, x, y * 0.1), mask, where(equal(x, x), x, y)};
                   },
                   {f32({5, 6}, 16), f32({6}, 17)}});
  cases.push_back({"integer_ops",
                   [](const std::vector<Array>& a) {
                     const Array &p = a[0], &q = a[1];
                     Array r = p * q + maximum(p, q) - abs(q);
                     return std::vector<Array>{r, sum(r, {0}), astype(r, DType::Float32) * 0.5,
                                               astype(greater(r, p), DType::Int32) + q};
                   },
                   {i32({4, 5}, 18, -20, 20), i32({5}, 19, -9, 9)}});
  cases.push_back({"embedding_take_and_one_hot",
                   [](const std::vector<Array>& a) {
                     Array rows = take(a[0], a[1], 0);
                     return std::vector<Array>{rows * 2.0, one_hot(a[1], 10), take_along_axis(a[0], a[2], 1)};
                   },
                   {f32({10, 4}, 20), i32({3, 2}, 21, 0, 9), i32({10, 2}, 22, 0, 3)}});
  cases.push_back({"attention_and_cross_entropy",
                   [](const std::vector<Array>& a) {
                     Array out = scaled_dot_product_attention(a[0], a[1], a[2], true);
                     Array logits = reshape(out, {-1, 8});
                     return std::vector<Array>{out, cross_entropy(logits, a[3]),
                                               cross_entropy(logits, a[3], -100, Reduction::None)};
                   },
                   {f32({1, 2, 5, 8}, 23), f32({1, 2, 5, 8}, 24), f32({1, 2, 5, 8}, 25), i32({10}, 26, 0, 7)}});
  cases.push_back({"multi_output_with_passthrough_and_duplicates",
                   [](const std::vector<Array>& a) {
                     Array s = a[0] + a[1];
                     return std::vector<Array>{s, a[0] * a[1], sum(s), a[1], s};
                   },
                   {f32({3, 3}, 27), f32({3, 3}, 28)}});
  cases.push_back({"grad_inside",
                   [](const std::vector<Array>& a) {
                     auto [value, grads] = value_and_grad(
                         [](const std::vector<Array>& p) { return sum(tanh(matmul(p[0], p[1])) * p[0].sum()); })(a);
                     return std::vector<Array>{value, grads[0], grads[1]};
                   },
                   {f32({3, 4}, 29), f32({4, 2}, 30)}});
  return cases;
}

TEST(JitModels, ZooMatchesEager) {
  for (const ZooCase& c : zoo()) {
    SCOPED_TRACE(c.name);
    std::vector<Array> want = tb::run_eager([&] { return c.fn(c.inputs); });
    Jitted jitted = jit(c.fn);
    for (int call = 0; call < 2; ++call) {  // the second call runs the cached executable
      std::vector<Array> got = jitted(c.inputs);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i)
        expect_matches(got[i], want[i], c.name + " output " + std::to_string(i) + " call " + std::to_string(call));
    }
    EXPECT_EQ(jitted.trace_count(), 1);
  }
}

}  // namespace
}  // namespace tessera
