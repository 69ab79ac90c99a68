// Model forward passes: gpt2 computes exactly bench/transformer_step.h's GPT (an
// independent implementation of the same math), gradients agree with central finite
// differences in float64 for both families, dropout only with a key, the KV cache
// reproduces logits() for gpt2 and llama (GQA), and bad tokens are rejected.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/test_util.h"
#include "tessera/models/model.h"
#include "tessera/tessera.h"
#include "transformer_step.h"

namespace tessera::models {
namespace {

ModelConfig small_config(const std::string& family) {
  ModelConfig c;
  c.family = family;
  c.vocab = 37;
  c.dim = 16;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = family == "llama" ? 2 : 0;
  c.mlp_dim = family == "llama" ? 24 : 0;
  c.context = 12;
  return c;
}

Array random_ids(int64_t b, int64_t t, int64_t vocab, uint32_t seed) {
  std::vector<int64_t> v = test::random_ints(b * t, seed, 0, vocab - 1);
  return Array::from_vector(std::vector<int32_t>(v.begin(), v.end()), {b, t});
}

// Norm scales and biases moved off 1 and 0, so their use is visible in the outputs.
Tree perturbed(const Tree& params, DType dtype, uint32_t seed) {
  uint32_t next = seed;
  return params.map([&](const Array& a) {
    std::vector<double> v = a.to_vector<double>();
    std::vector<double> noise = test::random_values(a.size(), next++, -0.05, 0.05);
    for (size_t i = 0; i < v.size(); ++i) v[i] += noise[i];
    return test::make_array(v, a.shape(), dtype);
  });
}

TEST(ModelForward, Gpt2IsTheBenchTransformer) {
  ModelConfig c = small_config("gpt2");
  c.init_std = 0.3;
  Model model(c);
  // Perturbed at the unpadded shapes (bench's transformer has no vocabulary padding).
  Tree p = pad_vocabulary(c, perturbed(strip_vocabulary(c, model.init(1)), DType::Float32, 2));
  // The same values in bench's layout.
  Tree bench_params;
  bench_params["wte"] = strip_vocabulary(c, p).at("wte");
  bench_params["wpe"] = p.at("wpe");
  bench_params["lnf_w"] = p.at("lnf").at("scale");
  bench_params["lnf_b"] = p.at("lnf").at("bias");
  std::vector<Tree> layers;
  for (const Tree& l : p.at("layers").elements()) {
    Tree b;
    b["ln1_w"] = l.at("ln1").at("scale");
    b["ln1_b"] = l.at("ln1").at("bias");
    b["qkv_w"] = l.at("attn").at("wqkv");
    b["qkv_b"] = l.at("attn").at("bqkv");
    b["attn_out_w"] = l.at("attn").at("wo");
    b["attn_out_b"] = l.at("attn").at("bo");
    b["ln2_w"] = l.at("ln2").at("scale");
    b["ln2_b"] = l.at("ln2").at("bias");
    b["fc_w"] = l.at("mlp").at("fc").at("w");
    b["fc_b"] = l.at("mlp").at("fc").at("b");
    b["proj_w"] = l.at("mlp").at("proj").at("w");
    b["proj_b"] = l.at("mlp").at("proj").at("b");
    layers.push_back(b);
  }
  bench_params["layers"] = Tree::list(layers);
  bench::TransformerConfig bc{.vocab = c.vocab, .dim = c.dim, .heads = c.heads, .layers = c.layers, .seq = c.context};
  Array tokens = random_ids(2, 9, c.vocab, 3);
  Array want = bench::forward(bc, bench_params, tokens);
  EXPECT_TRUE(test::all_close(model.logits(p, tokens), want, 1e-6, 1e-6));
}

// Central differences of the float64 loss at a few elements of every leaf.
void check_gradients(const std::string& family) {
  SCOPED_TRACE(family);
  ModelConfig c = small_config(family);
  c.context = 6;
  Model model(c);
  Tree p = perturbed(model.init(7), DType::Float64, 8);
  Array tokens = random_ids(2, 6, c.vocab, 9), targets = random_ids(2, 6, c.vocab, 10);
  auto loss_of = [&](const Tree& q) { return model.loss(q, tokens, targets); };
  auto [value, grads] = value_and_grad(TreeFn(loss_of))(p);
  EXPECT_EQ(value.dtype(), DType::Float64);
  std::vector<Array> leaves = p.leaves(), g = grads.leaves();
  std::vector<std::string> paths = p.paths();
  std::mt19937 gen(11);
  const double eps = 1e-6;
  for (size_t i = 0; i < leaves.size(); ++i) {
    std::vector<double> base = leaves[i].to_vector<double>(), gi = g[i].to_vector<double>();
    double scale = 0;
    for (double x : gi) scale = std::max(scale, std::abs(x));
    EXPECT_GT(scale, 0) << paths[i] << " has an all-zero gradient";
    for (int trial = 0; trial < 3; ++trial) {
      const size_t e = std::uniform_int_distribution<size_t>(0, base.size() - 1)(gen);
      auto loss_at = [&](double delta) {
        std::vector<double> v = base;
        v[e] += delta;
        std::vector<Array> moved = leaves;
        moved[i] = Array::from_vector(v, leaves[i].shape());
        return loss_of(p.with_leaves(moved)).item<double>();
      };
      const double fd = (loss_at(eps) - loss_at(-eps)) / (2 * eps);
      EXPECT_NEAR(gi[e], fd, 1e-6 * std::max(1.0, std::abs(fd)) + 1e-4 * scale) << paths[i] << " element " << e;
    }
  }
}

TEST(ModelForward, GradientsMatchFiniteDifferences) {
  check_gradients("gpt2");
  check_gradients("llama");
}

TEST(ModelForward, DropoutOnlyWithAKey) {
  ModelConfig c = small_config("gpt2");
  c.dropout = 0.3;
  Model model(c);
  Tree p = model.init(1);
  Array tokens = random_ids(2, 8, c.vocab, 4);
  Array plain = model.logits(p, tokens);
  EXPECT_EQ(model.logits(p, tokens).to_vector<float>(), plain.to_vector<float>());
  Array a = model.logits(p, tokens, key(5)), b = model.logits(p, tokens, key(5));
  EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>());
  EXPECT_NE(a.to_vector<float>(), plain.to_vector<float>());
  EXPECT_NE(model.logits(p, tokens, key(6)).to_vector<float>(), a.to_vector<float>());
  c.dropout = 0;
  EXPECT_EQ(Model(c).logits(p, tokens, key(5)).to_vector<float>(), plain.to_vector<float>());
}

// logits_with_cache over a prompt, then a 2-token chunk, then single tokens equals
// logits() on the whole sequence.
void check_cache(const std::string& family) {
  SCOPED_TRACE(family);
  ModelConfig c = small_config(family);
  c.init_std = 0.3;  // attention must matter to the logits, or a wrong mask passes
  Model model(c);
  Tree p = perturbed(model.init(3), DType::Float32, 4);
  const int64_t b = 2, t = c.context;
  Array tokens = random_ids(b, t, c.vocab, 5);
  Array full = model.logits(p, tokens);
  KVCache cache = model.empty_cache(b);
  EXPECT_EQ(cache.k.size(), static_cast<size_t>(c.layers));
  std::vector<Array> parts;
  std::vector<std::pair<int64_t, int64_t>> chunks{{0, 5}, {5, 7}};
  for (int64_t s = 7; s < t; ++s) chunks.emplace_back(s, s + 1);
  for (auto [start, stop] : chunks) {
    parts.push_back(model.logits_with_cache(p, slice_axis(tokens, 1, start, stop).eval(), cache));
    EXPECT_EQ(cache.length, stop);
    EXPECT_EQ(cache.k[0].shape(), (Shape{b, c.resolved_kv_heads(), stop, c.head_dim()}));
  }
  EXPECT_TRUE(test::all_close(concatenate(parts, 1), full, 1e-5, 1e-5));
  // The cache is full: one more token exceeds the context.
  EXPECT_THROW(model.logits_with_cache(p, random_ids(b, 1, c.vocab, 6), cache), ValueError);
  KVCache fresh = model.empty_cache(b);
  EXPECT_THROW(model.logits_with_cache(p, random_ids(b + 1, 2, c.vocab, 6), fresh), ValueError);
}

TEST(ModelForward, KvCacheReproducesFullLogits) {
  check_cache("gpt2");
  check_cache("llama");
}

TEST(ModelForward, RejectsBadTokens) {
  ModelConfig c = small_config("llama");
  Model model(c);
  Tree p = model.init(1);
  EXPECT_THROW(model.logits(p, random_ids(1, c.context + 1, c.vocab, 1)), ValueError);
  EXPECT_THROW(model.logits(p, Array::from_vector<int32_t>({1, 37, 2}, {1, 3})), ValueError);
  EXPECT_THROW(model.logits(p, Array::from_vector<int32_t>({1, -1}, {1, 2})), ValueError);
  EXPECT_THROW(model.logits(p, Array::from_vector<int32_t>({1, 2}, {2})), ShapeError);
  EXPECT_THROW(model.logits(p, zeros({1, 2})), ShapeError);
  EXPECT_THROW(model.loss(p, random_ids(1, 4, c.vocab, 1), random_ids(1, 3, c.vocab, 1)), ShapeError);
  EXPECT_THROW(model.empty_cache(0), ValueError);
}

}  // namespace
}  // namespace tessera::models
