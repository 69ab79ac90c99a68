// safetensors files (ckpt/safetensors.h): the header alone (`tessera ckpt inspect`) and
// the whole file (checkpoints).
#include "fuzz_util.h"
#include "tessera/ckpt/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  const std::filesystem::path path = fuzz::scratch_dir() / "model.safetensors";
  fuzz::write_file(path, fuzz::as_text(data, size));
  fuzz::expect_errors([&] { ckpt::read_safetensors_header(path); });
  fuzz::expect_errors([&] { ckpt::read_safetensors(path); });
  return 0;
}
