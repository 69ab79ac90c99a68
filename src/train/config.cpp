#include "tessera/train/config.h"

#include <fmt/format.h>

#define TOML_EXCEPTIONS 1
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>

#include "tessera/base/error.h"
#include "tessera/base/json_field.h"
#include "train/config_checks.h"
#include "train/config_mixture.h"

namespace tessera::train {

namespace {

// One configurable key: how to read it from a TOML node into the config, and how to
// show its current value. `where` is "file:line" or "--set key=value" for errors.
struct Field {
  std::string key;
  std::string type;  // "integer", "float", "boolean", "string", "string list"
  std::string help;
  std::function<void(TrainConfig&, const toml::node&, const std::string& where)> set;
  std::function<nlohmann::json(const TrainConfig&)> get;
};

[[noreturn]] void type_error(const std::string& where, const std::string& key, const std::string& expected,
                             const toml::node& node) {
  std::ostringstream got;
  got << node.type();
  fail<ConfigError>("{}: '{}' expects {} (got a {})", where, key, expected, got.str());
}

int64_t read_integer(const toml::node& node, const std::string& where, const std::string& key) {
  if (auto v = node.value_exact<int64_t>()) return *v;
  type_error(where, key, "an integer", node);
}

double read_float(const toml::node& node, const std::string& where, const std::string& key) {
  if (auto v = node.value_exact<double>()) return *v;
  if (auto v = node.value_exact<int64_t>()) return static_cast<double>(*v);
  type_error(where, key, "a number", node);
}

std::vector<std::string> read_string_list(const toml::node& node, const std::string& where, const std::string& key) {
  std::vector<std::string> out;
  if (auto s = node.value_exact<std::string>()) return {*s};
  const toml::array* array = node.as_array();
  if (!array) type_error(where, key, "a list of strings", node);
  for (const toml::node& item : *array) {
    auto s = item.value_exact<std::string>();
    if (!s) type_error(where, key, "a list of strings", item);
    out.push_back(*s);
  }
  return out;
}

template <typename T>
Field field(std::string key, std::string help, std::function<T&(TrainConfig&)> ref) {
  Field f{std::move(key), "", std::move(help), nullptr, nullptr};
  auto get_ref = [ref](const TrainConfig& c) -> const T& { return ref(const_cast<TrainConfig&>(c)); };
  f.get = [get_ref](const TrainConfig& c) { return nlohmann::json(get_ref(c)); };
  if constexpr (std::is_same_v<T, bool>) {
    f.type = "boolean";
    f.set = [ref, k = f.key](TrainConfig& c, const toml::node& n, const std::string& where) {
      auto v = n.value_exact<bool>();
      if (!v) type_error(where, k, "true or false", n);
      ref(c) = *v;
    };
  } else if constexpr (std::is_integral_v<T>) {
    f.type = "integer";
    f.set = [ref, k = f.key](TrainConfig& c, const toml::node& n, const std::string& where) {
      const int64_t v = read_integer(n, where, k);
      if (v < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
          (v > 0 && static_cast<uint64_t>(v) > static_cast<uint64_t>(std::numeric_limits<T>::max())))
        fail<ConfigError>("{}: '{}' = {} is out of range", where, k, v);
      ref(c) = static_cast<T>(v);
    };
  } else if constexpr (std::is_same_v<T, double>) {
    f.type = "float";
    f.set = [ref, k = f.key](TrainConfig& c, const toml::node& n, const std::string& where) {
      ref(c) = read_float(n, where, k);
    };
  } else if constexpr (std::is_same_v<T, std::string>) {
    f.type = "string";
    f.set = [ref, k = f.key](TrainConfig& c, const toml::node& n, const std::string& where) {
      auto v = n.value_exact<std::string>();
      if (!v) type_error(where, k, "a string", n);
      ref(c) = *v;
    };
  } else {
    static_assert(std::is_same_v<T, std::vector<std::string>>);
    f.type = "string list";
    f.set = [ref, k = f.key](TrainConfig& c, const toml::node& n, const std::string& where) {
      ref(c) = read_string_list(n, where, k);
    };
  }
  return f;
}

// A step count that may also be "auto" (kAutoInterval): chosen from measured costs.
Field auto_or_steps_field(std::string key, std::string help, std::function<int64_t&(TrainConfig&)> ref) {
  Field f{std::move(key), "integer/\"auto\"", std::move(help), nullptr, nullptr};
  f.set = [ref, k = f.key](TrainConfig& c, const toml::node& n, const std::string& where) {
    if (auto text = n.value_exact<std::string>()) {
      if (*text != "auto")
        fail<ConfigError>("{}: '{}' = \"{}\" is unknown (expected \"auto\" or a number of steps)", where, k, *text);
      ref(c) = kAutoInterval;
      return;
    }
    if (!n.value_exact<int64_t>()) type_error(where, k, "\"auto\" or an integer", n);
    const int64_t v = read_integer(n, where, k);
    if (v < 0) fail<ConfigError>("{}: '{}' = {} must be \"auto\" or >= 0 steps", where, k, v);
    ref(c) = v;
  };
  f.get = [ref](const TrainConfig& c) {
    const int64_t v = ref(const_cast<TrainConfig&>(c));
    return v == kAutoInterval ? nlohmann::json("auto") : nlohmann::json(v);
  };
  return f;
}

nn::ParamKind param_kind_from_name(const std::string& name, const std::string& where) {
  for (nn::ParamKind kind : {nn::ParamKind::Weight, nn::ParamKind::Bias, nn::ParamKind::Norm, nn::ParamKind::Embedding})
    if (name == nn::to_string(kind)) return kind;
  fail<ConfigError>("{}: 'optimizer.no_decay' has unknown parameter kind '{}' (kinds: weight, bias, norm, embedding)",
                    where, name);
}

// [model] (model.preset is applied first: the other model keys override it)
void add_model_fields(std::vector<Field>& f) {
  using C = TrainConfig;
  f.push_back(field<std::string>("model.preset", "start from a named shape (tiny, small, gpt2-124m, llama-1b, ...)",
                                 [](C& c) -> std::string& { return c.model_preset; }));
  f.push_back(field<std::string>("model.family", "gpt2 | llama", [](C& c) -> std::string& { return c.model.family; }));
  f.push_back(field<int64_t>("model.vocab", "vocabulary size", [](C& c) -> int64_t& { return c.model.vocab; }));
  f.push_back(field<int64_t>("model.vocab_pad_to",
                             "embedding rows padded with zeros to a multiple of this (fast GEMMs; 1: none)",
                             [](C& c) -> int64_t& { return c.model.vocab_pad_to; }));
  f.push_back(field<int64_t>("model.dim", "model width", [](C& c) -> int64_t& { return c.model.dim; }));
  f.push_back(field<int64_t>("model.layers", "transformer blocks", [](C& c) -> int64_t& { return c.model.layers; }));
  f.push_back(field<int64_t>("model.heads", "attention heads", [](C& c) -> int64_t& { return c.model.heads; }));
  f.push_back(field<int64_t>("model.kv_heads", "key/value heads (0: = heads; fewer: grouped-query)",
                             [](C& c) -> int64_t& { return c.model.kv_heads; }));
  f.push_back(field<int64_t>("model.mlp_dim", "MLP hidden size (0: family default)",
                             [](C& c) -> int64_t& { return c.model.mlp_dim; }));
  f.push_back(field<int64_t>("model.context", "longest sequence", [](C& c) -> int64_t& { return c.model.context; }));
  f.push_back(
      field<double>("model.dropout", "dropout while training", [](C& c) -> double& { return c.model.dropout; }));
  f.push_back(field<int64_t>("model.moe_experts", "mixture of experts (llama): SwiGLU experts per layer (0: dense MLP)",
                             [](C& c) -> int64_t& { return c.model.moe_experts; }));
  f.push_back(field<int64_t>("model.moe_top_k", "experts each token is routed to",
                             [](C& c) -> int64_t& { return c.model.moe_top_k; }));
  f.push_back(field<double>("model.moe_capacity_factor",
                            "expert slots per expert = ceil(factor * tokens * top_k / experts), the rest dropped "
                            "(0: dropless)",
                            [](C& c) -> double& { return c.model.moe_capacity_factor; }));
  f.push_back(field<int64_t>("model.moe_groups",
                             "routing groups, each with its own expert slots (0: one per batch device on a mesh)",
                             [](C& c) -> int64_t& { return c.model.moe_groups; }));
  f.push_back(field<double>("model.moe_aux_loss_coef", "weight of the load-balancing loss added to the training loss",
                            [](C& c) -> double& { return c.model.moe_aux_loss_coef; }));
  f.push_back(
      field<double>("model.norm_eps", "normalization epsilon", [](C& c) -> double& { return c.model.norm_eps; }));
  f.push_back(
      field<double>("model.rope_theta", "RoPE base (llama)", [](C& c) -> double& { return c.model.rope_theta; }));
  f.push_back(field<std::string>("model.rope_scaling", "RoPE scaling (llama): none | llama3 (Llama 3.1's)",
                                 [](C& c) -> std::string& { return c.model.rope_scaling; }));
  f.push_back(field<double>("model.rope_factor", "llama3 RoPE scaling: factor the low frequencies are divided by",
                            [](C& c) -> double& { return c.model.rope_factor; }));
  f.push_back(field<double>("model.rope_low_freq_factor", "llama3 RoPE scaling: low-frequency band edge factor",
                            [](C& c) -> double& { return c.model.rope_low_freq_factor; }));
  f.push_back(field<double>("model.rope_high_freq_factor", "llama3 RoPE scaling: high-frequency band edge factor",
                            [](C& c) -> double& { return c.model.rope_high_freq_factor; }));
  f.push_back(field<int64_t>("model.rope_original_context", "llama3 RoPE scaling: the pretraining context",
                             [](C& c) -> int64_t& { return c.model.rope_original_context; }));
  f.push_back(field<double>("model.init_std", "weight init std", [](C& c) -> double& { return c.model.init_std; }));
  {
    Field tied{"model.tied_embeddings", "boolean", "LM head shares the token embedding (default: gpt2 yes, llama no)",
               nullptr, nullptr};
    tied.set = [](C& c, const toml::node& n, const std::string& where) {
      auto v = n.value_exact<bool>();
      if (!v) type_error(where, "model.tied_embeddings", "true or false", n);
      c.model.tied_embeddings = *v;
    };
    tied.get = [](const C& c) { return nlohmann::json(c.model.resolved_tied()); };
    f.push_back(std::move(tied));
  }
  {
    Field dtype = field<std::string>("model.compute_dtype",
                                     "dtype of activations and matmuls: float32 | bfloat16 | float16 | auto (bfloat16 "
                                     "on a GPU or a CPU with AMX-BF16, else float32; parameters and optimizer state "
                                     "stay float32)",
                                     [](C& c) -> std::string& { return c.model.compute_dtype; });
    dtype.set = [](C& c, const toml::node& n, const std::string& where) {
      auto v = n.value_exact<std::string>();
      if (!v) type_error(where, "model.compute_dtype", "a string", n);
      detail::check_compute_dtype(*v, where);
      c.model.compute_dtype = *v;
    };
    f.push_back(std::move(dtype));
  }
  {
    Field remat = field<std::string>("model.remat",
                                     "recompute blocks in the backward pass: none | full | offload (full, with each "
                                     "block's input kept in host memory)",
                                     [](C& c) -> std::string& { return c.model.remat; });
    remat.set = [](C& c, const toml::node& n, const std::string& where) {
      auto v = n.value_exact<std::string>();
      if (!v) type_error(where, "model.remat", "a string", n);
      detail::check_remat(*v, where);
      c.model.remat = *v;
    };
    f.push_back(std::move(remat));
  }
}

// [quant]: int8 (AQT) matmuls of the model (models::ModelConfig::quant_targets).
void add_quant_fields(std::vector<Field>& f) {
  using C = TrainConfig;
  f.push_back(field<std::vector<std::string>>(
      "quant.targets", "matmuls run as int8 GEMMs (AQT): any of attention, mlp, head (default none)",
      [](C& c) -> std::vector<std::string>& { return c.model.quant_targets; }));
  f.push_back(field<std::string>("quant.backward",
                                 "int8: both backward GEMMs in int8, gradients rounded stochastically; float: "
                                 "forward only (straight-through)",
                                 [](C& c) -> std::string& { return c.model.quant_backward; }));
  f.push_back(field<std::string>("quant.mode",
                                 "on: the targets run in int8 wherever the job runs; auto: only on a CPU with int8 "
                                 "matrix units (AMX-INT8), else they stay in the compute dtype",
                                 [](C& c) -> std::string& { return c.quant_mode; }));
}

// [data]
void add_data_fields(std::vector<Field>& f) {
  using C = TrainConfig;
  f.push_back(
      field<std::string>("data.train", "training token file", [](C& c) -> std::string& { return c.data.train; }));
  f.push_back(field<std::string>("data.val", "validation token file", [](C& c) -> std::string& { return c.data.val; }));
  f.push_back(field<std::vector<std::string>>("data.sources", "text files/directories to prepare train/val from",
                                              [](C& c) -> std::vector<std::string>& { return c.data.sources; }));
  f.push_back(
      field<std::vector<std::string>>("data.fallback_sources", "used when none of data.sources exists",
                                      [](C& c) -> std::vector<std::string>& { return c.data.fallback_sources; }));
  f.push_back(field<std::string>("data.tokenizer",
                                 "tokenizer spec: byte, gpt2:PATH, hf:PATH, spm:PATH, or a path (relative to the "
                                 "current directory, like data.train)",
                                 [](C& c) -> std::string& { return c.data.tokenizer; }));
  f.push_back(field<double>("data.val_fraction", "share of prepared tokens kept for validation",
                            [](C& c) -> double& { return c.data.val_fraction; }));
  {
    Field mixture{"data.mixture", "source list",
                  "training sources mixed by weight ([[data.mixture]] path (default: data.train), weight, name, "
                  "kind, documents); none: data.train alone",
                  nullptr, nullptr};
    mixture.set = [](C& c, const toml::node& n, const std::string& where) {
      c.data.pipeline.sources = detail::read_mixture(n, where);
    };
    mixture.get = [](const C& c) { return detail::mixture_json(c.data.pipeline.sources); };
    f.push_back(std::move(mixture));
  }
  f.push_back(field<std::string>(
      "data.packing", "documents (segment masks stop attention at document ends) | concat (with data.mixture)",
      [](C& c) -> std::string& { return c.data.pipeline.packing; }));
  f.push_back(field<int64_t>("data.shuffle_buffer", "rows in the shuffle buffer (with data.mixture; <= 1: no shuffle)",
                             [](C& c) -> int64_t& { return c.data.pipeline.shuffle_buffer; }));
  f.push_back(field<int>("data.workers", "prefetch threads (with data.mixture; 0: on the training thread)",
                         [](C& c) -> int& { return c.data.pipeline.workers; }));
  f.push_back(field<int64_t>("data.prefetch", "batches prepared ahead (with data.mixture)",
                             [](C& c) -> int64_t& { return c.data.pipeline.prefetch; }));
}

// [optimizer]
void add_optimizer_fields(std::vector<Field>& f) {
  using C = TrainConfig;
  f.push_back(field<std::string>("optimizer.name", "adamw | sgd | lion | adafactor | muon",
                                 [](C& c) -> std::string& { return c.optimizer.name; }));
  f.push_back(field<double>("optimizer.lr", "peak learning rate", [](C& c) -> double& { return c.schedule.peak_lr; }));
  f.push_back(field<double>("optimizer.beta1", "AdamW beta1", [](C& c) -> double& { return c.optimizer.beta1; }));
  f.push_back(field<double>("optimizer.beta2", "AdamW beta2", [](C& c) -> double& { return c.optimizer.beta2; }));
  f.push_back(field<double>("optimizer.eps", "AdamW epsilon", [](C& c) -> double& { return c.optimizer.eps; }));
  f.push_back(field<double>("optimizer.weight_decay", "decoupled weight decay",
                            [](C& c) -> double& { return c.optimizer.weight_decay; }));
  f.push_back(
      field<double>("optimizer.momentum", "SGD momentum", [](C& c) -> double& { return c.optimizer.momentum; }));
  f.push_back(
      field<bool>("optimizer.nesterov", "SGD Nesterov momentum", [](C& c) -> bool& { return c.optimizer.nesterov; }));
  f.push_back(field<double>("optimizer.clip_norm", "global gradient-norm clip (0: off)",
                            [](C& c) -> double& { return c.optimizer.clip_norm; }));
  f.push_back(field<double>("optimizer.adafactor_decay_rate", "Adafactor: second-moment decay 1 - t^-rate",
                            [](C& c) -> double& { return c.optimizer.adafactor_decay_rate; }));
  f.push_back(field<int64_t>("optimizer.adafactor_min_dim_to_factor",
                             "Adafactor: factor a tensor's moments when its two largest dims are at least this",
                             [](C& c) -> int64_t& { return c.optimizer.adafactor_min_dim_to_factor; }));
  f.push_back(field<double>("optimizer.adafactor_clip_threshold", "Adafactor: update RMS clip (0: off)",
                            [](C& c) -> double& { return c.optimizer.adafactor_clip_threshold; }));
  f.push_back(field<double>("optimizer.adafactor_eps", "Adafactor: epsilon added to squared gradients",
                            [](C& c) -> double& { return c.optimizer.adafactor_eps; }));
  f.push_back(field<bool>("optimizer.adafactor_param_scale", "Adafactor: step relative to the parameter's RMS",
                          [](C& c) -> bool& { return c.optimizer.adafactor_param_scale; }));
  f.push_back(field<double>("optimizer.adafactor_min_scale", "Adafactor: the smallest parameter RMS the step uses",
                            [](C& c) -> double& { return c.optimizer.adafactor_min_scale; }));
  f.push_back(field<bool>("optimizer.adafactor_relative_step",
                          "Adafactor: the paper's step min(1e-2, 1/sqrt(t)) instead of the schedule",
                          [](C& c) -> bool& { return c.optimizer.adafactor_relative_step; }));
  f.push_back(field<double>("optimizer.muon_momentum", "Muon: momentum of the orthogonalized matrices",
                            [](C& c) -> double& { return c.optimizer.muon_momentum; }));
  f.push_back(field<bool>("optimizer.muon_nesterov", "Muon: Nesterov momentum",
                          [](C& c) -> bool& { return c.optimizer.muon_nesterov; }));
  f.push_back(field<int>("optimizer.muon_ns_steps", "Muon: Newton-Schulz iterations",
                         [](C& c) -> int& { return c.optimizer.muon_ns_steps; }));
  f.push_back(field<std::string>("optimizer.muon_ns_dtype",
                                 "Muon: dtype of the Newton-Schulz matmuls (float32 | bfloat16)",
                                 [](C& c) -> std::string& { return c.optimizer.muon_ns_dtype; }));
  {
    Field no_decay{"optimizer.no_decay", "string list",
                   "parameter kinds without weight decay (weight, bias, norm, embedding)", nullptr, nullptr};
    no_decay.set = [](C& c, const toml::node& n, const std::string& where) {
      c.optimizer.no_decay.clear();
      for (const std::string& name : read_string_list(n, where, "optimizer.no_decay"))
        c.optimizer.no_decay.push_back(param_kind_from_name(name, where));
    };
    no_decay.get = [](const C& c) {
      nlohmann::json names = nlohmann::json::array();
      for (nn::ParamKind kind : c.optimizer.no_decay) names.push_back(nn::to_string(kind));
      return names;
    };
    f.push_back(std::move(no_decay));
  }
  {
    Field loss_scale{"optimizer.loss_scale", "string/float",
                     "loss scaling: auto (dynamic for float16 compute, else none) | dynamic | none | a static scale "
                     "(0: none)",
                     nullptr, nullptr};
    loss_scale.set = [](C& c, const toml::node& n, const std::string& where) {
      optim::LossScaleConfig& ls = c.optimizer.loss_scale;
      if (auto text = n.value_exact<std::string>()) {
        if (*text == "auto") {
          ls.mode = optim::LossScaling::Auto;
        } else if (*text == "dynamic") {
          ls.mode = optim::LossScaling::Dynamic;
        } else if (*text == "none") {
          ls.mode = optim::LossScaling::Off;
        } else {
          fail<ConfigError>("{}: 'optimizer.loss_scale' = \"{}\" is unknown (expected auto, dynamic, none or a number)",
                            where, *text);
        }
        return;
      }
      const double scale = read_float(n, where, "optimizer.loss_scale");
      if (!(scale >= 0) || !std::isfinite(scale))
        fail<ConfigError>("{}: 'optimizer.loss_scale' = {} (expected a finite scale >= 0; 0: none)", where, scale);
      ls.mode = scale == 0 ? optim::LossScaling::Off : optim::LossScaling::Static;
      if (scale > 0) ls.static_scale = scale;
    };
    loss_scale.get = [](const C& c) {
      const optim::LossScaleConfig& ls = c.optimizer.loss_scale;
      if (ls.mode == optim::LossScaling::Static) return nlohmann::json(ls.static_scale);
      return nlohmann::json(optim::loss_scaling_name(ls.mode));
    };
    f.push_back(std::move(loss_scale));
  }
  f.push_back(field<double>("optimizer.loss_scale_init", "dynamic loss scaling: the first scale (2^16)",
                            [](C& c) -> double& { return c.optimizer.loss_scale.init_scale; }));
  f.push_back(field<int64_t>("optimizer.loss_scale_growth_interval",
                             "dynamic loss scaling: good steps in a row before the scale grows",
                             [](C& c) -> int64_t& { return c.optimizer.loss_scale.growth_interval; }));
  f.push_back(field<double>("optimizer.loss_scale_growth_factor", "dynamic loss scaling: growth factor",
                            [](C& c) -> double& { return c.optimizer.loss_scale.growth_factor; }));
  f.push_back(field<double>("optimizer.loss_scale_backoff_factor",
                            "dynamic loss scaling: factor on a step with non-finite gradients (skipped)",
                            [](C& c) -> double& { return c.optimizer.loss_scale.backoff_factor; }));
}

// [schedule]
void add_schedule_fields(std::vector<Field>& f) {
  using C = TrainConfig;
  f.push_back(field<std::string>("schedule.decay", "cosine | linear | constant | wsd (warmup-stable-decay)",
                                 [](C& c) -> std::string& { return c.schedule.decay; }));
  f.push_back(field<double>("schedule.decay_fraction", "wsd: the share of the steps after warm-up spent decaying",
                            [](C& c) -> double& { return c.schedule.decay_fraction; }));
  f.push_back(field<int64_t>("schedule.warmup_steps", "linear warm-up steps",
                             [](C& c) -> int64_t& { return c.schedule.warmup_steps; }));
  f.push_back(field<double>("schedule.min_lr_ratio", "final learning rate / peak",
                            [](C& c) -> double& { return c.schedule.min_lr_ratio; }));
}

// [train]
void add_train_fields(std::vector<Field>& f) {
  using C = TrainConfig;
  f.push_back(field<int64_t>("train.steps", "optimizer steps", [](C& c) -> int64_t& { return c.loop.steps; }));
  f.push_back(
      field<int64_t>("train.batch", "sequences per optimizer step", [](C& c) -> int64_t& { return c.loop.batch; }));
  f.push_back(field<int64_t>("train.micro_batch", "sequences per forward/backward (0: = batch)",
                             [](C& c) -> int64_t& { return c.loop.micro_batch; }));
  f.push_back(field<int64_t>("train.seq", "tokens per sequence", [](C& c) -> int64_t& { return c.loop.seq; }));
  f.push_back(field<double>("train.time_limit_s", "stop after this many seconds of training (0: none)",
                            [](C& c) -> double& { return c.loop.time_limit_s; }));
  f.push_back(field<int64_t>("train.log_interval", "steps between progress records",
                             [](C& c) -> int64_t& { return c.loop.log_interval; }));
  f.push_back(field<int64_t>("train.eval_interval", "steps between validation passes (0: at the end)",
                             [](C& c) -> int64_t& { return c.loop.eval_interval; }));
  f.push_back(field<int64_t>("train.eval_batches", "validation batches per pass",
                             [](C& c) -> int64_t& { return c.loop.eval_batches; }));
}

// [checkpoint]
void add_checkpoint_fields(std::vector<Field>& f) {
  using C = TrainConfig;
  f.push_back(auto_or_steps_field(
      "checkpoint.interval", "steps between checkpoints (\"auto\": Young/Daly from the measured cost; 0: at the end)",
      [](C& c) -> int64_t& { return c.checkpoint.interval; }));
  f.push_back(field<int>("checkpoint.keep_last", "newest checkpoints kept",
                         [](C& c) -> int& { return c.checkpoint.keep_last; }));
  f.push_back(field<int>("checkpoint.keep_every", "also keep multiples of this step (0: none)",
                         [](C& c) -> int& { return c.checkpoint.keep_every; }));
  f.push_back(field<bool>("checkpoint.async", "write checkpoints in a background thread",
                          [](C& c) -> bool& { return c.checkpoint.async; }));
  f.push_back(field<std::string>("checkpoint.local_dir",
                                 "fast local tier (\"auto\": /dev/shm, else the temp dir; a path; \"\": off)",
                                 [](C& c) -> std::string& { return c.checkpoint.local_dir; }));
  f.push_back(auto_or_steps_field(
      "checkpoint.local_interval",
      "steps between local-tier checkpoints (\"auto\": cost under 1% of the steps; 0: no local tier)",
      [](C& c) -> int64_t& { return c.checkpoint.local_interval; }));
  f.push_back(field<int>("checkpoint.local_keep_last", "newest local-tier checkpoints kept",
                         [](C& c) -> int& { return c.checkpoint.local_keep_last; }));
  f.push_back(field<double>("checkpoint.mtbf_s", "assumed mean time between failures (Young/Daly interval)",
                            [](C& c) -> double& { return c.checkpoint.mtbf_s; }));
}

// [run]
void add_run_fields(std::vector<Field>& f) {
  using C = TrainConfig;
  f.push_back(field<std::string>("run.dir", "run directory (checkpoints, metrics, goodput)",
                                 [](C& c) -> std::string& { return c.run.dir; }));
  f.push_back(field<uint64_t>("run.seed", "seed of init, data order and dropout",
                              [](C& c) -> uint64_t& { return c.run.seed; }));
  f.push_back(field<int>("run.threads", "CPU threads (0: all cores)", [](C& c) -> int& { return c.run.threads; }));
  f.push_back(field<std::string>("run.device", "where the training step runs: cpu, cuda or cuda:N",
                                 [](C& c) -> std::string& { return c.run.device; }));
  f.push_back(field<bool>("run.tensorboard",
                          "write the metrics.jsonl scalars as TensorBoard events (RUN_DIR/tensorboard)",
                          [](C& c) -> bool& { return c.run.tensorboard; }));
  f.push_back(field<std::string>("run.init_from",
                                 "start from these weights: a Hugging Face directory, a checkpoint or a run (the "
                                 "model shape comes from there)",
                                 [](C& c) -> std::string& { return c.run.init_from; }));
  f.push_back(field<std::string>("run.compilation_cache",
                                 "persistent compilation cache directory: auto (RUN_DIR/compilation_cache, or "
                                 "TESSERA_COMPILATION_CACHE_DIR when set), \"\" (off) or a path",
                                 [](C& c) -> std::string& { return c.run.compilation_cache; }));
}

// [parallel]
void add_parallel_fields(std::vector<Field>& f) {
  using C = TrainConfig;
  f.push_back(field<std::string>("parallel.mesh", "device mesh, e.g. data=2,fsdp=2,tensor=2 (empty: one device)",
                                 [](C& c) -> std::string& { return c.parallel.mesh; }));
  f.push_back(field<std::string>("parallel.rules",
                                 "logical axis rules over the defaults, e.g. embed=fsdp,heads=tensor,vocab=",
                                 [](C& c) -> std::string& { return c.parallel.rules; }));
  f.push_back(field<std::string>("parallel.pipeline_schedule",
                                 "with a pipeline mesh axis: gpipe, 1f1b or interleaved (1F1B over virtual stages)",
                                 [](C& c) -> std::string& { return c.parallel.pipeline_schedule; }));
  f.push_back(field<int64_t>("parallel.pipeline_micro_batches",
                             "pipeline micro-batches per replica and accumulation step (0: auto, the most up to 2 x "
                             "the stages that divide the rows)",
                             [](C& c) -> int64_t& { return c.parallel.pipeline_micro_batches; }));
  f.push_back(field<int64_t>("parallel.virtual_stages",
                             "pipeline stages per device (interleaved; 0: 2 for interleaved, else 1)",
                             [](C& c) -> int64_t& { return c.parallel.virtual_stages; }));
  f.push_back(field<std::string>("parallel.pipeline_stages",
                                 "layers of each pipeline stage, e.g. 0-2,3-5 (\"\": balanced by FLOPs)",
                                 [](C& c) -> std::string& { return c.parallel.pipeline_stages; }));
  f.push_back(field<bool>("parallel.pipeline_recompute",
                          "a pipeline stage's backward recomputes its forward (true) or reads the activations its "
                          "forward kept (false: no second forward, more memory per micro-batch in flight)",
                          [](C& c) -> bool& { return c.parallel.pipeline_recompute; }));
}

const std::vector<Field>& schema() {
  static const std::vector<Field> fields = [] {
    std::vector<Field> f;
    add_model_fields(f);
    add_quant_fields(f);
    add_data_fields(f);
    add_optimizer_fields(f);
    add_schedule_fields(f);
    add_train_fields(f);
    add_checkpoint_fields(f);
    add_run_fields(f);
    add_parallel_fields(f);
    return f;
  }();
  return fields;
}

const Field* find_field(const std::string& key) {
  for (const Field& f : schema())
    if (f.key == key) return &f;
  return nullptr;
}

std::string suggestion(const std::string& key) {
  const Field* best = nullptr;
  size_t best_distance = std::numeric_limits<size_t>::max();
  for (const Field& f : schema()) {
    // Compare against the full key and against its last part (a key in the wrong section).
    const std::string leaf = f.key.substr(f.key.find('.') + 1);
    const std::string key_leaf = key.substr(key.find('.') + 1);
    const size_t d = std::min(edit_distance(key, f.key), edit_distance(key_leaf, leaf) + (key_leaf == leaf ? 1 : 2));
    if (d < best_distance) best_distance = d, best = &f;
  }
  if (!best || best_distance > std::max<size_t>(3, key.size() / 3)) return "";
  return fmt::format(" (did you mean '{}'?)", best->key);
}

[[noreturn]] void unknown_key(const std::string& where, const std::string& key) {
  fail<ConfigError>("{}: unknown key '{}'{}; `tessera train --list-keys` lists every key", where, key, suggestion(key));
}

std::string location(const std::string& origin, const toml::source_region& source) {
  return fmt::format("{}:{}", origin, source.begin.line);
}

void apply_preset(TrainConfig& config, const std::string& name, const std::string& where) {
  try {
    config.model = models::preset(name);
  } catch (const Error& e) {
    fail<ConfigError>("{}: model.preset: {}", where, e.what());
  }
  config.model_preset = name;
}

// Walks the parsed document: every leaf must be a known "section.key".
void apply_table(TrainConfig& config, const toml::table& root, const std::string& origin) {
  // model.preset first, so the file's other model keys override the preset's.
  if (const toml::table* model = root["model"].as_table())
    if (const toml::node* preset = model->get("preset")) {
      auto name = preset->value_exact<std::string>();
      if (!name) type_error(location(origin, preset->source()), "model.preset", "a string", *preset);
      apply_preset(config, *name, location(origin, preset->source()));
    }
  for (auto&& [section_key, section_node] : root) {
    const std::string section(section_key.str());
    const toml::table* section_table = section_node.as_table();
    if (!section_table) {
      const std::string key = section;
      unknown_key(location(origin, section_key.source()), key + " (keys belong in a [section])");
    }
    for (auto&& [key, node] : *section_table) {
      const std::string full = section + "." + std::string(key.str());
      const std::string where = location(origin, key.source());
      const Field* f = find_field(full);
      if (!f) unknown_key(where, full);
      if (full == "model.preset") continue;
      f->set(config, node, where);
    }
  }
}

// The offset of the first byte that does not belong to well-formed UTF-8, or npos. The
// table is RFC 3629's syntax (section 4): per lead byte range, the number of continuation
// bytes and the range of the first one (which excludes overlong forms, surrogates and
// code points past U+10FFFF); later continuation bytes are 80..BF.
size_t invalid_utf8_at(std::string_view text) {
  struct Lead {
    unsigned char first, last, continuation, lo, hi;
  };
  constexpr Lead kLeads[] = {{0x00, 0x7F, 0, 0, 0},       {0xC2, 0xDF, 1, 0x80, 0xBF}, {0xE0, 0xE0, 2, 0xA0, 0xBF},
                             {0xE1, 0xEC, 2, 0x80, 0xBF}, {0xED, 0xED, 2, 0x80, 0x9F}, {0xEE, 0xEF, 2, 0x80, 0xBF},
                             {0xF0, 0xF0, 3, 0x90, 0xBF}, {0xF1, 0xF3, 3, 0x80, 0xBF}, {0xF4, 0xF4, 3, 0x80, 0x8F}};
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  for (size_t i = 0; i < text.size();) {
    const Lead* lead = std::find_if(std::begin(kLeads), std::end(kLeads),
                                    [c = p[i]](const Lead& l) { return c >= l.first && c <= l.last; });
    if (lead == std::end(kLeads) || lead->continuation > text.size() - i - 1) return i;
    for (size_t k = 1; k <= lead->continuation; ++k)
      if (p[i + k] < (k == 1 ? lead->lo : 0x80) || p[i + k] > (k == 1 ? lead->hi : 0xBF)) return i;
    i += lead->continuation + size_t{1};
  }
  return std::string_view::npos;
}

void apply_override(TrainConfig& config, const std::string& override_text) {
  const std::string where = "--set " + override_text;
  // TOML files are UTF-8 (toml++ checks), and so must an override be, or a bare-word value
  // would carry invalid text into the checkpoint manifest, whose JSON cannot hold it.
  if (const size_t bad = invalid_utf8_at(override_text); bad != std::string_view::npos)
    fail<ConfigError>("{}: not valid UTF-8 (byte 0x{:02x} at offset {}; expected text)", where,
                      static_cast<unsigned char>(override_text[bad]), bad);
  const size_t eq = override_text.find('=');
  if (eq == std::string::npos || eq == 0)
    fail<ConfigError>("{}: expected section.key=value (e.g. --set optimizer.lr=3e-4)", where);
  const std::string key = override_text.substr(0, eq);
  const std::string value = override_text.substr(eq + 1);
  const Field* f = find_field(key);
  if (!f) unknown_key(where, key);
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
    // A bare word (--set run.dir=runs/x) is a string.
    parsed = toml::table{{"v", value}};
  }
  const toml::node& node = *parsed.get("v");
  if (key == "model.preset") {
    auto name = node.value_exact<std::string>();
    if (!name) type_error(where, key, "a string", node);
    apply_preset(config, *name, where);
    return;
  }
  f->set(config, node, where);
}

}  // namespace

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

optim::OptimizerConfig TrainConfig::optimizer_config() const {
  optim::OptimizerConfig out = optimizer;
  if (out.loss_scale.mode == optim::LossScaling::Auto)
    out.loss_scale.mode = model.compute_dtype == "float16" ? optim::LossScaling::Dynamic : optim::LossScaling::Off;
  return out;
}

nlohmann::json TrainConfig::to_json() const {
  nlohmann::json out = nlohmann::json::object();
  for (const Field& f : schema()) {
    const size_t dot = f.key.find('.');
    out[f.key.substr(0, dot)][f.key.substr(dot + 1)] = f.get(*this);
  }
  return out;
}

TrainConfig parse_config(const std::string& toml_text, const std::string& origin,
                         const std::vector<std::string>& overrides) {
  TrainConfig config;
  toml::table root;
  try {
    root = toml::parse(toml_text, origin);
  } catch (const toml::parse_error& e) {
    fail<ConfigError>("{}:{}:{}: TOML syntax error: {}", origin, e.source().begin.line, e.source().begin.column,
                      std::string(e.description()));
  }
  apply_table(config, root, origin);
  for (const std::string& o : overrides) apply_override(config, o);
  config.schedule.total_steps = config.loop.steps;
  detail::check_compute_dtype(config.model.compute_dtype, origin);
  config.model.compute_dtype = detail::resolve_compute_dtype(config.model.compute_dtype, config.run.device);
  detail::resolve_quant_mode(config, origin);
  config.validate();
  return config;
}

TrainConfig load_config(const std::filesystem::path& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  if (!in) fail<ConfigError>("{}: cannot read the config file ({})", path.string(), std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  return parse_config(text.str(), path.string(), overrides);
}

TrainConfig config_from_json(const nlohmann::json& json) {
  // Through TOML so every key takes the same checked path as a config file. The JSON comes
  // from a checkpoint manifest, so its shape is checked too: a damaged one is a
  // ConfigError, never a JSON or TOML library error thrown past the resume logic.
  constexpr const char* kWhere = "checkpoint config";
  if (!json.is_object()) fail<ConfigError>("{}: expected an object of sections (got {})", kWhere, json.type_name());
  TrainConfig config;
  bool legacy_auto_interval = false;
  const nlohmann::json model = json_field_or<nlohmann::json>(json, "model", nlohmann::json());
  const std::optional<nlohmann::json> preset = json_field<nlohmann::json>(model, "preset");
  if (preset && !preset->is_string())
    fail<ConfigError>("{}: key 'model.preset' is {} (expected a string)", kWhere, preset->dump());
  if (preset && !preset->get<std::string>().empty()) apply_preset(config, preset->get<std::string>(), kWhere);
  for (const auto& [section, keys] : json.items()) {
    if (!keys.is_object())
      fail<ConfigError>("{}: section '{}' is {} (expected an object of keys)", kWhere, section, keys.type_name());
    for (const auto& [key, value] : keys.items()) {
      const std::string full = section + "." + key;
      if (full == "model.preset") continue;
      if (full == "checkpoint.auto_interval") {
        // Written by checkpoints before "auto" became a value of checkpoint.interval.
        legacy_auto_interval = value == true;
        continue;
      }
      const Field* f = find_field(full);
      if (!f) fail<ConfigError>("{}: unknown key '{}'", kWhere, full);
      toml::table parsed;
      try {
        // data.mixture holds tables, whose JSON is not TOML; every other value's JSON is.
        parsed = toml::parse("v = " + (full == "data.mixture" ? detail::toml_inline(value) : value.dump()));
      } catch (const toml::parse_error& e) {
        fail<ConfigError>("{}: key '{}' is {} (not a TOML value: {})", kWhere, full, value.dump(),
                          std::string(e.description()));
      }
      f->set(config, *parsed.get("v"), kWhere);
    }
  }
  if (legacy_auto_interval) config.checkpoint.interval = kAutoInterval;
  // Checkpoints written before model.vocab_pad_to existed hold unpadded tables.
  if (!model.is_object() || !model.contains("vocab_pad_to")) config.model.vocab_pad_to = 1;
  config.model_preset = preset ? preset->get<std::string>() : "";
  config.schedule.total_steps = config.loop.steps;
  config.validate();
  return config;
}

std::string describe_config_keys() {
  TrainConfig defaults;
  std::string out;
  for (const Field& f : schema())
    out += fmt::format("{:<28} {:<12} default {:<24} {}\n", f.key, f.type, f.get(defaults).dump(), f.help);
  return out;
}

}  // namespace tessera::train
