// Heartbeat files for `tessera launch` (see heartbeat.h): write-temp-then-rename.
#include "train/heartbeat.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace tessera::train {
namespace {

std::string rank_from_environment() {
  for (const char* name : {"TESSERA_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"})
    if (const char* value = std::getenv(name); value != nullptr && *value != '\0') return value;
  return "0";
}

}  // namespace

Heartbeat Heartbeat::from_environment() {
  const char* file = std::getenv("TESSERA_HEARTBEAT_FILE");
  std::string path = file == nullptr ? "" : file;
  if (const size_t at = path.find("{rank}"); at != std::string::npos) path.replace(at, 6, rank_from_environment());
  return Heartbeat(path);
}

void Heartbeat::beat(int64_t step) {
  if (path_.empty()) return;
  const auto now = std::chrono::steady_clock::now();
  if (wrote_ && now - last_write_ < kMinInterval) return;
  const double unix_s = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string line = fmt::format("{{\"step\":{},\"time\":{:.3f},\"pid\":{}}}\n", step, unix_s, ::getpid());
  const std::string tmp = path_ + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  bool ok = fd >= 0 && ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  if (fd >= 0) ok = (::close(fd) == 0) && ok;
  ok = ok && std::rename(tmp.c_str(), path_.c_str()) == 0;
  if (!ok && !warned_) {
    std::fprintf(stderr, "warning: cannot write the heartbeat file %s: %s (the supervisor may see a hang)\n",
                 path_.c_str(), std::strerror(errno));
    warned_ = true;
  }
  wrote_ = true;
  last_write_ = now;
}

}  // namespace tessera::train
