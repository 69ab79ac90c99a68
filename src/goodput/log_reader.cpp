// Tolerant reader of the goodput event log: a crash may tear the last line, ranks may
// merge out of order, a retried write may duplicate a line, a newer writer may add
// event types. Each is skipped or repaired with a warning; only a missing file throws.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "tessera/base/error.h"
#include "tessera/base/json_field.h"
#include "tessera/goodput/events.h"

namespace tessera::goodput {

std::filesystem::path event_log_path(const std::filesystem::path& run_dir) {
  return run_dir / "goodput" / "events.jsonl";
}

EventLog parse_event_log(std::string_view text, const std::string& source) {
  EventLog log;
  log.path = source;
  std::set<std::string> seen;
  std::map<std::string, std::pair<int, int>> unknown;  // type -> (count, first line)
  int duplicates = 0, out_of_order = 0, newer_version_line = 0;
  double prev_t = -INFINITY, max_back = 0;

  size_t pos = 0;
  int line_no = 0;
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    const bool last_unterminated = nl == std::string_view::npos;
    const std::string_view line = text.substr(pos, last_unterminated ? std::string_view::npos : nl - pos);
    pos = last_unterminated ? text.size() : nl + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;

    nlohmann::json obj = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (obj.is_discarded() || !obj.is_object()) {
      if (last_unterminated || pos >= text.size())
        log.warnings.push_back(
            fmt::format("{}:{}: last line is torn ({} bytes, not a complete JSON object; a crash "
                        "mid-write?); ignored",
                        source, line_no, line.size()));
      else
        log.warnings.push_back(fmt::format("{}:{}: not a JSON object; line ignored", source, line_no));
      continue;
    }
    const auto t = obj.find("t");
    const auto type = obj.find("type");
    if (t == obj.end() || !t->is_number() || !std::isfinite(t->get<double>()) || type == obj.end() ||
        !type->is_string()) {
      log.warnings.push_back(
          fmt::format("{}:{}: missing or invalid \"t\" (number) or \"type\" (string); line ignored", source, line_no));
      continue;
    }
    if (json_field_or<int64_t>(obj, "v", kSchemaVersion) > kSchemaVersion && newer_version_line == 0)
      newer_version_line = line_no;
    const std::string type_name = type->get<std::string>();
    const std::optional<EventType> event_type = event_type_from_name(type_name);
    if (!event_type) {
      auto& [count, first] = unknown[type_name];
      if (count++ == 0) first = line_no;
      continue;
    }
    if (!seen.insert(obj.dump()).second) {
      ++duplicates;
      continue;
    }
    Event event;
    event.t = t->get<double>();
    event.type = *event_type;
    event.line = line_no;
    // An attempt number that is negative or does not fit (damage) counts as absent; the
    // ceiling leaves room for the `+ 1` below.
    if (const std::optional<int> attempt = json_field<int>(obj, "attempt");
        attempt && *attempt >= 0 && *attempt < std::numeric_limits<int>::max())
      event.attempt = *attempt;
    event.fields = std::move(obj);
    if (event.t < prev_t) {
      ++out_of_order;
      max_back = std::max(max_back, prev_t - event.t);
    }
    prev_t = std::max(prev_t, event.t);
    log.events.push_back(std::move(event));
  }

  if (newer_version_line)
    log.warnings.push_back(fmt::format("{}:{}: schema version newer than {} (this reader); unknown fields ignored",
                                       source, newer_version_line, kSchemaVersion));
  for (const auto& [name, info] : unknown)
    log.warnings.push_back(fmt::format("{}:{}: unknown event type '{}' ({} line{}); ignored", source, info.second, name,
                                       info.first, info.first == 1 ? "" : "s"));
  if (duplicates)
    log.warnings.push_back(fmt::format("{}: {} duplicate line{} (identical events) dropped", source, duplicates,
                                       duplicates == 1 ? "" : "s"));
  if (out_of_order)
    log.warnings.push_back(fmt::format(
        "{}: {} event{} out of time order (up to {:.3f} s earlier than a line before; merged ranks or a clock "
        "that went backwards); sorted by time",
        source, out_of_order, out_of_order == 1 ? "" : "s", max_back));

  std::stable_sort(log.events.begin(), log.events.end(), [](const Event& a, const Event& b) { return a.t < b.t; });

  // Events without an "attempt" field belong to the latest attempt_start before them.
  int current = 0, next = 0;
  for (Event& event : log.events) {
    if (event.type == EventType::kAttemptStart) {
      if (event.attempt < 0) event.attempt = next;
      current = event.attempt;
      next = std::max(next, current + 1);
    } else if (event.attempt < 0) {
      event.attempt = current;
    }
  }
  return log;
}

EventLog read_event_log(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    fail<IOError>(
        "goodput event log {} does not exist (was the run recorded with a goodput::Recorder? expected "
        "RUN_DIR/goodput/events.jsonl)",
        path.string());
  std::ifstream in(path, std::ios::binary);
  if (!in) fail<IOError>("cannot open goodput event log {} for reading", path.string());
  std::ostringstream buffer;
  buffer << in.rdbuf();
  EventLog log = parse_event_log(buffer.str(), path.string());
  if (log.events.empty()) log.warnings.push_back(fmt::format("{}: no valid events", path.string()));
  return log;
}

}  // namespace tessera::goodput
