#include "tessera/models/model.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <utility>

#include "tessera/base/error.h"
#include "tessera/core/checkpoint.h"
#include "tessera/core/ops.h"
#include "tessera/core/random.h"
#include "tessera/nn/attention.h"
#include "tessera/nn/dropout.h"
#include "tessera/nn/layer_norm.h"
#include "tessera/nn/mlp.h"
#include "tessera/nn/moe.h"
#include "tessera/nn/rms_norm.h"

namespace tessera::models {

void ModelConfig::validate() const {
  if (family != "gpt2" && family != "llama")
    fail<ValueError>("ModelConfig: family '{}' is unknown (expected 'gpt2' or 'llama')", family);
  auto positive = [](const char* field, int64_t value) {
    if (value <= 0) fail<ValueError>("ModelConfig: {} = {} must be positive", field, value);
  };
  positive("vocab", vocab);
  positive("dim", dim);
  positive("layers", layers);
  positive("heads", heads);
  positive("context", context);
  if (kv_heads < 0) fail<ValueError>("ModelConfig: kv_heads = {} must be >= 0 (0: = heads)", kv_heads);
  if (mlp_dim < 0) fail<ValueError>("ModelConfig: mlp_dim = {} must be >= 0 (0: the family default)", mlp_dim);
  if (vocab > (int64_t{1} << 31)) fail<ValueError>("ModelConfig: vocab = {} does not fit int32 token ids", vocab);
  if (vocab_pad_to < 1 || vocab_pad_to > 65536)
    fail<ValueError>("ModelConfig: vocab_pad_to = {} must be in [1, 65536] (1: no padding)", vocab_pad_to);
  if (dim % heads != 0) fail<ValueError>("ModelConfig: dim = {} is not a multiple of heads = {}", dim, heads);
  if (heads % resolved_kv_heads() != 0)
    fail<ValueError>("ModelConfig: heads = {} is not a multiple of kv_heads = {}", heads, resolved_kv_heads());
  if (family == "llama" && head_dim() % 2 != 0)
    fail<ValueError>("ModelConfig: llama's RoPE needs an even head_dim (dim {} / heads {} = {})", dim, heads,
                     head_dim());
  if (!(dropout >= 0 && dropout < 1)) fail<ValueError>("ModelConfig: dropout = {} must be in [0, 1)", dropout);
  if (!(norm_eps > 0)) fail<ValueError>("ModelConfig: norm_eps = {} must be positive", norm_eps);
  if (!(rope_theta > 0)) fail<ValueError>("ModelConfig: rope_theta = {} must be positive", rope_theta);
  if (rope_scaling != "none" && rope_scaling != "llama3")
    fail<ValueError>("ModelConfig: rope_scaling = '{}' is unknown (expected 'none' or 'llama3')", rope_scaling);
  if (rope_scaling != "none" && family != "llama")
    fail<ValueError>("ModelConfig: rope_scaling = '{}' needs family 'llama' (family '{}' has no RoPE)", rope_scaling,
                     family);
  if (remat != "none" && remat != "full" && remat != "offload")
    fail<ValueError>("ModelConfig: remat = '{}' is unknown (expected one of: none, full, offload)", remat);
  if (!(rope_factor > 0)) fail<ValueError>("ModelConfig: rope_factor = {} must be positive", rope_factor);
  if (!(rope_low_freq_factor > 0))
    fail<ValueError>("ModelConfig: rope_low_freq_factor = {} must be positive", rope_low_freq_factor);
  if (!(rope_high_freq_factor > rope_low_freq_factor))
    fail<ValueError>("ModelConfig: rope_high_freq_factor = {} must be greater than rope_low_freq_factor = {}",
                     rope_high_freq_factor, rope_low_freq_factor);
  if (rope_original_context <= 0)
    fail<ValueError>("ModelConfig: rope_original_context = {} must be positive", rope_original_context);
  if (!(init_std > 0) || !std::isfinite(init_std))
    fail<ValueError>("ModelConfig: init_std = {} must be positive and finite", init_std);
  const DType dtype = compute();
  for (size_t i = 0; i < quant_targets.size(); ++i) {
    const std::string& t = quant_targets[i];
    if (t != "attention" && t != "mlp" && t != "head")
      fail<ValueError>(
          "ModelConfig: quant target '{}' (quant.targets) is unknown (expected 'attention', 'mlp' or 'head')", t);
    if (std::find(quant_targets.begin(), quant_targets.begin() + static_cast<std::ptrdiff_t>(i), t) !=
        quant_targets.begin() + static_cast<std::ptrdiff_t>(i))
      fail<ValueError>("ModelConfig: quant target '{}' is listed twice in quant.targets", t);
  }
  if (quant_backward != "int8" && quant_backward != "float")
    fail<ValueError>("ModelConfig: quant.backward = '{}' is unknown (expected 'int8' or 'float')", quant_backward);
  if (!quant_targets.empty() && dtype == DType::Float16)
    fail<ValueError>(
        "ModelConfig: int8 matmuls (quant.targets) need model.compute_dtype float32 or bfloat16 (got float16)");
  if (moe_experts < 0) fail<ValueError>("ModelConfig: moe_experts = {} must be >= 0 (0: no experts)", moe_experts);
  if (moe()) {
    if (family != "llama")
      fail<ValueError>("ModelConfig: moe_experts = {} needs family 'llama' (Mixtral's SwiGLU experts; got '{}')",
                       moe_experts, family);
    if (moe_top_k < 1 || moe_top_k > moe_experts)
      fail<ValueError>("ModelConfig: moe_top_k = {} must be between 1 and moe_experts = {}", moe_top_k, moe_experts);
    if (!(moe_capacity_factor >= 0) || !std::isfinite(moe_capacity_factor))
      fail<ValueError>("ModelConfig: moe_capacity_factor = {} must be >= 0 (0: dropless)", moe_capacity_factor);
    if (moe_groups < 0) fail<ValueError>("ModelConfig: moe_groups = {} must be >= 0 (0: automatic)", moe_groups);
    if (!(moe_aux_loss_coef >= 0) || !std::isfinite(moe_aux_loss_coef))
      fail<ValueError>("ModelConfig: moe_aux_loss_coef = {} must be >= 0", moe_aux_loss_coef);
    if (remat != "none")
      fail<ValueError>("ModelConfig: remat = '{}' with experts (moe_experts = {}) is not supported yet; use 'none'",
                       remat, moe_experts);
    if (quantized("mlp"))
      fail<ValueError>("ModelConfig: int8 'mlp' matmuls (quant.targets) with experts are not supported yet");
  }
}

bool ModelConfig::quantized(const std::string& target) const {
  return std::find(quant_targets.begin(), quant_targets.end(), target) != quant_targets.end();
}

bool ModelConfig::needs_step_key() const { return dropout > 0 || (!quant_targets.empty() && quant_backward == "int8"); }

DType ModelConfig::compute() const {
  if (compute_dtype == "float32") return DType::Float32;
  if (compute_dtype == "bfloat16") return DType::BFloat16;
  if (compute_dtype == "float16") return DType::Float16;
  fail<ValueError>("ModelConfig: compute_dtype = '{}' is unknown (expected one of: float32, bfloat16, float16)",
                   compute_dtype);
}

int64_t ModelConfig::padded_vocab() const {
  const int64_t multiple = std::max<int64_t>(vocab_pad_to, 1);
  return (vocab + multiple - 1) / multiple * multiple;
}

int64_t ModelConfig::resolved_kv_heads() const { return kv_heads == 0 ? heads : kv_heads; }

int64_t ModelConfig::resolved_mlp_dim() const {
  if (mlp_dim > 0) return mlp_dim;
  if (family == "llama") {
    // Llama: int(2/3 * 4 dim), rounded up to a multiple of 256.
    const int64_t hidden = 8 * dim / 3;
    return (hidden + 255) / 256 * 256;
  }
  return 4 * dim;
}

bool ModelConfig::resolved_tied() const { return tied_embeddings.value_or(family == "gpt2"); }

std::optional<nn::Llama3RopeScaling> ModelConfig::rope_llama3() const {
  if (rope_scaling != "llama3") return std::nullopt;
  return nn::Llama3RopeScaling{.factor = rope_factor,
                               .low_freq_factor = rope_low_freq_factor,
                               .high_freq_factor = rope_high_freq_factor,
                               .original_context = rope_original_context};
}

ModelConfig preset(const std::string& name) {
  ModelConfig c;
  if (name == "tiny") {
    c = {.family = "gpt2", .vocab = 256, .dim = 256, .layers = 4, .heads = 4, .context = 256};
  } else if (name == "small") {
    c = {.family = "gpt2", .vocab = 4096, .dim = 384, .layers = 6, .heads = 6, .context = 256};
  } else if (name == "gpt2-124m") {
    c = {.family = "gpt2", .vocab = 50257, .dim = 768, .layers = 12, .heads = 12, .context = 1024};
  } else if (name == "gpt2-350m") {
    c = {.family = "gpt2", .vocab = 50257, .dim = 1024, .layers = 24, .heads = 16, .context = 1024};
  } else if (name == "llama-tiny") {
    c = {.family = "llama", .vocab = 256, .dim = 256, .layers = 4, .heads = 4, .kv_heads = 2, .context = 256};
  } else if (name == "llama-1b") {
    c = {.family = "llama",
         .vocab = 32000,
         .dim = 2048,
         .layers = 16,
         .heads = 32,
         .kv_heads = 8,
         .mlp_dim = 8192,
         .context = 2048};
  } else if (name == "llama2-7b" || name == "llama2-70b") {
    // Llama 2 (Touvron et al. 2023, Table 1 and the released config.json files).
    const bool big = name == "llama2-70b";
    c = {.family = "llama",
         .vocab = 32000,
         .dim = big ? 8192 : 4096,
         .layers = big ? 80 : 32,
         .heads = big ? 64 : 32,
         .kv_heads = big ? 8 : 32,
         .mlp_dim = big ? 28672 : 11008,
         .context = 4096};
  } else if (name == "llama3.1-8b" || name == "llama3.1-70b") {
    // Llama 3.1 (the released config.json files): trained at 8192 tokens, then extended.
    const bool big = name == "llama3.1-70b";
    c = {.family = "llama",
         .vocab = 128256,
         .dim = big ? 8192 : 4096,
         .layers = big ? 80 : 32,
         .heads = big ? 64 : 32,
         .kv_heads = 8,
         .mlp_dim = big ? 28672 : 14336,
         .context = 8192,
         .rope_theta = 500000.0};
  } else if (name == "mixtral-tiny") {
    c = {.family = "llama",
         .vocab = 256,
         .dim = 128,
         .layers = 2,
         .heads = 4,
         .kv_heads = 2,
         .mlp_dim = 256,
         .context = 256,
         .moe_experts = 4,
         .moe_top_k = 2};
  } else if (name == "mixtral-8x7b") {
    // Mixtral-8x7B-v0.1's config.json: 8 experts, 2 per token, rope_theta 1e6, 32k context.
    c = {.family = "llama",
         .vocab = 32000,
         .dim = 4096,
         .layers = 32,
         .heads = 32,
         .kv_heads = 8,
         .mlp_dim = 14336,
         .context = 32768,
         .rope_theta = 1e6,
         .moe_experts = 8,
         .moe_top_k = 2};
  } else {
    fail<ValueError>("preset: unknown model '{}' (known: {})", name, fmt::join(preset_names(), ", "));
  }
  return c;
}

std::vector<std::string> preset_names() {
  return {"tiny",      "small",      "gpt2-124m",   "gpt2-350m",    "llama-tiny",   "llama-1b",
          "llama2-7b", "llama2-70b", "llama3.1-8b", "llama3.1-70b", "mixtral-tiny", "mixtral-8x7b"};
}

namespace {

bool is_gpt2(const ModelConfig& c) { return c.family == "gpt2"; }

double residual_std(const ModelConfig& c) { return c.init_std / std::sqrt(2.0 * static_cast<double>(c.layers)); }

nn::Attention attention_of(const ModelConfig& c) {
  return nn::Attention{.dim = c.dim,
                       .heads = c.heads,
                       .kv_heads = c.resolved_kv_heads(),
                       .bias = is_gpt2(c),
                       .rope = !is_gpt2(c),
                       .rope_theta = c.rope_theta,
                       .rope_llama3 = c.rope_llama3(),
                       .init_std = c.init_std,
                       .out_std = residual_std(c)};
}

nn::GeluMLP gelu_mlp_of(const ModelConfig& c) {
  return {
      .dim = c.dim, .hidden = c.resolved_mlp_dim(), .bias = true, .init_std = c.init_std, .out_std = residual_std(c)};
}

nn::SwiGLU swiglu_of(const ModelConfig& c) {
  return {.dim = c.dim, .hidden = c.resolved_mlp_dim(), .init_std = c.init_std, .out_std = residual_std(c)};
}

nn::MoE moe_of(const ModelConfig& c) {
  return {.dim = c.dim,
          .hidden = c.resolved_mlp_dim(),
          .experts = c.moe_experts,
          .top_k = c.moe_top_k,
          .groups = c.moe_groups,
          .capacity_factor = c.moe_capacity_factor,
          .init_std = c.init_std,
          .out_std = residual_std(c)};
}

// gpt2: LayerNorm with bias; llama: RMSNorm. Both keep "scale" (and gpt2 "bias").
Tree norm_init(const ModelConfig& c, nn::ParamScope scope) {
  if (is_gpt2(c)) return nn::LayerNorm{c.dim, c.norm_eps, true}.init(std::move(scope));
  return nn::RMSNorm{c.dim, c.norm_eps}.init(std::move(scope));
}

Array norm_apply(const ModelConfig& c, const Tree& p, const Array& x) {
  if (is_gpt2(c)) return nn::LayerNorm{c.dim, c.norm_eps, true}(p, x);
  return nn::RMSNorm{c.dim, c.norm_eps}(p, x);
}

// {"wte", ["wpe"], "layers": [{"ln1", "attn", "ln2", "mlp"}...], "lnf", ["head"]}.
Tree build_params(const ModelConfig& c, const nn::ParamScope& scope) {
  using nn::Initializer;
  using nn::ParamKind;
  Tree p;
  p["wte"] = scope.param("wte", {.shape = {c.padded_vocab(), c.dim},
                                 .axes = {"vocab", "embed"},
                                 .init = Initializer::normal(c.init_std),
                                 .kind = ParamKind::Embedding});
  if (is_gpt2(c))
    p["wpe"] = scope.param("wpe", {.shape = {c.context, c.dim},
                                   .axes = {"position", "embed"},
                                   .init = Initializer::normal(c.init_std),
                                   .kind = ParamKind::Embedding});
  const nn::Attention attention = attention_of(c);
  std::vector<Tree> layers;
  nn::ParamScope layer_scope = scope.child("layers");
  for (int64_t l = 0; l < c.layers; ++l) {
    nn::ParamScope s = layer_scope.child(static_cast<size_t>(l));
    Tree layer;
    layer["ln1"] = norm_init(c, s.child("ln1"));
    layer["attn"] = attention.init(s.child("attn"));
    layer["ln2"] = norm_init(c, s.child("ln2"));
    if (c.moe())
      layer["moe"] = moe_of(c).init(s.child("moe"));
    else
      layer["mlp"] = is_gpt2(c) ? gelu_mlp_of(c).init(s.child("mlp")) : swiglu_of(c).init(s.child("mlp"));
    layers.push_back(std::move(layer));
  }
  p["layers"] = Tree::list(std::move(layers));
  p["lnf"] = norm_init(c, scope.child("lnf"));
  if (!c.resolved_tied())
    p["head"] = scope.param("head", {.shape = {c.dim, c.padded_vocab()},
                                     .axes = {"embed", "vocab"},
                                     .init = Initializer::normal(c.init_std),
                                     .kind = ParamKind::Weight});
  return p;
}

void check_tokens(const ModelConfig& c, const Array& tokens, int64_t cached, const char* op) {
  if (tokens.ndim() != 2 || !is_integral(tokens.dtype()))
    fail<ShapeError>("Model::{}: tokens are {} (expected integer ids [batch, seq])", op, type_string(tokens));
  const int64_t t = tokens.shape(1);
  if (t < 1 || tokens.shape(0) < 1)
    fail<ShapeError>("Model::{}: tokens of shape {} are empty", op, to_string(tokens.shape()));
  if (cached + t > c.context) {
    if (cached == 0) fail<ValueError>("Model::{}: {} tokens exceed the context of {}", op, t, c.context);
    fail<ValueError>("Model::{}: cache length {} + {} new tokens = {} exceeds the context of {}", op, cached, t,
                     cached + t, c.context);
  }
  // Values are checked when they are known (not while jit traces placeholders).
  if (tokens.is_evaluated()) {
    std::vector<int64_t> ids = tokens.to_vector<int64_t>();
    for (size_t i = 0; i < ids.size(); ++i)
      if (ids[i] < 0 || ids[i] >= c.vocab)
        fail<ValueError>("Model::{}: token id {} at flat index {} is outside [0, vocab {})", op, ids[i], i, c.vocab);
  }
}

// Packing arrays have the tokens' shape and an integer dtype; known positions lie in
// [0, T) (the RoPE and position tables are gathered at them).
void check_packing(const Array& tokens, const std::optional<Packing>& packing, const char* op) {
  if (!packing) return;
  for (const Array* a : {&packing->segments, &packing->positions}) {
    const char* what = a == &packing->segments ? "segments" : "positions";
    if (!a->valid() || !is_integral(a->dtype()) || a->shape() != tokens.shape())
      fail<ShapeError>("Model::{}: packing {} are {} (expected integer ids of the tokens' shape {})", op, what,
                       a->valid() ? type_string(*a) : std::string("missing"), to_string(tokens.shape()));
  }
  if (packing->positions.is_evaluated()) {
    const int64_t t = tokens.shape(1);
    std::vector<int64_t> pos = packing->positions.to_vector<int64_t>();
    for (size_t i = 0; i < pos.size(); ++i)
      if (pos[i] < 0 || pos[i] >= t)
        fail<ValueError>("Model::{}: packing position {} at flat index {} is outside [0, seq {})", op, pos[i], i, t);
  }
}

}  // namespace

Model::Model(ModelConfig config) : config_(std::move(config)) {
  config_.validate();
  nn::ParamScope scope = nn::ParamScope::specs_only();
  build_params(config_, scope);
  specs_ = scope.specs();
}

// The parameters are drawn at the unpadded shapes (the same values as a model without
// padding) and then padded with zeros.
Tree Model::init(uint64_t seed) const {
  ModelConfig unpadded = config_;
  unpadded.vocab_pad_to = 1;
  return pad_vocabulary(config_, build_params(unpadded, nn::ParamScope(seed)));
}

Tree Model::init(uint64_t seed, const std::function<bool(const std::string& path)>& materialize) const {
  ModelConfig unpadded = config_;
  unpadded.vocab_pad_to = 1;
  return pad_vocabulary(config_, build_params(unpadded, nn::ParamScope(seed).only(materialize)));
}

Tree Model::placeholders() const {
  nn::ParamScope scope = nn::ParamScope::specs_only();
  return build_params(config_, scope);
}

int64_t Model::parameter_count() const {
  const int64_t tables = config_.resolved_tied() ? 1 : 2;
  return nn::parameter_count(specs_) - tables * (config_.padded_vocab() - config_.vocab) * config_.dim;
}

namespace {

// Resizes the vocabulary axis of one table from `from` to `to` entries (zeros added, or
// the tail dropped); any other size is a ShapeError naming the parameter.
Array resize_vocab_axis(const Array& table, int axis, int64_t from, int64_t to, const char* name) {
  const int64_t n = table.shape(axis);
  if (n == to) return table;
  if (n != from)
    fail<ShapeError>("Model: parameter '{}' has {} entries along the vocabulary (expected {} or {})", name, n, from,
                     to);
  if (table.is_leaf() && !table.is_evaluated()) {  // a placeholder (Model::init's materialize): the new shape
    Shape shape = table.shape();
    shape[static_cast<size_t>(axis)] = to;
    return Array::placeholder(shape, table.dtype());
  }
  if (to < from) return slice_axis(table, axis, 0, to).eval();
  Shape pad = table.shape();
  pad[static_cast<size_t>(axis)] = to - from;
  return concatenate({table, zeros(pad, table.dtype())}, axis).eval();
}

Tree resize_vocabulary(const Tree& params, int64_t from, int64_t to) {
  if (from == to) return params;
  Tree out = params;
  out["wte"] = resize_vocab_axis(params.at("wte").leaf(), 0, from, to, "wte");
  if (params.items().count("head") > 0) out["head"] = resize_vocab_axis(params.at("head").leaf(), 1, from, to, "head");
  return out;
}

}  // namespace

Tree pad_vocabulary(const ModelConfig& config, const Tree& params) {
  return resize_vocabulary(params, config.vocab, config.padded_vocab());
}

Tree strip_vocabulary(const ModelConfig& config, const Tree& params) {
  return resize_vocabulary(params, config.padded_vocab(), config.vocab);
}

namespace {

// The dtype the forward pass casts parameters to: none for "float32" (the default:
// activations follow the parameters' dtype, so the float32 graph is unchanged and
// float64 parameters still compute in float64), else the low-precision dtype.
std::optional<DType> cast_dtype(const ModelConfig& c) {
  const DType dtype = c.compute();
  if (dtype == DType::Float32) return std::nullopt;
  return dtype;
}

Array cast(const Array& a, std::optional<DType> dtype) { return dtype ? astype(a, *dtype) : a; }

// The checkpoint policy of every block (ModelConfig::remat), or none.
std::optional<CheckpointPolicy> remat_policy(const ModelConfig& c) {
  if (c.remat == "full") return CheckpointPolicy::full();
  if (c.remat == "offload") return CheckpointPolicy::offload({ModelConfig::kBlockInput});
  return std::nullopt;
}

// The parameters as the blocks use them: every leaf cast to the compute dtype except
// the embedding tables, whose gathered rows are cast instead (a cast of the whole
// table would make the lookup's gradient a scatter-add in low precision).
Tree compute_params(const Tree& params, std::optional<DType> dtype) {
  if (!dtype) return params;
  Tree out = params;
  for (const auto& [key, value] : params.items())
    if (key != "wte" && key != "wpe") out[key] = value.map([dtype](const Array& p) { return astype(p, *dtype); });
  return out;
}

// The int8 matmul options of a site: `salt` tells its rounding noise apart from the
// other sites' (the step key is shared).
QuantizedMatmulOptions int8_options(const ModelConfig& c, const std::optional<Array>& key, uint32_t salt) {
  QuantizedMatmulOptions o;
  o.int8_backward = c.quant_backward == "int8";
  o.salt = salt;
  o.key = key;
  return o;
}

// A module's projections as int8 matmuls, site `site` salted salt + site.
nn::ProjectionMatmul int8_projection(const ModelConfig& c, const std::optional<Array>& key, uint32_t salt) {
  const QuantizedMatmulOptions base = int8_options(c, key, salt);
  return [base](const Array& x, const Array& w, int site) {
    QuantizedMatmulOptions o = base;
    o.salt += static_cast<uint32_t>(site);
    return quantized_matmul(x, w, o);
  };
}

// A contiguous part of the forward pass (a pipeline stage): with `embed` it starts from
// tokens, else from the residual stream; its layers are params["layers"], numbered from
// first_layer (dropout keys and int8 salts follow the whole model's numbering); with
// `head` it ends with the final norm and the logits, else it returns the stream.
struct Segment {
  int64_t first_layer = 0;
  bool embed = true, head = true;
  bool whole() const { return first_layer == 0 && embed && head; }
};

// The shared forward pass: logits of tokens at positions offset.. (offset = the
// cache's length), with dropout when `dropout_key` is set. Activations (the residual
// stream included, as in MaxText) are in the compute dtype.
// With experts, each layer's routing figures go to `moe_stats` when given.
Array forward(const ModelConfig& c, const Tree& master, const Array& tokens, const std::optional<Array>& dropout_key,
              KVCache* cache, const std::optional<Packing>& packing = std::nullopt, const Segment& segment = {},
              std::vector<nn::MoE::Output>* moe_stats = nullptr) {
  const int64_t t = tokens.shape(1), offset = cache != nullptr ? cache->length : 0;
  const std::optional<DType> dtype = cast_dtype(c);
  const Tree params = compute_params(master, dtype);
  const nn::Dropout drop{c.dropout};
  std::vector<Array> keys;
  if (dropout_key && c.dropout > 0) keys = random::split_keys(*dropout_key, 1 + 2 * c.layers);
  auto key_at = [&](size_t i) -> std::optional<Array> {
    if (keys.empty()) return std::nullopt;
    return keys[i];
  };

  Array x = tokens;
  if (segment.embed) {
    x = cast(take(params.at("wte").leaf(), tokens, 0), dtype);
    if (is_gpt2(c)) {
      const Array& wpe = params.at("wpe").leaf();
      x = x + cast(packing ? take(wpe, packing->positions, 0) : slice_axis(wpe, 0, offset, offset + t), dtype);
    }
    x = drop(x, key_at(0));
  }
  nn::Attention attention = attention_of(c);
  nn::GeluMLP gelu_mlp = gelu_mlp_of(c);
  nn::SwiGLU swiglu = swiglu_of(c);
  const nn::MoE moe = moe_of(c);
  const std::vector<Tree>& layers = params.at("layers").elements();
  if (segment.whole() && static_cast<int64_t>(layers.size()) != c.layers)
    fail<ValueError>("Model: params have {} layers (the config says {})", layers.size(), c.layers);
  if (segment.first_layer < 0 || segment.first_layer + static_cast<int64_t>(layers.size()) > c.layers)
    fail<ValueError>("Model: a stage of {} layers from layer {} does not fit the model's {} layers", layers.size(),
                     segment.first_layer, c.layers);
  const std::optional<CheckpointPolicy> remat = cache != nullptr ? std::nullopt : remat_policy(c);
  for (size_t i = 0; i < layers.size(); ++i) {
    const Tree& layer = layers[i];
    const size_t l = static_cast<size_t>(segment.first_layer) + i;
    const auto salt = static_cast<uint32_t>(l + 1) * 16;
    if (c.quantized("attention")) attention.projection = int8_projection(c, dropout_key, salt);
    if (c.quantized("mlp")) gelu_mlp.projection = swiglu.projection = int8_projection(c, dropout_key, salt + 8);
    auto block = [&](const Array& input) {
      Array y = remat ? checkpoint_name(input, ModelConfig::kBlockInput) : input;
      Array h = norm_apply(c, layer.at("ln1"), y);
      if (cache != nullptr) {
        nn::KVState state{cache->k[l], cache->v[l]};
        h = attention(layer.at("attn"), h, &state);
        cache->k[l] = state.k;
        cache->v[l] = state.v;
      } else if (packing) {
        h = attention(layer.at("attn"), h, *packing);
      } else {
        h = attention(layer.at("attn"), h);
      }
      y = y + drop(h, key_at(1 + 2 * l));
      h = norm_apply(c, layer.at("ln2"), y);
      if (c.moe()) {
        nn::MoE::Output routed = moe(layer.at("moe"), h);
        h = routed.y;
        if (moe_stats != nullptr) moe_stats->push_back(std::move(routed));
      } else {
        h = is_gpt2(c) ? gelu_mlp(layer.at("mlp"), h) : swiglu(layer.at("mlp"), h);
      }
      return y + drop(h, key_at(2 + 2 * l));
    };
    x = remat ? checkpoint(std::function<Array(const Array&)>(block), *remat)(x) : block(x);
  }
  if (!segment.head) return x;
  x = norm_apply(c, params.at("lnf"), x);
  if (c.quantized("head")) {
    QuantizedMatmulOptions o = int8_options(c, dropout_key, 1);
    if (!c.resolved_tied()) return quantized_matmul(x, params.at("head").leaf(), o);
    o.transpose_w = true;  // the table [vocab, dim] is w^T
    return quantized_matmul(x, cast(params.at("wte").leaf(), dtype), o);
  }
  if (c.resolved_tied()) return matmul(x, transpose(cast(params.at("wte").leaf(), dtype)));
  return matmul(x, params.at("head").leaf());
}

}  // namespace

namespace {
// The logits without the padding columns (a copy, for inference; the loss reads the
// padded logits in place).
Array real_classes(const ModelConfig& c, const Array& logits) {
  if (c.padded_vocab() == c.vocab) return logits;
  return slice_axis(logits, -1, 0, c.vocab);
}
}  // namespace

Array Model::logits(const Tree& params, const Array& tokens, const std::optional<Array>& dropout_key,
                    const std::optional<Packing>& packing) const {
  check_tokens(config_, tokens, 0, "logits");
  check_packing(tokens, packing, "logits");
  return real_classes(config_, forward(config_, params, tokens, dropout_key, nullptr, packing));
}

Array Model::loss(const Tree& params, const Array& tokens, const Array& targets,
                  const std::optional<Array>& dropout_key, const std::optional<Packing>& packing) const {
  if (targets.shape() != tokens.shape())
    fail<ShapeError>("Model::loss: targets {} do not match tokens {}", to_string(targets.shape()),
                     to_string(tokens.shape()));
  check_tokens(config_, tokens, 0, "loss");
  check_packing(tokens, packing, "loss");
  std::vector<nn::MoE::Output> routing;
  const Array ce = cross_entropy(forward(config_, params, tokens, dropout_key, nullptr, packing, {}, &routing), targets,
                                 -100, Reduction::Mean, config_.vocab);
  if (!config_.moe() || config_.moe_aux_loss_coef == 0) return ce;
  return ce + nn::load_balancing_loss(routing, config_.moe_experts) * config_.moe_aux_loss_coef;
}

Model::StageOutput Model::stage_forward(const Tree& params, const Array& input, int64_t first_layer, bool embed,
                                        const std::optional<Array>& targets, const std::optional<Packing>& packing,
                                        const std::optional<Array>& dropout_key,
                                        const std::optional<Array>& routing) const {
  if (embed) check_tokens(config_, input, 0, "stage_forward");
  if (packing && input.ndim() >= 2)
    for (const Array* a : {&packing->segments, &packing->positions})
      if (a->shape() != Shape{input.shape(0), input.shape(1)})
        fail<ShapeError>("Model::stage_forward: packing {} are {} (expected the batch [{}, {}])",
                         a == &packing->segments ? "segments" : "positions", to_string(a->shape()), input.shape(0),
                         input.shape(1));
  const bool balances = config_.balances_load();
  const Shape routing_shape{config_.moe_top_k + 1, config_.moe_experts};
  if (routing && !balances)
    fail<ValueError>("Model::stage_forward: routing figures {} for a model without a load-balancing loss",
                     type_string(*routing));
  if (routing && embed)
    fail<ValueError>("Model::stage_forward: routing figures {} into the first part (it takes none)",
                     type_string(*routing));
  if (routing && (routing->shape() != routing_shape || routing->dtype() != DType::Float32))
    fail<ValueError>("Model::stage_forward: routing figures {} (expected f32{}: top_k + 1 rows over the {} experts)",
                     type_string(*routing), to_string(routing_shape), config_.moe_experts);
  if (balances && !embed && !routing)
    fail<ValueError>(
        "Model::stage_forward: a part after the first of a mixture-of-experts model needs the routing "
        "figures of the layers before it");
  const Segment segment{first_layer, embed, targets.has_value()};
  std::vector<nn::MoE::Output> stats;
  StageOutput result;
  result.out = forward(config_, params, input, dropout_key, nullptr, packing, segment, balances ? &stats : nullptr);
  if (balances) {
    // Summed in layer order from the previous parts' sum, as loss() sums every layer's.
    std::optional<Array> sum = routing;
    for (const nn::MoE::Output& layer : stats) {
      const Array figures = concatenate({layer.choice_share, expand_dims(layer.router_prob, 0)}, 0);
      sum = sum ? *sum + figures : figures;
    }
    if (!sum) fail<ValueError>("Model::stage_forward: a part of a mixture-of-experts model needs at least one layer");
    result.routing = *sum;
  }
  if (!targets) return result;
  if (targets->shape() != Shape{input.shape(0), input.shape(1)})
    fail<ShapeError>("Model::stage_forward: targets {} do not match the batch [{}, {}]", to_string(targets->shape()),
                     input.shape(0), input.shape(1));
  result.cross_entropy = cross_entropy(result.out, *targets, -100, Reduction::Sum, config_.vocab);
  result.out = result.cross_entropy;
  if (balances) {
    // loss() adds coef x aux to a mean; to a sum over the counted targets, that many times.
    const int64_t k = config_.moe_top_k;
    const Array aux = nn::load_balancing_loss(slice_axis(result.routing, 0, 0, k),
                                              reshape(slice_axis(result.routing, 0, k, k + 1), {config_.moe_experts}),
                                              config_.layers, config_.moe_experts);
    const Array counted = sum(astype(not_equal(*targets, scalar_like(-100, *targets)), DType::Float32));
    result.out = result.cross_entropy + aux * config_.moe_aux_loss_coef * counted;
  }
  return result;
}

double Model::load_balancing_term(const std::vector<double>& routing_sum, int64_t parts) const {
  if (!config_.balances_load()) return 0;
  const int64_t k = config_.moe_top_k, e = config_.moe_experts;
  if (static_cast<int64_t>(routing_sum.size()) != (k + 1) * e || parts < 1)
    fail<ValueError>("Model::load_balancing_term: {} routing figures over {} parts (expected {} over at least 1)",
                     routing_sum.size(), parts, (k + 1) * e);
  // Means over the parts and over the layers.
  const Array figures = Array::from_vector<double>(routing_sum, {k + 1, e}).astype(DType::Float32);
  const Array aux = nn::load_balancing_loss(slice_axis(figures, 0, 0, k),
                                            reshape(slice_axis(figures, 0, k, k + 1), {e}), parts * config_.layers, e);
  return aux.item<double>() * config_.moe_aux_loss_coef;
}

KVCache Model::empty_cache(int64_t batch) const {
  if (batch <= 0) fail<ValueError>("Model::empty_cache: batch {} must be positive", batch);
  KVCache cache;
  const Shape shape{batch, config_.resolved_kv_heads(), 0, config_.head_dim()};
  for (int64_t l = 0; l < config_.layers; ++l) {
    cache.k.push_back(zeros(shape, config_.compute()).eval());
    cache.v.push_back(zeros(shape, config_.compute()).eval());
  }
  return cache;
}

Array Model::logits_with_cache(const Tree& params, const Array& tokens, KVCache& cache) const {
  check_tokens(config_, tokens, cache.length, "logits_with_cache");
  if (static_cast<int64_t>(cache.k.size()) != config_.layers || cache.v.size() != cache.k.size())
    fail<ValueError>("Model::logits_with_cache: cache has {} / {} layers (expected {}; use empty_cache)",
                     cache.k.size(), cache.v.size(), config_.layers);
  for (const Array& k : cache.k)
    if (k.ndim() != 4 || k.shape(0) != tokens.shape(0) || k.shape(2) != cache.length)
      fail<ValueError>("Model::logits_with_cache: cache keys {} do not match batch {} and length {}",
                       to_string(k.shape()), tokens.shape(0), cache.length);
  KVCache next = cache;
  Array out = real_classes(config_, forward(config_, params, tokens, std::nullopt, &next));
  std::vector<Array> results{out};
  results.insert(results.end(), next.k.begin(), next.k.end());
  results.insert(results.end(), next.v.begin(), next.v.end());
  eval(results);
  next.length = cache.length + tokens.shape(1);
  cache = std::move(next);
  return out;
}

double Model::flops_per_token(int64_t seq) const {
  if (seq <= 0) fail<ValueError>("Model::flops_per_token: seq {} must be positive", seq);
  int64_t n = parameter_count();  // without the vocabulary padding
  if (is_gpt2(config_)) n -= config_.context * config_.dim;
  // Experts: a token runs through top_k of them (the active parameters).
  if (config_.moe())
    n -= config_.layers * (config_.moe_experts - config_.moe_top_k) * 3 * config_.dim * config_.resolved_mlp_dim();
  return 6.0 * static_cast<double>(n) +
         12.0 * static_cast<double>(config_.layers) * static_cast<double>(seq) * static_cast<double>(config_.dim);
}

}  // namespace tessera::models
