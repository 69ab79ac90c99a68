// File primitives every layer shares: file descriptors, atomic (and durable) writes
// through a temporary name, and streaming XXH3-64 hashes. Every
// failure is an IOError naming the path and the OS reason (strerror).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

namespace tessera::fileio {

// "<what> <path>: <strerror(errno)>" as an IOError.
[[noreturn]] void fail_errno(std::string_view what, const std::filesystem::path& path, int error);

// An open file descriptor closed on destruction.
class File {
 public:
  // flags as for open(2); O_CLOEXEC is added.
  File(const std::filesystem::path& path, int flags, int mode = 0644);
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  int fd() const { return fd_; }
  uint64_t size() const;                                           // fstat
  void write_all(const void* data, size_t bytes);                  // retries short writes and EINTR
  void write_at(uint64_t offset, const void* data, size_t bytes);  // pwrite, all of it
  size_t read_at(uint64_t offset, void* data, size_t n);           // returns bytes read (< n only at end of file)
  void sync();                                                     // fsync
  void close();                                                    // close, reporting errors

 private:
  std::filesystem::path path_;
  int fd_ = -1;
};

// fsyncs a directory so that renames and creations in it are durable.
void sync_directory(const std::filesystem::path& dir);

// What survives a crash of the machine (a process crash never shows a part either way).
enum class Durability {
  // fsync the file before the rename and the directory after it: once the call returns,
  // the new file survives a power cut (checkpoints, cache entries, rendezvous files).
  Durable,
  // No fsync: readers still see the old file or the new one, never a part, but a power
  // cut may lose the new one (heartbeats, reports rewritten every few seconds).
  Atomic,
};

// Writes `bytes` to `path` through a temporary name in the same directory, unique to
// this process and call, then renames it over `path`: readers see the old file or the
// new one, never a part. The temporary file is removed when anything fails.
void write_file_atomic(const std::filesystem::path& path, std::string_view bytes,
                       Durability durability = Durability::Durable);
// The same, with the contents written by `writer` into the temporary file.
void write_file_atomic(const std::filesystem::path& path, const std::function<void(File&)>& writer,
                       Durability durability = Durability::Durable);

// XXH3-64 of a whole file, read in chunks with the streaming state.
uint64_t hash_file(const std::filesystem::path& path);

// "0123456789abcdef": the 16 hex digits manifests store.
std::string hex64(uint64_t value);

// A leading "~/" replaced by $HOME (paths from TESSERA_* variables); unchanged
// otherwise, or when HOME is not set.
std::string expand_home(const std::string& path);

}  // namespace tessera::fileio
