// The straggler section of the goodput reports: a short text block for the table and
// the full attribution (every compared step) as JSON.
#include <fmt/format.h>

#include "tessera/goodput/report.h"

namespace tessera::goodput {
namespace {

std::string step_name(const StepStraggler& s, bool several_attempts) {
  return several_attempts ? fmt::format("step {} (attempt {})", s.step, s.attempt) : fmt::format("step {}", s.step);
}

nlohmann::json step_json(const StepStraggler& s) {
  return {{"attempt", s.attempt},           {"step", s.step},           {"ranks", s.ranks},
          {"slowest_rank", s.slowest_rank}, {"slowest_s", s.slowest_s}, {"median_s", s.median_s},
          {"fastest_s", s.fastest_s},       {"excess_s", s.excess_s()}};
}

}  // namespace

std::string format_stragglers(const StragglerReport& st) {
  // A one-process job has no one to wait for: nothing to say in the table (JSON keeps it).
  if (!st.present || st.world_size <= 1) return "";
  std::string out = fmt::format(
      "  stragglers: {} rank{} recorded, {} steps compared; {:.3f} s lost (sum over steps of slowest - median "
      "rank), {} step{} over {:.0f}% above the median\n",
      st.ranks.size(), st.ranks.size() == 1 ? "" : "s", st.steps.size(), st.lost_s, st.straggler_steps,
      st.straggler_steps == 1 ? "" : "s", 100 * st.threshold);
  if (st.slowest_rank >= 0)
    for (const RankStragglerStats& r : st.ranks)
      if (r.rank == st.slowest_rank)
        out += fmt::format("    slowest rank overall: rank {} (slowest in {} of {} steps, {:.3f} s charged)\n", r.rank,
                           r.slowest_count, st.steps.size(), r.lost_s);
  if (!st.ranks.empty()) {
    out += fmt::format("    {:>6} {:>7} {:>8} {:>9} {:>14} {:>12} {:>13}\n", "rank", "steps", "slowest", "lost_s",
                       "median_own_s", "data_wait_s", "collective_s");
    for (const RankStragglerStats& r : st.ranks)
      out += fmt::format("    {:>6} {:>7} {:>8} {:>9.3f} {:>14.4f} {:>12.3f} {:>13.3f}\n", r.rank, r.steps,
                         r.slowest_count, r.lost_s, r.median_own_s, r.data_wait_s, r.collective_s);
  }
  bool several_attempts = false;
  for (const StepStraggler& s : st.steps) several_attempts |= s.attempt != st.steps.front().attempt;
  constexpr size_t kWorstShown = 3;
  for (size_t i = 0; i < st.worst.size() && i < kWorstShown; ++i) {
    const StepStraggler& s = st.worst[i];
    out += fmt::format("    {} {}: rank {} took {:.3f} s, median {:.3f} s, fastest {:.3f} s: +{:.3f} s\n",
                       i == 0 ? "worst" : "     ", step_name(s, several_attempts), s.slowest_rank, s.slowest_s,
                       s.median_s, s.fastest_s, s.excess_s());
  }
  constexpr size_t kNotesShown = 3;
  for (size_t i = 0; i < st.notes.size() && i < kNotesShown; ++i) out += "    note: " + st.notes[i] + "\n";
  if (st.notes.size() > kNotesShown)
    out += fmt::format("    ... {} more notes (--json lists them all)\n", st.notes.size() - kNotesShown);
  return out;
}

nlohmann::json stragglers_to_json(const StragglerReport& st) {
  using nlohmann::json;
  json ranks = json::array(), steps = json::array(), worst = json::array();
  for (const RankStragglerStats& r : st.ranks)
    ranks.push_back({{"rank", r.rank},
                     {"steps", r.steps},
                     {"slowest_count", r.slowest_count},
                     {"lost_s", r.lost_s},
                     {"median_own_s", r.median_own_s},
                     {"data_wait_s", r.data_wait_s},
                     {"collective_s", r.collective_s}});
  for (const StepStraggler& s : st.steps) steps.push_back(step_json(s));
  for (const StepStraggler& s : st.worst) worst.push_back(step_json(s));
  return {{"present", st.present},
          {"world_size", st.world_size},
          {"lost_s", st.lost_s},
          {"straggler_steps", st.straggler_steps},
          {"threshold", st.threshold},
          {"slowest_rank", st.slowest_rank >= 0 ? json(st.slowest_rank) : json(nullptr)},
          {"ranks", ranks},
          {"worst", worst},
          {"steps", steps},
          {"notes", st.notes}};
}

}  // namespace tessera::goodput
