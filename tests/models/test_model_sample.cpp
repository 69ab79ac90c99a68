// Sampling: sample_token's filters against a float64 reference (greedy, top-k, top-p,
// temperature, inverse-CDF draw), sample() with and without the KV cache gives the
// same tokens, stops at the context, and rejects bad prompts and options.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "tessera/models/sample.h"
#include "tessera/tessera.h"

namespace tessera::models {
namespace {

// Reference distribution after temperature / top-k / top-p, indexed by token.
std::vector<double> reference_probs(const std::vector<float>& logits, const SampleOptions& o) {
  const size_t n = logits.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return logits[a] > logits[b]; });
  std::vector<double> p(n, 0.0);
  size_t keep = o.top_k > 0 ? std::min(n, static_cast<size_t>(o.top_k)) : n;
  double total = 0;
  for (size_t i = 0; i < keep; ++i) total += p[order[i]] = std::exp(logits[order[i]] / o.temperature);
  for (double& x : p) x /= total;
  double mass = 0;
  size_t nucleus = 0;
  while (nucleus < keep && mass < o.top_p) mass += p[order[nucleus++]];
  for (size_t i = nucleus; i < n; ++i) p[order[i]] = 0;
  for (double& x : p) x /= mass;
  return p;
}

TEST(Sample, TokenFiltersMatchReference) {
  const std::vector<float> logits{0.5f, 2.0f, -1.0f, 1.5f, 2.0f, 0.0f, -3.0f, 1.0f};
  for (SampleOptions o :
       {SampleOptions{.temperature = 1.0}, SampleOptions{.temperature = 0.7, .top_k = 3},
        SampleOptions{.temperature = 1.3, .top_p = 0.6}, SampleOptions{.temperature = 0.9, .top_k = 5, .top_p = 0.8}}) {
    SCOPED_TRACE("temperature " + std::to_string(o.temperature) + " top_k " + std::to_string(o.top_k) + " top_p " +
                 std::to_string(o.top_p));
    std::vector<double> want = reference_probs(logits, o);
    // A fine grid of uniforms estimates each token's probability.
    const int grid = 20000;
    std::vector<double> got(logits.size(), 0.0);
    for (int i = 0; i < grid; ++i)
      got[static_cast<size_t>(sample_token(logits.data(), 8, o, (i + 0.5) / grid))] += 1.0 / grid;
    for (size_t t = 0; t < logits.size(); ++t) EXPECT_NEAR(got[t], want[t], 1.0 / grid + 1e-12) << "token " << t;
  }
}

TEST(Sample, GreedyAtTemperatureZeroTakesTheFirstMaximum) {
  const std::vector<float> logits{0.5f, 2.0f, -1.0f, 2.0f};
  SampleOptions o{.temperature = 0};
  for (double u : {0.0, 0.5, 0.999}) EXPECT_EQ(sample_token(logits.data(), 4, o, u), 1);
}

TEST(Sample, TokenRejectsBadInput) {
  const std::vector<float> logits{0.5f, NAN};
  EXPECT_THROW(sample_token(logits.data(), 2, {}, 0.5), ValueError);
  const std::vector<float> ok{0.5f, 1.0f};
  EXPECT_THROW(sample_token(ok.data(), 2, {}, 1.0), ValueError);
  EXPECT_THROW(sample_token(ok.data(), 0, {}, 0.5), ValueError);
  EXPECT_THROW(sample_token(ok.data(), 2, {.temperature = -1}, 0.5), ValueError);
  EXPECT_THROW(sample_token(ok.data(), 2, {.top_p = 0}, 0.5), ValueError);
  EXPECT_THROW(sample_token(ok.data(), 2, {.top_p = 1.5}, 0.5), ValueError);
  EXPECT_THROW(sample_token(ok.data(), 2, {.top_k = -2}, 0.5), ValueError);
}

ModelConfig sample_config(const std::string& family) {
  ModelConfig c = preset(family == "gpt2" ? "tiny" : "llama-tiny");
  c.vocab = 50;
  c.dim = 32;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = family == "gpt2" ? 0 : 2;
  c.mlp_dim = family == "gpt2" ? 0 : 64;
  c.context = 24;
  c.init_std = 0.3;  // peaked distributions make the test sensitive to wrong logits
  return c;
}

TEST(Sample, CachedAndUncachedGiveTheSameTokens) {
  for (std::string family : {"gpt2", "llama"}) {
    SCOPED_TRACE(family);
    Model model(sample_config(family));
    Tree p = model.init(2);
    for (SampleOptions o : {SampleOptions{.max_tokens = 12, .temperature = 0, .seed = 1},
                            SampleOptions{.max_tokens = 12, .temperature = 1.0, .top_k = 10, .seed = 3},
                            SampleOptions{.max_tokens = 12, .temperature = 0.8, .top_p = 0.9, .seed = 4}}) {
      o.use_cache = true;
      SampleResult cached = sample(model, p, {1, 2, 3}, o);
      o.use_cache = false;
      SampleResult plain = sample(model, p, {1, 2, 3}, o);
      EXPECT_EQ(cached.tokens, plain.tokens);
      EXPECT_EQ(cached.tokens.size(), 12u);
      EXPECT_FALSE(cached.hit_context);
      for (int32_t t : cached.tokens) EXPECT_TRUE(t >= 0 && t < 50);
      EXPECT_EQ(sample(model, p, {1, 2, 3}, o).tokens, plain.tokens);  // deterministic in the seed
    }
    // A different seed gives a different continuation (at temperature 1).
    SampleOptions a{.max_tokens = 12, .seed = 1}, b{.max_tokens = 12, .seed = 2};
    EXPECT_NE(sample(model, p, {1}, a).tokens, sample(model, p, {1}, b).tokens);
  }
}

TEST(Sample, StopsAtTheContext) {
  Model model(sample_config("llama"));
  Tree p = model.init(2);
  std::vector<int32_t> prompt(20, 7);
  for (bool cache : {true, false}) {
    SampleResult r = sample(model, p, prompt, {.max_tokens = 10, .use_cache = cache});
    EXPECT_EQ(r.tokens.size(), 5u);  // the last one reads 24 tokens
    EXPECT_TRUE(r.hit_context);
  }
  SampleResult exact = sample(model, p, prompt, {.max_tokens = 5});
  EXPECT_FALSE(exact.hit_context);
  EXPECT_EQ(sample(model, p, std::vector<int32_t>(24, 1), {.max_tokens = 3}).tokens.size(), 1u);
}

// vocab_limit keeps padded ids (past the tokenizer's vocabulary) out of the samples;
// stop_token ends the sequence at the first occurrence and is not returned.
TEST(Sample, VocabLimitAndStopToken) {
  Model model(sample_config("gpt2"));
  Tree p = model.init(2);
  const SampleOptions wide{.max_tokens = 20, .temperature = 2.0, .seed = 5};
  const std::vector<int32_t> unlimited = sample(model, p, {1}, wide).tokens;
  ASSERT_TRUE(std::any_of(unlimited.begin(), unlimited.end(), [](int32_t t) { return t >= 10; }))
      << "the unlimited samples should use ids >= 10 for the limit to be tested";
  SampleOptions limited = wide;
  limited.vocab_limit = 10;
  for (bool cache : {true, false}) {
    limited.use_cache = cache;
    const std::vector<int32_t> tokens = sample(model, p, {1}, limited).tokens;
    EXPECT_EQ(tokens.size(), 20u);
    for (int32_t t : tokens) EXPECT_LT(t, 10);
  }
  // Stop at the 4th token of the unlimited run (its first occurrence there).
  const int32_t stop = unlimited[3];
  const auto first = std::find(unlimited.begin(), unlimited.end(), stop);
  SampleOptions stopping = wide;
  stopping.stop_token = stop;
  const SampleResult r = sample(model, p, {1}, stopping);
  EXPECT_TRUE(r.hit_stop);
  EXPECT_FALSE(r.hit_context);
  EXPECT_EQ(r.tokens, std::vector<int32_t>(unlimited.begin(), first));
  EXPECT_THROW(sample(model, p, {1}, {.vocab_limit = 51}), ValueError);
  EXPECT_THROW(sample(model, p, {1}, {.vocab_limit = -1}), ValueError);
}

TEST(Sample, RejectsBadPromptsAndOptions) {
  Model model(sample_config("gpt2"));
  Tree p = model.init(2);
  EXPECT_THROW(sample(model, p, {}, {}), ValueError);
  EXPECT_THROW(sample(model, p, std::vector<int32_t>(25, 1), {}), ValueError);
  EXPECT_THROW(sample(model, p, {1, 50}, {}), ValueError);
  EXPECT_THROW(sample(model, p, {-1}, {}), ValueError);
  EXPECT_THROW(sample(model, p, {1}, {.temperature = -0.5}), ValueError);
  EXPECT_THROW(sample(model, p, {1}, {.top_p = 0}), ValueError);
  EXPECT_THROW(sample(model, p, {1}, {.top_p = 1.01}), ValueError);
  EXPECT_THROW(sample(model, p, {1}, {.max_tokens = -1}), ValueError);
  try {
    sample(model, p, std::vector<int32_t>(30, 1), {});
    FAIL() << "expected a ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("30"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera::models
