// Small binary encodings shared by tessera's file formats (serialized executables,
// compilation-cache entries and index files): plain values in host byte order, and
// blobs as a u64 length followed by the bytes. The reader checks every read against
// the bytes left, so damaged input is an error (or, through the try_ reads, a refusal)
// and never a read past the end or a huge allocation.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>

namespace tessera {

class ByteWriter {
 public:
  template <typename T>
  void pod(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    bytes_.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  void blob(const void* data, size_t n) {
    pod<uint64_t>(n);
    bytes_.append(static_cast<const char*>(data), n);
  }
  void str(std::string_view s) { blob(s.data(), s.size()); }
  std::string& bytes() { return bytes_; }

 private:
  std::string bytes_;
};

class ByteReader {
 public:
  // `format` names the bytes in errors: "executable: truncated bytes reading ...".
  ByteReader(std::string_view bytes, std::string_view format) : bytes_(bytes), format_(format) {}

  // Throwing reads: ValueError naming the format, what was read, the offset and sizes.
  template <typename T>
  T pod(const char* what) {
    T v;
    if (!try_pod(v)) truncated(sizeof(T), what);
    return v;
  }
  std::string_view blob(const char* what) {
    const uint64_t n = pod<uint64_t>(what);
    if (n > remaining()) truncated(n, what);
    std::string_view s = bytes_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  // A count (stored as Count) of records of at least `record_bytes` each: more than the
  // bytes left can hold is damage (and would otherwise reserve absurd amounts of memory).
  template <typename Count = uint64_t>
  uint64_t count(const char* what, size_t record_bytes) {
    const uint64_t n = pod<Count>(what);
    if (n > remaining() / record_bytes) too_many(what, n);
    return n;
  }

  // Non-throwing reads, for formats where damage is a cache miss: false (and nothing
  // consumed) when the bytes left are too few.
  template <typename T>
  bool try_pod(T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (sizeof(T) > remaining()) return false;
    std::memcpy(&v, bytes_.data() + pos_, sizeof v);
    pos_ += sizeof v;
    return true;
  }
  // `n` raw bytes (no length prefix).
  bool try_bytes(uint64_t n, std::string_view& s) {
    if (n > remaining()) return false;
    s = bytes_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  bool try_blob(std::string_view& s) {
    const size_t start = pos_;
    uint64_t n = 0;
    if (!try_pod(n)) return false;
    if (n > remaining()) {
      pos_ = start;
      return false;
    }
    s = bytes_.substr(pos_, n);
    pos_ += n;
    return true;
  }

  size_t position() const { return pos_; }
  size_t remaining() const { return bytes_.size() - pos_; }
  bool done() const { return pos_ == bytes_.size(); }
  // The bytes from the current position on.
  std::string_view rest() const { return bytes_.substr(pos_); }

 private:
  [[noreturn]] void truncated(uint64_t need, const char* what) const;
  [[noreturn]] void too_many(const char* what, uint64_t n) const;

  std::string_view bytes_;
  std::string_view format_;
  size_t pos_ = 0;
};

}  // namespace tessera
