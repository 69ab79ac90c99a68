#include "tessera/models/sample.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "tessera/base/error.h"
#include "tessera/core/ops.h"

namespace tessera::models {

namespace {

void check_options(const SampleOptions& o) {
  if (o.max_tokens < 0) fail<ValueError>("sample: max_tokens {} must be >= 0", o.max_tokens);
  if (!(o.temperature >= 0) || !std::isfinite(o.temperature))
    fail<ValueError>("sample: temperature {} must be finite and >= 0 (0: greedy)", o.temperature);
  if (o.top_k < 0) fail<ValueError>("sample: top_k {} must be >= 0 (0: off)", o.top_k);
  if (!(o.top_p > 0 && o.top_p <= 1)) fail<ValueError>("sample: top_p {} must be in (0, 1] (1: off)", o.top_p);
}

// A uniform double in [0, 1) from the top 53 bits of one draw (the same on every
// standard library, unlike std::uniform_real_distribution).
double next_uniform(std::mt19937_64& gen) { return static_cast<double>(gen() >> 11) * 0x1.0p-53; }

// The last position's logits of [1, T, vocab] as float32.
std::vector<float> last_row(const Array& logits) {
  const int64_t t = logits.shape(1), v = logits.shape(2);
  return slice_axis(logits, 1, t - 1, t).astype(DType::Float32).reshape({v}).to_vector<float>();
}

}  // namespace

int32_t sample_token(const float* logits, int64_t vocab, const SampleOptions& options, double uniform) {
  check_options(options);
  if (vocab <= 0) fail<ValueError>("sample_token: vocab {} must be positive", vocab);
  if (!(uniform >= 0 && uniform < 1)) fail<ValueError>("sample_token: uniform {} must be in [0, 1)", uniform);
  for (int64_t i = 0; i < vocab; ++i)
    if (std::isnan(logits[i]) || logits[i] == std::numeric_limits<float>::infinity())
      fail<ValueError>("sample_token: logit {} of token {} is not a number below +inf", logits[i], i);
  // Candidates by descending logit, ties by ascending id: the order every filter and
  // the inverse-CDF draw use, so the result is a pure function of the inputs.
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  const float best = logits[order[0]];
  if (best == -std::numeric_limits<float>::infinity())
    fail<ValueError>("sample_token: every one of the {} logits is -inf", vocab);
  if (options.temperature == 0) return order[0];

  size_t keep = order.size();
  if (options.top_k > 0) keep = std::min(keep, static_cast<size_t>(options.top_k));
  // softmax(logits / temperature) over the kept candidates, in float64.
  std::vector<double> probs(keep);
  double total = 0;
  for (size_t i = 0; i < keep; ++i) {
    probs[i] = std::exp((static_cast<double>(logits[order[i]]) - best) / options.temperature);
    total += probs[i];
  }
  for (double& p : probs) p /= total;
  if (options.top_p < 1) {
    // Nucleus: the shortest prefix whose mass reaches top_p (at least one token).
    double mass = 0;
    size_t n = 0;
    while (n < keep) {
      mass += probs[n++];
      if (mass >= options.top_p) break;
    }
    keep = n;
    total = mass;
    for (size_t i = 0; i < keep; ++i) probs[i] /= total;
  }
  double cumulative = 0;
  for (size_t i = 0; i < keep; ++i) {
    cumulative += probs[i];
    if (uniform < cumulative) return order[i];
  }
  // Rounding left the total a hair below 1: the last kept candidate with mass.
  for (size_t i = keep; i-- > 0;)
    if (probs[i] > 0) return order[i];
  return order[0];
}

SampleResult sample(const Model& model, const Tree& params, const std::vector<int32_t>& prompt,
                    const SampleOptions& options) {
  check_options(options);
  const ModelConfig& c = model.config();
  if (prompt.empty()) fail<ValueError>("sample: the prompt is empty (at least one token expected)");
  const auto prompt_len = static_cast<int64_t>(prompt.size());
  if (prompt_len > c.context)
    fail<ValueError>("sample: the prompt has {} tokens, {} more than the context of {}", prompt_len,
                     prompt_len - c.context, c.context);
  if (options.vocab_limit < 0 || options.vocab_limit > c.vocab)
    fail<ValueError>("sample: vocab_limit {} is outside [0, vocab {}] (0: the whole vocabulary)", options.vocab_limit,
                     c.vocab);
  const int64_t sampled_vocab = options.vocab_limit > 0 ? options.vocab_limit : c.vocab;
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= c.vocab)
      fail<ValueError>("sample: prompt token {} at position {} is outside [0, vocab {})", prompt[i], i, c.vocab);

  // The model reads at most context tokens: the last new token's logits come from
  // prompt + (n - 1) tokens, so n <= context - prompt + 1.
  const int64_t room = c.context - prompt_len + 1;
  SampleResult result;
  const int64_t steps = std::min(options.max_tokens, room);
  result.hit_context = options.max_tokens > room;
  std::mt19937_64 gen(options.seed);
  std::vector<int32_t> sequence = prompt;
  KVCache cache;
  if (options.use_cache) cache = model.empty_cache(1);
  for (int64_t step = 0; step < steps; ++step) {
    std::vector<float> row;
    if (options.use_cache) {
      // The first step feeds the whole prompt, later steps the one new token.
      std::vector<int32_t> fresh(sequence.begin() + cache.length, sequence.end());
      Array tokens = Array::from_vector(fresh, {1, static_cast<int64_t>(fresh.size())});
      row = last_row(model.logits_with_cache(params, tokens, cache));
    } else {
      const auto len = static_cast<int64_t>(sequence.size());
      const int64_t start = std::max<int64_t>(0, len - c.context);
      std::vector<int32_t> window(sequence.begin() + start, sequence.end());
      Array tokens = Array::from_vector(window, {1, len - start});
      row = last_row(model.logits(params, tokens));
    }
    const double u = next_uniform(gen);
    const int32_t token = sample_token(row.data(), sampled_vocab, options, u);
    if (token == options.stop_token) {
      result.hit_stop = true;
      result.hit_context = false;
      break;
    }
    result.tokens.push_back(token);
    sequence.push_back(token);
  }
  return result;
}

}  // namespace tessera::models
