// Checkpoints: one directory per step under <run_dir>/checkpoints/, committed
// atomically and verified before use.
//
//   checkpoints/step_00000100/
//     params.safetensors      model parameters (Tree paths as tensor names)
//     opt_state.safetensors   optimizer state
//     manifest.json           {"format": "tessera-checkpoint", "version": 1, "step",
//                              "created", "extra": {...caller's JSON: config, data
//                              position, RNG, tokenizer...}, "files": {"params.safetensors":
//                              {"bytes", "xxh3"}, ...}}
//
// Saving writes into "step_00000100.tmp-<pid>", fsyncs every file and the directory,
// renames it into place and fsyncs the parent: a crash leaves either the old set of
// checkpoints or the new one, never a half-written checkpoint under a final name.
// Temporary directories left by a crash are never read (restore_newest reports them)
// and are removed by the next save. Saving a step that already exists swaps the new
// directory in atomically (renameat2 RENAME_EXCHANGE).
// One process saves into a run directory at a time.
//
// Tensor names are the Tree paths ("layers.0.weight"); a tree whose paths collide (a
// dict key containing '.') cannot be saved (ValueError). load() verifies the checksums
// first, so a corrupt checkpoint is never loaded.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tessera/core/tree.h"

namespace tessera::ckpt {

struct RetentionPolicy {
  int keep_last = 3;   // the newest N are always kept (>= 1)
  int keep_every = 0;  // also keep steps that are multiples of K (0: none)
};

// What a placeholder leaf of a load's templates stands for.
enum class Placeholders {
  kStructure,  // the leaf's type only: it is read like every other
  kNotHeld,    // a leaf the caller does not hold: its type is checked, its data not read
};

struct CheckpointState {
  int64_t step = 0;
  Tree params;
  Tree opt_state;
  nlohmann::json extra = nlohmann::json::object();
};

struct CheckpointInfo {
  std::filesystem::path path;
  int64_t step = 0;
  uint64_t bytes = 0;
  std::string created;
};

struct VerifyResult {
  bool ok = false;
  std::string problem;  // empty when ok: "params.safetensors: checksum mismatch (expected ..., got ...)"
};

class CheckpointManager {
 public:
  // Creates <run_dir>/checkpoints if needed; a directory that cannot be created or
  // written is an IOError naming it and the OS reason.
  CheckpointManager(std::filesystem::path run_dir, RetentionPolicy retention = {});

  // Saves atomically, then applies the retention policy. Returns the final path.
  // mid_write (fault injection, tests): called with the temporary directory once the
  // params file is written, before the optimizer state, the manifest and the commit.
  std::filesystem::path save(const CheckpointState& state,
                             const std::function<void(const std::filesystem::path& partial)>& mid_write = {});

  // Committed checkpoints, oldest first (not verified).
  std::vector<CheckpointInfo> list() const;
  static VerifyResult verify(const std::filesystem::path& checkpoint_dir);

  // Loads a checkpoint into the structure of `params_like` / `opt_like` (same paths,
  // shapes, dtypes, else IOError naming the path and both types). With
  // Placeholders::kNotHeld, a placeholder leaf of them (Array::is_placeholder) is one the
  // caller does not hold, such as another pipeline stage's parameter: it is checked
  // against the file's header and stays a placeholder, its data not read.
  static CheckpointState load(const std::filesystem::path& checkpoint_dir, const Tree& params_like,
                              const Tree& opt_like, Placeholders placeholders = Placeholders::kStructure);

  // The newest checkpoint that verifies and loads; every one skipped on the way is
  // reported through `warn` with its problem. nullopt when there is none.
  std::optional<CheckpointState> restore_latest(const Tree& params_like, const Tree& opt_like,
                                                const std::function<void(const std::string&)>& warn) const;

  const std::filesystem::path& directory() const { return dir_; }

 private:
  std::filesystem::path dir_;
  RetentionPolicy retention_;
};

// Reads and parses manifest.json (IOError if missing or malformed).
nlohmann::json read_manifest(const std::filesystem::path& checkpoint_dir);

// The committed checkpoints (step_<digits> directories) in a checkpoints directory,
// oldest first, without creating or verifying anything; an absent directory has none.
std::vector<CheckpointInfo> list_checkpoints(const std::filesystem::path& checkpoints_dir);

// The temporary directories of saves that never committed ("step_00000100.tmp-<pid>",
// left by a crash during a save) in a checkpoints directory, sorted; none when absent.
std::vector<std::filesystem::path> list_partial_saves(const std::filesystem::path& checkpoints_dir);

}  // namespace tessera::ckpt
