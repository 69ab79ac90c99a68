// A Hugging Face model directory (interop/hf_checkpoint.h): config.json and
// model.safetensors are the input's two '\0'-separated fields, imported as `tessera
// train --init-from` and `tessera hf import` do.
#include "fuzz_util.h"
#include "tessera/interop/hf_checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  const std::string_view text = fuzz::as_text(data, size);
  const size_t cut = text.find('\0');
  if (cut == std::string_view::npos) return 0;
  const std::filesystem::path dir = fuzz::scratch_dir();
  fuzz::write_file(dir / "config.json", text.substr(0, cut));
  fuzz::write_file(dir / "model.safetensors", text.substr(cut + 1));
  fuzz::expect_errors([&] { interop::load_hf_model(dir); });
  return 0;
}
