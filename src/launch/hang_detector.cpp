// Hang detection from heartbeat progress (see hang_detector.h).
#include "launch/hang_detector.h"

#include <fmt/format.h>

#include <algorithm>

#include "tessera/base/error.h"

namespace tessera::launch {

HangDetector::HangDetector(int ranks, HangPolicy policy) : policy_(policy), ranks_(static_cast<size_t>(ranks)) {
  if (ranks < 1) fail<ValueError>("HangDetector: {} ranks; expected at least 1", ranks);
  if (policy_.timeout_s && !(*policy_.timeout_s > 0))
    fail<ValueError>("hang timeout {} s: expected a positive number of seconds or auto", *policy_.timeout_s);
  if (!(policy_.startup_s > 0))
    fail<ValueError>("start-up timeout {} s: expected a positive number", policy_.startup_s);
}

void HangDetector::start_attempt(double now) {
  attempt_start_ = now;
  for (Rank& rank : ranks_) rank = Rank{};
}

void HangDetector::observe(int rank, int64_t step, double worker_time, double now) {
  Rank& r = ranks_.at(static_cast<size_t>(rank));
  if (r.done || step == r.step) return;
  if (r.step >= 0 && step > r.step && worker_time > r.worker_time)
    step_seconds_.push_back((worker_time - r.worker_time) / static_cast<double>(step - r.step));
  r.step = step;
  r.worker_time = worker_time;
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
  return std::max(policy_.auto_floor_s, median ? policy_.auto_factor * *median : 0.0);
}

int64_t HangDetector::last_step(int rank) const { return ranks_.at(static_cast<size_t>(rank)).step; }

std::optional<std::string> HangDetector::check(double now) const {
  const double timeout = progress_timeout_s();
  for (size_t i = 0; i < ranks_.size(); ++i) {
    const Rank& r = ranks_[i];
    if (r.done) continue;
    if (r.step < 0) {
      if (now - attempt_start_ > policy_.startup_s)
        return fmt::format("hang: rank {} completed no step within the start-up allowance of {:.0f} s", i,
                           policy_.startup_s);
    } else if (now - r.changed_at > timeout) {
      return fmt::format("hang: no step progress for {:.0f} s (rank {} stuck after step {})", timeout, i, r.step);
    }
  }
  return std::nullopt;
}

}  // namespace tessera::launch
