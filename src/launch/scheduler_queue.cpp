// Queue waits from the scheduler (see scheduler_queue.h).
#include "launch/scheduler_queue.h"

#include <fmt/format.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>

namespace tessera::launch {
namespace {

// The value of `key=` among space-separated Key=Value words, or empty.
std::string_view field(std::string_view line, std::string_view key) {
  size_t at = 0;
  while (at < line.size()) {
    const size_t end = std::min(line.find(' ', at), line.size());
    const std::string_view word = line.substr(at, end - at);
    if (word.size() > key.size() && word.substr(0, key.size()) == key && word[key.size()] == '=')
      return word.substr(key.size() + 1);
    at = end + 1;
  }
  return {};
}

// "2026-11-27T10:02:30" in the local time zone -> Unix seconds.
std::optional<double> local_time(std::string_view text) {
  std::tm tm{};
  int consumed = 0;
  const std::string copy(text);
  if (std::sscanf(copy.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
                  &tm.tm_min, &tm.tm_sec, &consumed) != 6 ||
      consumed != static_cast<int>(copy.size()))
    return std::nullopt;
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  tm.tm_isdst = -1;  // the zone's rule for that date
  const std::time_t t = std::mktime(&tm);
  if (t == static_cast<std::time_t>(-1)) return std::nullopt;
  return static_cast<double>(t);
}

}  // namespace

std::optional<QueueWait> parse_scontrol_job(std::string_view line, std::string* why_not) {
  auto no = [&](std::string why) -> std::optional<QueueWait> {
    if (why_not) *why_not = std::move(why);
    return std::nullopt;
  };
  const std::string_view id = field(line, "JobId"), submit = field(line, "SubmitTime"),
                         start = field(line, "StartTime");
  if (id.empty()) return no("no JobId in scontrol's output");
  const std::optional<double> submitted = local_time(submit), started = local_time(start);
  if (!submitted) return no(fmt::format("job {}: SubmitTime '{}' is not a time", id, submit));
  if (!started) return no(fmt::format("job {}: StartTime '{}' is not a time (not started?)", id, start));
  if (*started < *submitted) return no(fmt::format("job {}: StartTime {} is before SubmitTime {}", id, start, submit));
  return QueueWait{*submitted, *started, fmt::format("slurm job {}", id)};
}

std::optional<QueueWait> slurm_queue_wait(std::string* why_not) {
  auto no = [&](std::string why) -> std::optional<QueueWait> {
    if (why_not) *why_not = std::move(why);
    return std::nullopt;
  };
  const char* job = std::getenv("SLURM_JOB_ID");
  if (job == nullptr || *job == '\0') return no("not in a Slurm job (SLURM_JOB_ID is not set)");
  const std::string id(job);
  if (id.find_first_not_of("0123456789_") != std::string::npos)
    return no(fmt::format("SLURM_JOB_ID '{}' is not a job id", id));
  const std::string command = fmt::format("scontrol show job -o {} 2>&1", id);
  std::FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return no("cannot run scontrol");
  std::string output;
  std::array<char, 4096> buffer{};
  while (std::fgets(buffer.data(), static_cast<int>(buffer.size()), pipe) != nullptr) output += buffer.data();
  const int status = ::pclose(pipe);
  while (!output.empty() && (output.back() == '\n' || output.back() == '\r')) output.pop_back();
  if (status != 0) {
    if (output.find("not found") != std::string::npos && output.find("scontrol") != std::string::npos)
      return no("scontrol is not installed here");
    return no(fmt::format("`scontrol show job -o {}` failed: {}", id, output.substr(0, 200)));
  }
  // One line per job; an array job's line comes first.
  return parse_scontrol_job(std::string_view(output).substr(0, output.find('\n')), why_not);
}

}  // namespace tessera::launch
