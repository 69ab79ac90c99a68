// Model parameters: paths, logical axes, kinds and initializers per family, counts
// equal to the closed form (GPT-2 124M: 124,439,808), specs computed without
// allocating, bitwise-deterministic init, flops_per_token, presets and config checks.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "tessera/models/model.h"
#include "tessera/tessera.h"

namespace tessera::models {
namespace {

using nn::AxisNames;
using nn::ParamKind;

// Closed form: embeddings, per layer norms + attention + MLP, final norm, head.
int64_t closed_form_count(const ModelConfig& c) {
  const int64_t d = c.dim, f = c.resolved_mlp_dim(), dh = c.head_dim();
  const int64_t qkv = (c.heads + 2 * c.resolved_kv_heads()) * dh;
  const bool gpt2 = c.family == "gpt2";
  int64_t n = c.vocab * d + (gpt2 ? c.context * d : 0);
  // Experts: moe_experts SwiGLUs and the router [d, E] in place of one SwiGLU.
  const int64_t mlp = c.moe() ? c.moe_experts * 3 * d * f + d * c.moe_experts : 3 * d * f;
  int64_t layer =
      gpt2 ? 2 * (2 * d) + d * qkv + qkv + d * d + d + d * f + f + f * d + d : 2 * d + d * qkv + d * d + mlp;
  n += c.layers * layer + (gpt2 ? 2 * d : d);
  if (!c.resolved_tied()) n += d * c.vocab;
  return n;
}

TEST(ModelSpecs, Gpt2_124mCountIsTheKnownNumber) {
  Model model(preset("gpt2-124m"));  // specs only: nothing is allocated
  EXPECT_EQ(model.parameter_count(), 124439808);
  EXPECT_EQ(model.parameter_count(), closed_form_count(model.config()));
  EXPECT_EQ(model.specs().size(), 4u + 12u * 12u);
}

TEST(ModelSpecs, CountsMatchClosedFormForEveryPreset) {
  for (const std::string& name : preset_names()) {
    SCOPED_TRACE(name);
    Model model(preset(name));
    EXPECT_EQ(model.parameter_count(), closed_form_count(model.config()));
  }
  ModelConfig untied = preset("tiny");
  untied.tied_embeddings = false;
  EXPECT_EQ(Model(untied).parameter_count(), closed_form_count(untied));
  EXPECT_EQ(Model(untied).parameter_count(), Model(preset("tiny")).parameter_count() + 256 * 256);
  EXPECT_EQ(preset("llama-tiny").resolved_mlp_dim(), 768);  // 2/3 * 1024 = 682 -> 768
}

TEST(ModelSpecs, Gpt2PathsAxesKindsAndInitializers) {
  Model model(preset("tiny"));
  const nn::ParamSpecs& s = model.specs();
  const double residual = 0.02 / std::sqrt(8.0);
  struct Want {
    std::string path;
    Shape shape;
    AxisNames axes;
    ParamKind kind;
    std::string init;
  };
  for (const Want& w :
       std::vector<Want>{{"wte", {256, 256}, {"vocab", "embed"}, ParamKind::Embedding, "normal(0.02)"},
                         {"wpe", {256, 256}, {"position", "embed"}, ParamKind::Embedding, "normal(0.02)"},
                         {"layers.0.ln1.scale", {256}, {"norm"}, ParamKind::Norm, "ones"},
                         {"layers.0.ln1.bias", {256}, {"norm"}, ParamKind::Norm, "zeros"},
                         {"layers.0.attn.wqkv", {256, 768}, {"embed", "heads"}, ParamKind::Weight, "normal(0.02)"},
                         {"layers.0.attn.bqkv", {768}, {"heads"}, ParamKind::Bias, "zeros"},
                         {"layers.3.attn.wo",
                          {256, 256},
                          {"heads", "embed"},
                          ParamKind::Weight,
                          fmt::format("normal({:g})", residual)},
                         {"layers.3.attn.bo", {256}, {"embed"}, ParamKind::Bias, "zeros"},
                         {"layers.1.ln2.scale", {256}, {"norm"}, ParamKind::Norm, "ones"},
                         {"layers.1.mlp.fc.w", {256, 1024}, {"embed", "mlp"}, ParamKind::Weight, "normal(0.02)"},
                         {"layers.1.mlp.fc.b", {1024}, {"mlp"}, ParamKind::Bias, "zeros"},
                         {"layers.2.mlp.proj.w",
                          {1024, 256},
                          {"mlp", "embed"},
                          ParamKind::Weight,
                          fmt::format("normal({:g})", residual)},
                         {"layers.2.mlp.proj.b", {256}, {"embed"}, ParamKind::Bias, "zeros"},
                         {"lnf.scale", {256}, {"norm"}, ParamKind::Norm, "ones"},
                         {"lnf.bias", {256}, {"norm"}, ParamKind::Norm, "zeros"}}) {
    SCOPED_TRACE(w.path);
    ASSERT_TRUE(s.contains(w.path));
    EXPECT_EQ(s.at(w.path).shape, w.shape);
    EXPECT_EQ(s.at(w.path).axes, w.axes);
    EXPECT_EQ(s.at(w.path).kind, w.kind);
    EXPECT_EQ(s.at(w.path).init.to_string(), w.init);
    EXPECT_EQ(s.at(w.path).dtype, DType::Float32);
  }
  EXPECT_FALSE(s.contains("head"));  // tied
  EXPECT_EQ(s.size(), 4u + 4u * 12u);
}

TEST(ModelSpecs, LlamaHasNoBiasesAndAnUntiedHead) {
  Model model(preset("llama-tiny"));
  const nn::ParamSpecs& s = model.specs();
  EXPECT_FALSE(s.contains("wpe"));
  ASSERT_TRUE(s.contains("head"));
  EXPECT_EQ(s.at("head").axes, (AxisNames{"embed", "vocab"}));
  EXPECT_EQ(s.at("head").kind, ParamKind::Weight);
  EXPECT_EQ(s.at("layers.0.attn.wqkv").shape, (Shape{256, (4 + 2 * 2) * 64}));
  for (std::string w : {"gate", "up"}) EXPECT_EQ(s.at("layers.0.mlp." + w + ".w").shape, (Shape{256, 768}));
  EXPECT_EQ(s.at("layers.0.mlp.down.w").axes, (AxisNames{"mlp", "embed"}));
  for (const auto& [path, info] : s) {
    EXPECT_NE(info.kind, ParamKind::Bias) << path;
    if (info.kind == ParamKind::Norm) {
      EXPECT_TRUE(path.ends_with(".scale")) << path;
    }
  }
  EXPECT_EQ(s.size(), 3u + 4u * 7u);
}

TEST(ModelSpecs, InitIsDeterministicAndMatchesSpecs) {
  for (std::string name : {"tiny", "llama-tiny"}) {
    SCOPED_TRACE(name);
    ModelConfig c = preset(name);
    c.layers = 2;
    Model model(c);
    Tree a = model.init(5), b = model.init(5), other = model.init(6);
    std::vector<std::string> paths = a.paths();
    std::set<std::string> spec_paths;
    for (const auto& [path, info] : model.specs()) spec_paths.insert(path);
    EXPECT_EQ(std::set<std::string>(paths.begin(), paths.end()), spec_paths);
    std::vector<Array> la = a.leaves(), lb = b.leaves(), lo = other.leaves();
    for (size_t i = 0; i < la.size(); ++i) {
      SCOPED_TRACE(paths[i]);
      EXPECT_EQ(la[i].shape(), model.specs().at(paths[i]).shape);
      std::vector<float> va = la[i].to_vector<float>();
      EXPECT_EQ(std::memcmp(va.data(), lb[i].to_vector<float>().data(), va.size() * sizeof(float)), 0);
      const nn::ParamInfo& info = model.specs().at(paths[i]);
      if (info.kind == ParamKind::Weight || info.kind == ParamKind::Embedding) {
        EXPECT_NE(va, lo[i].to_vector<float>());
        double sq = 0;
        for (float v : va) sq += static_cast<double>(v) * v;
        EXPECT_NEAR(std::sqrt(sq / static_cast<double>(va.size())), info.init.stddev, 0.1 * info.init.stddev);
      }
    }
  }
}

TEST(ModelSpecs, FlopsPerTokenIsTheHeaderFormula) {
  Model gpt(preset("gpt2-124m"));
  const double n = 124439808.0 - 1024.0 * 768.0;
  EXPECT_EQ(gpt.flops_per_token(1024), 6 * n + 12.0 * 12 * 1024 * 768);
  Model llama(preset("llama-tiny"));
  EXPECT_EQ(llama.flops_per_token(128), 6.0 * static_cast<double>(llama.parameter_count()) + 12.0 * 4 * 128 * 256);
  EXPECT_THROW(gpt.flops_per_token(0), ValueError);
}

TEST(ModelSpecs, PresetsAndConfigErrors) {
  EXPECT_EQ(preset_names().size(), 12u);
  // The published models' parameter counts (Hugging Face's num_parameters() of the
  // released checkpoints).
  EXPECT_EQ(Model(preset("llama2-7b")).parameter_count(), 6738415616);
  EXPECT_EQ(Model(preset("llama2-70b")).parameter_count(), 68976648192);
  EXPECT_EQ(Model(preset("llama3.1-8b")).parameter_count(), 8030261248);
  EXPECT_EQ(Model(preset("llama3.1-70b")).parameter_count(), 70553706496);
  EXPECT_EQ(Model(preset("mixtral-8x7b")).parameter_count(), 46702792704);
  ModelConfig l = preset("llama-1b");
  EXPECT_EQ(l.resolved_kv_heads(), 8);
  EXPECT_EQ(l.resolved_mlp_dim(), 8192);
  EXPECT_FALSE(l.resolved_tied());
  EXPECT_TRUE(preset("gpt2-350m").resolved_tied());
  try {
    preset("gpt5");
    FAIL() << "expected a ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("llama-tiny"), std::string::npos) << e.what();
  }
  auto bad = [](auto edit) {
    ModelConfig c = preset("tiny");
    edit(c);
    return c;
  };
  EXPECT_THROW(Model(bad([](ModelConfig& c) { c.family = "bert"; })), ValueError);
  EXPECT_THROW(Model(bad([](ModelConfig& c) { c.dim = 250; })), ValueError);
  EXPECT_THROW(Model(bad([](ModelConfig& c) { c.kv_heads = 3; })), ValueError);
  EXPECT_THROW(Model(bad([](ModelConfig& c) { c.vocab = 0; })), ValueError);
  EXPECT_THROW(Model(bad([](ModelConfig& c) { c.dropout = 1; })), ValueError);
  EXPECT_THROW(Model(bad([](ModelConfig& c) { c.context = -1; })), ValueError);
  EXPECT_THROW(Model(bad([](ModelConfig& c) { c.norm_eps = 0; })), ValueError);
}

TEST(ModelConfig, RopeScalingIsCheckedAndReachesTheAttention) {
  auto error_of = [](auto edit) -> std::string {
    ModelConfig c = preset("llama-tiny");
    c.rope_scaling = "llama3";
    edit(c);
    try {
      Model{c};
    } catch (const ValueError& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_EQ(error_of([](ModelConfig&) {}), "no error");
  EXPECT_NE(error_of([](ModelConfig& c) { c.rope_scaling = "yarn"; }).find("rope_scaling = 'yarn' is unknown"),
            std::string::npos);
  EXPECT_NE(error_of([](ModelConfig& c) { c.family = "gpt2"; }).find("needs family 'llama'"), std::string::npos);
  EXPECT_NE(error_of([](ModelConfig& c) { c.rope_factor = 0; }).find("rope_factor = 0 must be positive"),
            std::string::npos);
  EXPECT_NE(error_of([](ModelConfig& c) {
              c.rope_high_freq_factor = 1;
            }).find("rope_high_freq_factor = 1 must be greater than rope_low_freq_factor = 1"),
            std::string::npos);
  EXPECT_NE(error_of([](ModelConfig& c) { c.rope_original_context = 0; }).find("rope_original_context = 0"),
            std::string::npos);
  // Only "llama3" turns the scaling on, and it changes the logits of the same weights.
  ModelConfig plain{.family = "llama", .vocab = 16, .dim = 16, .layers = 1, .heads = 2, .context = 64};
  ModelConfig scaled = plain;
  scaled.rope_scaling = "llama3";
  scaled.rope_original_context = 16;
  EXPECT_FALSE(plain.rope_llama3().has_value());
  ASSERT_TRUE(scaled.rope_llama3().has_value());
  EXPECT_EQ(scaled.rope_llama3()->original_context, 16);
  const Tree params = Model(plain).init(1);
  const Array tokens = Array::from_vector(std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, {1, 10});
  const std::vector<float> a = Model(plain).logits(params, tokens).to_vector<float>();
  const std::vector<float> b = Model(scaled).logits(params, tokens).to_vector<float>();
  ModelConfig unused = plain;
  unused.rope_factor = 3;  // parameters without rope_scaling = "llama3" change nothing
  EXPECT_EQ(Model(unused).logits(params, tokens).to_vector<float>(), a);
  EXPECT_NE(a, b);
}

// Model::init with a materialize predicate (a pipeline process builds its stages' part):
// the accepted parameters have the whole init's bits, the others are placeholders of the
// same (vocabulary-padded) types with no data.
TEST(ModelSpecs, InitMaterializesOnlyTheAcceptedParameters) {
  for (const std::string family : {"gpt2", "llama"}) {
    ModelConfig c = preset("tiny");  // a padded vocabulary of 50 entries, 3 layers
    c.family = family;
    std::tie(c.vocab, c.vocab_pad_to, c.layers) = std::make_tuple(50, 64, 3);
    const Model model(c);
    const Tree whole = model.init(11);
    auto accept = [](const std::string& path) { return path.starts_with("layers.1.") || path == "wte"; };
    const Tree part = model.init(11, accept);
    const std::vector<std::string> paths = whole.paths();
    ASSERT_EQ(part.paths(), paths) << family;
    const std::vector<Array> w = whole.leaves(), p = part.leaves();
    size_t built = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      EXPECT_EQ(p[i].shape(), w[i].shape()) << family << " " << paths[i];
      EXPECT_EQ(p[i].dtype(), w[i].dtype()) << family << " " << paths[i];
      if (accept(paths[i])) {
        ++built;
        ASSERT_TRUE(p[i].is_evaluated()) << family << " " << paths[i];
        EXPECT_EQ(std::memcmp(p[i].raw_data(), w[i].raw_data(), w[i].nbytes()), 0) << family << " " << paths[i];
      } else {
        EXPECT_FALSE(p[i].is_evaluated()) << family << " " << paths[i] << " should hold no data";
      }
    }
    EXPECT_GT(built, 1u) << family;
    EXPECT_EQ(part.at("wte").leaf().shape(0), 64) << family << ": the padded vocabulary";
  }
}

}  // namespace
}  // namespace tessera::models
