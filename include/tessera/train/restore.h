// Loading a trained model back from a checkpoint (for `tessera sample` and
// `tessera eval`): the config stored in the manifest rebuilds the model, the params
// file fills it.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include "tessera/models/model.h"
#include "tessera/train/config.h"

namespace tessera::train {

struct RestoredModel {
  TrainConfig config;
  std::unique_ptr<models::Model> model;
  Tree params;
  int64_t step = 0;
  std::filesystem::path checkpoint;
  std::string tokenizer;       // the tokenizer's id (token files and checkpoints match on it)
  std::string tokenizer_spec;  // how to load it (make_tokenizer); = tokenizer for "byte"
};

// `path` is one checkpoint directory (verified; an IOError if it fails) or a run
// directory (its newest valid checkpoint; skipped ones are reported through `warn`),
// or a Hugging Face model directory (train/pretrained.h: step 0; tokenizer and
// tokenizer_spec empty when the directory has no tokenizer files).
RestoredModel restore_model(const std::filesystem::path& path, const std::function<void(const std::string&)>& warn);

}  // namespace tessera::train
