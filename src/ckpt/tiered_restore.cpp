#include "tessera/ckpt/tiered_restore.h"

#include <algorithm>

#include "tessera/base/error.h"

namespace fs = std::filesystem;

namespace tessera::ckpt {

std::optional<RestoredCheckpoint> restore_newest(const std::vector<fs::path>& checkpoints_dirs, const Tree& params_like,
                                                 const Tree& opt_like,
                                                 const std::function<void(const std::string&)>& warn,
                                                 const std::function<void(const fs::path&)>& verified,
                                                 Placeholders placeholders) {
  if (warn)
    for (const fs::path& dir : checkpoints_dirs)
      for (const fs::path& partial : list_partial_saves(dir))
        warn(
            fmt::format("checkpoint {} is a partial save (the writer stopped before its commit): ignored, and "
                        "removed by the next save",
                        partial.string()));
  struct Candidate {
    CheckpointInfo info;
    size_t tier;
  };
  std::vector<Candidate> all;
  for (size_t tier = 0; tier < checkpoints_dirs.size(); ++tier)
    for (CheckpointInfo& info : list_checkpoints(checkpoints_dirs[tier])) all.push_back({std::move(info), tier});
  // Newest first; on a tie the tier listed first.
  std::stable_sort(all.begin(), all.end(), [](const Candidate& a, const Candidate& b) {
    return a.info.step != b.info.step ? a.info.step > b.info.step : a.tier < b.tier;
  });
  for (size_t i = 0; i < all.size(); ++i) {
    const fs::path& path = all[i].info.path;
    const std::string fallback = i + 1 < all.size() ? "; trying the next newest" : "; no older checkpoint left";
    const VerifyResult check = CheckpointManager::verify(path);
    if (!check.ok) {
      if (warn) warn(fmt::format("checkpoint {} is corrupt: {}{}", path.string(), check.problem, fallback));
      continue;
    }
    if (verified) verified(path);
    try {
      return RestoredCheckpoint{CheckpointManager::load(path, params_like, opt_like, placeholders), path};
    } catch (const IOError& e) {
      if (warn) warn(fmt::format("checkpoint {} cannot be loaded: {}{}", path.string(), e.what(), fallback));
    }
  }
  return std::nullopt;
}

}  // namespace tessera::ckpt
