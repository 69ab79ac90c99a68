// Hugging Face model directories (what save_pretrained writes and from_pretrained reads):
//
//   config.json                          the architecture (hf_config.h)
//   model.safetensors                    every tensor, or, when sharded:
//   model.safetensors.index.json         {"metadata": {"total_size": bytes of tensor data},
//                                         "weight_map": {tensor name: shard file}}
//   model-00001-of-0000N.safetensors ... the shards
//   tokenizer files (tokenizer.json, vocab.json + merges.txt, tokenizer.model), optional
//
// Reading validates the index against the shards (a tensor mapped to a missing file, a
// listed tensor absent from its shard, a shard tensor the map does not list: IOErrors
// naming them); every file goes through ckpt::read_safetensors' header checks.
// Writing is atomic: everything goes into a temporary directory beside the target,
// which is fsynced and renamed into place; on any error nothing is left at the target.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tessera/interop/hf_weights.h"
#include "tessera/models/model.h"

namespace tessera::interop {

// A directory with config.json and no tessera manifest.json.
bool is_hf_model_dir(const std::filesystem::path& dir);

// config.json's content (IOError naming the file when it is missing or not JSON).
nlohmann::json read_hf_config(const std::filesystem::path& dir);

// Every tensor of the directory's model.safetensors or indexed shards.
HfTensors read_hf_tensors(const std::filesystem::path& dir);

struct HfModel {
  models::ModelConfig config;
  nlohmann::json hf_config;  // config.json as read
  Tree params;               // float32
};

// config.json + tensors -> the model's config and parameters (hf_config.h, hf_weights.h).
HfModel load_hf_model(const std::filesystem::path& dir);

struct HfSaveOptions {
  DType dtype = DType::Float32;                       // of the written tensors: Float32 or BFloat16
  uint64_t max_shard_bytes = 5'000'000'000;           // tensor bytes per file before a new shard starts
  std::optional<int64_t> bos_token_id, eos_token_id;  // written to config.json when known
  // Files copied into the directory: (source, name in the directory), e.g. tokenizer files.
  std::vector<std::pair<std::filesystem::path, std::string>> extra_files;
};

// Writes `out_dir` (which must not exist, or be an empty directory) atomically.
void save_hf_model(const std::filesystem::path& out_dir, const models::ModelConfig& config, const Tree& params,
                   const HfSaveOptions& options = {});

// "5GB" -> 5e9; units B, KB, MB, GB, TB (powers of 1000, as transformers' max_shard_size)
// and KiB, MiB, GiB, TiB (powers of 1024); a bare number is bytes. ValueError otherwise.
uint64_t parse_byte_size(const std::string& text);

}  // namespace tessera::interop
