#include "train/local_tier.h"

#include <fmt/format.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <xxhash.h>

#include <string_view>
#include <system_error>

#include "tessera/base/file_io.h"
#include "tessera/base/flags.h"

namespace fs = std::filesystem;

namespace tessera::train {
namespace {

std::string gib(double bytes) { return fmt::format("{:.2f} GiB", bytes / (1024.0 * 1024.0 * 1024.0)); }

// The run's directory name under a candidate parent: readable, and unique per run
// directory (two runs named "default" in different places do not share a tier).
std::string run_key(const fs::path& run_dir) {
  std::error_code ec;
  fs::path absolute = fs::weakly_canonical(fs::absolute(run_dir, ec), ec);
  if (ec) absolute = fs::absolute(run_dir);
  std::string name = absolute.filename().string();
  if (name.empty()) name = "run";
  const std::string path = absolute.string();
  return name + "-" + fileio::hex64(XXH3_64bits(path.data(), path.size())).substr(0, 12);
}

// Free bytes for this user under `dir` (statvfs f_bavail), or -1 when it cannot be read.
double free_bytes(const fs::path& dir) {
  struct statvfs info {};
  if (::statvfs(dir.c_str(), &info) != 0) return -1;
  return static_cast<double>(info.f_bavail) * static_cast<double>(info.f_frsize);
}

// Creates parent/tessera-<uid> (owner-only: other users must not read or plant
// checkpoints) and returns it, or an empty path with `problem` set.
fs::path user_directory(const fs::path& parent, std::string* problem) {
  const fs::path dir = parent / fmt::format("tessera-{}", ::getuid());
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    *problem = fmt::format("cannot create {}: {}", dir.string(), ec.message());
    return {};
  }
  fs::permissions(dir, fs::perms::owner_all, fs::perm_options::replace, ec);
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    *problem = fmt::format("{} is not writable", dir.string());
    return {};
  }
  return dir;
}

}  // namespace

LocalTier resolve_local_tier(const CheckpointConfig& config, const fs::path& run_dir, uint64_t state_bytes,
                             bool multi_process, std::vector<fs::path> candidates) {
  LocalTier tier;
  if (config.local_dir.empty() || config.local_interval == 0) {
    tier.why = config.local_dir.empty() ? "local tier off (checkpoint.local_dir = \"\")"
                                        : "local tier off (checkpoint.local_interval = 0)";
    return tier;
  }
  if (config.local_dir != "auto") {
    tier.dir = config.local_dir;
    tier.why = fmt::format("local tier {} (checkpoint.local_dir)", tier.dir.string());
    return tier;
  }
  if (multi_process) {
    tier.why =
        "local tier off: a multi-process job (each host would hold its own copy, and every rank must resume from the "
        "same step); set checkpoint.local_dir to a directory all ranks share to have one";
    return tier;
  }
  if (candidates.empty()) {
    if (const char* roots = flags::env("TESSERA_LOCAL_TIER_ROOT"); roots != nullptr && *roots != '\0') {
      std::string_view rest = roots;
      while (!rest.empty()) {
        const size_t colon = rest.find(':');
        if (colon != 0) {
          candidates.emplace_back(std::string(rest.substr(0, colon)));
          std::error_code ec;
          fs::create_directories(candidates.back(), ec);  // named on purpose: made if missing
        }
        rest = colon == std::string_view::npos ? std::string_view() : rest.substr(colon + 1);
      }
    } else {
      candidates.push_back("/dev/shm");
      std::error_code ec;
      const fs::path tmp = fs::temp_directory_path(ec);
      if (!ec) candidates.push_back(tmp);
    }
  }
  const double needed = static_cast<double>(state_bytes) * (config.local_keep_last + 1);
  std::vector<std::string> skipped;
  for (const fs::path& parent : candidates) {
    std::error_code ec;
    if (!fs::is_directory(parent, ec)) {
      skipped.push_back(fmt::format("{} does not exist", parent.string()));
      continue;
    }
    std::string problem;
    const fs::path user_dir = user_directory(parent, &problem);
    if (user_dir.empty()) {
      skipped.push_back(problem);
      continue;
    }
    const fs::path dir = user_dir / run_key(run_dir);
    // Space already held by this run's earlier local checkpoints (a restart) is reusable.
    double held = 0;
    for (const auto& entry : fs::recursive_directory_iterator(dir, ec))
      if (entry.is_regular_file(ec)) held += static_cast<double>(entry.file_size(ec));
    const double available = free_bytes(user_dir);
    // At most half of what is free: a memory-backed tier must leave the machine its RAM.
    if (available >= 0 && available + held < 2 * needed) {
      skipped.push_back(fmt::format("{} has {} free, twice {} needed ({} checkpoints of {})", parent.string(),
                                    gib(available + held), gib(needed), config.local_keep_last + 1,
                                    gib(static_cast<double>(state_bytes))));
      continue;
    }
    tier.dir = dir;
    tier.automatic = true;
    tier.why = fmt::format("local tier {} ({} free for {} checkpoints of {}{}{})", dir.string(), gib(available + held),
                           config.local_keep_last + 1, gib(static_cast<double>(state_bytes)),
                           skipped.empty() ? "" : "; ", fmt::join(skipped, "; "));
    return tier;
  }
  tier.why =
      fmt::format("local tier off: no room ({}); restarts resume from the persistent tier", fmt::join(skipped, "; "));
  return tier;
}

}  // namespace tessera::train
