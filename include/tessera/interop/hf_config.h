// Hugging Face config.json <-> models::ModelConfig, for the two architectures tessera
// computes exactly: GPT2LMHeadModel (model_type "gpt2") and LlamaForCausalLM ("llama").
//
// Import accepts only configs whose model tessera's blocks reproduce: GPT-2 with
// gelu_new (tanh GELU), scaled attention, no per-layer attention scaling; Llama with
// silu, no biases, head_dim = hidden / heads and RoPE plain or with Llama 3.1's scaling
// (rope_type "llama3", in rope_scaling or rope_parameters). Anything
// else is a ValueError naming the key, its value and what is supported, so a model that
// would load but compute something different is never imported silently.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tessera/models/model.h"

namespace tessera::interop {

// "gpt2", "llama": the model_types import understands (and their architectures).
std::vector<std::string> supported_hf_model_types();

// config.json's content -> ModelConfig (dropout 0, compute float32). `origin` (the
// file) prefixes every error.
models::ModelConfig model_config_from_hf(const nlohmann::json& config, const std::string& origin);

struct HfConfigOptions {
  std::string dtype = "float32";  // torch_dtype written: "float32" | "bfloat16"
  std::optional<int64_t> bos_token_id, eos_token_id;
};

// ModelConfig -> config.json content (architectures, model_type, the sizes, torch_dtype,
// token ids when known). model_config_from_hf(hf_config_from_model(c)) gives c back.
nlohmann::json hf_config_from_model(const models::ModelConfig& config, const HfConfigOptions& options = {});

}  // namespace tessera::interop
