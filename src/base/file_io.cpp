#include "tessera/base/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "tessera/base/error.h"

namespace tessera::fileio {

void fail_errno(std::string_view what, const std::filesystem::path& path, int error) {
  fail<IOError>("{} {}: {}", what, path.string(), std::strerror(error));
}

File::File(const std::filesystem::path& path, int flags, int mode) : path_(path) {
  do {
    fd_ = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  } while (fd_ < 0 && errno == EINTR);
  if (fd_ < 0) fail_errno((flags & (O_WRONLY | O_RDWR)) ? "cannot open for writing" : "cannot open", path, errno);
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

uint64_t File::size() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) fail_errno("cannot stat", path_, errno);
  return static_cast<uint64_t>(st.st_size);
}

void File::write_all(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail_errno("cannot write", path_, errno);
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void File::write_at(uint64_t offset, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd_, p, bytes, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail_errno("cannot write", path_, errno);
    }
    p += n;
    offset += static_cast<uint64_t>(n);
    bytes -= static_cast<size_t>(n);
  }
}

size_t File::read_at(uint64_t offset, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  size_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd_, p + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      fail_errno("cannot read", path_, errno);
    }
    if (got == 0) break;
    done += static_cast<size_t>(got);
  }
  return done;
}

void File::sync() {
  if (::fsync(fd_) != 0) fail_errno("cannot fsync", path_, errno);
}

void File::close() {
  const int fd = fd_;
  fd_ = -1;
  if (fd >= 0 && ::close(fd) != 0) fail_errno("cannot close", path_, errno);
}

void sync_directory(const std::filesystem::path& dir) {
  File d(dir.empty() ? std::filesystem::path(".") : dir, O_RDONLY | O_DIRECTORY);
  // Some file systems refuse fsync on a directory (EINVAL); there is nothing more to do there.
  if (::fsync(d.fd()) != 0 && errno != EINVAL) fail_errno("cannot fsync directory", dir, errno);
}

void write_file_atomic(const std::filesystem::path& path, const std::function<void(File&)>& writer,
                       Durability durability) {
  // Unique per process and call: threads writing the same path never share a temporary.
  static std::atomic<uint64_t> counter{0};
  const std::filesystem::path dir = path.parent_path();
  const std::filesystem::path tmp =
      path.string() + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1));
  try {
    File file(tmp, O_WRONLY | O_CREAT | O_TRUNC);
    writer(file);
    if (durability == Durability::Durable) file.sync();
    file.close();
    if (::rename(tmp.c_str(), path.c_str()) != 0) fail_errno("cannot rename " + tmp.string() + " to", path, errno);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  if (durability == Durability::Durable) sync_directory(dir);
}

void write_file_atomic(const std::filesystem::path& path, std::string_view bytes, Durability durability) {
  write_file_atomic(
      path, [&](File& file) { file.write_all(bytes.data(), bytes.size()); }, durability);
}

uint64_t hash_file(const std::filesystem::path& path) {
  File file(path, O_RDONLY);
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(), XXH3_freeState);
  if (!state) fail<IOError>("hash {}: out of memory for the XXH3 state", path.string());
  XXH3_64bits_reset(state.get());
  std::vector<char> buffer(size_t{1} << 22);
  uint64_t offset = 0;
  for (;;) {
    const size_t n = file.read_at(offset, buffer.data(), buffer.size());
    if (n == 0) break;
    XXH3_64bits_update(state.get(), buffer.data(), n);
    offset += n;
  }
  return XXH3_64bits_digest(state.get());
}

std::string hex64(uint64_t value) { return fmt::format("{:016x}", value); }

std::string expand_home(const std::string& path) {
  if (!path.starts_with("~/")) return path;
  const char* home = std::getenv("HOME");
  return home != nullptr ? std::string(home) + path.substr(1) : path;
}

}  // namespace tessera::fileio
