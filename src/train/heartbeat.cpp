// Heartbeat files for `tessera launch` (see heartbeat.h): write-temp-then-rename.
#include "train/heartbeat.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>

#include "tessera/base/error.h"
#include "tessera/base/file_io.h"
#include "tessera/base/flags.h"

namespace tessera::train {
namespace {

std::string rank_from_environment() {
  for (const char* name : {"TESSERA_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"})
    if (const char* value = flags::env(name); value != nullptr && *value != '\0') return value;
  return "0";
}

}  // namespace

Heartbeat::Heartbeat(std::string path) : path_(std::move(path)) {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) name[0] = '\0';
  host_json_ = nlohmann::json(std::string(name)).dump();
}

Heartbeat Heartbeat::from_environment() {
  const char* file = flags::env("TESSERA_HEARTBEAT_FILE");
  std::string path = file == nullptr ? "" : file;
  if (const size_t at = path.find("{rank}"); at != std::string::npos) path.replace(at, 6, rank_from_environment());
  return Heartbeat(path);
}

void Heartbeat::beat(int64_t step) {
  if (path_.empty()) return;
  if (wrote_ && stepping_ && std::chrono::steady_clock::now() - last_write_ < kMinInterval) return;
  write("step", step, -1);
}

void Heartbeat::enter(std::string_view phase, int64_t step, double expect_s) {
  if (path_.empty()) return;
  write(phase, step, expect_s);
}

void Heartbeat::write(std::string_view phase, int64_t step, double expect_s) {
  const auto now = std::chrono::steady_clock::now();
  const double unix_s = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string expect = expect_s >= 0 ? fmt::format(",\"expect_s\":{:.3f}", expect_s) : std::string();
  const std::string line = fmt::format("{{\"step\":{},\"phase\":\"{}\",\"time\":{:.3f},\"pid\":{},\"host\":{}{}}}\n",
                                       step, phase, unix_s, ::getpid(), host_json_, expect);
  // Atomic, not durable: the supervisor reads it every few seconds, and a power cut ends
  // the supervisor too.
  bool ok = true;
  std::string why;
  try {
    fileio::write_file_atomic(path_, line, fileio::Durability::Atomic);
  } catch (const IOError& e) {
    ok = false;
    why = e.what();
  }
  if (!ok && !warned_) {
    std::fprintf(stderr, "warning: the heartbeat file: %s (the supervisor may see a hang)\n", why.c_str());
    warned_ = true;
  }
  wrote_ = true;
  stepping_ = phase == "step";
  last_write_ = now;
}

}  // namespace tessera::train
