// Vocabulary padding (ModelConfig::vocab_pad_to): a model whose embedding table is
// padded with zero rows computes what the unpadded model computes (init, logits, loss,
// gradients, compiled AdamW steps, within float32 rounding of the other GEMM shapes),
// its padding rows and their optimizer state stay exactly 0 through training (tied and
// untied heads), Hugging Face files hold `vocab` rows either way, parameter counts and
// FLOPs leave the padding out, and checkpoints written before the key existed read as
// unpadded.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/test_util.h"
#include "tessera/base/error.h"
#include "tessera/interop/hf_weights.h"
#include "tessera/models/model.h"
#include "tessera/optim/optimizer.h"
#include "tessera/tessera.h"
#include "tessera/train/config.h"
#include "tessera/train/train_step.h"

namespace tessera::models {
namespace {

constexpr int64_t kVocab = 97;

ModelConfig config(const std::string& family, int64_t pad_to) {
  ModelConfig c;
  c.family = family;
  c.vocab = kVocab;
  c.vocab_pad_to = pad_to;
  c.dim = 32;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = family == "llama" ? 2 : 0;
  c.context = 16;
  return c;
}

Array random_ids(int64_t b, int64_t t, uint32_t seed) {
  std::vector<int64_t> v = test::random_ints(b * t, seed, 0, kVocab - 1);
  return Array::from_vector(std::vector<int32_t>(v.begin(), v.end()), {b, t});
}

// ||a - b|| / ||b|| in float64.
double rel_error(const Array& a, const Array& b) {
  const std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  EXPECT_EQ(x.size(), y.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    num += (x[i] - y[i]) * (x[i] - y[i]);
    den += y[i] * y[i];
  }
  return std::sqrt(num / den);
}

// Every value of the vocabulary padding of `table` (rows of wte, columns of head).
std::vector<double> padding_of(const Array& table, bool columns) {
  const std::vector<double> v = table.to_vector<double>();
  std::vector<double> out;
  const int64_t rows = table.shape(0), cols = table.shape(1);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      if ((columns ? c : r) >= kVocab) out.push_back(v[static_cast<size_t>(r * cols + c)]);
  return out;
}

void expect_padding_zero(const Tree& params, const std::string& what) {
  for (const std::string key : {"wte", "head"}) {
    if (params.items().count(key) == 0) continue;
    const Array& table = params.at(key).leaf();
    const std::vector<double> pad = padding_of(table, key == "head");
    ASSERT_FALSE(pad.empty()) << what << " " << key << " " << to_string(table.shape());
    for (double x : pad) ASSERT_EQ(x, 0.0) << what << " " << key;
  }
}

TEST(VocabPadding, ShapesCountsAndFlops) {
  const ModelConfig c = preset("gpt2-124m");
  EXPECT_EQ(c.padded_vocab(), 50304);
  const Model model(c);
  EXPECT_EQ(model.specs().at("wte").shape, (Shape{50304, 768}));
  EXPECT_EQ(model.parameter_count(), 124439808);  // GPT-2 124M's published count
  ModelConfig unpadded = c;
  unpadded.vocab_pad_to = 1;
  EXPECT_EQ(model.flops_per_token(1024), Model(unpadded).flops_per_token(1024));
  ModelConfig bad = c;
  bad.vocab_pad_to = 0;
  EXPECT_THROW(Model{bad}, ValueError);
  EXPECT_EQ(preset("tiny").padded_vocab(), 256);  // already a multiple: no padding
}

TEST(VocabPadding, PaddedModelEqualsUnpadded) {
  for (const std::string family : {"gpt2", "llama"}) {
    SCOPED_TRACE(family);
    const Model padded(config(family, 64)), plain(config(family, 1));
    ASSERT_EQ(padded.config().padded_vocab(), 128);
    const Tree p = padded.init(3), u = plain.init(3);
    expect_padding_zero(p, "init");
    // The same draws: the stripped tables are the unpadded model's, bit for bit.
    const std::vector<Array> stripped = strip_vocabulary(padded.config(), p).leaves(), want = u.leaves();
    ASSERT_EQ(stripped.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_EQ(stripped[i].to_vector<double>(), want[i].to_vector<double>()) << u.paths()[i];

    const Array tokens = random_ids(2, 12, 1), targets = random_ids(2, 12, 2);
    const Array logits = padded.logits(p, tokens);
    EXPECT_EQ(logits.shape(), (Shape{2, 12, kVocab}));
    EXPECT_LT(rel_error(logits, plain.logits(u, tokens)), 1e-6);

    auto loss_and_grads = [&](const Model& m, const Tree& params) {
      return value_and_grad(TreeFn([&](const Tree& q) { return m.loss(q, tokens, targets); }))(params);
    };
    auto [loss_p, grads_p] = loss_and_grads(padded, p);
    auto [loss_u, grads_u] = loss_and_grads(plain, u);
    EXPECT_NEAR(loss_p.item<double>(), loss_u.item<double>(), 1e-6 * loss_u.item<double>());
    expect_padding_zero(grads_p, "gradient");
    const std::vector<Array> g = strip_vocabulary(padded.config(), grads_p).leaves(), gu = grads_u.leaves();
    for (size_t i = 0; i < gu.size(); ++i) EXPECT_LT(rel_error(g[i], gu[i]), 1e-5) << grads_u.paths()[i];
  }
}

// Compiled AdamW steps (weight decay on): the losses follow the unpadded model's and
// the padding rows, their moments included, stay exactly 0.
TEST(VocabPadding, PaddingStaysZeroThroughAdamW) {
  for (const std::string family : {"gpt2", "llama"}) {
    SCOPED_TRACE(family);
    std::vector<double> losses[2];
    for (int pad : {0, 1}) {
      const Model model(config(family, pad ? 64 : 1));
      optim::OptimizerConfig oc;
      oc.weight_decay = 0.1;
      optim::Optimizer optimizer(oc, model.specs());
      Tree params = model.init(5);
      Tree state = optimizer.init(params);
      train::TrainStep step(model, optimizer, 1);
      const data::Batch batch{random_ids(4, 16, 8), random_ids(4, 16, 9)};
      for (int i = 0; i < 6; ++i) losses[pad].push_back(step.run(params, state, {batch}, 3e-3, std::nullopt).loss);
      if (!pad) continue;
      expect_padding_zero(params, "params");
      for (const std::string moment : {"m", "v"})
        if (state.items().count(moment) > 0) expect_padding_zero(state.at(moment), moment);
    }
    for (size_t i = 0; i < losses[0].size(); ++i) EXPECT_NEAR(losses[1][i], losses[0][i], 1e-5) << "step " << i;
    EXPECT_LT(losses[1].back(), losses[1].front());
  }
}

TEST(VocabPadding, HuggingFaceFilesHoldTheVocabularyOnly) {
  for (const std::string family : {"gpt2", "llama"}) {
    SCOPED_TRACE(family);
    const ModelConfig c = config(family, 64);
    const Tree params = Model(c).init(11);
    const auto tensors = interop::hf_tensors_from_params(c, params, DType::Float32);
    interop::HfTensors files;
    int tables = 0;
    for (const auto& [name, array] : tensors) {
      if (name.find("wte") != std::string::npos || name.find("embed_tokens") != std::string::npos ||
          name.find("lm_head") != std::string::npos) {
        EXPECT_EQ(array.shape(0), kVocab) << name;
        ++tables;
      }
      files.emplace(name, interop::HfTensor{array.eval(), "model.safetensors"});
    }
    EXPECT_EQ(tables, family == "gpt2" ? 1 : 2);
    const Tree back = interop::params_from_hf(c, files, "test");
    const std::vector<Array> got = back.leaves(), want = params.leaves();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i].shape(), want[i].shape()) << params.paths()[i];
      EXPECT_EQ(got[i].to_vector<double>(), want[i].to_vector<double>()) << params.paths()[i];
    }
  }
}

TEST(VocabPadding, CheckpointConfigsWithoutTheKeyAreUnpadded) {
  nlohmann::json saved = {{"model", {{"preset", "gpt2-124m"}, {"vocab", 50257}}}};
  EXPECT_EQ(train::config_from_json(saved).model.padded_vocab(), 50257);
  saved["model"]["vocab_pad_to"] = 128;
  EXPECT_EQ(train::config_from_json(saved).model.padded_vocab(), 50304);
}

}  // namespace
}  // namespace tessera::models
