// Learning-rate schedules: linear warm-up from 0 to the peak, then cosine or linear
// decay to min_lr_ratio * peak at total_steps (constant afterwards), or constant.
#pragma once

#include <cstdint>
#include <string>

namespace tessera::optim {

struct ScheduleConfig {
  double peak_lr = 1e-3;
  std::string decay = "cosine";  // "cosine" | "linear" | "constant" | "wsd"
  // wsd (warmup-stable-decay): after the warm-up the rate stays at the peak, then falls
  // linearly to min_lr_ratio * peak over the last decay_fraction of the steps after warm-up.
  double decay_fraction = 0.2;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1000;
  double min_lr_ratio = 0.1;

  void validate() const;  // ValueError naming the bad field
};

// The rate for optimizer step `step` (0-based: the first update uses step 0, which
// during warm-up is peak * 1 / warmup_steps, never 0).
double learning_rate(const ScheduleConfig& schedule, int64_t step);

}  // namespace tessera::optim
