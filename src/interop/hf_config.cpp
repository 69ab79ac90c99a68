#include "tessera/interop/hf_config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdint>
#include <limits>

#include "tessera/base/error.h"

namespace tessera::interop {
namespace {

using nlohmann::json;

struct Family {
  const char* model_type;
  const char* architecture;
  const char* family;  // tessera's
};

constexpr Family kFamilies[] = {{"gpt2", "GPT2LMHeadModel", "gpt2"},
                                {"llama", "LlamaForCausalLM", "llama"},
                                {"mixtral", "MixtralForCausalLM", "llama"}};

// Typed reads of config.json keys; a wrong type or a missing required key names both.
class Reader {
 public:
  Reader(const json& config, std::string origin) : config_(config), origin_(std::move(origin)) {}

  bool has(const char* key) const { return config_.contains(key) && !config_[key].is_null(); }

  int64_t integer(const char* key) const {
    if (!has(key)) fail<ValueError>("{}: '{}' is missing (a positive integer is required)", origin_, key);
    const json& v = config_[key];
    if (!v.is_number_integer() || v.get<int64_t>() <= 0)
      fail<ValueError>("{}: '{}' = {} (expected a positive integer)", origin_, key, v.dump());
    // Every size of a model is far below 2^31 (vocab must fit int32 token ids); the bound
    // keeps products such as 4 * n_embd or head_dim * heads from overflowing int64.
    if (v.get<int64_t>() > std::numeric_limits<int32_t>::max())
      fail<ValueError>("{}: '{}' = {} is too large (expected a positive integer below 2^31)", origin_, key, v.dump());
    return v.get<int64_t>();
  }
  int64_t integer_or(const char* key, int64_t fallback) const { return has(key) ? integer(key) : fallback; }

  double number(const char* key) const {
    if (!has(key)) fail<ValueError>("{}: '{}' is missing (a positive number is required)", origin_, key);
    const json& v = config_[key];
    if (!v.is_number() || !(v.get<double>() > 0))
      fail<ValueError>("{}: '{}' = {} (expected a positive number)", origin_, key, v.dump());
    return v.get<double>();
  }
  double number_or(const char* key, double fallback) const { return has(key) ? number(key) : fallback; }
  // A number >= 0 (a coefficient that may be 0).
  double non_negative_or(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    const json& v = config_[key];
    if (!v.is_number() || !(v.get<double>() >= 0))
      fail<ValueError>("{}: '{}' = {} (expected a number >= 0)", origin_, key, v.dump());
    return v.get<double>();
  }

  bool boolean_or(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!config_[key].is_boolean())
      fail<ValueError>("{}: '{}' = {} (expected true or false)", origin_, key, config_[key].dump());
    return config_[key].get<bool>();
  }

  // A boolean that tessera supports only at one value (the model would compute
  // something else otherwise).
  void require_bool(const char* key, bool fallback, bool supported, const char* why) const {
    const bool value = boolean_or(key, fallback);
    if (value != supported)
      fail<ValueError>("{}: '{}' = {} is not supported (tessera supports {}: {})", origin_, key, value, supported, why);
  }

  void require_string(const char* key, const char* fallback, const std::vector<std::string>& supported) const {
    const std::string value = has(key) && config_[key].is_string() ? config_[key].get<std::string>() : fallback;
    if (has(key) && !config_[key].is_string())
      fail<ValueError>("{}: '{}' = {} (expected a string)", origin_, key, config_[key].dump());
    for (const std::string& s : supported)
      if (value == s) return;
    fail<ValueError>("{}: '{}' = \"{}\" is not supported (supported: {})", origin_, key, value,
                     fmt::join(supported, ", "));
  }

  const json& raw(const char* key) const { return config_[key]; }
  const std::string& origin() const { return origin_; }

 private:
  const json& config_;
  std::string origin_;
};

models::ModelConfig gpt2_from_hf(const Reader& r) {
  models::ModelConfig c;
  c.family = "gpt2";
  c.vocab = r.integer("vocab_size");
  c.context = r.integer("n_positions");
  c.dim = r.integer("n_embd");
  c.layers = r.integer("n_layer");
  c.heads = r.integer("n_head");
  c.mlp_dim = r.integer_or("n_inner", 4 * c.dim);  // null: 4 * n_embd
  if (c.mlp_dim == 4 * c.dim) c.mlp_dim = 0;       // tessera's gpt2 default says the same
  c.norm_eps = r.number_or("layer_norm_epsilon", 1e-5);
  r.require_string("activation_function", "gelu_new", {"gelu_new", "gelu_pytorch_tanh"});
  r.require_bool("scale_attn_weights", true, true, "attention scores scaled by 1/sqrt(head_dim)");
  r.require_bool("scale_attn_by_inverse_layer_idx", false, false, "no per-layer attention scaling");
  r.require_bool("reorder_and_upcast_attn", false, false, "the plain attention order");
  r.require_bool("add_cross_attention", false, false, "a decoder-only model");
  c.tied_embeddings = r.boolean_or("tie_word_embeddings", true);
  return c;
}

// RoPE, in either transformers' form:
//   4: rope_theta at the top level, rope_scaling null or {"rope_type" (or "type"): ..., parameters}
//   5: rope_parameters {"rope_type": ..., "rope_theta": ..., parameters}
// (transformers 5 reads either object the same way: a rope_theta inside wins).
// rope_type "default" is plain RoPE; "llama3" takes factor, low_freq_factor,
// high_freq_factor and original_max_position_embeddings (default: max_position_embeddings,
// overridden by a top-level original_max_position_embeddings, as transformers does).
// Any other type or parameter is refused: the model would compute something else.
void read_llama_rope(const Reader& r, models::ModelConfig& c) {
  c.rope_theta = r.number_or("rope_theta", 10000.0);
  if (r.has("rope_scaling") && r.has("rope_parameters"))
    fail<ValueError>("{}: both 'rope_scaling' and 'rope_parameters' are set (expected one of them)", r.origin());
  const char* section = r.has("rope_scaling") ? "rope_scaling" : "rope_parameters";
  if (!r.has(section)) return;
  const json& p = r.raw(section);
  if (!p.is_object()) fail<ValueError>("{}: '{}' = {} (expected an object)", r.origin(), section, p.dump());
  const Reader rope(p, fmt::format("{}: {}", r.origin(), section));
  const char* type_key = rope.has("rope_type") || !rope.has("type") ? "rope_type" : "type";
  rope.require_string(type_key, "default", {"default", "llama3"});
  const bool llama3 = rope.has(type_key) && rope.raw(type_key) == "llama3";
  for (const auto& [key, value] : p.items()) {
    const bool known = key == "rope_type" || key == "type" || key == "rope_theta" ||
                       (llama3 && (key == "factor" || key == "low_freq_factor" || key == "high_freq_factor" ||
                                   key == "original_max_position_embeddings"));
    if (!known && !value.is_null())
      fail<ValueError>(
          "{}: '{}.{}' = {} is not supported (tessera's rope_type \"{}\" takes {})", r.origin(), section, key,
          value.dump(), llama3 ? "llama3" : "default",
          llama3 ? "factor, low_freq_factor, high_freq_factor, original_max_position_embeddings" : "only rope_theta");
  }
  c.rope_theta = rope.number_or("rope_theta", c.rope_theta);
  if (!llama3) return;
  c.rope_scaling = "llama3";
  c.rope_factor = rope.number("factor");
  c.rope_low_freq_factor = rope.number("low_freq_factor");
  c.rope_high_freq_factor = rope.number("high_freq_factor");
  if (!(c.rope_high_freq_factor > c.rope_low_freq_factor))
    fail<ValueError>("{}: 'high_freq_factor' = {} must be greater than 'low_freq_factor' = {}", rope.origin(),
                     c.rope_high_freq_factor, c.rope_low_freq_factor);
  c.rope_original_context =
      r.integer_or("original_max_position_embeddings", rope.integer_or("original_max_position_embeddings", c.context));
}

models::ModelConfig llama_from_hf(const Reader& r) {
  models::ModelConfig c;
  c.family = "llama";
  c.vocab = r.integer("vocab_size");
  c.dim = r.integer("hidden_size");
  c.mlp_dim = r.integer("intermediate_size");
  c.layers = r.integer("num_hidden_layers");
  c.heads = r.integer("num_attention_heads");
  c.kv_heads = r.integer_or("num_key_value_heads", c.heads);
  c.context = r.integer("max_position_embeddings");
  c.norm_eps = r.number_or("rms_norm_eps", 1e-6);  // LlamaConfig's default
  read_llama_rope(r, c);
  c.tied_embeddings = r.boolean_or("tie_word_embeddings", false);
  r.require_string("hidden_act", "silu", {"silu"});
  r.require_bool("attention_bias", false, false, "no q/k/v/o biases");
  r.require_bool("mlp_bias", false, false, "no MLP biases");
  if (r.has("head_dim") && r.integer("head_dim") * c.heads != c.dim)
    fail<ValueError>("{}: 'head_dim' = {} is not supported (tessera needs hidden_size / num_attention_heads = {})",
                     r.origin(), r.integer("head_dim"), c.dim / c.heads);
  return c;
}

// Mixtral: Llama's attention and norms with a sparse MoE block per layer (nn/moe.h), as
// transformers computes it: dropless, top num_experts_per_tok of num_local_experts,
// renormalized gates. Router jitter (a training-time noise) and a sliding window shorter
// than the context would compute something else and are refused.
models::ModelConfig mixtral_from_hf(const Reader& r) {
  models::ModelConfig c = llama_from_hf(r);
  c.moe_experts = r.integer("num_local_experts");
  c.moe_top_k = r.integer("num_experts_per_tok");
  c.moe_capacity_factor = 0;
  c.moe_aux_loss_coef = r.non_negative_or("router_aux_loss_coef", 0.001);  // MixtralConfig's default
  if (r.non_negative_or("router_jitter_noise", 0) != 0)
    fail<ValueError>("{}: 'router_jitter_noise' = {} is not supported (tessera's router has no jitter: 0)", r.origin(),
                     r.raw("router_jitter_noise").dump());
  if (r.has("sliding_window") && r.integer("sliding_window") < c.context)
    fail<ValueError>("{}: 'sliding_window' = {} is not supported (tessera attends to the whole context of {})",
                     r.origin(), r.integer("sliding_window"), c.context);
  return c;
}

}  // namespace

std::vector<std::string> supported_hf_model_types() {
  std::vector<std::string> out;
  for (const Family& f : kFamilies) out.push_back(fmt::format("{} ({})", f.model_type, f.architecture));
  return out;
}

models::ModelConfig model_config_from_hf(const json& config, const std::string& origin) {
  if (!config.is_object()) fail<ValueError>("{}: expected a JSON object", origin);
  const Reader r(config, origin);
  if (!config.contains("model_type") || !config["model_type"].is_string())
    fail<ValueError>("{}: 'model_type' is missing (supported: {})", origin,
                     fmt::join(supported_hf_model_types(), ", "));
  const std::string model_type = config["model_type"].get<std::string>();
  const Family* family = nullptr;
  for (const Family& f : kFamilies)
    if (model_type == f.model_type) family = &f;
  if (family == nullptr)
    fail<ValueError>("{}: model_type \"{}\" is not supported (supported: {})", origin, model_type,
                     fmt::join(supported_hf_model_types(), ", "));
  if (r.has("architectures")) {
    const json& archs = config["architectures"];
    if (!archs.is_array() || archs.size() != 1 || archs[0] != family->architecture)
      fail<ValueError>("{}: architectures = {} is not supported for model_type \"{}\" (supported: [\"{}\"])", origin,
                       archs.dump(), model_type, family->architecture);
  }
  models::ModelConfig c = model_type == "gpt2"      ? gpt2_from_hf(r)
                          : model_type == "mixtral" ? mixtral_from_hf(r)
                                                    : llama_from_hf(r);
  try {
    c.validate();
  } catch (const ValueError& e) {
    fail<ValueError>("{}: {}", origin, e.what());
  }
  return c;
}

json hf_config_from_model(const models::ModelConfig& c, const HfConfigOptions& options) {
  c.validate();
  if (options.dtype != "float32" && options.dtype != "bfloat16")
    fail<ValueError>("hf config: dtype \"{}\" is not supported (float32 or bfloat16)", options.dtype);
  json out = json::object();
  if (c.family == "gpt2") {
    out["architectures"] = {"GPT2LMHeadModel"};
    out["model_type"] = "gpt2";
    out["vocab_size"] = c.vocab;
    out["n_positions"] = c.context;
    out["n_embd"] = c.dim;
    out["n_layer"] = c.layers;
    out["n_head"] = c.heads;
    out["n_inner"] = c.resolved_mlp_dim();
    out["layer_norm_epsilon"] = c.norm_eps;
    out["activation_function"] = "gelu_new";
    out["scale_attn_weights"] = true;
    out["scale_attn_by_inverse_layer_idx"] = false;
    out["reorder_and_upcast_attn"] = false;
    // Inference as trained: dropout is a training-time choice of the importer.
    for (const char* key : {"resid_pdrop", "embd_pdrop", "attn_pdrop"}) out[key] = 0.0;
  } else {
    out["architectures"] = {c.moe() ? "MixtralForCausalLM" : "LlamaForCausalLM"};
    out["model_type"] = c.moe() ? "mixtral" : "llama";
    out["vocab_size"] = c.vocab;
    out["hidden_size"] = c.dim;
    out["intermediate_size"] = c.resolved_mlp_dim();
    out["num_hidden_layers"] = c.layers;
    out["num_attention_heads"] = c.heads;
    out["num_key_value_heads"] = c.resolved_kv_heads();
    out["head_dim"] = c.head_dim();
    out["max_position_embeddings"] = c.context;
    out["rms_norm_eps"] = c.norm_eps;
    out["rope_theta"] = c.rope_theta;
    // transformers 4's form (Meta's Llama 3.1 configs), which transformers 5 reads too.
    out["rope_scaling"] = nullptr;
    if (c.rope_scaling == "llama3")
      out["rope_scaling"] = {{"rope_type", "llama3"},
                             {"factor", c.rope_factor},
                             {"low_freq_factor", c.rope_low_freq_factor},
                             {"high_freq_factor", c.rope_high_freq_factor},
                             {"original_max_position_embeddings", c.rope_original_context}};
    out["hidden_act"] = "silu";
    out["attention_bias"] = false;
    out["mlp_bias"] = false;
    out["attention_dropout"] = 0.0;
    if (c.moe()) {
      // transformers' Mixtral is dropless: a model trained with a capacity factor runs
      // there (and in tessera's HF import) without dropping tokens.
      out["num_local_experts"] = c.moe_experts;
      out["num_experts_per_tok"] = c.moe_top_k;
      out["router_aux_loss_coef"] = c.moe_aux_loss_coef;
      out["router_jitter_noise"] = 0.0;
      out["sliding_window"] = nullptr;
      out["output_router_logits"] = false;
      out.erase("mlp_bias");
      out.erase("attention_bias");
    }
  }
  out["tie_word_embeddings"] = c.resolved_tied();
  out["torch_dtype"] = options.dtype;
  // Unknown ids are written as null: absent, transformers would fill in GPT-2's 50256.
  out["bos_token_id"] = options.bos_token_id ? json(*options.bos_token_id) : json(nullptr);
  out["eos_token_id"] = options.eos_token_id ? json(*options.eos_token_id) : json(nullptr);
  return out;
}

}  // namespace tessera::interop
