// Pretrained weights in and out of tessera: `tessera ckpt import-hf` (a Hugging Face
// directory -> a tessera run directory with one step-0 checkpoint), `tessera ckpt
// export-hf` (a checkpoint -> a Hugging Face directory transformers loads), `tessera
// sample --ckpt HF_DIR` (restore_model reads the directory directly) and `tessera train
// --init-from DIR` (the model's shape and first parameters from DIR).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include "tessera/core/tree.h"
#include "tessera/models/model.h"
#include "tessera/train/restore.h"

namespace tessera::train {

using Warn = std::function<void(const std::string&)>;

struct TokenizerRef {
  std::string id, spec;  // data::Tokenizer::id() and spec()
};

// The tokenizer files of a Hugging Face directory (tokenizer.json, vocab.json +
// merges.txt, tokenizer.model), loaded to learn their id. nullopt when there are none,
// or (with a warning through `warn`) when they cannot be loaded.
std::optional<TokenizerRef> hf_dir_tokenizer(const std::filesystem::path& dir, const Warn& warn);

// A Hugging Face directory as restore_model returns checkpoints: step 0, the model
// config in a default TrainConfig, the tokenizer of the directory (empty id and spec
// when it has none: the caller must be given one).
RestoredModel restore_hf_model(const std::filesystem::path& dir, const Warn& warn);

struct ImportResult {
  std::filesystem::path checkpoint;  // OUT/checkpoints/step_00000000
  models::ModelConfig config;
  std::optional<TokenizerRef> tokenizer;
};

// Writes `out_run_dir`/checkpoints/step_00000000 (params, a fresh optimizer state of
// the default optimizer, manifest extra: config, tokenizer, tokenizer_spec,
// imported_from, hf_token_ids). The run directory must hold no checkpoint yet.
ImportResult import_hf(const std::filesystem::path& hf_dir, const std::filesystem::path& out_run_dir, const Warn& warn);

struct ExportOptions {
  DType dtype = DType::Float32;  // Float32 or BFloat16
  uint64_t max_shard_bytes = 5'000'000'000;
};

// A checkpoint, a run directory (its newest valid checkpoint) or a Hugging Face
// directory -> `out_dir` (config.json, safetensors, the tokenizer's files when the
// checkpoint's tokenizer_spec names files). Atomic (hf_checkpoint.h).
void export_hf(const std::filesystem::path& source, const std::filesystem::path& out_dir, const ExportOptions& options,
               const Warn& warn);

// The model config stored in `dir` without reading its weights: a Hugging Face
// directory's config.json, a checkpoint's manifest, or a run's newest checkpoint's.
models::ModelConfig stored_model_config(const std::filesystem::path& dir);

// `configured` with every shape field (family, sizes, context, norm_eps, rope_theta,
// tied embeddings) taken from `dir`; compute_dtype, dropout and init_std stay.
models::ModelConfig init_from_model_config(const models::ModelConfig& configured, const std::filesystem::path& dir);

// The parameters stored in `dir` (any kind above) for a model of `config`; a config
// whose shape differs from the stored one is a ValueError naming both.
Tree load_init_params(const std::filesystem::path& dir, const models::ModelConfig& config, const Warn& warn);

}  // namespace tessera::train
