#include "train/fault_injection.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "tessera/base/error.h"
#include "tessera/base/file_io.h"
#include "tessera/base/flags.h"
#include "tessera/ckpt/checkpoint.h"

namespace fs = std::filesystem;

namespace tessera::train {
namespace {

constexpr std::string_view kGrammar =
    "a ';'-separated list of kill@step=N, term@step=N, hang@step=N, slow@step=N,ms=M, fail_write@step=N, "
    "kill@save=N, "
    "kill@restore=N or corrupt_newest, each optionally followed by ,rank=R";

[[noreturn]] void fail_item(std::string_view spec, size_t index, std::string_view item, std::string_view problem) {
  fail<ValueError>("TESSERA_FAULT '{}': item {} '{}': {}; expected {}", spec, index + 1, item, problem, kGrammar);
}

// Without surrounding blanks: "kill@step=5; kill@save=2" reads as two faults.
std::string_view trim(std::string_view text) {
  const size_t first = text.find_first_not_of(" \t");
  if (first == std::string_view::npos) return {};
  return text.substr(first, text.find_last_not_of(" \t") - first + 1);
}

int64_t parse_number(std::string_view text, std::string_view spec, size_t index, std::string_view item,
                     int64_t minimum) {
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < minimum)
    fail_item(spec, index, item, fmt::format("'{}' is not an integer >= {}", text, minimum));
  return value;
}

// One item: a fault, then optional ",rank=R" (and ",ms=M" for slow@step).
Fault parse_item(std::string_view spec, size_t index, std::string_view item) {
  struct Form {
    std::string_view prefix;
    Fault::Kind kind;
    int64_t minimum;  // of the number after the prefix; -1: the form takes none
  };
  static constexpr Form kForms[] = {
      {"kill@step=", Fault::Kind::kKill, 0},
      {"term@step=", Fault::Kind::kTerm, 0},
      {"hang@step=", Fault::Kind::kHang, 0},
      {"slow@step=", Fault::Kind::kSlow, 0},
      {"fail_write@step=", Fault::Kind::kFailWrite, 0},
      {"kill@save=", Fault::Kind::kKillInSave, 1},
      {"kill@restore=", Fault::Kind::kKillInRestore, 1},
      {"corrupt_newest", Fault::Kind::kCorruptNewest, -1},
  };
  Fault fault;
  fault.index = index;
  fault.text = std::string(item);
  bool have_kind = false;
  size_t begin = 0;
  while (begin <= item.size()) {
    const size_t comma = std::min(item.find(',', begin), item.size());
    const std::string_view part = trim(item.substr(begin, comma - begin));
    begin = comma + 1;
    if (part.empty()) fail_item(spec, index, item, "an empty part between commas");
    if (part.starts_with("rank=")) {
      if (fault.rank >= 0) fail_item(spec, index, item, "two rank filters");
      fault.rank = static_cast<int>(parse_number(part.substr(5), spec, index, item, 0));
      continue;
    }
    if (part.starts_with("ms=")) {
      if (fault.ms >= 0) fail_item(spec, index, item, "two ms= delays");
      fault.ms = parse_number(part.substr(3), spec, index, item, 0);
      continue;
    }
    if (have_kind)
      fail_item(spec, index, item, fmt::format("'{}' is a second fault in one item (separate faults with ';')", part));
    const Form* form = nullptr;
    for (const Form& f : kForms)
      if (f.minimum < 0 ? part == f.prefix : part.starts_with(f.prefix)) form = &f;
    if (!form) fail_item(spec, index, item, fmt::format("'{}' is not a fault", part));
    fault.kind = form->kind;
    if (form->minimum >= 0) fault.at = parse_number(part.substr(form->prefix.size()), spec, index, item, form->minimum);
    have_kind = true;
  }
  if (!have_kind) fail_item(spec, index, item, "a rank filter but no fault");
  if ((fault.kind == Fault::Kind::kSlow) != (fault.ms >= 0))
    fail_item(spec, index, item,
              fault.kind == Fault::Kind::kSlow ? "slow@step needs ,ms=M (the delay)" : "ms= belongs to slow@step only");
  return fault;
}

// The item's text as a file name part: characters other than [A-Za-z0-9@=._-] become '_'.
std::string marker_text(std::string_view text) {
  std::string out(text);
  for (char& c : out)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '@' && c != '=' && c != '.' && c != '_' && c != '-')
      c = '_';
  return out;
}

// Says on stderr which fault fires, whatever the trainer's verbosity: a killed worker's
// last line in the launcher's log.
void announce(const Fault& fault, std::string_view what) {
  std::fprintf(stderr, "fault injection: TESSERA_FAULT item %zu '%s': %.*s\n", fault.index + 1, fault.text.c_str(),
               static_cast<int>(what.size()), what.data());
  std::fflush(stderr);
}

}  // namespace

FaultPlan FaultPlan::parse(std::string_view spec) {
  FaultPlan plan;
  size_t begin = 0, index = 0;
  while (begin <= spec.size()) {
    const size_t semicolon = std::min(spec.find(';', begin), spec.size());
    const std::string_view item = trim(spec.substr(begin, semicolon - begin));
    begin = semicolon + 1;
    if (item.empty()) continue;  // "a;" and "" are fine
    plan.faults.push_back(parse_item(spec, index++, item));
  }
  return plan;
}

FaultPlan FaultPlan::from_env() {
  const char* spec = flags::env("TESSERA_FAULT");
  return spec ? parse(spec) : FaultPlan{};
}

FaultInjector::FaultInjector(FaultPlan plan, int rank, int64_t start_step, fs::path run_dir)
    : rank_(rank), run_dir_(std::move(run_dir)) {
  for (Fault& fault : plan.faults) {
    Armed entry;
    entry.marker = run_dir_ / fmt::format(".fault_fired.{}.{}.rank{}", fault.index, marker_text(fault.text), rank);
    const bool rank_matches = fault.rank < 0 || fault.rank == rank;
    const bool is_step_fault = fault.kind == Fault::Kind::kKill || fault.kind == Fault::Kind::kTerm ||
                               fault.kind == Fault::Kind::kHang || fault.kind == Fault::Kind::kSlow ||
                               fault.kind == Fault::Kind::kFailWrite;
    const bool step_ahead = !is_step_fault || start_step < fault.at;
    entry.armed = rank_matches && step_ahead && !fs::exists(entry.marker);
    entry.fault = std::move(fault);
    if (rank_matches) faults_.push_back(std::move(entry));
  }
}

bool FaultInjector::active() const {
  return std::any_of(faults_.begin(), faults_.end(), [](const Armed& a) { return a.armed; });
}

void FaultInjector::mark_fired(Armed& armed) {
  fs::create_directories(armed.marker.parent_path());
  fileio::write_file_atomic(armed.marker, fmt::format("{}\n", armed.fault.text));
  armed.armed = false;
}

void FaultInjector::at_step_start(int64_t step) {
  for (Armed& a : faults_) {
    if (!a.armed || a.fault.at != step) continue;
    if (a.fault.kind == Fault::Kind::kKill) {
      mark_fired(a);
      announce(a.fault, fmt::format("SIGKILL at the start of step {}", step));
      std::raise(SIGKILL);
    }
    if (a.fault.kind == Fault::Kind::kTerm) {  // a preemption notice to this rank alone
      mark_fired(a);
      announce(a.fault, fmt::format("SIGTERM at the start of step {}", step));
      std::raise(SIGTERM);
    }
    if (a.fault.kind == Fault::Kind::kHang) {
      mark_fired(a);
      announce(a.fault, fmt::format("hanging at the start of step {}", step));
      while (true) ::pause();  // only a signal ends it
    }
    if (a.fault.kind == Fault::Kind::kSlow) {
      mark_fired(a);
      announce(a.fault, fmt::format("sleeping {} ms at the start of step {}", a.fault.ms, step));
      std::this_thread::sleep_for(std::chrono::milliseconds(a.fault.ms));
    }
  }
}

bool FaultInjector::fail_this_write(int64_t save_step) {
  for (Armed& a : faults_)
    if (a.armed && a.fault.kind == Fault::Kind::kFailWrite && save_step >= a.fault.at) {
      mark_fired(a);
      return true;
    }
  return false;
}

std::function<void(const fs::path&)> FaultInjector::begin_save(int64_t save_step) {
  ++saves_;
  for (Armed& a : faults_) {
    if (!a.armed || a.fault.kind != Fault::Kind::kKillInSave || a.fault.at != saves_) continue;
    a.armed = false;  // this process's count never comes back to it; the marker is written when it fires
    return [fired = a, save = saves_, save_step](const fs::path& partial) mutable {
      mark_fired(fired);
      announce(fired.fault, fmt::format("SIGKILL in checkpoint write {} (step {}) with {} partly written", save,
                                        save_step, partial.string()));
      std::raise(SIGKILL);
    };
  }
  return {};
}

std::function<void(const fs::path&)> FaultInjector::restore_hook() {
  std::vector<Armed> restore_faults;
  for (const Armed& a : faults_)
    if (a.fault.kind == Fault::Kind::kKillInRestore) restore_faults.push_back(a);
  if (restore_faults.empty()) return {};
  const fs::path counter = run_dir_ / fmt::format(".fault_restores.rank{}", rank_);
  // Called for every checkpoint tried; one restore counts once.
  return [restore_faults, counter, counted = false](const fs::path& checkpoint) mutable {
    if (counted) return;
    counted = true;
    int64_t restores = 0;
    if (std::ifstream in(counter); in) in >> restores;
    ++restores;
    fs::create_directories(counter.parent_path());
    fileio::write_file_atomic(counter, fmt::format("{}\n", restores));
    for (Armed& a : restore_faults) {
      if (!a.armed || a.fault.at != restores) continue;
      mark_fired(a);
      announce(a.fault, fmt::format("SIGKILL in restore {} of this run directory, {} read but not loaded", restores,
                                    checkpoint.string()));
      std::raise(SIGKILL);
    }
  };
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
  for (Armed& a : faults_) {
    if (!a.armed || a.fault.kind != Fault::Kind::kCorruptNewest) continue;
    ckpt::CheckpointInfo newest;
    newest.step = -1;
    for (const fs::path& dir : checkpoints_dirs)
      for (const ckpt::CheckpointInfo& info : ckpt::list_checkpoints(dir))
        if (info.step > newest.step) newest = info;
    if (newest.step < 0) return {};  // nothing to corrupt yet: stays armed for a later start
    const fs::path file = newest.path / "params.safetensors";
    mark_fired(a);
    flip_bytes_in_middle(file);
    return file;
  }
  return {};
}

}  // namespace tessera::train
