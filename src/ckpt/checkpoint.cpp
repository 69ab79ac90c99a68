#include "tessera/ckpt/checkpoint.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <ctime>
#include <set>

#include "tessera/base/error.h"
#include "tessera/base/file_io.h"
#include "tessera/base/json_field.h"
#include "tessera/ckpt/safetensors.h"

namespace fs = std::filesystem;

namespace tessera::ckpt {
namespace {

constexpr const char* kFormat = "tessera-checkpoint";
constexpr int kVersion = 1;
constexpr const char* kParamsFile = "params.safetensors";
constexpr const char* kOptFile = "opt_state.safetensors";
constexpr const char* kManifestFile = "manifest.json";

std::string step_name(int64_t step) { return fmt::format("step_{:08d}", step); }

// The step of a committed checkpoint directory name ("step_00000100"), or -1.
int64_t parse_step_name(const std::string& name) {
  constexpr std::string_view kPrefix = "step_";
  if (!name.starts_with(kPrefix) || name.size() == kPrefix.size() || name.size() > kPrefix.size() + 18) return -1;
  int64_t step = 0;
  for (size_t i = kPrefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

bool is_tmp_name(const std::string& name) {
  return name.starts_with("step_") && name.find(".tmp-") != std::string::npos;
}

std::string utc_now() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

std::map<std::string, Array> tree_tensors(const Tree& tree, std::string_view what) {
  const std::vector<std::string> paths = tree.paths();
  const std::vector<Array> leaves = tree.leaves();
  std::map<std::string, Array> tensors;
  for (size_t i = 0; i < paths.size(); ++i)
    if (!tensors.emplace(paths[i], leaves[i]).second)
      fail<ValueError>("checkpoint save: {} path '{}' occurs twice (a dict key containing '.'?)", what, paths[i]);
  return tensors;
}

// The template's structure filled with the file's tensors. Any difference is a
// ConfigError: the checkpoints are verified before they are loaded, so a file of another
// structure holds another model (the run's config changed), which no older checkpoint of
// the run would fix, and skipping them all would silently restart from step 0.
constexpr const char* kAnotherModel =
    " (the config describes another model than the one saved: use its model settings or a new run directory)";

Tree match_tree(const fs::path& dir, const char* file_name, const Tree& like, Placeholders placeholders) {
  const fs::path file = dir / file_name;
  const std::vector<std::string> paths = like.paths();
  const std::vector<Array> leaves = like.leaves();
  // The structure is checked against the header; the data of a leaf the caller does not
  // hold is not read.
  std::set<std::string> held;
  for (size_t i = 0; i < paths.size(); ++i)
    if (placeholders == Placeholders::kStructure || !leaves[i].is_placeholder()) held.insert(paths[i]);
  std::map<std::string, const SafetensorsEntry*> entries;
  const SafetensorsHeader header = read_safetensors_header(file);
  for (const SafetensorsEntry& entry : header.tensors) entries.emplace(entry.name, &entry);
  SafetensorsFile contents =
      read_safetensors(file, header, [&](const std::string& name) { return held.contains(name); });
  std::vector<Array> loaded;
  std::set<std::string> used;
  for (size_t i = 0; i < paths.size(); ++i) {
    const auto it = entries.find(paths[i]);
    if (it == entries.end())
      fail<ConfigError>("checkpoint {}: {} has no tensor '{}' (expected {}){}", dir.string(), file_name, paths[i],
                        type_string(leaves[i]), kAnotherModel);
    const SafetensorsEntry& entry = *it->second;
    if (entry.dtype != leaves[i].dtype() || entry.shape != leaves[i].shape())
      fail<ConfigError>("checkpoint {}: {}: '{}' is {}{} in the checkpoint but {} is expected{}", dir.string(),
                        file_name, paths[i], short_name(entry.dtype), to_string(entry.shape), type_string(leaves[i]),
                        kAnotherModel);
    loaded.push_back(held.contains(paths[i]) ? contents.tensors.at(paths[i]) : leaves[i]);
    used.insert(paths[i]);
  }
  for (const SafetensorsEntry& entry : header.tensors)
    if (!used.contains(entry.name))
      fail<ConfigError>("checkpoint {}: {}: tensor '{}' ({}{}) is not in the expected structure{}", dir.string(),
                        file_name, entry.name, short_name(entry.dtype), to_string(entry.shape), kAnotherModel);
  return like.with_leaves(loaded);
}

uint64_t directory_bytes(const fs::path& dir) {
  uint64_t bytes = 0;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.is_regular_file(ec)) bytes += entry.file_size(ec);
  return bytes;
}

void remove_tree(const fs::path& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) fail<IOError>("checkpoint: cannot remove {}: {}", path.string(), ec.message());
}

}  // namespace

CheckpointManager::CheckpointManager(fs::path run_dir, RetentionPolicy retention)
    : dir_(std::move(run_dir) / "checkpoints"), retention_(retention) {
  if (retention_.keep_last < 1 || retention_.keep_every < 0)
    fail<ValueError>("CheckpointManager: retention keep_last {} must be >= 1 and keep_every {} >= 0",
                     retention_.keep_last, retention_.keep_every);
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) fail<IOError>("checkpoint directory {} cannot be created: {}", dir_.string(), ec.message());
  if (!fs::is_directory(dir_, ec)) fail<IOError>("checkpoint directory {} is not a directory", dir_.string());
  // Creating a file is the only reliable test of writability (ACLs, read-only mounts, root).
  const fs::path probe = dir_ / fmt::format(".write-probe-{}", ::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fileio::fail_errno("checkpoint directory is not writable:", dir_, errno);
  ::close(fd);
  ::unlink(probe.c_str());
}

fs::path CheckpointManager::save(const CheckpointState& state, const std::function<void(const fs::path&)>& mid_write) {
  if (state.step < 0) fail<ValueError>("checkpoint save: step {} is negative", state.step);
  const std::map<std::string, Array> params = tree_tensors(state.params, "params");
  const std::map<std::string, Array> opt_state = tree_tensors(state.opt_state, "opt_state");

  // Leftovers of a save that crashed; nothing reads them.
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir_, ec))
    if (is_tmp_name(entry.path().filename().string())) remove_tree(entry.path());
  if (ec) fail<IOError>("checkpoint directory {} cannot be listed: {}", dir_.string(), ec.message());

  const fs::path final_dir = dir_ / step_name(state.step);
  const fs::path tmp = dir_ / fmt::format("{}.tmp-{}", step_name(state.step), ::getpid());
  if (::mkdir(tmp.c_str(), 0755) != 0) fileio::fail_errno("cannot create checkpoint directory", tmp, errno);
  try {
    write_safetensors(tmp / kParamsFile, params);
    if (mid_write) mid_write(tmp);
    write_safetensors(tmp / kOptFile, opt_state);
    nlohmann::json files = nlohmann::json::object();
    for (const char* name : {kParamsFile, kOptFile})
      files[name] = {{"bytes", fs::file_size(tmp / name)}, {"xxh3", fileio::hex64(fileio::hash_file(tmp / name))}};
    const nlohmann::json manifest = {{"format", kFormat},    {"version", kVersion},  {"step", state.step},
                                     {"created", utc_now()}, {"extra", state.extra}, {"files", files}};
    const std::string text = manifest.dump(2) + "\n";
    fileio::File file(tmp / kManifestFile, O_WRONLY | O_CREAT | O_TRUNC);
    file.write_all(text.data(), text.size());
    file.sync();
    file.close();
    fileio::sync_directory(tmp);

    if (::rename(tmp.c_str(), final_dir.c_str()) != 0) {
      if (errno != ENOTEMPTY && errno != EEXIST)
        fileio::fail_errno("cannot rename " + tmp.string() + " to", final_dir, errno);
      // The step exists already (a resumed run saving it again): swap atomically; the old one is then at `tmp`.
      if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) != 0)
        fileio::fail_errno("cannot replace checkpoint " + final_dir.string() + " with", tmp, errno);
      fileio::sync_directory(dir_);
      remove_tree(tmp);
    }
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  fileio::sync_directory(dir_);

  // Retention: the newest keep_last, and multiples of keep_every.
  const std::vector<CheckpointInfo> all = list();
  for (size_t i = 0; i + static_cast<size_t>(retention_.keep_last) < all.size(); ++i) {
    const int64_t step = all[i].step;
    if (retention_.keep_every > 0 && step % retention_.keep_every == 0) continue;
    remove_tree(all[i].path);
  }
  return final_dir;
}

std::vector<CheckpointInfo> list_checkpoints(const fs::path& checkpoints_dir) {
  std::vector<CheckpointInfo> result;
  std::error_code ec;
  if (!fs::exists(checkpoints_dir, ec)) return result;
  for (const auto& entry : fs::directory_iterator(checkpoints_dir, ec)) {
    const int64_t step = parse_step_name(entry.path().filename().string());
    if (step < 0 || !entry.is_directory(ec)) continue;
    CheckpointInfo info;
    info.path = entry.path();
    info.step = step;
    info.bytes = directory_bytes(entry.path());
    try {
      const nlohmann::json manifest = read_manifest(entry.path());
      if (manifest.contains("created") && manifest["created"].is_string()) info.created = manifest["created"];
    } catch (const IOError&) {
      // list() does not judge; verify() reports the problem.
    }
    result.push_back(std::move(info));
  }
  if (ec) fail<IOError>("checkpoint directory {} cannot be listed: {}", checkpoints_dir.string(), ec.message());
  std::sort(result.begin(), result.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
  return result;
}

std::vector<fs::path> list_partial_saves(const fs::path& checkpoints_dir) {
  std::vector<fs::path> result;
  std::error_code ec;
  if (!fs::exists(checkpoints_dir, ec)) return result;
  for (const auto& entry : fs::directory_iterator(checkpoints_dir, ec))
    if (is_tmp_name(entry.path().filename().string())) result.push_back(entry.path());
  if (ec) fail<IOError>("checkpoint directory {} cannot be listed: {}", checkpoints_dir.string(), ec.message());
  std::sort(result.begin(), result.end());
  return result;
}

std::vector<CheckpointInfo> CheckpointManager::list() const { return list_checkpoints(dir_); }

nlohmann::json read_manifest(const fs::path& checkpoint_dir) {
  const fs::path path = checkpoint_dir / kManifestFile;
  fileio::File file(path, O_RDONLY);
  std::string text(file.size(), '\0');
  text.resize(file.read_at(0, text.data(), text.size()));
  try {
    nlohmann::json manifest = nlohmann::json::parse(text);
    if (!manifest.is_object()) fail<IOError>("manifest {}: not a JSON object", path.string());
    return manifest;
  } catch (const nlohmann::json::exception& e) {
    // Not only parse_error: a number past double's range ("1e999") is an out_of_range,
    // which must reach restore_latest's fallback as an IOError like any other damage.
    fail<IOError>("manifest {}: malformed JSON: {}", path.string(), e.what());
  }
}

VerifyResult CheckpointManager::verify(const fs::path& checkpoint_dir) {
  const auto problem = [](std::string text) { return VerifyResult{false, std::move(text)}; };
  nlohmann::json manifest;
  try {
    manifest = read_manifest(checkpoint_dir);
  } catch (const IOError& e) {
    return problem(e.what());
  }
  if (json_field<std::string>(manifest, "format") != kFormat)
    return problem(fmt::format("manifest.json: format is {} (expected \"{}\")",
                               manifest.contains("format") ? manifest["format"].dump() : "missing", kFormat));
  if (!manifest.contains("version") || manifest["version"] != kVersion)
    return problem(fmt::format("manifest.json: version {} (expected {})",
                               manifest.contains("version") ? manifest["version"].dump() : "missing", kVersion));
  if (!manifest.contains("step") || !manifest["step"].is_number_integer())
    return problem("manifest.json: step missing or not an integer");
  if (const int64_t dir_step = parse_step_name(checkpoint_dir.filename().string());
      dir_step >= 0 && manifest["step"].get<int64_t>() != dir_step)
    return problem(fmt::format("manifest.json: step {} differs from the directory name's {}",
                               manifest["step"].get<int64_t>(), dir_step));
  if (!manifest.contains("files") || !manifest["files"].is_object())
    return problem("manifest.json: 'files' missing or not an object");
  const nlohmann::json& files = manifest["files"];
  for (const char* required : {kParamsFile, kOptFile})
    if (!files.contains(required)) return problem(fmt::format("manifest.json: no entry for {}", required));
  for (const auto& [name, entry] : files.items()) {
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
      return problem(fmt::format("manifest.json: file name '{}' is not a plain file name", name));
    if (!entry.is_object() || !entry.contains("bytes") || !entry["bytes"].is_number_unsigned() ||
        !entry.contains("xxh3") || !entry["xxh3"].is_string())
      return problem(fmt::format("manifest.json: entry for {} needs \"bytes\" and \"xxh3\"", name));
    const fs::path path = checkpoint_dir / name;
    std::error_code ec;
    const uint64_t bytes = fs::file_size(path, ec);
    if (ec) return problem(fmt::format("{}: cannot read: {}", name, ec.message()));
    const uint64_t expected_bytes = entry["bytes"].get<uint64_t>();
    if (bytes != expected_bytes)
      return problem(fmt::format("{}: size mismatch (expected {} bytes, found {}{})", name, expected_bytes, bytes,
                                 bytes < expected_bytes ? ": truncated" : ""));
    std::string hash;
    try {
      hash = fileio::hex64(fileio::hash_file(path));
    } catch (const IOError& e) {
      return problem(fmt::format("{}: {}", name, e.what()));
    }
    if (hash != entry["xxh3"].get<std::string>())
      return problem(fmt::format("{}: checksum mismatch (expected xxh3 {}, got {})", name,
                                 entry["xxh3"].get<std::string>(), hash));
  }
  return VerifyResult{true, ""};
}

CheckpointState CheckpointManager::load(const fs::path& checkpoint_dir, const Tree& params_like, const Tree& opt_like,
                                        Placeholders placeholders) {
  if (const VerifyResult check = verify(checkpoint_dir); !check.ok)
    fail<IOError>("checkpoint {}: {}", checkpoint_dir.string(), check.problem);
  const nlohmann::json manifest = read_manifest(checkpoint_dir);
  CheckpointState state;
  state.step = manifest["step"].get<int64_t>();
  state.extra = json_field_or<nlohmann::json>(manifest, "extra", nlohmann::json::object());
  if (!state.extra.is_object()) state.extra = nlohmann::json::object();
  state.params = match_tree(checkpoint_dir, kParamsFile, params_like, placeholders);
  state.opt_state = match_tree(checkpoint_dir, kOptFile, opt_like, placeholders);
  return state;
}

std::optional<CheckpointState> CheckpointManager::restore_latest(
    const Tree& params_like, const Tree& opt_like, const std::function<void(const std::string&)>& warn) const {
  const std::vector<CheckpointInfo> all = list();
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    const bool older = std::next(it) != all.rend();
    const std::string fallback = older ? "; trying the previous one" : "; no older checkpoint left";
    const VerifyResult check = verify(it->path);
    if (!check.ok) {
      if (warn) warn(fmt::format("checkpoint {} is corrupt: {}{}", it->path.string(), check.problem, fallback));
      continue;
    }
    try {
      return load(it->path, params_like, opt_like);
    } catch (const IOError& e) {
      if (warn) warn(fmt::format("checkpoint {} cannot be loaded: {}{}", it->path.string(), e.what(), fallback));
    }
  }
  return std::nullopt;
}

}  // namespace tessera::ckpt
