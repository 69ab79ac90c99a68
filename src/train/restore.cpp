#include "tessera/train/restore.h"

#include "tessera/base/error.h"
#include "tessera/base/json_field.h"
#include "tessera/ckpt/checkpoint.h"
#include "tessera/interop/hf_checkpoint.h"
#include "tessera/optim/optimizer.h"
#include "tessera/train/pretrained.h"

namespace tessera::train {

namespace fs = std::filesystem;

RestoredModel restore_model(const fs::path& path, const std::function<void(const std::string&)>& warn) {
  if (!fs::exists(path)) fail<IOError>("'{}' does not exist (expected a checkpoint or a run directory)", path.string());
  // A Hugging Face model directory (config.json, safetensors): imported on the fly.
  if (interop::is_hf_model_dir(path)) return train::restore_hf_model(path, warn);
  fs::path checkpoint = path;
  if (!fs::exists(path / "manifest.json")) {
    // A run directory: newest checkpoint that verifies.
    std::vector<ckpt::CheckpointInfo> all = ckpt::CheckpointManager(path).list();
    checkpoint.clear();
    for (auto it = all.rbegin(); it != all.rend(); ++it) {
      const ckpt::VerifyResult check = ckpt::CheckpointManager::verify(it->path);
      if (check.ok) {
        checkpoint = it->path;
        break;
      }
      warn(fmt::format("skipping {}: {}", it->path.string(), check.problem));
    }
    if (checkpoint.empty()) fail<IOError>("'{}' holds no valid checkpoint", path.string());
  } else if (const ckpt::VerifyResult check = ckpt::CheckpointManager::verify(path); !check.ok) {
    fail<IOError>("checkpoint '{}' is invalid: {}", path.string(), check.problem);
  }
  const nlohmann::json manifest = ckpt::read_manifest(checkpoint);
  const nlohmann::json extra = json_field_or<nlohmann::json>(manifest, "extra", nlohmann::json::object());
  if (!extra.is_object() || !extra.contains("config"))
    fail<IOError>("checkpoint '{}': its manifest has no training config (extra.config)", checkpoint.string());

  RestoredModel out;
  out.config = config_from_json(extra.at("config"));
  out.model = std::make_unique<models::Model>(out.config.model);
  // The params template only fixes structure and types; values come from the file.
  Tree params_like = out.model->init(out.config.run.seed);
  optim::Optimizer optimizer(out.config.optimizer_config(), out.model->specs());
  ckpt::CheckpointState state = ckpt::CheckpointManager::load(checkpoint, params_like, optimizer.init(params_like));
  out.params = std::move(state.params);
  out.step = state.step;
  out.checkpoint = checkpoint;
  out.tokenizer = json_field_or<std::string>(extra, "tokenizer", out.config.data.tokenizer);
  out.tokenizer_spec = json_field_or<std::string>(extra, "tokenizer_spec", out.tokenizer);
  return out;
}

}  // namespace tessera::train
