// A fresh directory under $TMPDIR (or /tmp) for one test, removed with its contents
// afterwards; shared by the data and ckpt tests.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace tessera::testing {

class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base && *base ? base : "/tmp") + "/tessera-test-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) ADD_FAILURE() << "mkdtemp " << pattern << " failed";
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::permissions(path_, std::filesystem::perms::owner_all, std::filesystem::perm_options::add, ec);
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

inline void write_bytes(const std::filesystem::path& path, const std::string& bytes) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::string read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Flips one bit of the byte at `offset` (negative: from the end).
inline void flip_bit(const std::filesystem::path& path, int64_t offset) {
  std::string bytes = read_bytes(path);
  const size_t at = offset >= 0 ? static_cast<size_t>(offset) : bytes.size() - static_cast<size_t>(-offset);
  bytes.at(at) = static_cast<char>(bytes.at(at) ^ 0x10);
  write_bytes(path, bytes);
}

inline bool small_tests() {
  const char* size = std::getenv("TESSERA_TEST_SIZE");
  return size != nullptr && std::string(size) == "small";
}

}  // namespace tessera::testing
