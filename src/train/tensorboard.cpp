#include "tessera/train/tensorboard.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <system_error>

#include "tessera/base/error.h"

namespace tessera::train {

namespace fs = std::filesystem;

namespace {

constexpr std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
  return table;
}

constexpr std::array<uint32_t, 256> kCrc32cTable = make_crc32c_table();

// ---- protobuf wire format ----

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

void put_key(std::string& out, uint32_t field, uint32_t wire_type) { put_varint(out, (field << 3) | wire_type); }

constexpr uint32_t kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;

void put_double(std::string& out, uint32_t field, double v) {
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, kFixed64);
  put_le(out, bits, 8);
}

void put_float(std::string& out, uint32_t field, float v) {
  uint32_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, kFixed32);
  put_le(out, bits, 4);
}

void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes);
}

std::string default_file_name(double wall_time) {
  static std::atomic<int> counter{0};
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') std::strcpy(host, "localhost");
  return fmt::format("events.out.tfevents.{}.{}.{}.{}", static_cast<int64_t>(std::floor(wall_time)), host, ::getpid(),
                     counter.fetch_add(1));
}

}  // namespace

uint32_t crc32c(std::string_view data, uint32_t crc) {
  crc = ~crc;
  for (const char c : data) crc = kCrc32cTable[(crc ^ static_cast<unsigned char>(c)) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

uint32_t mask_crc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

std::string tfrecord_frame(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  put_le(out, data.size(), 8);
  put_le(out, mask_crc32c(crc32c(out)), 4);
  out.append(data);
  put_le(out, mask_crc32c(crc32c(data)), 4);
  return out;
}

std::string encode_file_version_event(double wall_time, std::string_view file_version) {
  std::string event;
  put_double(event, 1, wall_time);
  put_bytes(event, 3, file_version);
  return event;
}

std::string encode_scalar_event(double wall_time, int64_t step, std::string_view tag, float value) {
  std::string summary_value;
  put_bytes(summary_value, 1, tag);
  put_float(summary_value, 2, value);
  std::string summary;
  put_bytes(summary, 1, summary_value);
  std::string event;
  put_double(event, 1, wall_time);
  put_key(event, 2, kVarint);
  put_varint(event, static_cast<uint64_t>(step));  // int64: negative steps take 10 bytes, as protobuf does
  put_bytes(event, 5, summary);
  return event;
}

TensorBoardWriter::TensorBoardWriter(const fs::path& dir, TensorBoardOptions options) : options_(std::move(options)) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail<IOError>("tensorboard: cannot create the directory '{}': {}", dir.string(), ec.message());
  const double t = now();
  for (int attempt = 0; fd_ < 0; ++attempt) {
    path_ = dir / (options_.file_name.empty() ? default_file_name(t) : options_.file_name);
    // O_EXCL: one file per writer, never appended to or overwritten.
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ < 0 && !(errno == EEXIST && options_.file_name.empty() && attempt < 100))
      fail<IOError>("tensorboard: cannot create the event file '{}': {}", path_.string(), std::strerror(errno));
  }
  pending_ = tfrecord_frame(encode_file_version_event(t));
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  try {
    close();
  } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor must not throw; close() reports
  }
  if (fd_ >= 0) ::close(fd_);
}

double TensorBoardWriter::now() const {
  if (options_.clock) return options_.clock();
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void TensorBoardWriter::add_scalar(std::string_view tag, double value, int64_t step) {
  if (fd_ < 0) fail<IOError>("tensorboard: '{}' is closed; cannot add '{}' at step {}", path_.string(), tag, step);
  if (tag.empty()) fail<ValueError>("tensorboard: a scalar needs a tag (step {})", step);
  pending_ += tfrecord_frame(encode_scalar_event(now(), step, tag, static_cast<float>(value)));
}

void TensorBoardWriter::add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars) {
  for (const auto& [tag, value] : scalars) add_scalar(tag, value, step);
  flush();
}

void TensorBoardWriter::write_all(std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd_, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      fail<IOError>("tensorboard: cannot write to '{}': {}", path_.string(), std::strerror(errno));
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
}

void TensorBoardWriter::flush() {
  if (fd_ < 0 || pending_.empty()) return;
  // The buffer is dropped even if the write fails, so a full disk is reported once.
  const std::string bytes = std::move(pending_);
  pending_.clear();
  write_all(bytes);
}

void TensorBoardWriter::close() {
  if (fd_ < 0) return;
  flush();
  if (::fsync(fd_) != 0) fail<IOError>("tensorboard: cannot fsync '{}': {}", path_.string(), std::strerror(errno));
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail<IOError>("tensorboard: cannot close '{}': {}", path_.string(), std::strerror(errno));
}

}  // namespace tessera::train
