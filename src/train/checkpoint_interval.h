// How often to checkpoint: Young's (1974) first-order optimum, as refined by Daly
// (2006) for small costs. With a save costing C seconds of training time and failures
// arriving on average every M seconds, the expected loss per unit of time is
// C / T (saving) + T / (2 M) (on average half an interval is redone after a failure);
// it is smallest at T = sqrt(2 C M).
#pragma once

#include <cstdint>

namespace tessera::train {

// sqrt(2 * save_cost_s * mtbf_s) seconds; ValueError unless both are finite, cost >= 0
// and mtbf > 0.
double young_daly_interval_s(double save_cost_s, double mtbf_s);

// The same in optimizer steps of step_time_s each, rounded, at least 1.
int64_t young_daly_interval_steps(double save_cost_s, double mtbf_s, double step_time_s);

}  // namespace tessera::train
