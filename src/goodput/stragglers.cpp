// Merges the per-rank step records into per-step straggler attribution (the math is in
// stragglers.h): read every rank's log, place each step in an attempt, group the ranks'
// own times by (attempt, step), then charge each step's excess over the median to its
// slowest rank.
#include "tessera/goodput/stragglers.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <optional>
#include <regex>

#include "tessera/base/statistics.h"

namespace tessera::goodput {
namespace {

namespace fs = std::filesystem;

// The rank in a file name events.rank-<R>.jsonl, or nullopt.
std::optional<int> rank_of_file(const fs::path& path) {
  static const std::regex kName(R"(events\.rank-(0|[1-9][0-9]{0,8})\.jsonl)");
  std::smatch match;
  const std::string name = path.filename().string();
  if (!std::regex_match(name, match, kName)) return std::nullopt;
  return std::atoi(match[1].str().c_str());
}

struct OwnTime {
  int rank = 0;
  double own_s = 0;
};

// The attempt running at time t: the last one started at or before it (the first when
// t precedes them all; 0 without attempts).
int attempt_at(const std::vector<std::pair<int, double>>& starts, double t) {
  int attempt = starts.empty() ? 0 : starts.front().first;
  for (const auto& [number, start] : starts)
    if (start <= t) attempt = number;
  return attempt;
}

}  // namespace

std::vector<EventLog> read_rank_logs(const fs::path& run_dir) {
  std::vector<std::pair<int, fs::path>> files;
  std::error_code ec;
  for (fs::directory_iterator it(run_dir / "goodput", ec), end; !ec && it != end; it.increment(ec))
    if (const std::optional<int> rank = rank_of_file(it->path())) files.emplace_back(*rank, it->path());
  std::sort(files.begin(), files.end());
  std::vector<EventLog> logs;
  for (const auto& [rank, path] : files) {
    try {
      logs.push_back(read_event_log(path));
    } catch (const std::exception& e) {
      EventLog unreadable;
      unreadable.path = path;
      unreadable.warnings.push_back(e.what());
      logs.push_back(std::move(unreadable));
    }
  }
  return logs;
}

StragglerReport compute_stragglers(const std::vector<EventLog>& rank_logs,
                                   const std::vector<std::pair<int, double>>& attempt_starts,
                                   const StragglerOptions& options) {
  StragglerReport r;
  r.threshold = options.threshold;
  r.present = !rank_logs.empty();
  std::vector<std::pair<int, double>> starts = attempt_starts;
  std::sort(starts.begin(), starts.end(), [](const auto& a, const auto& b) { return a.second < b.second; });

  // ---- each rank's steps: own time by (attempt, step) ----
  std::map<std::pair<int, int64_t>, std::vector<OwnTime>> by_step;
  std::map<int, std::map<int, int64_t>> last_step;  // rank -> attempt -> its last step
  for (const EventLog& log : rank_logs) {
    for (const std::string& w : log.warnings) r.notes.push_back(w);
    const std::optional<int> file_rank = rank_of_file(log.path);
    RankStragglerStats stats;
    stats.rank = file_rank.value_or(-1);
    std::map<std::pair<int, int64_t>, double> own;  // a step recorded twice: the last record
    for (const Event& e : log.events) {
      const int rank = static_cast<int>(e.integer("rank", stats.rank));
      if (stats.rank < 0) stats.rank = rank;
      if (e.type == EventType::kRankStart) {
        r.world_size = std::max<int>(r.world_size, static_cast<int>(e.integer("world_size", 0)));
        continue;
      }
      if (e.type != EventType::kRankStep) continue;
      const double start = e.number("start", e.t), end = e.number("end", e.t);
      const int64_t step = e.integer("step", -1);
      if (step < 0 || !(end >= start)) {
        r.notes.push_back(fmt::format("{}:{}: rank_step without a step or with end before start; ignored",
                                      log.path.string(), e.line));
        continue;
      }
      const int64_t recorded_attempt = e.integer("attempt", -1);
      const int attempt = recorded_attempt >= 0 ? static_cast<int>(recorded_attempt) : attempt_at(starts, start);
      const double collective = std::clamp(e.number("collective_s", 0), 0.0, end - start);
      own[{attempt, step}] = end - start - collective;
      stats.data_wait_s += std::max(0.0, e.number("data_wait_s", 0));
      stats.collective_s += collective;
    }
    if (stats.rank < 0) {
      r.notes.push_back(fmt::format("{}: no valid records and no rank in its name; ignored", log.path.string()));
      continue;
    }
    std::vector<double> times;
    for (const auto& [key, seconds] : own) {
      by_step[key].push_back({stats.rank, seconds});
      times.push_back(seconds);
      int64_t& last = last_step[stats.rank][key.first];
      last = std::max(last, key.second);
    }
    stats.steps = static_cast<int64_t>(own.size());
    stats.median_own_s = median(times);
    if (own.empty())
      r.notes.push_back(fmt::format("rank {}: its log {} has no step records", stats.rank, log.path.string()));
    r.ranks.push_back(stats);
  }
  std::sort(r.ranks.begin(), r.ranks.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
  r.world_size = std::max(r.world_size, r.ranks.empty() ? 0 : r.ranks.back().rank + 1);

  // ---- ranks the job had but that left no log ----
  std::vector<int> missing;
  for (int rank = 0, i = 0; rank < r.world_size; ++rank) {
    while (i < static_cast<int>(r.ranks.size()) && r.ranks[i].rank < rank) ++i;
    if (i >= static_cast<int>(r.ranks.size()) || r.ranks[i].rank != rank) missing.push_back(rank);
  }
  if (!missing.empty()) {
    constexpr size_t kListed = 10;
    const std::vector<int> listed(missing.begin(), missing.begin() + std::min(missing.size(), kListed));
    r.notes.push_back(fmt::format(
        "{} of {} ranks left no per-rank log (goodput/events.rank-R.jsonl): rank{} {}{}; they never started "
        "recording (died at start-up?) or wrote to another run directory",
        missing.size(), r.world_size, missing.size() == 1 ? "" : "s", fmt::join(listed, ", "),
        missing.size() > kListed ? ", ..." : ""));
  }

  // ---- ranks that stopped early in an attempt (died or were stopped there) ----
  std::map<int, int64_t> furthest;  // attempt -> the last step any rank recorded
  for (const auto& [rank, attempts] : last_step)
    for (const auto& [attempt, step] : attempts) furthest[attempt] = std::max(furthest[attempt], step);
  for (const auto& [rank, attempts] : last_step)
    for (const auto& [attempt, step] : attempts)
      if (step < furthest[attempt])
        r.notes.push_back(fmt::format(
            "rank {}: its records of attempt {} end at step {} while other ranks reached step {} (it died or was "
            "stopped; its last line may be torn)",
            rank, attempt, step, furthest[attempt]));

  // ---- per step: the slowest rank and its excess over the median ----
  std::map<int, RankStragglerStats*> stats_of;
  for (RankStragglerStats& s : r.ranks) stats_of[s.rank] = &s;
  for (const auto& [key, times] : by_step) {
    if (times.size() < 2) continue;
    StepStraggler s;
    s.attempt = key.first;
    s.step = key.second;
    s.ranks = static_cast<int>(times.size());
    std::vector<double> values;
    s.fastest_s = times.front().own_s;
    for (const OwnTime& t : times) {
      values.push_back(t.own_s);
      if (s.slowest_rank < 0 || t.own_s > s.slowest_s) s.slowest_rank = t.rank, s.slowest_s = t.own_s;
      s.fastest_s = std::min(s.fastest_s, t.own_s);
    }
    s.median_s = median(values);
    r.lost_s += s.excess_s();
    if (s.excess_s() > options.threshold * s.median_s) ++r.straggler_steps;
    // A step where every rank took exactly as long has no slowest rank to charge.
    if (s.slowest_s > s.fastest_s) {
      RankStragglerStats& slowest = *stats_of[s.slowest_rank];
      ++slowest.slowest_count;
      slowest.lost_s += s.excess_s();
    }
    r.steps.push_back(s);
  }
  if (r.present && r.steps.empty() && r.ranks.size() < 2)
    r.notes.push_back(fmt::format("per-rank records of {} rank{} only: no straggler attribution", r.ranks.size(),
                                  r.ranks.size() == 1 ? "" : "s"));

  // ---- the slowest rank overall and the worst steps ----
  for (const RankStragglerStats& s : r.ranks) {
    if (s.lost_s <= 0) continue;
    const RankStragglerStats* best = r.slowest_rank >= 0 ? stats_of[r.slowest_rank] : nullptr;
    if (!best || s.lost_s > best->lost_s) r.slowest_rank = s.rank;
  }
  r.worst = r.steps;
  std::stable_sort(r.worst.begin(), r.worst.end(),
                   [](const StepStraggler& a, const StepStraggler& b) { return a.excess_s() > b.excess_s(); });
  if (r.worst.size() > options.worst) r.worst.resize(options.worst);
  return r;
}

}  // namespace tessera::goodput
