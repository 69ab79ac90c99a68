// The training config (train/config.h): TOML text, then `--set key=value` overrides, the
// input's '\0'-separated fields. A config that parses must also survive the checkpoint
// round trip (to_json, config_from_json) that resuming a run takes.
#include "fuzz_util.h"
#include "tessera/train/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  std::vector<std::string> fields = fuzz::split_fields(fuzz::as_text(data, size));
  const std::string toml = fields.front();
  fields.erase(fields.begin());
  fuzz::expect_errors([&] {
    const train::TrainConfig config = train::parse_config(toml, "fuzz.toml", fields);
    train::config_from_json(config.to_json());
  });
  return 0;
}
