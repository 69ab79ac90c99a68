// Optimizers over parameter Trees: AdamW (decoupled weight decay, by default not on
// norms, biases and embeddings) and SGD with momentum, both with global-norm gradient
// clipping. Every update is traceable: the learning rate and step count are arrays, so
// a jitted training step compiles once for the whole schedule.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/core/tree.h"
#include "tessera/nn/param.h"

namespace tessera::optim {

struct OptimizerConfig {
  std::string name = "adamw";                    // "adamw" | "sgd"
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;  // adamw
  double weight_decay = 0.1;                     // decoupled (adamw) / L2-free decoupled form for sgd too
  double momentum = 0.9;                         // sgd
  bool nesterov = false;                         // sgd
  double clip_norm = 1.0;                        // global-norm clipping threshold; 0 = off
  // Parameter kinds that get no weight decay (default: norms, biases, embeddings).
  std::vector<nn::ParamKind> no_decay = {nn::ParamKind::Norm, nn::ParamKind::Bias, nn::ParamKind::Embedding};

  void validate() const;  // ValueError naming the bad field
};

// sqrt(sum of squares of every leaf), float32 scalar (traceable).
Array global_norm(const Tree& grads);

// grads * min(1, max_norm / (norm + 1e-6)) (traceable); returns {clipped, norm}.
std::pair<Tree, Array> clip_by_global_norm(const Tree& grads, double max_norm);

class Optimizer {
 public:
  // `specs` gives each parameter's kind (weight decay mask) by path; paths of the
  // params Tree missing from specs are a ValueError at init/apply.
  Optimizer(OptimizerConfig config, nn::ParamSpecs specs);
  const OptimizerConfig& config() const { return config_; }

  // State: adamw {"m": like params, "v": like params, "step": int64 0};
  // sgd {"momentum": like params, "step": int64 0}. Moments are float32.
  Tree init(const Tree& params) const;

  struct Update {
    Tree params;
    Tree state;
    Array grad_norm;  // before clipping (0-d float32)
  };
  // Clips (if configured), then applies one step with learning rate `lr` (0-d float).
  Update apply(const Tree& params, const Tree& grads, const Tree& state, const Array& lr) const;

  // Whether the parameter at `path` gets weight decay.
  bool decays(const std::string& path) const;

 private:
  OptimizerConfig config_;
  nn::ParamSpecs specs_;
};

}  // namespace tessera::optim
