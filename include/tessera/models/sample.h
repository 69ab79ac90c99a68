// Autoregressive sampling from a Model: temperature, top-k and nucleus (top-p)
// filtering, with or without a KV cache (the two give the same tokens for the same
// seed; the cache makes each new token cost one position instead of the whole prefix).
#pragma once

#include <cstdint>
#include <vector>

#include "tessera/models/model.h"

namespace tessera::models {

struct SampleOptions {
  int64_t max_tokens = 64;   // new tokens to generate (stops early at the context length)
  double temperature = 1.0;  // 0: greedy (argmax)
  int64_t top_k = 0;         // 0: off
  double top_p = 1.0;        // 1: off
  uint64_t seed = 0;         // host RNG seed (deterministic)
  bool use_cache = true;
  // Sample only ids below this (0: the model's vocab). A model whose embedding table is
  // padded past its tokenizer's vocabulary (GPT-2's 50257 -> 50304) must not emit ids
  // the tokenizer cannot decode.
  int64_t vocab_limit = 0;
  // Stop when this token is sampled (it is not included in the result); -1: never.
  int32_t stop_token = -1;
};

struct SampleResult {
  std::vector<int32_t> tokens;  // the new tokens only
  bool hit_context = false;     // stopped because prompt + generated reached the context
  bool hit_stop = false;        // stopped at options.stop_token
};

// Prompt token ids -> new tokens. An empty prompt, a prompt longer than the context,
// token ids outside [0, vocab) or bad options (temperature < 0, top_p outside (0, 1],
// vocab_limit outside [0, vocab]) are ValueErrors that say which and by how much.
SampleResult sample(const Model& model, const Tree& params, const std::vector<int32_t>& prompt,
                    const SampleOptions& options);

// One token from logits (float32 [vocab]) with the options' filtering; `uniform` in [0, 1).
int32_t sample_token(const float* logits, int64_t vocab, const SampleOptions& options, double uniform);

}  // namespace tessera::models
