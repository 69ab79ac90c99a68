// The tiny GPT, batches and optimizer the SPMD training tests share (in-process in
// test_parallel_train.cpp, one process per device in mpi/mpi_train_main.cpp), so both
// compare the same run.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "tessera/data/loader.h"
#include "tessera/models/model.h"
#include "tessera/optim/optimizer.h"
#include "tessera/train/parallel.h"

namespace tessera::testing {

inline constexpr int64_t kTrainBatch = 8, kTrainSeq = 16, kTrainSteps = 3;

inline models::ModelConfig tiny_gpt() {
  models::ModelConfig c;
  c.family = "gpt2";
  c.vocab = 64;
  c.dim = 32;
  c.layers = 2;
  c.heads = 4;
  c.context = 16;
  c.init_std = 0.1;
  return c;
}

inline data::Batch random_batch(int64_t b, int64_t t, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> u(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> tokens(static_cast<size_t>(b * t)), targets(tokens.size());
  for (auto& x : tokens) x = u(rng);
  for (auto& x : targets) x = u(rng);
  return {Array::from_vector(tokens, {b, t}), Array::from_vector(targets, {b, t})};
}

// Random tokens cut into documents of random lengths (1 to 8 tokens) as the pipeline
// packs them: segment ids count the documents of a row, positions restart at 0, the
// last token of each document has no target (-100).
inline data::Batch packed_batch(int64_t b, int64_t t, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab - 1)), length(1, 8);
  std::vector<int32_t> tokens(static_cast<size_t>(b * t)), targets(tokens.size()), segments(tokens.size()),
      positions(tokens.size());
  for (int64_t r = 0; r < b; ++r) {
    int32_t doc = 0, pos = 0, left = length(rng);
    for (int64_t i = 0; i < t; ++i) {
      const auto at = static_cast<size_t>(r * t + i);
      tokens[at] = token(rng);
      segments[at] = doc;
      positions[at] = pos++;
      if (--left == 0 || i + 1 == t) {
        targets[at] = -100;
        ++doc, pos = 0, left = length(rng);
      }
    }
    for (int64_t i = 0; i + 1 < t; ++i) {
      const auto at = static_cast<size_t>(r * t + i);
      if (targets[at] != -100) targets[at] = tokens[at + 1];
    }
  }
  const Shape shape{b, t};
  data::Batch batch{Array::from_vector(tokens, shape), Array::from_vector(targets, shape)};
  batch.segments = Array::from_vector(segments, shape);
  batch.positions = Array::from_vector(positions, shape);
  return batch;
}

inline optim::OptimizerConfig test_adamw() {
  optim::OptimizerConfig oc;
  oc.weight_decay = 0.1;
  // The gradient of the attention key bias is zero up to rounding (softmax ignores a
  // constant shift); with a tiny eps AdamW turns that rounding noise into full-size
  // updates, which differ between any two summation orders. eps = 1e-3 keeps the
  // comparison about the math, not the noise.
  oc.eps = 1e-3;
  return oc;
}

// The layout of `mesh_text` with the default rules, params and opt placed on it; nullopt
// (nothing moved) for "" (one device).
inline std::optional<train::Layout> place_on_mesh(const std::string& mesh_text, const models::Model& model,
                                                  Tree& params, Tree& opt) {
  if (mesh_text.empty()) return std::nullopt;
  std::optional<train::Layout> layout;
  layout.emplace(spmd::Mesh::parse(mesh_text), train::default_axis_rules(), model.specs());
  params = layout->shard_params(params);
  opt = layout->shard_opt_state(opt);
  return layout;
}

}  // namespace tessera::testing
