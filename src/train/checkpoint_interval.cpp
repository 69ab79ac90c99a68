#include "train/checkpoint_interval.h"

#include <algorithm>
#include <cmath>

#include "tessera/base/error.h"

namespace tessera::train {

double young_daly_interval_s(double save_cost_s, double mtbf_s) {
  if (!std::isfinite(save_cost_s) || save_cost_s < 0)
    fail<ValueError>("checkpoint interval: save cost {} s must be finite and >= 0", save_cost_s);
  if (!std::isfinite(mtbf_s) || mtbf_s <= 0)
    fail<ValueError>("checkpoint interval: mtbf {} s must be finite and > 0", mtbf_s);
  return std::sqrt(2.0 * save_cost_s * mtbf_s);
}

int64_t young_daly_interval_steps(double save_cost_s, double mtbf_s, double step_time_s) {
  if (!std::isfinite(step_time_s) || step_time_s <= 0)
    fail<ValueError>("checkpoint interval: step time {} s must be finite and > 0", step_time_s);
  const double steps = std::round(young_daly_interval_s(save_cost_s, mtbf_s) / step_time_s);
  return static_cast<int64_t>(std::clamp(steps, 1.0, 1e15));
}

int64_t budget_interval_steps(double save_cost_s, double write_s, double step_time_s, double budget) {
  if (!std::isfinite(save_cost_s) || save_cost_s < 0 || !std::isfinite(write_s) || write_s < 0)
    fail<ValueError>("checkpoint interval: save cost {} s and write time {} s must be finite and >= 0", save_cost_s,
                     write_s);
  if (!std::isfinite(step_time_s) || step_time_s <= 0 || !std::isfinite(budget) || budget <= 0)
    fail<ValueError>("checkpoint interval: step time {} s and budget {} must be finite and > 0", step_time_s, budget);
  const double by_cost = std::ceil(save_cost_s / (budget * step_time_s));
  const double by_write = std::ceil(write_s / step_time_s);
  return static_cast<int64_t>(std::clamp(std::max(by_cost, by_write), 1.0, 1e15));
}

}  // namespace tessera::train
