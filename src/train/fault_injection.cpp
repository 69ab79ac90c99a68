#include "train/fault_injection.h"

#include <unistd.h>

#include <charconv>
#include <csignal>
#include <cstdlib>
#include <fstream>

#include "data/file_io.h"
#include "tessera/base/error.h"
#include "tessera/ckpt/checkpoint.h"

namespace fs = std::filesystem;

namespace tessera::train {
namespace {

int64_t parse_number(std::string_view text, std::string_view spec, std::string_view part) {
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 0)
    fail<ValueError>("fault spec '{}': '{}' needs a non-negative integer (got '{}')", spec, part, text);
  return value;
}

}  // namespace

FaultPlan FaultPlan::parse(std::string_view spec) {
  FaultPlan plan;
  size_t begin = 0;
  while (begin <= spec.size()) {
    const size_t comma = std::min(spec.find(',', begin), spec.size());
    const std::string_view part = spec.substr(begin, comma - begin);
    begin = comma + 1;
    if (part.empty()) continue;
    if (part.starts_with("rank=")) {
      plan.rank = static_cast<int>(parse_number(part.substr(5), spec, part));
      continue;
    }
    if (plan.kind != Kind::kNone)
      fail<ValueError>("fault spec '{}': one fault at a time ('{}' is a second one)", spec, part);
    if (part == "corrupt_newest") {
      plan.kind = Kind::kCorruptNewest;
      continue;
    }
    const size_t at = part.find("@step=");
    const std::string_view name = part.substr(0, at);
    if (at == std::string_view::npos || (name != "kill" && name != "hang" && name != "fail_write"))
      fail<ValueError>(
          "fault spec '{}': '{}' is unknown (expected kill@step=N, hang@step=N, fail_write@step=N, corrupt_newest or "
          "rank=R)",
          spec, part);
    plan.kind = name == "kill" ? Kind::kKill : name == "hang" ? Kind::kHang : Kind::kFailWrite;
    plan.step = parse_number(part.substr(at + 6), spec, part);
  }
  if (plan.kind == Kind::kNone && plan.rank >= 0) fail<ValueError>("fault spec '{}': a rank filter but no fault", spec);
  return plan;
}

FaultPlan FaultPlan::from_env() {
  const char* spec = std::getenv("TESSERA_FAULT");
  return spec ? parse(spec) : FaultPlan{};
}

FaultInjector::FaultInjector(FaultPlan plan, int rank, int64_t start_step, fs::path run_dir) : plan_(plan) {
  static constexpr const char* kNames[] = {"none", "kill", "hang", "corrupt_newest", "fail_write"};
  marker_ = run_dir / fmt::format(".fault_fired.{}.rank{}", kNames[static_cast<int>(plan_.kind)], rank);
  const bool rank_matches = plan_.rank < 0 || plan_.rank == rank;
  const bool step_ahead = plan_.kind == FaultPlan::Kind::kCorruptNewest || start_step < plan_.step;
  armed_ = plan_.kind != FaultPlan::Kind::kNone && rank_matches && step_ahead && !fs::exists(marker_);
}

void FaultInjector::mark_fired() {
  fs::create_directories(marker_.parent_path());
  fileio::write_file_atomic(marker_, fmt::format("{}\n", plan_.step));
  armed_ = false;
}

void FaultInjector::at_step_start(int64_t step) {
  if (!armed_ || step != plan_.step) return;
  if (plan_.kind == FaultPlan::Kind::kKill) {
    mark_fired();
    std::raise(SIGKILL);
  }
  if (plan_.kind == FaultPlan::Kind::kHang) {
    mark_fired();
    while (true) ::pause();  // only a signal ends it
  }
}

bool FaultInjector::fail_this_write(int64_t save_step) {
  if (!armed_ || plan_.kind != FaultPlan::Kind::kFailWrite || save_step < plan_.step) return false;
  mark_fired();
  return true;
}

void flip_bytes_in_middle(const fs::path& file) {
  std::error_code ec;
  const uint64_t size = fs::file_size(file, ec);
  if (ec || size == 0)
    fail<IOError>("corrupt_newest: cannot corrupt {}: {}", file.string(), ec ? ec.message() : "empty");
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  if (!f) fail<IOError>("corrupt_newest: cannot open {} for writing", file.string());
  const uint64_t start = size / 2, count = std::min<uint64_t>(16, size - start);
  std::string bytes(count, '\0');
  f.seekg(static_cast<std::streamoff>(start));
  f.read(bytes.data(), static_cast<std::streamsize>(count));
  for (char& c : bytes) c = static_cast<char>(c ^ 0x5a);
  f.seekp(static_cast<std::streamoff>(start));
  f.write(bytes.data(), static_cast<std::streamsize>(count));
  if (!f) fail<IOError>("corrupt_newest: cannot write {}", file.string());
}

fs::path FaultInjector::corrupt_newest(const std::vector<fs::path>& checkpoints_dirs) {
  if (!armed_ || plan_.kind != FaultPlan::Kind::kCorruptNewest) return {};
  ckpt::CheckpointInfo newest;
  newest.step = -1;
  for (const fs::path& dir : checkpoints_dirs)
    for (const ckpt::CheckpointInfo& info : ckpt::list_checkpoints(dir))
      if (info.step > newest.step) newest = info;
  if (newest.step < 0) return {};
  const fs::path file = newest.path / "params.safetensors";
  mark_fired();
  flip_bytes_in_middle(file);
  return file;
}

}  // namespace tessera::train
