// Restoring from several checkpoint tiers (a fast local one such as /dev/shm and the
// persistent run directory): the newest checkpoint of any tier that verifies and
// loads wins; every newer one skipped on the way is reported with its problem, and so is
// every partial save left by a crash.
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tessera/ckpt/checkpoint.h"

namespace tessera::ckpt {

struct RestoredCheckpoint {
  CheckpointState state;
  std::filesystem::path path;  // the checkpoint directory it came from
};

// `checkpoints_dirs`: the tiers' checkpoints directories (<dir>/checkpoints), in order
// of preference when two tiers hold the same step. A missing directory holds none.
// Partial saves (a crash before the commit) are reported through `warn` and skipped.
// verified (fault injection, tests): called with each checkpoint that verified (every
// file read and its checksum checked), before its tensors are loaded. `placeholders`:
// as CheckpointManager::load's.
std::optional<RestoredCheckpoint> restore_newest(
    const std::vector<std::filesystem::path>& checkpoints_dirs, const Tree& params_like, const Tree& opt_like,
    const std::function<void(const std::string&)>& warn,
    const std::function<void(const std::filesystem::path& checkpoint)>& verified = {},
    Placeholders placeholders = Placeholders::kStructure);

}  // namespace tessera::ckpt
