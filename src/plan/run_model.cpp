#include "tessera/plan/run_model.h"

#include <cmath>
#include <limits>

#include "tessera/base/error.h"

namespace tessera::plan {

RunEstimate estimate_run(const StepEstimate& step, const goodput::AcceleratorSpec& accelerator, double tokens,
                         const RunCosts& costs) {
  if (!(tokens > 0)) fail<ConfigError>("plan: the token budget must be positive (got {})", tokens);
  if (!(step.step_seconds > 0)) fail<ValueError>("plan: the step time must be positive (got {})", step.step_seconds);
  const double chips = static_cast<double>(step.layout.chips());
  RunEstimate run;
  run.tokens = tokens;
  run.steps = std::ceil(tokens / (static_cast<double>(step.global_batch) * static_cast<double>(step.seq)));
  run.raw_seconds = run.steps * step.step_seconds;
  const double rate = chips * accelerator.failure_rate / 3600.0;  // failures per second
  if (rate > 0) {
    run.mtbf_seconds = 1 / rate;
    const double c = std::max(costs.save_seconds, 0.0);
    // Young/Daly, but never longer than the run itself (a run shorter than the interval
    // saves at its end only, and a failure loses on average half of it).
    run.checkpoint_interval_seconds = std::min(std::sqrt(2 * std::max(c, 1e-3) * run.mtbf_seconds), run.raw_seconds);
    const double t = run.checkpoint_interval_seconds;
    run.goodput = 1 / (1 + c / t + (costs.restart_seconds + t / 2) / run.mtbf_seconds);
  } else {
    run.mtbf_seconds = std::numeric_limits<double>::infinity();
    run.goodput = 1;
  }
  run.seconds = run.raw_seconds / run.goodput;
  run.chip_hours = run.seconds * chips / 3600;
  run.dollars_raw = run.raw_seconds * chips / 3600 * accelerator.price;
  run.dollars = run.chip_hours * accelerator.price;
  return run;
}

}  // namespace tessera::plan
