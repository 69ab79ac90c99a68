// OptimizerConfig::validate (optim/optimizer.h).
#include <cmath>
#include <limits>

#include "tessera/base/error.h"
#include "tessera/optim/optimizer.h"

namespace tessera::optim {

namespace {

void check_range(const char* field, double value, double low, bool low_open, double high, bool high_open) {
  const bool ok =
      std::isfinite(value) && (low_open ? value > low : value >= low) && (high_open ? value < high : value <= high);
  if (!ok)
    fail<ValueError>("optimizer: {} = {} (expected {} {} {} {} {})", field, value, low, low_open ? "<" : "<=", field,
                     high_open ? "<" : "<=", high);
}

void check_at_least(const char* field, double value, double low, bool open) {
  if (!std::isfinite(value) || (open ? value <= low : value < low))
    fail<ValueError>("optimizer: {} = {} (expected a finite value {} {})", field, value, open ? ">" : ">=", low);
}

}  // namespace

const char* loss_scaling_name(LossScaling mode) {
  switch (mode) {
    case LossScaling::Off:
      return "none";
    case LossScaling::Static:
      return "static";
    case LossScaling::Dynamic:
      return "dynamic";
    case LossScaling::Auto:
      return "auto";
  }
  return "?";
}

void OptimizerConfig::validate() const {
  if (name != "adamw" && name != "sgd" && name != "lion" && name != "adafactor" && name != "muon")
    fail<ValueError>("optimizer: name = \"{}\" is unknown (expected one of: adamw, sgd, lion, adafactor, muon)", name);
  check_at_least("weight_decay", weight_decay, 0, false);
  check_at_least("clip_norm", clip_norm, 0, false);
  if (name == "adamw" || name == "lion" || name == "muon") {
    check_range("beta1", beta1, 0, false, 1, true);
    check_range("beta2", beta2, 0, false, 1, true);
    check_at_least("eps", eps, 0, true);
    if (name == "muon") {
      check_range("muon_momentum", muon_momentum, 0, false, 1, true);
      if (muon_ns_steps < 1 || muon_ns_steps > 20)
        fail<ValueError>("optimizer: muon_ns_steps = {} (expected 1 to 20)", muon_ns_steps);
      if (muon_ns_dtype != "float32" && muon_ns_dtype != "bfloat16")
        fail<ValueError>("optimizer: muon_ns_dtype = \"{}\" (expected float32 or bfloat16)", muon_ns_dtype);
    }
  } else if (name == "adafactor") {
    check_range("adafactor_decay_rate", adafactor_decay_rate, 0, true, 1, false);
    if (adafactor_min_dim_to_factor < 1)
      fail<ValueError>("optimizer: adafactor_min_dim_to_factor = {} (expected >= 1)", adafactor_min_dim_to_factor);
    check_at_least("adafactor_clip_threshold", adafactor_clip_threshold, 0, false);
    check_at_least("adafactor_eps", adafactor_eps, 0, true);
    check_at_least("adafactor_min_scale", adafactor_min_scale, 0, false);
  } else {
    check_range("momentum", momentum, 0, false, 1, true);
    // Nesterov's look-ahead is g + momentum * buf: without momentum it is plain SGD,
    // which is almost certainly not what was asked for.
    if (nesterov && momentum == 0) fail<ValueError>("optimizer: nesterov = true needs momentum > 0 (got momentum = 0)");
  }
  if (loss_scale.mode == LossScaling::Auto)
    fail<ValueError>(
        "optimizer: loss_scale = auto is resolved from the model's compute dtype by the trainer "
        "(TrainConfig::optimizer_config); an Optimizer needs none, static or dynamic");
  if (loss_scale.mode == LossScaling::Static) check_at_least("loss_scale", loss_scale.static_scale, 0, true);
  check_at_least("loss_scale_init", loss_scale.init_scale, 0, true);
  // The scale is a float32 in the state.
  for (double scale : {loss_scale.static_scale, loss_scale.init_scale})
    if (scale > static_cast<double>(std::numeric_limits<float>::max()))
      fail<ValueError>("optimizer: loss scale {} does not fit float32 (expected at most {})", scale,
                       std::numeric_limits<float>::max());
  if (loss_scale.growth_interval < 1)
    fail<ValueError>("optimizer: loss_scale_growth_interval = {} (expected an integer >= 1)",
                     loss_scale.growth_interval);
  check_at_least("loss_scale_growth_factor", loss_scale.growth_factor, 1, true);
  check_range("loss_scale_backoff_factor", loss_scale.backoff_factor, 0, true, 1, true);
}

}  // namespace tessera::optim
