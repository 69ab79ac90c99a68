// Where the fast local checkpoint tier lives. A restart on the same machine resumes
// from it, so a failure loses only the steps since its last save; it is written far
// more often than the persistent tier because it is cheap (memory-backed where possible).
//
// checkpoint.local_dir = "auto" (the default) picks the first candidate that is a
// writable directory where local_keep_last + 1 checkpoints (the kept ones and the one
// being written), state_bytes each, take at most half of the free space (tmpfs is RAM):
//   1. /dev/shm/tessera-<uid>/<run name>-<hash of the run directory's absolute path>
//      (tmpfs: a save is a memory copy; gone on reboot, which the persistent tier covers)
//   2. the same under the temporary directory ($TMPDIR or /tmp: a local disk)
// and is off, saying why, when neither has room or the job has several processes (each
// host would hold its own copy, and every rank must resume from the same step). An
// explicit path is used as given; "" turns the tier off.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "tessera/train/config.h"

namespace tessera::train {

struct LocalTier {
  std::filesystem::path dir;  // empty: no local tier
  std::string why;            // one line for the start of the run: where, or why not
  bool automatic = false;     // chosen by "auto": the run owns the directory and removes it after success
};

// candidates: the parent directories "auto" tries, in order (default: TESSERA_LOCAL_TIER_ROOT,
// else /dev/shm, then std::filesystem::temp_directory_path()).
LocalTier resolve_local_tier(const CheckpointConfig& config, const std::filesystem::path& run_dir, uint64_t state_bytes,
                             bool multi_process, std::vector<std::filesystem::path> candidates = {});

}  // namespace tessera::train
