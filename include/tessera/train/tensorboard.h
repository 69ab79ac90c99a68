// TensorBoard event files for the trainer's scalars, without TensorFlow or protobuf.
//
//   TensorBoardWriter tb(run_dir / "tensorboard");   // events.out.tfevents.<time>.<host>.<pid>.<n>
//   tb.add_scalars(step, {{"train/loss", 2.31}, {"train/lr", 3e-4}});   // written and flushed
//   tb.close();                                       // fsynced (the destructor closes too)
//
// The file is a sequence of TFRecords: uint64 length (little-endian), masked CRC32C of
// those 8 bytes, the data, masked CRC32C of the data; the mask is
// ((crc >> 15) | (crc << 17)) + 0xa282ead8. Each record's data is a tensorflow.Event
// protobuf, hand-encoded: the first has wall_time and file_version "brain.Event:2", then
// one Event per scalar: wall_time (double, field 1), step (int64, field 2), summary
// (field 5) = Summary{value (field 1) = Value{tag (field 1), simple_value (float,
// field 2)}}. Each writer makes its own file, so a resumed run adds a new file to the
// same directory, which TensorBoard reads as one run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tessera::train {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), table-driven; `crc` continues
// an earlier call's result. crc32c("123456789") = 0xE3069283.
uint32_t crc32c(std::string_view data, uint32_t crc = 0);
// The TFRecord mask: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t mask_crc32c(uint32_t crc);

// One TFRecord: length, masked CRC of the length, data, masked CRC of the data.
std::string tfrecord_frame(std::string_view data);
// The serialized Event protobufs the writer frames.
std::string encode_file_version_event(double wall_time, std::string_view file_version = "brain.Event:2");
std::string encode_scalar_event(double wall_time, int64_t step, std::string_view tag, float value);

struct TensorBoardOptions {
  std::function<double()> clock;  // wall_time in unix seconds; default: std::chrono::system_clock
  std::string file_name;          // "": events.out.tfevents.<unix time>.<hostname>.<pid>.<n>
};

class TensorBoardWriter {
 public:
  // Creates `dir` if needed and a new event file in it holding the file_version event.
  // An unwritable directory or an existing `options.file_name` is an IOError naming the path.
  explicit TensorBoardWriter(const std::filesystem::path& dir, TensorBoardOptions options = {});
  ~TensorBoardWriter();  // close(); errors are swallowed here (call close() to see them)
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // Buffers one Event for the scalar; flush() writes the buffered events.
  void add_scalar(std::string_view tag, double value, int64_t step);
  // One step's scalars, written and flushed to the file (a live TensorBoard sees them).
  void add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars);
  void flush();
  // Flushes and fsyncs the file, then closes it; later calls do nothing.
  void close();

  const std::filesystem::path& path() const { return path_; }

 private:
  void write_all(std::string_view bytes);
  double now() const;

  std::filesystem::path path_;
  TensorBoardOptions options_;
  std::string pending_;
  int fd_ = -1;
};

}  // namespace tessera::train
