// Mixed precision (ModelConfig::compute_dtype): bfloat16/float16 logits track the
// float32 ones, the loss is float32, gradients reach the float32 parameters as
// float32 and track float32's; a few AdamW steps of a tiny GPT in bfloat16 track the
// float32 losses while parameters and optimizer state stay float32; the KV cache
// runs in the compute dtype; an unknown compute dtype is rejected.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/test_util.h"
#include "tessera/models/model.h"
#include "tessera/optim/optimizer.h"
#include "tessera/tessera.h"
#include "tessera/train/train_step.h"

namespace tessera::models {
namespace {

ModelConfig config(const std::string& family, const std::string& dtype) {
  ModelConfig c;
  c.family = family;
  c.vocab = 64;
  c.dim = 64;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = family == "llama" ? 2 : 0;
  c.context = 32;
  c.compute_dtype = dtype;
  return c;
}

Array random_ids(int64_t b, int64_t t, int64_t vocab, uint32_t seed) {
  std::vector<int64_t> v = test::random_ints(b * t, seed, 0, vocab - 1);
  return Array::from_vector(std::vector<int32_t>(v.begin(), v.end()), {b, t});
}

// ||a - b|| / ||b|| in float64.
double rel_error(const Array& a, const Array& b) {
  const std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  EXPECT_EQ(x.size(), y.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += (x[i] - y[i]) * (x[i] - y[i]);
    den += y[i] * y[i];
  }
  return std::sqrt(num / den);
}

double tolerance(const std::string& dtype) { return dtype == "bfloat16" ? 3e-2 : 5e-3; }

DType dtype_of(const std::string& name) { return name == "bfloat16" ? DType::BFloat16 : DType::Float16; }

TEST(MixedPrecision, LogitsAndLossTrackFloat32) {
  for (const std::string family : {"gpt2", "llama"}) {
    Model reference(config(family, "float32"));
    // Larger weights than the default init, so the logits are far from zero.
    Tree params = reference.init(3).map([](const Array& p) { return (p * 4.0).eval(); });
    Array tokens = random_ids(2, 16, 64, 1), targets = random_ids(2, 16, 64, 2);
    Array want = reference.logits(params, tokens).eval();
    const double want_loss = reference.loss(params, tokens, targets).item<double>();
    for (const std::string dtype : {"bfloat16", "float16"}) {
      Model model(config(family, dtype));
      Array logits = model.logits(params, tokens).eval();
      const std::string what = family + " " + dtype;
      EXPECT_EQ(logits.dtype(), dtype_of(dtype)) << what;
      const double err = rel_error(logits, want);
      EXPECT_LT(err, tolerance(dtype)) << what;
      EXPECT_GT(err, 0) << what << ": the compute dtype made no difference";
      Array loss = model.loss(params, tokens, targets);
      EXPECT_EQ(loss.dtype(), DType::Float32) << what;
      EXPECT_NEAR(loss.item<double>(), want_loss, tolerance(dtype) * want_loss) << what;
      // The parameters were not changed (or converted) by the forward pass.
      for (const Array& p : params.leaves()) EXPECT_EQ(p.dtype(), DType::Float32) << what;
    }
  }
}

TEST(MixedPrecision, GradientsAreFloat32AndTrackFloat32) {
  for (const std::string family : {"gpt2", "llama"}) {
    Model reference(config(family, "float32")), model(config(family, "bfloat16"));
    Tree params = reference.init(5);
    Array tokens = random_ids(2, 16, 64, 3), targets = random_ids(2, 16, 64, 4);
    auto grads_of = [&](const Model& m) {
      return value_and_grad(TreeFn([&](const Tree& p) { return m.loss(p, tokens, targets); }))(params).second;
    };
    Tree want = grads_of(reference), got = grads_of(model);
    std::vector<Array> w = want.leaves(), g = got.leaves();
    eval(w);
    eval(g);
    const std::vector<std::string> paths = got.paths();
    ASSERT_EQ(paths, want.paths());
    std::vector<double> all_w, all_g;
    for (size_t i = 0; i < g.size(); ++i) {
      EXPECT_EQ(g[i].dtype(), DType::Float32) << family << " " << paths[i];
      EXPECT_EQ(g[i].shape(), w[i].shape()) << family << " " << paths[i];
      for (double x : w[i].to_vector<double>()) all_w.push_back(x);
      for (double x : g[i].to_vector<double>()) all_g.push_back(x);
    }
    const double err = rel_error(Array::from_vector(all_g, {static_cast<int64_t>(all_g.size())}),
                                 Array::from_vector(all_w, {static_cast<int64_t>(all_w.size())}));
    EXPECT_LT(err, 2e-2) << family;
    EXPECT_GT(err, 0) << family;
  }
}

// A few AdamW steps on a fixed batch through train::TrainStep (the compiled step).
std::vector<double> train_losses(const std::string& dtype, int steps, Tree* final_params, Tree* final_state) {
  Model model(config("gpt2", dtype));
  optim::OptimizerConfig oc;
  oc.weight_decay = 0.01;
  optim::Optimizer optimizer(oc, model.specs());
  Tree params = model.init(7);
  Tree state = optimizer.init(params);
  train::TrainStep step(model, optimizer, 1);
  const data::Batch batch{random_ids(4, 32, 64, 8), random_ids(4, 32, 64, 9)};
  std::vector<double> losses;
  for (int i = 0; i < steps; ++i) losses.push_back(step.run(params, state, {batch}, 3e-3, std::nullopt).loss);
  EXPECT_EQ(step.trace_count(), 1);
  *final_params = params;
  *final_state = state;
  return losses;
}

TEST(MixedPrecision, Bf16TrainingTracksFloat32AndKeepsFloat32State) {
  const int steps = 12;
  Tree p32, s32, p16, s16;
  const std::vector<double> want = train_losses("float32", steps, &p32, &s32);
  const std::vector<double> got = train_losses("bfloat16", steps, &p16, &s16);
  for (int i = 0; i < steps; ++i) EXPECT_NEAR(got[i], want[i], 2e-2 * want[i]) << "step " << i;
  EXPECT_LT(got.back(), 0.8 * got.front()) << "first " << got.front() << ", last " << got.back();
  // Master weights and optimizer state stay float32 (the step count int64).
  for (const Array& p : p16.leaves()) EXPECT_EQ(p.dtype(), DType::Float32);
  const std::vector<Array> state = s16.leaves();
  const std::vector<std::string> paths = s16.paths();
  for (size_t i = 0; i < state.size(); ++i)
    EXPECT_EQ(state[i].dtype(), paths[i] == "step" ? DType::Int64 : DType::Float32) << paths[i];
  EXPECT_FALSE(s16.items().contains("loss_scale")) << "bfloat16 needs no loss scaling";
  // The weights moved like float32's.
  const Array w16 = p16.at("layers").at(0).at("attn").at("wqkv").leaf();
  const Array w32 = p32.at("layers").at(0).at("attn").at("wqkv").leaf();
  const Array w0 = Model(config("gpt2", "float32")).init(7).at("layers").at(0).at("attn").at("wqkv").leaf();
  EXPECT_LT(rel_error(w16 - w0, w32 - w0), 0.1);
}

TEST(MixedPrecision, KvCacheRunsInTheComputeDtype) {
  Model model(config("llama", "bfloat16"));
  Tree params = model.init(2);
  Array tokens = random_ids(2, 10, 64, 5);
  Array full = model.logits(params, tokens).eval();
  KVCache cache = model.empty_cache(2);
  ASSERT_EQ(cache.k[0].dtype(), DType::BFloat16);
  Array first = model.logits_with_cache(params, slice_axis(tokens, 1, 0, 6).eval(), cache);
  Array rest = model.logits_with_cache(params, slice_axis(tokens, 1, 6, 10).eval(), cache);
  EXPECT_EQ(cache.k[0].dtype(), DType::BFloat16);
  EXPECT_EQ(rest.dtype(), DType::BFloat16);
  EXPECT_LT(rel_error(concatenate({first, rest}, 1), full), 2e-2);
}

TEST(MixedPrecision, UnknownComputeDtypeIsRejected) {
  for (const std::string bad : {"bf16", "float64", "int8", ""}) {
    ModelConfig c = config("gpt2", bad);
    try {
      Model model(c);
      ADD_FAILURE() << "compute_dtype '" << bad << "' was accepted";
    } catch (const ValueError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("compute_dtype"), std::string::npos) << message;
      EXPECT_NE(message.find("float32, bfloat16, float16"), std::string::npos) << message;
    }
  }
}

}  // namespace
}  // namespace tessera::models
