// Event type names and typed field access for the goodput event log.
#include "tessera/goodput/events.h"

#include <array>
#include <optional>
#include <utility>

#include "tessera/base/json_field.h"

namespace tessera::goodput {
namespace {

constexpr std::array<std::pair<EventType, std::string_view>, 25> kNames{{
    {EventType::kJobStart, "job_start"},
    {EventType::kJobEnd, "job_end"},
    {EventType::kAttemptStart, "attempt_start"},
    {EventType::kBackendInitStart, "backend_init_start"},
    {EventType::kBackendInitEnd, "backend_init_end"},
    {EventType::kCompileStart, "compile_start"},
    {EventType::kCompileEnd, "compile_end"},
    {EventType::kCheckpointRestoreStart, "checkpoint_restore_start"},
    {EventType::kCheckpointRestoreEnd, "checkpoint_restore_end"},
    {EventType::kCheckpointSaveStart, "checkpoint_save_start"},
    {EventType::kCheckpointSaveEnd, "checkpoint_save_end"},
    {EventType::kDataWaitStart, "data_wait_start"},
    {EventType::kDataWaitEnd, "data_wait_end"},
    {EventType::kStepStart, "step_start"},
    {EventType::kStepEnd, "step_end"},
    {EventType::kEvalStart, "eval_start"},
    {EventType::kEvalEnd, "eval_end"},
    {EventType::kFailure, "failure"},
    {EventType::kCustomBadputStart, "custom_badput_start"},
    {EventType::kCustomBadputEnd, "custom_badput_end"},
    {EventType::kCalibration, "calibration"},
    {EventType::kDevice, "device"},
    {EventType::kLaunchWait, "launch_wait"},
    {EventType::kRankStart, "rank_start"},
    {EventType::kRankStep, "rank_step"},
}};

}  // namespace

std::string_view event_type_name(EventType type) {
  for (const auto& [t, name] : kNames)
    if (t == type) return name;
  return "unknown";
}

std::optional<EventType> event_type_from_name(std::string_view name) {
  for (const auto& [t, n] : kNames)
    if (n == name) return t;
  return std::nullopt;
}

double Event::number(const char* key, double fallback) const { return json_field_or<double>(fields, key, fallback); }

int64_t Event::integer(const char* key, int64_t fallback) const {
  if (const std::optional<int64_t> v = json_field<int64_t>(fields, key)) return *v;
  // A number written as a float (1e3): its integer part where it fits in int64 (casting
  // one that does not is undefined behaviour); otherwise the fallback.
  const std::optional<double> d = json_field<double>(fields, key);
  if (!d || !(*d > -9.2e18 && *d < 9.2e18)) return fallback;
  return static_cast<int64_t>(*d);
}

std::string Event::text(const char* key, std::string fallback) const {
  return json_field_or<std::string>(fields, key, std::move(fallback));
}

bool Event::flag(const char* key, bool fallback) const { return json_field_or<bool>(fields, key, fallback); }

}  // namespace tessera::goodput
