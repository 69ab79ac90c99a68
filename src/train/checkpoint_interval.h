// How often to checkpoint: Young's (1974) first-order optimum, as refined by Daly
// (2006) for small costs. With a save costing C seconds of training time and failures
// arriving on average every M seconds, the expected loss per unit of time is
// C / T (saving) + T / (2 M) (on average half an interval is redone after a failure);
// it is smallest at T = sqrt(2 C M).
#pragma once

#include <cstdint>

namespace tessera::train {

// checkpoint.interval = "auto": the first persistent save comes after this many steps,
// to measure its cost (it also protects the first minutes); Young/Daly after that.
inline constexpr int64_t kFirstAutoSaveStep = 10;
// checkpoint.local_interval = "auto": the first local save (measured), and the share of
// training time the local tier may cost.
inline constexpr int64_t kFirstLocalSaveStep = 5;
inline constexpr double kLocalTierBudget = 0.01;

// sqrt(2 * save_cost_s * mtbf_s) seconds; ValueError unless both are finite, cost >= 0
// and mtbf > 0.
double young_daly_interval_s(double save_cost_s, double mtbf_s);

// The same in optimizer steps of step_time_s each, rounded, at least 1.
int64_t young_daly_interval_steps(double save_cost_s, double mtbf_s, double step_time_s);

// The shortest interval in steps whose saves cost at most `budget` of the training time,
// ceil(save_cost_s / (budget * step_time_s)), and no shorter than one background write
// (ceil(write_s / step_time_s)) so saves do not queue behind each other; at least 1.
// ValueError unless the costs are finite and >= 0, the step time and budget > 0.
int64_t budget_interval_steps(double save_cost_s, double write_s, double step_time_s, double budget);

}  // namespace tessera::train
