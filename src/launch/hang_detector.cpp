// Hang detection from heartbeat progress (see hang_detector.h).
#include "launch/hang_detector.h"

#include <fmt/format.h>

#include <algorithm>

#include "tessera/base/error.h"

namespace tessera::launch {

namespace {

bool is_startup_phase(const std::string& phase) {
  return phase.empty() || phase == "startup" || phase == "restore" || phase == "compile";
}

}  // namespace

HangDetector::HangDetector(int ranks, HangPolicy policy) : policy_(policy), ranks_(static_cast<size_t>(ranks)) {
  if (ranks < 1) fail<ValueError>("HangDetector: {} ranks; expected at least 1", ranks);
  if (policy_.timeout_s && !(*policy_.timeout_s > 0))
    fail<ValueError>("hang timeout {} s: expected a positive number of seconds or auto", *policy_.timeout_s);
  if (!(policy_.startup_s > 0))
    fail<ValueError>("start-up timeout {} s: expected a positive number", policy_.startup_s);
  if (!(policy_.auto_floor_s > 0) || !(policy_.auto_factor > 0) || !(policy_.first_steps_s > 0) ||
      !(policy_.phase_floor_s > 0))
    fail<ValueError>("hang policy: floors and factors must be positive");
}

void HangDetector::start_attempt(double now) {
  attempt_start_ = now;
  for (Rank& rank : ranks_) rank = Rank{};
}

void HangDetector::observe(int rank, const Progress& p, double now) {
  Rank& r = ranks_.at(static_cast<size_t>(rank));
  if (r.done || (p.step == r.step && p.phase == r.phase)) return;
  // A step time only from two consecutive step-phase beats (an eval or save between
  // them is not a step).
  if (r.phase == "step" && p.phase == "step" && r.step >= 0 && p.step > r.step && p.worker_time > r.worker_time)
    step_seconds_.push_back((p.worker_time - r.worker_time) / static_cast<double>(p.step - r.step));
  if (p.phase == "step") r.stepped = true;
  r.step = p.step;
  r.phase = p.phase;
  r.expect_s = p.expect_s;
  r.worker_time = p.worker_time;
  r.changed_at = now;
}

void HangDetector::finished(int rank) { ranks_.at(static_cast<size_t>(rank)).done = true; }

std::optional<double> HangDetector::median_step_s() const {
  if (step_seconds_.empty()) return std::nullopt;
  std::vector<double> sorted = step_seconds_;
  const auto mid = sorted.begin() + static_cast<std::ptrdiff_t>(sorted.size() / 2);
  std::nth_element(sorted.begin(), mid, sorted.end());
  return *mid;
}

double HangDetector::progress_timeout_s() const {
  if (policy_.timeout_s) return *policy_.timeout_s;
  const std::optional<double> median = median_step_s();
  if (!median) return policy_.first_steps_s;
  return std::max(policy_.auto_floor_s, policy_.auto_factor * *median);
}

double HangDetector::limit_s(const Rank& r) const {
  if (is_startup_phase(r.phase)) return policy_.startup_s;
  if (r.phase == "step") return progress_timeout_s();
  // eval, save, or a phase this supervisor does not know: the worker's expectation.
  if (r.expect_s && *r.expect_s >= 0) return std::max(policy_.phase_floor_s, policy_.auto_factor * *r.expect_s);
  return policy_.startup_s;
}

int64_t HangDetector::last_step(int rank) const { return ranks_.at(static_cast<size_t>(rank)).step; }

bool HangDetector::made_progress() const {
  return std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.stepped; });
}

std::optional<std::string> HangDetector::overdue(size_t i, double now) const {
  const Rank& r = ranks_[i];
  if (r.done) return std::nullopt;
  if (r.phase.empty()) {
    if (now - attempt_start_ > policy_.startup_s)
      return fmt::format("hang: rank {} completed no step within the start-up allowance of {:.0f} s", i,
                         policy_.startup_s);
    return std::nullopt;
  }
  const double limit = limit_s(r);
  if (now - r.changed_at <= limit) return std::nullopt;
  if (r.phase == "step")
    return fmt::format("hang: no step progress for {:.0f} s (rank {} stuck after step {})", limit, i, r.step);
  return fmt::format("hang: rank {} spent over {:.0f} s in {} (after step {})", i, limit, r.phase, r.step);
}

std::optional<std::string> HangDetector::check(double now) const {
  for (size_t i = 0; i < ranks_.size(); ++i)
    if (std::optional<std::string> hang = overdue(i, now)) return hang;
  return std::nullopt;
}

int HangDetector::hung_rank(double now) const {
  for (size_t i = 0; i < ranks_.size(); ++i)
    if (overdue(i, now)) return static_cast<int>(i);
  return -1;
}

}  // namespace tessera::launch
