// The goodput event log: one JSON object per line in RUN_DIR/goodput/events.jsonl,
// appended by one Recorder per job (docs/goodput.md has the full schema).
//
//   {"v":1,"t":1718000000.25,"type":"step_end","attempt":0,"step":12,"tokens":8192,"model_flops":3.1e12}
//
// "v" is the schema version, "t" wall-clock seconds since the Unix epoch (double),
// "type" one of the names below; the other fields depend on the type.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::goodput {

inline constexpr int kSchemaVersion = 1;

enum class EventType {
  kJobStart,
  kJobEnd,
  kAttemptStart,
  kBackendInitStart,
  kBackendInitEnd,
  kCompileStart,
  kCompileEnd,
  kCheckpointRestoreStart,
  kCheckpointRestoreEnd,
  kCheckpointSaveStart,
  kCheckpointSaveEnd,
  kDataWaitStart,
  kDataWaitEnd,
  kStepStart,
  kStepEnd,
  kEvalStart,
  kEvalEnd,
  kFailure,
  kCustomBadputStart,
  kCustomBadputEnd,
  kCalibration,  // CPU peak FLOP/s measured by a calibration GEMM
  kDevice,       // accelerator name, count and peak FLOP/s
  kLaunchWait,   // a launcher's record of time spent queued/scheduling: {"start","end"}
  kRankStart,    // per-rank logs only (rank_log.h): a rank's process started
  kRankStep,     // per-rank logs only: one rank's step {"step","start","end","data_wait_s","collective_s"}
};

// "job_start", "step_end", ...; nullopt for a name this version does not know.
std::string_view event_type_name(EventType type);
std::optional<EventType> event_type_from_name(std::string_view name);

struct Event {
  double t = 0;
  EventType type = EventType::kJobStart;
  int attempt = -1;                                  // the "attempt" field; -1 when absent (the reader then infers it)
  int line = 0;                                      // 1-based line in the log, for messages
  nlohmann::json fields = nlohmann::json::object();  // the whole object as read

  // A field as a number/string, or the fallback when absent or of another type.
  double number(const char* key, double fallback = 0) const;
  int64_t integer(const char* key, int64_t fallback = -1) const;
  std::string text(const char* key, std::string fallback = {}) const;
  bool flag(const char* key, bool fallback = false) const;
};

// Events in time order (stable: ties keep file order), with what the reader had to
// tolerate: torn or corrupt lines, unknown types, duplicates, time going backwards.
struct EventLog {
  std::filesystem::path path;
  std::vector<Event> events;
  std::vector<std::string> warnings;
};

// RUN_DIR/goodput/events.jsonl
std::filesystem::path event_log_path(const std::filesystem::path& run_dir);

// Parses log text. Never throws on bad content: bad lines are skipped with a warning.
EventLog parse_event_log(std::string_view text, const std::string& source);

// Reads a log file; a missing or unreadable file is an IOError naming the path.
EventLog read_event_log(const std::filesystem::path& path);

}  // namespace tessera::goodput
