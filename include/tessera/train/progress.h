// The live progress line of a training run on stderr:
//   step  420/2000 | loss 1.8342 | lr 1.96e-03 | 6,120 tok/s | MFU 21.3% | 334 ms/step | ETA 8m47s
// On a terminal it redraws one line; otherwise (logs, CI) it prints a line every
// few seconds so a log stays short.
#pragma once

#include <cstdint>
#include <string>

namespace tessera::train {

struct ProgressState {
  int64_t step = 0;
  double loss = 0;
  double lr = 0;
  double tokens_per_s = 0;
  double mfu = 0;
  double step_seconds = 0;
  double time_limit_s = 0;  // 0: none
  double elapsed_s = 0;
};

// "8m47s", "1h02m", "12s".
std::string format_duration(double seconds);

class Progress {
 public:
  Progress(int64_t total_steps, bool enabled);
  void update(const ProgressState& state);
  // A line of its own (validation results), printed above the progress line.
  void message(const std::string& text);
  void finish();  // ends the redrawn line
  std::string line(const ProgressState& state) const;

 private:
  int64_t total_;
  bool enabled_, tty_;
  bool open_line_ = false;
  double last_print_ = -1e9;
};

}  // namespace tessera::train
