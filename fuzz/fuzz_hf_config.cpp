// A Hugging Face config.json (interop/hf_config.h) as the model config it maps to; a
// config that maps must map back (`tessera hf export`).
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "tessera/interop/hf_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  const nlohmann::json config = nlohmann::json::parse(fuzz::as_text(data, size), nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded()) return 0;
  fuzz::expect_errors([&] {
    const models::ModelConfig model = interop::model_config_from_hf(config, "config.json");
    interop::hf_config_from_model(model);
  });
  return 0;
}
