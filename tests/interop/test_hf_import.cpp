// Importing Hugging Face models: tessera's logits of the committed fixtures against
// the logits transformers computed from the same files (tests/oracles/hf_models.py ->
// goldens/hf_models.json), sharded vs single-file, and the config checks.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "hf_test_util.h"
#include "tessera/base/error.h"
#include "tessera/interop/hf_checkpoint.h"
#include "tessera/interop/hf_config.h"

namespace tessera {
namespace {

using nlohmann::json;
using test::hf_golden;
using test::kHfFixtures;

// Both sides compute in float32 with different summation orders (tessera's blocked
// GEMMs and fused attention/norm kernels vs torch's); at d = 32 and |logits| of a few
// units the differences are a few float32 ulps (observed <= 4e-6), while any mapping
// mistake (a swapped head, a missed transpose) moves logits by O(0.1 .. 1).
constexpr double kLogitTolerance = 5e-5;

// `plain_rope`: computed as if the config had no RoPE scaling (to show the scaling matters).
double max_logit_error(const std::string& fixture, bool plain_rope = false) {
  interop::HfModel hf = interop::load_hf_model(kHfFixtures / fixture);
  if (plain_rope) hf.config.rope_scaling = "none";
  const models::Model model(hf.config);
  const Array logits = model.logits(hf.params, test::golden_tokens()).eval();
  const json* found = nullptr;
  for (const json& c : hf_golden().at("cases"))
    if (c.at("name") == fixture) found = &c;
  if (found == nullptr) ADD_FAILURE() << "no golden case " << fixture;
  const json& want = found != nullptr ? *found : hf_golden();
  const std::vector<int64_t> shape = want.at("shape").get<std::vector<int64_t>>();
  EXPECT_EQ(logits.shape(), Shape(shape.begin(), shape.end()));
  const std::vector<float> got = logits.to_vector<float>();
  const json& values = want.at("logits");
  EXPECT_EQ(got.size(), values.size());
  double worst = 0;
  for (size_t i = 0; i < got.size() && i < values.size(); ++i)
    worst = std::max(worst, std::abs(static_cast<double>(got[i]) - values[i].get<double>()));
  return worst;
}

TEST(HfImport, Gpt2LogitsMatchTransformers) {
  const double err = max_logit_error("hf_gpt2");
  EXPECT_LE(err, kLogitTolerance);
  RecordProperty("max_abs_error", fmt::format("{:.3g}", err));
}

TEST(HfImport, LlamaGqaLogitsMatchTransformers) {
  const double err = max_logit_error("hf_llama");
  EXPECT_LE(err, kLogitTolerance);
  RecordProperty("max_abs_error", fmt::format("{:.3g}", err));
}

TEST(HfImport, TiedLlamaLogitsMatchTransformers) {
  const double err = max_logit_error("hf_llama_tied");
  EXPECT_LE(err, kLogitTolerance);
  RecordProperty("max_abs_error", fmt::format("{:.3g}", err));
}

TEST(HfImport, Llama31ScaledRopeLogitsMatchTransformers) {
  const double err = max_logit_error("hf_llama31");
  EXPECT_LE(err, kLogitTolerance);
  // The fixture is built so that the scaling matters: plain RoPE on the same weights
  // misses transformers' logits by far more than the tolerance (2.4 when written).
  const double unscaled = max_logit_error("hf_llama31", /*plain_rope=*/true);
  EXPECT_GT(unscaled, 1000 * kLogitTolerance);
  RecordProperty("max_abs_error", fmt::format("{:.3g}", err));
  RecordProperty("max_abs_change_by_scaling", fmt::format("{:.3g}", unscaled));
}

TEST(HfImport, MixtralLogitsMatchTransformers) {
  // 4 experts, 2 per token, dropless: transformers' MixtralForCausalLM on the same files.
  const double err = max_logit_error("hf_mixtral");
  EXPECT_LE(err, kLogitTolerance);
  RecordProperty("max_abs_error", fmt::format("{:.3g}", err));
  const interop::HfModel hf = interop::load_hf_model(kHfFixtures / "hf_mixtral");
  EXPECT_EQ(hf.config.family, "llama");
  EXPECT_EQ(hf.config.moe_experts, 4);
  EXPECT_EQ(hf.config.moe_top_k, 2);
  EXPECT_EQ(hf.config.moe_capacity_factor, 0);
  EXPECT_DOUBLE_EQ(hf.config.moe_aux_loss_coef, 0.02);
  // An expert's weights land in their slot: expert 2's w1 (gate) transposed.
  const interop::HfTensors files = interop::read_hf_tensors(kHfFixtures / "hf_mixtral");
  const Array w1 = files.at("model.layers.1.block_sparse_moe.experts.2.w1.weight").array;
  const Array gate = hf.params.at("layers").at(1).at("moe").at("gate").at("w").leaf();
  EXPECT_EQ(transpose(w1).to_vector<float>(), squeeze(slice_axis(gate, 0, 2, 3), {0}).to_vector<float>());
}

TEST(HfImport, MixtralFusedExpertLayoutEqualsTheHubLayout) {
  // transformers 5 keeps a layer's experts fused (save_pretrained(save_original_format=
  // False) writes them so): mlp.gate.weight, mlp.experts.gate_up_proj [E, 2f, d] with the
  // gate rows first, mlp.experts.down_proj [E, d, f]. Built here from the hub-layout
  // fixture, it imports to the same parameters bit for bit.
  const interop::HfModel hub = interop::load_hf_model(kHfFixtures / "hf_mixtral");
  const interop::HfTensors files = interop::read_hf_tensors(kHfFixtures / "hf_mixtral");
  interop::HfTensors fused;
  for (const auto& [name, t] : files)
    if (name.find(".block_sparse_moe.") == std::string::npos) fused[name] = t;
  for (int64_t l = 0; l < hub.config.layers; ++l) {
    const std::string from = fmt::format("model.layers.{}.block_sparse_moe.", l);
    const std::string to = fmt::format("model.layers.{}.mlp.", l);
    fused[to + "gate.weight"] = files.at(from + "gate.weight");
    std::vector<Array> gate_up, down;
    for (int64_t e = 0; e < hub.config.moe_experts; ++e) {
      const std::string n = fmt::format("{}experts.{}.", from, e);
      gate_up.push_back(concatenate({files.at(n + "w1.weight").array, files.at(n + "w3.weight").array}, 0));
      down.push_back(files.at(n + "w2.weight").array);
    }
    fused[to + "experts.gate_up_proj"] = {stack(gate_up, 0).eval(), "fused"};
    fused[to + "experts.down_proj"] = {stack(down, 0).eval(), "fused"};
  }
  const Tree params = interop::params_from_hf(hub.config, fused, "fused");
  const std::vector<Array> got = params.leaves(), want = hub.params.leaves();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].to_vector<float>(), want[i].to_vector<float>()) << i;
}

TEST(HfImport, ConfigsMapToModelConfigs) {
  const interop::HfModel gpt2 = interop::load_hf_model(kHfFixtures / "hf_gpt2");
  EXPECT_EQ(gpt2.config.family, "gpt2");
  EXPECT_EQ(gpt2.config.vocab, 96);
  EXPECT_EQ(gpt2.config.dim, 32);
  EXPECT_EQ(gpt2.config.layers, 2);
  EXPECT_EQ(gpt2.config.heads, 4);
  EXPECT_EQ(gpt2.config.context, 32);
  EXPECT_EQ(gpt2.config.resolved_mlp_dim(), 128);
  EXPECT_TRUE(gpt2.config.resolved_tied());
  EXPECT_FALSE(gpt2.params.items().count("head"));
  const interop::HfModel llama = interop::load_hf_model(kHfFixtures / "hf_llama");
  EXPECT_EQ(llama.config.family, "llama");
  EXPECT_EQ(llama.config.resolved_kv_heads(), 2);
  EXPECT_EQ(llama.config.resolved_mlp_dim(), 64);
  EXPECT_EQ(llama.config.rope_theta, 10000.0);
  EXPECT_EQ(llama.config.norm_eps, 1e-5);
  EXPECT_FALSE(llama.config.resolved_tied());
  EXPECT_EQ(llama.config.vocab, 96);
  EXPECT_EQ(llama.params.at("head").leaf().shape(), Shape({32, 128}));  // padded to vocab_pad_to
  EXPECT_EQ(llama.config.padded_vocab(), 128);
  EXPECT_EQ(llama.config.rope_scaling, "none");
  const interop::HfModel llama31 = interop::load_hf_model(kHfFixtures / "hf_llama31");
  EXPECT_EQ(llama31.config.rope_theta, 100.0);
  EXPECT_EQ(llama31.config.rope_scaling, "llama3");
  EXPECT_EQ(llama31.config.rope_factor, 8.0);
  EXPECT_EQ(llama31.config.rope_low_freq_factor, 1.0);
  EXPECT_EQ(llama31.config.rope_high_freq_factor, 4.0);
  EXPECT_EQ(llama31.config.rope_original_context, 32);
  EXPECT_EQ(llama31.config.context, 64);
}

TEST(HfImport, ShardedEqualsSingleFileBitwise) {
  ASSERT_TRUE(std::filesystem::exists(kHfFixtures / "hf_llama_sharded/model.safetensors.index.json"));
  const interop::HfModel single = interop::load_hf_model(kHfFixtures / "hf_llama");
  const interop::HfModel sharded = interop::load_hf_model(kHfFixtures / "hf_llama_sharded");
  test::expect_trees_bitwise_equal(single.params, sharded.params);
}

TEST(HfImport, HubStyleNamesWithoutTransformerPrefix) {
  // Hub GPT-2 files name tensors "h.0.attn..." (GPT2Model's state dict) and may hold the
  // attn.bias causal-mask buffers; both import to the same parameters.
  interop::HfTensors tensors = interop::read_hf_tensors(kHfFixtures / "hf_gpt2");
  interop::HfTensors hub;
  for (auto& [name, t] : tensors) hub[name.substr(std::string("transformer.").size())] = t;
  hub["h.0.attn.bias"] = {Array::from_vector(std::vector<float>(16, 1.0f), {1, 1, 4, 4}), "x"};
  const interop::HfModel reference = interop::load_hf_model(kHfFixtures / "hf_gpt2");
  test::expect_trees_bitwise_equal(interop::params_from_hf(reference.config, hub, "hub"), reference.params);
}

json fixture_config(const std::string& name) { return test::read_json_file(kHfFixtures / name / "config.json"); }

std::string config_error(const json& config) {
  try {
    interop::model_config_from_hf(config, "x/config.json");
  } catch (const ValueError& e) {
    return e.what();
  }
  return "no error";
}

TEST(HfConfig, UnsupportedSettingsAreErrorsNamingKeyAndValue) {
  json c = fixture_config("hf_gpt2");
  c["model_type"] = "mistral";
  std::string e = config_error(c);
  EXPECT_NE(e.find("model_type \"mistral\" is not supported"), std::string::npos) << e;
  EXPECT_NE(e.find("gpt2 (GPT2LMHeadModel)"), std::string::npos) << e;
  EXPECT_NE(e.find("llama (LlamaForCausalLM)"), std::string::npos) << e;

  c = fixture_config("hf_gpt2");
  c["activation_function"] = "relu";
  e = config_error(c);
  EXPECT_NE(e.find("'activation_function' = \"relu\" is not supported"), std::string::npos) << e;
  EXPECT_NE(e.find("gelu_new"), std::string::npos) << e;

  c = fixture_config("hf_gpt2");
  c["scale_attn_by_inverse_layer_idx"] = true;
  e = config_error(c);
  EXPECT_NE(e.find("'scale_attn_by_inverse_layer_idx' = true is not supported"), std::string::npos) << e;

  c = fixture_config("hf_llama");
  c.erase("rope_parameters");
  c["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  e = config_error(c);
  EXPECT_NE(e.find("rope_scaling: 'rope_type' = \"linear\" is not supported (supported: default, llama3)"),
            std::string::npos)
      << e;

  c = fixture_config("hf_llama");
  c["rope_parameters"]["rope_type"] = "yarn";
  e = config_error(c);
  EXPECT_NE(e.find("'rope_type' = \"yarn\" is not supported"), std::string::npos) << e;

  c = fixture_config("hf_llama");
  c["hidden_act"] = "gelu";
  EXPECT_NE(config_error(c).find("'hidden_act' = \"gelu\""), std::string::npos);

  c = fixture_config("hf_llama");
  c["attention_bias"] = true;
  EXPECT_NE(config_error(c).find("'attention_bias' = true is not supported"), std::string::npos);

  c = fixture_config("hf_llama");
  c["head_dim"] = 16;
  EXPECT_NE(config_error(c).find("'head_dim' = 16 is not supported"), std::string::npos);

  c = fixture_config("hf_llama");
  c.erase("hidden_size");
  EXPECT_NE(config_error(c).find("'hidden_size' is missing"), std::string::npos);

  c = fixture_config("hf_llama");
  c["architectures"] = {"LlamaForSequenceClassification"};
  EXPECT_NE(config_error(c).find("architectures"), std::string::npos);
}

// Sizes past 2^31 are refused by name before any arithmetic on them: 4 * n_embd and
// head_dim * num_attention_heads overflowed int64 (found by fuzz_hf_config).
TEST(HfConfig, HugeSizesAreErrorsNamingTheKey) {
  json c = fixture_config("hf_gpt2");
  c["n_embd"] = int64_t{1} << 62;
  std::string e = config_error(c);
  EXPECT_NE(e.find("x/config.json: 'n_embd' = 4611686018427387904 is too large (expected a positive integer below "
                   "2^31)"),
            std::string::npos)
      << e;
  c = fixture_config("hf_llama");
  c["head_dim"] = int64_t{1} << 62;
  e = config_error(c);
  EXPECT_NE(e.find("'head_dim' = 4611686018427387904 is too large"), std::string::npos) << e;
  c = fixture_config("hf_llama");
  c["vocab_size"] = uint64_t{1} << 63;
  EXPECT_NE(config_error(c).find("'vocab_size' = 9223372036854775808 (expected a positive integer)"),
            std::string::npos);
}

TEST(HfConfig, BadLlama3RopeScalingIsAnErrorNamingTheKey) {
  auto error_with = [](const std::function<void(json&)>& edit) {
    json c = fixture_config("hf_llama31");
    edit(c["rope_parameters"]);
    return config_error(c);
  };
  std::string e = error_with([](json& p) { p["factor"] = 0.0; });
  EXPECT_NE(e.find("rope_parameters: 'factor' = 0.0 (expected a positive number)"), std::string::npos) << e;
  e = error_with([](json& p) { p["factor"] = -8; });
  EXPECT_NE(e.find("'factor' = -8 (expected a positive number)"), std::string::npos) << e;
  e = error_with([](json& p) { p["high_freq_factor"] = 1.0; });
  EXPECT_NE(e.find("'high_freq_factor' = 1 must be greater than 'low_freq_factor' = 1"), std::string::npos) << e;
  e = error_with([](json& p) { p["low_freq_factor"] = 0; });
  EXPECT_NE(e.find("'low_freq_factor' = 0 (expected a positive number)"), std::string::npos) << e;
  e = error_with([](json& p) { p.erase("factor"); });
  EXPECT_NE(e.find("'factor' is missing"), std::string::npos) << e;
  e = error_with([](json& p) { p["original_max_position_embeddings"] = 8.5; });
  EXPECT_NE(e.find("'original_max_position_embeddings' = 8.5 (expected a positive integer)"), std::string::npos) << e;
  e = error_with([](json& p) { p["rope_type"] = "yarn"; });
  EXPECT_NE(e.find("'rope_type' = \"yarn\" is not supported (supported: default, llama3)"), std::string::npos) << e;
  // A parameter of another rope type would silently change nothing: refused.
  e = error_with([](json& p) { p["attention_factor"] = 0.5; });
  EXPECT_NE(e.find("'rope_parameters.attention_factor' = 0.5 is not supported"), std::string::npos) << e;
  json both = fixture_config("hf_llama31");
  both["rope_scaling"] = both["rope_parameters"];
  e = config_error(both);
  EXPECT_NE(e.find("both 'rope_scaling' and 'rope_parameters'"), std::string::npos) << e;
}

TEST(HfConfig, TransformersFourLlama3RopeScalingIsAccepted) {
  // Meta's Llama 3.1 config.json form: rope_theta at the top, rope_scaling with "rope_type"
  // (older files: "type"); original_max_position_embeddings defaults to
  // max_position_embeddings, and a top-level one wins (as in transformers).
  const models::ModelConfig v5 = interop::model_config_from_hf(fixture_config("hf_llama31"), "x");
  for (const char* type_key : {"rope_type", "type"}) {
    SCOPED_TRACE(type_key);
    json c = fixture_config("hf_llama31");
    c["rope_scaling"] = c["rope_parameters"];
    c.erase("rope_parameters");
    c["rope_scaling"].erase("rope_theta");
    c["rope_scaling"].erase("rope_type");
    c["rope_scaling"][type_key] = "llama3";
    c["rope_theta"] = 100.0;
    const models::ModelConfig v4 = interop::model_config_from_hf(c, "x");
    EXPECT_EQ(v4.rope_scaling, "llama3");
    EXPECT_EQ(v4.rope_theta, v5.rope_theta);
    EXPECT_EQ(v4.rope_factor, v5.rope_factor);
    EXPECT_EQ(v4.rope_low_freq_factor, v5.rope_low_freq_factor);
    EXPECT_EQ(v4.rope_high_freq_factor, v5.rope_high_freq_factor);
    EXPECT_EQ(v4.rope_original_context, v5.rope_original_context);
    c["rope_scaling"].erase("original_max_position_embeddings");
    EXPECT_EQ(interop::model_config_from_hf(c, "x").rope_original_context, 64);
    c["original_max_position_embeddings"] = 48;
    EXPECT_EQ(interop::model_config_from_hf(c, "x").rope_original_context, 48);
  }
}

TEST(HfConfig, TransformersFourRopeKeysAreAccepted) {
  json c = fixture_config("hf_llama");
  c.erase("rope_parameters");
  c["rope_theta"] = 500000.0;
  c["rope_scaling"] = nullptr;
  EXPECT_EQ(interop::model_config_from_hf(c, "x").rope_theta, 500000.0);
}

}  // namespace
TEST(HfConfig, MixtralSettingsTesseraCannotComputeAreErrors) {
  json c = fixture_config("hf_mixtral");
  c["router_jitter_noise"] = 0.1;
  std::string e = config_error(c);
  EXPECT_NE(e.find("'router_jitter_noise' = 0.1 is not supported"), std::string::npos) << e;
  c = fixture_config("hf_mixtral");
  c["sliding_window"] = 16;
  e = config_error(c);
  EXPECT_NE(e.find("'sliding_window' = 16 is not supported (tessera attends to the whole context of 32)"),
            std::string::npos)
      << e;
  c = fixture_config("hf_mixtral");
  c["num_experts_per_tok"] = 5;
  e = config_error(c);
  EXPECT_NE(e.find("moe_top_k = 5 must be between 1 and moe_experts = 4"), std::string::npos) << e;
  c = fixture_config("hf_mixtral");
  c["architectures"] = {"LlamaForCausalLM"};
  e = config_error(c);
  EXPECT_NE(e.find("(supported: [\"MixtralForCausalLM\"])"), std::string::npos) << e;
  // Exported back, the config says mixtral with the same experts.
  const json out = interop::hf_config_from_model(interop::model_config_from_hf(fixture_config("hf_mixtral"), "x"), {});
  EXPECT_EQ(out.at("model_type"), "mixtral");
  EXPECT_EQ(out.at("num_local_experts"), 4);
  EXPECT_EQ(out.at("num_experts_per_tok"), 2);
}

}  // namespace tessera
