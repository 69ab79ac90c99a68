#include "tessera/train/pretrained.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "tessera/base/error.h"
#include "tessera/base/json_field.h"
#include "tessera/ckpt/checkpoint.h"
#include "tessera/data/tokenizer.h"
#include "tessera/interop/hf_checkpoint.h"
#include "tessera/interop/hf_config.h"
#include "tessera/optim/optimizer.h"
#include "tessera/train/config.h"

namespace tessera::train {

// The Hugging Face reader and writer this file composes with checkpoints.
using namespace tessera::interop;

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

bool has_tokenizer_files(const fs::path& dir) {
  return fs::exists(dir / "tokenizer.json") || (fs::exists(dir / "vocab.json") && fs::exists(dir / "merges.txt")) ||
         fs::exists(dir / "tokenizer.model");
}

std::optional<int64_t> token_id(const json& config, const char* key) {
  if (config.contains(key) && config[key].is_number_integer()) return config[key].get<int64_t>();
  return std::nullopt;
}

// The fields that define the model's computation (what a checkpoint must agree on).
bool same_shape(const models::ModelConfig& a, const models::ModelConfig& b) {
  return a.family == b.family && a.vocab == b.vocab && a.padded_vocab() == b.padded_vocab() && a.dim == b.dim &&
         a.layers == b.layers && a.heads == b.heads && a.resolved_kv_heads() == b.resolved_kv_heads() &&
         a.resolved_mlp_dim() == b.resolved_mlp_dim() && a.context == b.context &&
         a.resolved_tied() == b.resolved_tied();
}

std::string shape_string(const models::ModelConfig& c) {
  return fmt::format("{} vocab {} dim {} layers {} heads {} kv_heads {} mlp {} context {}{}", c.family, c.vocab, c.dim,
                     c.layers, c.heads, c.resolved_kv_heads(), c.resolved_mlp_dim(), c.context,
                     c.resolved_tied() ? " tied" : "");
}

// A tokenizer spec's files as (source, name in a Hugging Face directory).
std::vector<std::pair<fs::path, std::string>> tokenizer_files(const std::string& spec) {
  std::string path = spec;
  for (const char* prefix : {"gpt2:", "hf:", "spm:"})
    if (spec.rfind(prefix, 0) == 0) path = spec.substr(std::string(prefix).size());
  std::vector<std::pair<fs::path, std::string>> out;
  if (path.empty() || spec == "byte" || !fs::exists(path)) return out;
  fs::path dir = path;
  if (fs::is_regular_file(path)) {
    const fs::path file = path;
    if (file.extension() == ".model") return {{file, "tokenizer.model"}};
    if (spec.rfind("hf:", 0) == 0 || file.filename() == "tokenizer.json") return {{file, "tokenizer.json"}};
    dir = file.parent_path();  // GPT-2 vocab.json / encoder.json: the merges sit beside it
  }
  // Standard names, and OpenAI's GPT-2 names under the ones transformers reads.
  const std::pair<const char*, const char*> names[] = {{"tokenizer.json", "tokenizer.json"},
                                                       {"tokenizer_config.json", "tokenizer_config.json"},
                                                       {"special_tokens_map.json", "special_tokens_map.json"},
                                                       {"vocab.json", "vocab.json"},
                                                       {"merges.txt", "merges.txt"},
                                                       {"tokenizer.model", "tokenizer.model"},
                                                       {"encoder.json", "vocab.json"},
                                                       {"vocab.bpe", "merges.txt"}};
  for (const auto& name : names) {
    // Not a structured binding: clang before 16 cannot capture one in the lambda.
    const char* to = name.second;
    const bool taken = std::any_of(out.begin(), out.end(), [&](const auto& f) { return f.second == to; });
    if (!taken && fs::is_regular_file(dir / name.first)) out.emplace_back(dir / name.first, to);
  }
  return out;
}

}  // namespace

std::optional<TokenizerRef> hf_dir_tokenizer(const fs::path& dir, const Warn& warn) {
  if (!has_tokenizer_files(dir)) return std::nullopt;
  try {
    std::unique_ptr<data::Tokenizer> tokenizer = data::make_tokenizer(fs::absolute(dir).lexically_normal().string());
    return TokenizerRef{tokenizer->id(), tokenizer->spec()};
  } catch (const std::exception& e) {
    if (warn)
      warn(fmt::format("{}: its tokenizer files cannot be loaded ({}); going on without a tokenizer", dir.string(),
                       e.what()));
    return std::nullopt;
  }
}

train::RestoredModel restore_hf_model(const fs::path& dir, const Warn& warn) {
  HfModel hf = load_hf_model(dir);
  train::RestoredModel out;
  out.config.model = hf.config;
  out.config.loop.seq = std::min(out.config.loop.seq, hf.config.context);
  out.model = std::make_unique<models::Model>(hf.config);
  out.params = std::move(hf.params);
  out.step = 0;
  out.checkpoint = dir;
  if (std::optional<TokenizerRef> tokenizer = hf_dir_tokenizer(dir, warn)) {
    out.tokenizer = tokenizer->id;
    out.tokenizer_spec = tokenizer->spec;
    out.config.data.tokenizer = tokenizer->spec;
  }
  return out;
}

ImportResult import_hf(const fs::path& hf_dir, const fs::path& out_run_dir, const Warn& warn) {
  if (!ckpt::list_checkpoints(out_run_dir / "checkpoints").empty())
    fail<IOError>("{} already holds checkpoints (import into a new directory)", out_run_dir.string());
  HfModel hf = load_hf_model(hf_dir);
  ImportResult result;
  result.config = hf.config;
  result.tokenizer = hf_dir_tokenizer(hf_dir, warn);

  train::TrainConfig config;
  config.model = hf.config;
  config.loop.seq = std::min(config.loop.seq, hf.config.context);
  config.run.dir = out_run_dir.string();
  if (result.tokenizer) config.data.tokenizer = result.tokenizer->spec;
  config.validate();
  const models::Model model(config.model);
  optim::Optimizer optimizer(config.optimizer_config(), model.specs());

  ckpt::CheckpointState state;
  state.step = 0;
  state.opt_state = optimizer.init(hf.params);  // fresh: training from here starts like any run
  state.params = std::move(hf.params);
  state.extra["config"] = config.to_json();
  state.extra["tokenizer"] = result.tokenizer ? result.tokenizer->id : "";
  state.extra["tokenizer_spec"] = result.tokenizer ? result.tokenizer->spec : "";
  state.extra["imported_from"] = fs::absolute(hf_dir).lexically_normal().string();
  json ids = json::object();
  for (const char* key : {"bos_token_id", "eos_token_id"})
    if (std::optional<int64_t> id = token_id(hf.hf_config, key)) ids[key] = *id;
  state.extra["hf_token_ids"] = ids;
  result.checkpoint = ckpt::CheckpointManager(out_run_dir).save(state);
  return result;
}

void export_hf(const fs::path& source, const fs::path& out_dir, const ExportOptions& options, const Warn& warn) {
  const train::RestoredModel restored = train::restore_model(source, warn);
  HfSaveOptions save;
  save.dtype = options.dtype;
  save.max_shard_bytes = options.max_shard_bytes;
  json ids = json::object();
  if (is_hf_model_dir(restored.checkpoint))
    ids = read_hf_config(restored.checkpoint);
  else if (fs::exists(restored.checkpoint / "manifest.json"))
    ids = json_field_or<json>(json_field_or<json>(ckpt::read_manifest(restored.checkpoint), "extra", json()),
                              "hf_token_ids", json::object());
  save.bos_token_id = token_id(ids, "bos_token_id");
  save.eos_token_id = token_id(ids, "eos_token_id");
  if (!restored.tokenizer_spec.empty() && restored.tokenizer_spec != "byte") {
    save.extra_files = tokenizer_files(restored.tokenizer_spec);
    if (save.extra_files.empty() && warn)
      warn(fmt::format("tokenizer {}: no files found to copy; the export has no tokenizer", restored.tokenizer_spec));
    if (!save.eos_token_id) {
      try {
        save.eos_token_id = data::make_tokenizer(restored.tokenizer_spec)->eos_id();
      } catch (const std::exception& e) {
        if (warn)
          warn(fmt::format("tokenizer {}: {} (config.json gets no eos_token_id)", restored.tokenizer_spec, e.what()));
      }
    }
  }
  save_hf_model(out_dir, restored.config.model, restored.params, save);
}

models::ModelConfig stored_model_config(const fs::path& dir) {
  if (!fs::is_directory(dir)) fail<IOError>("'{}' is not a directory (expected a model to start from)", dir.string());
  if (is_hf_model_dir(dir)) return model_config_from_hf(read_hf_config(dir), (dir / "config.json").string());
  fs::path checkpoint = dir;
  if (!fs::exists(dir / "manifest.json")) {
    const std::vector<ckpt::CheckpointInfo> all = ckpt::list_checkpoints(dir / "checkpoints");
    if (all.empty())
      fail<IOError>(
          "'{}' is neither a Hugging Face model (config.json), a checkpoint (manifest.json) nor a run with "
          "checkpoints",
          dir.string());
    checkpoint = all.back().path;
  }
  const json manifest = ckpt::read_manifest(checkpoint);
  if (!manifest.contains("extra") || !manifest["extra"].contains("config"))
    fail<IOError>("checkpoint '{}': its manifest has no training config (extra.config)", checkpoint.string());
  return train::config_from_json(manifest["extra"]["config"]).model;
}

models::ModelConfig init_from_model_config(const models::ModelConfig& configured, const fs::path& dir) {
  models::ModelConfig out = stored_model_config(dir);
  out.compute_dtype = configured.compute_dtype;
  out.quant_targets = configured.quant_targets;
  out.quant_backward = configured.quant_backward;
  out.remat = configured.remat;
  out.dropout = configured.dropout;
  out.init_std = configured.init_std;
  return out;
}

Tree load_init_params(const fs::path& dir, const models::ModelConfig& config, const Warn& warn) {
  models::ModelConfig stored;
  Tree params;
  if (is_hf_model_dir(dir)) {
    HfModel hf = load_hf_model(dir);
    stored = hf.config;
    params = std::move(hf.params);
  } else {
    train::RestoredModel restored = train::restore_model(dir, warn);
    stored = restored.config.model;
    params = std::move(restored.params);
  }
  if (!same_shape(stored, config))
    fail<ValueError>("init from '{}': it holds a {} model, but the run's model is {}", dir.string(),
                     shape_string(stored), shape_string(config));
  return params;
}

}  // namespace tessera::train
