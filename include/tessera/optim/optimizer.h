// Optimizers over parameter Trees: AdamW (decoupled weight decay, by default not on
// norms, biases and embeddings) and SGD with momentum, both with global-norm gradient
// clipping. Every update is traceable: the learning rate and step count are arrays, so
// a jitted training step compiles once for the whole schedule.
//
// Loss scaling (for float16 compute, where small gradients underflow): the caller
// multiplies the loss by the scale before differentiating (TrainStep seeds the
// backward pass with it), apply() divides the gradients by it and, when any gradient
// is not finite, skips the update (params, moments and the step count unchanged).
// Dynamic scaling follows PyTorch's GradScaler: start at 2^16, halve on every skipped
// step, double after `growth_interval` (2000) good steps in a row. The scale and the
// good-step count live in the optimizer state ("loss_scale": {"scale", "good_steps"}),
// so everything runs inside the compiled step and checkpoints resume it bitwise.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/core/tree.h"
#include "tessera/nn/param.h"

namespace tessera::optim {

enum class LossScaling {
  Off,      // no scaling (float32 and bfloat16 compute need none)
  Static,   // a constant scale (static_scale); non-finite steps are still skipped
  Dynamic,  // GradScaler's: init_scale, x backoff_factor on overflow, x growth_factor after growth_interval good steps
  Auto,     // the trainer's default: Dynamic for float16 compute, else Off (TrainConfig::optimizer_config resolves
            // it; an Optimizer rejects it)
};
const char* loss_scaling_name(LossScaling mode);

struct LossScaleConfig {
  LossScaling mode = LossScaling::Off;
  double static_scale = 1.0;       // Static
  double init_scale = 65536.0;     // Dynamic: the first scale (2^16)
  int64_t growth_interval = 2000;  // Dynamic: good steps in a row before the scale grows
  double growth_factor = 2.0;      // Dynamic
  double backoff_factor = 0.5;     // Dynamic: on a step with non-finite gradients
  bool enabled() const { return mode == LossScaling::Static || mode == LossScaling::Dynamic; }
  double initial() const { return mode == LossScaling::Static ? static_scale : init_scale; }
};

struct OptimizerConfig {
  std::string name = "adamw";                    // "adamw" | "sgd" | "lion" | "adafactor" | "muon"
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;  // adamw (and muon's AdamW group); lion's two betas
  double weight_decay = 0.1;                     // decoupled (adamw) / L2-free decoupled form for sgd too
  double momentum = 0.9;                         // sgd
  bool nesterov = false;                         // sgd
  double clip_norm = 1.0;                        // global-norm clipping threshold; 0 = off
  // Adafactor (Optax's defaults): second-moment decay 1 - t^-decay_rate; tensors whose two
  // largest dims are both >= min_dim_to_factor keep factored row/column moments; updates
  // clipped to RMS clip_threshold (0: off); step relative to max(RMS(param), min_scale)
  // when param_scale; relative_step: the paper's step min(1e-2, 1/sqrt(t)) replaces lr.
  double adafactor_decay_rate = 0.8;
  int64_t adafactor_min_dim_to_factor = 128;
  double adafactor_clip_threshold = 1.0;
  double adafactor_eps = 1e-30;
  bool adafactor_param_scale = true;
  double adafactor_min_scale = 1e-3;
  bool adafactor_relative_step = false;
  // Muon: momentum of the orthogonalized matrices, Nesterov's form, Newton-Schulz steps.
  double muon_momentum = 0.95;
  bool muon_nesterov = true;
  int muon_ns_steps = 5;
  // The dtype the Newton-Schulz matmuls run in: "float32", or "bfloat16" as the GPT-2
  // speedruns do (the iteration only needs the singular values near 1; bf16 GEMMs run on
  // the CPU's matrix units and GPU tensor cores). The momentum and update stay float32.
  std::string muon_ns_dtype = "float32";
  // Parameter kinds that get no weight decay (default: norms, biases, embeddings).
  std::vector<nn::ParamKind> no_decay = {nn::ParamKind::Norm, nn::ParamKind::Bias, nn::ParamKind::Embedding};
  LossScaleConfig loss_scale;  // off by default

  void validate() const;  // ValueError naming the bad field
};

// sqrt(sum of squares of every leaf), float32 scalar (traceable).
Array global_norm(const Tree& grads);
// The sum of squares of every leaf, in the norm's accumulation dtype (float64 when a
// leaf is, else float32): what a tree split over devices (pipeline stages) adds up
// across them before taking the root.
Array global_squared_norm(const Tree& grads);

// grads * min(1, max_norm / (norm + 1e-6)) (traceable); returns {clipped, norm}. When
// `squared_norm` is given, grads are part of a larger tree and norm = sqrt(squared_norm)
// (the whole tree's global_squared_norm) instead of their own.
std::pair<Tree, Array> clip_by_global_norm(const Tree& grads, double max_norm, const Array& squared_norm = Array());

// The clip factor alone: {min(1, max_norm / (norm + 1e-6)) in the norm's accumulation
// dtype, norm as float32}. clip_by_global_norm multiplies each leaf by it cast to the
// leaf's dtype; AdamW takes that cast factor as its grad_scale instead (the same bits,
// without writing the clipped gradients).
std::pair<Array, Array> clip_factor(const Tree& grads, double max_norm, const Array& squared_norm = Array());

class Optimizer {
 public:
  // `specs` gives each parameter's kind (weight decay mask) by path; paths of the
  // params Tree missing from specs are a ValueError at init/apply.
  Optimizer(OptimizerConfig config, nn::ParamSpecs specs);
  const OptimizerConfig& config() const { return config_; }

  // State: adamw {"m": like params, "v": like params, "step": int64 0};
  // sgd {"momentum": like params, "step"}; lion {"m": like params, "step"};
  // adafactor {"v", "v_row", "v_col", "step"} (per parameter: the full second moment, or
  // its factored rows and columns; 0-d where unused); muon {"m": like params, "v": like
  // params for the AdamW group, 0-d for the orthogonalized matrices, "step"} (optim/rules.h).
  // Moments are float32. With loss scaling also "loss_scale": {"scale": float32 initial
  // scale, "good_steps": int64 0}.
  Tree init(const Tree& params) const;

  struct Update {
    Tree params;
    Tree state;
    Array grad_norm;  // before clipping, of the unscaled gradients (0-d float32)
    Array skipped;    // with loss scaling: bool 0-d, true when the update was skipped; invalid without
  };
  // Clips (if configured), then applies one step with learning rate `lr` (0-d float).
  // With loss scaling, `grads` are those of the scaled loss: they are divided by the
  // state's scale first, and a non-finite one skips the step (see the header comment).
  // `squared_norm`: params are part of a larger model whose other parameters are updated
  // elsewhere (pipeline stages on other processes); it is the whole model's unscaled
  // squared gradient norm (the sum over the parts of squared_norm() below), and clipping,
  // the reported norm and the loss scaler's finite check use its root, so every part
  // makes the decision the whole model's update would.
  Update apply(const Tree& params, const Tree& grads, const Tree& state, const Array& lr,
               const Array& squared_norm = Array()) const;
  // The sum of squares of the unscaled gradients (divided by the state's loss scale when
  // scaling), in the norm's accumulation dtype: one part's term of apply's squared_norm.
  Array squared_norm(const Tree& grads, const Tree& state) const;

  // Whether the loss is scaled (config.loss_scale Static or Dynamic).
  bool scales_loss() const { return config_.loss_scale.enabled(); }
  // The scale to multiply the loss by: the state's "loss_scale.scale" (0-d float32).
  // ValueError without loss scaling.
  Array loss_scale(const Tree& state) const;

  // Whether the parameter at `path` gets weight decay.
  bool decays(const std::string& path) const;
  // Per leaf of params (in order): whether Muon orthogonalizes it (muon only).
  std::vector<bool> muon_mask(const Tree& params) const;

 private:
  void apply_loss_scale(const Tree& params, const Tree& state, const Array& scale, Update& out) const;
  OptimizerConfig config_;
  nn::ParamSpecs specs_;
};

}  // namespace tessera::optim
