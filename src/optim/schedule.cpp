// Learning-rate schedules (optim/schedule.h).
#include "tessera/optim/schedule.h"

#include <cmath>
#include <numbers>

#include "tessera/base/error.h"

namespace tessera::optim {

void ScheduleConfig::validate() const {
  if (!std::isfinite(peak_lr) || peak_lr < 0)
    fail<ValueError>("schedule: peak_lr = {} (expected a finite learning rate >= 0)", peak_lr);
  if (decay != "cosine" && decay != "linear" && decay != "constant" && decay != "wsd")
    fail<ValueError>("schedule: decay = \"{}\" is unknown (expected one of: cosine, linear, constant, wsd)", decay);
  if (!(decay_fraction > 0 && decay_fraction <= 1))
    fail<ValueError>("schedule: decay_fraction = {} (expected 0 < decay_fraction <= 1)", decay_fraction);
  if (warmup_steps < 0) fail<ValueError>("schedule: warmup_steps = {} (expected >= 0)", warmup_steps);
  if (total_steps < 0) fail<ValueError>("schedule: total_steps = {} (expected >= 0)", total_steps);
  if (warmup_steps > total_steps)
    fail<ValueError>("schedule: warmup_steps = {} exceeds total_steps = {} (expected warmup_steps <= total_steps)",
                     warmup_steps, total_steps);
  if (!(min_lr_ratio >= 0 && min_lr_ratio <= 1))
    fail<ValueError>("schedule: min_lr_ratio = {} (expected 0 <= min_lr_ratio <= 1)", min_lr_ratio);
}

double learning_rate(const ScheduleConfig& s, int64_t step) {
  s.validate();
  if (step < 0) fail<ValueError>("schedule: step = {} (expected >= 0; steps are 0-based)", step);
  // Step s of the warm-up uses peak * (s + 1) / warmup, so the first update moves the
  // parameters and the last warm-up step reaches the peak.
  if (step < s.warmup_steps) return s.peak_lr * static_cast<double>(step + 1) / static_cast<double>(s.warmup_steps);
  if (s.decay == "constant") return s.peak_lr;
  const double floor = s.min_lr_ratio * s.peak_lr;
  if (step >= s.total_steps) return floor;
  // Fraction of the decay interval [warmup, total) done: 0 at its first step.
  const double t = static_cast<double>(step - s.warmup_steps) / static_cast<double>(s.total_steps - s.warmup_steps);
  if (s.decay == "linear") return s.peak_lr - (s.peak_lr - floor) * t;
  if (s.decay == "wsd") {
    // Stable until the last decay_fraction of [warmup, total), then linear to the floor.
    const double stable = 1 - s.decay_fraction;
    if (t < stable) return s.peak_lr;
    return s.peak_lr - (s.peak_lr - floor) * (t - stable) / s.decay_fraction;
  }
  return floor + (s.peak_lr - floor) * 0.5 * (1 + std::cos(std::numbers::pi * t));
}

}  // namespace tessera::optim
