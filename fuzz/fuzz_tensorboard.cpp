// The TensorBoard writer's inputs (train/tensorboard.h): arbitrary tags, steps and
// values (NaN, infinities, huge steps) encoded as events and written to an event file.
// One writer serves many inputs (opening and fsyncing a file per input would make this
// target a file-system benchmark); it is replaced every kInputsPerFile inputs.
#include <cstring>
#include <memory>

#include "fuzz_util.h"
#include "tessera/train/tensorboard.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  constexpr int kInputsPerFile = 10000;
  static std::unique_ptr<train::TensorBoardWriter> writer;
  static int inputs = 0;
  if (size < 16) return 0;
  double value = 0;
  float single = 0;
  int64_t step = 0;
  std::memcpy(&value, data, 8);
  std::memcpy(&single, data, 4);
  std::memcpy(&step, data + 8, 8);
  const std::vector<std::string> tags = fuzz::split_fields(fuzz::as_text(data + 16, size - 16));
  train::tfrecord_frame(train::encode_scalar_event(value, step, tags.front(), single));
  if (!writer || ++inputs % kInputsPerFile == 0) {
    writer.reset();
    train::TensorBoardOptions options;
    options.clock = [] { return 1.7e9; };
    writer = std::make_unique<train::TensorBoardWriter>(fuzz::scratch_dir(), options);
  }
  fuzz::expect_errors([&] {
    std::vector<std::pair<std::string, double>> scalars;
    for (const std::string& tag : tags) scalars.emplace_back(tag, value);
    writer->add_scalars(step, scalars);
  });
  return 0;
}
