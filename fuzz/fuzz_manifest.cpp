// A checkpoint's manifest.json (ckpt/checkpoint.h) as resuming reads it: verification
// (which decides whether to fall back to an older checkpoint) and, for a manifest that
// carries one, the training config in extra.config.
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "tessera/base/json_field.h"
#include "tessera/ckpt/checkpoint.h"
#include "tessera/train/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  const std::filesystem::path dir = fuzz::scratch_dir() / "step_00000010";
  std::filesystem::create_directories(dir);
  fuzz::write_file(dir / "manifest.json", fuzz::as_text(data, size));
  fuzz::write_file(dir / "params.safetensors", "params");
  ckpt::CheckpointManager::verify(dir);
  fuzz::expect_errors([&] {
    const nlohmann::json manifest = ckpt::read_manifest(dir);
    const nlohmann::json extra = json_field_or<nlohmann::json>(manifest, "extra", nlohmann::json::object());
    if (const std::optional<nlohmann::json> config = json_field<nlohmann::json>(extra, "config"))
      train::config_from_json(*config);
  });
  return 0;
}
