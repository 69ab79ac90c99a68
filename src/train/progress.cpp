#include "tessera/train/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace tessera::train {

namespace {

std::string thousands(double value) {
  std::string digits = fmt::format("{:.0f}", value);
  for (int i = static_cast<int>(digits.size()) - 3; i > 0; i -= 3) digits.insert(static_cast<size_t>(i), ",");
  return digits;
}

}  // namespace

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<int64_t>(std::llround(seconds));
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
}

Progress::Progress(int64_t total_steps, bool enabled)
    : total_(total_steps), enabled_(enabled), tty_(enabled && ::isatty(STDERR_FILENO)) {}

std::string Progress::line(const ProgressState& s) const {
  double eta = static_cast<double>(total_ - s.step) * s.step_seconds;
  if (s.time_limit_s > 0) eta = std::min(eta, std::max(0.0, s.time_limit_s - s.elapsed_s));
  const int width = static_cast<int>(std::to_string(total_).size());
  return fmt::format("step {:>{}}/{} | loss {:.4f} | lr {:.2e} | {} tok/s | MFU {:.1f}% | {:.0f} ms/step | ETA {}",
                     s.step, width, total_, s.loss, s.lr, thousands(s.tokens_per_s), 100 * s.mfu, 1000 * s.step_seconds,
                     format_duration(eta));
}

void Progress::update(const ProgressState& state) {
  if (!enabled_) return;
  // Terminal: redraw at most 10 times a second. Log: a line every 5 s, plus the first and last steps.
  const double min_gap = tty_ ? 0.1 : 5.0;
  if (state.elapsed_s - last_print_ < min_gap && state.step != total_ && state.step > 1) return;
  last_print_ = state.elapsed_s;
  if (tty_) {
    std::fprintf(stderr, "\r%s\033[K", line(state).c_str());
    open_line_ = true;
  } else {
    std::fprintf(stderr, "%s\n", line(state).c_str());
  }
  std::fflush(stderr);
}

void Progress::message(const std::string& text) {
  if (!enabled_) return;
  if (open_line_) std::fprintf(stderr, "\r\033[K");
  std::fprintf(stderr, "%s\n", text.c_str());
  open_line_ = false;
  last_print_ = -1e9;  // redraw the progress line at the next update
}

void Progress::finish() {
  if (enabled_ && open_line_) std::fprintf(stderr, "\n");
  open_line_ = false;
}

}  // namespace tessera::train
