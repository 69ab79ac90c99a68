// The update rules of the optimizers beyond AdamW and SGD (optimizer.cpp dispatches on
// OptimizerConfig::name): Lion, Adafactor and Muon, one file each. Lion calls its fused
// lion_update primitive per parameter; Adafactor and Muon are written with ops
// (traceable: under jit the elementwise parts fuse). Each keeps its state as trees
// with the parameters' structure, one leaf per parameter: a state leaf shaped like its
// parameter follows the parameter's layout under SPMD (train/parallel.cpp); a smaller one
// (Adafactor's factored rows and columns, the 0-d stand-ins of unused slots) is replicated.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tessera/core/tree.h"
#include "tessera/nn/param.h"
#include "tessera/optim/optimizer.h"

namespace tessera::optim::detail {

// What one step of a rule reads: leaves in the params' order.
struct StepInputs {
  const OptimizerConfig& config;
  const std::vector<std::string>& paths;
  const std::vector<const nn::ParamInfo*>& infos;
  const std::vector<bool>& decay;  // weight decay on this leaf
  const std::vector<Array>& params;
  const std::vector<Array>& grads;  // unscaled and clipped
  const Array& lr;                  // 0-d floating
  const Array& step;                // 0-d int64, 1-based (this update's number)
};

// State keys of each rule (besides "step" and "loss_scale"), sorted.
std::vector<std::string> state_keys(const std::string& name);

// Checks that `tree` has the params' paths and that each leaf has the dtype and the
// shape `shape_of(param, i)` gives (ValueError naming the state and the path).
void check_state_leaves(const char* what, const Tree& params, const Tree& tree,
                        const std::function<Shape(const Array& param, size_t index)>& shape_of);

// Lion (Chen et al. 2023): c = b1 m + (1 - b1) g; p -= lr (sign(c) + wd p);
// m = b2 m + (1 - b2) g. State {"m"}.
Tree lion_init(const Tree& params);
void lion_check(const Tree& params, const Tree& state);
std::vector<Array> lion_apply(const StepInputs& in, const Tree& state, Tree& new_state);

// Adafactor (Shazeer & Stern 2018, Optax's adafactor): factored second moments for
// tensors whose two largest dims are >= adafactor_min_dim_to_factor, update clipping by
// block RMS, step size relative to the parameter's RMS. State {"v", "v_row", "v_col"}.
Tree adafactor_init(const OptimizerConfig& config, const Tree& params);
void adafactor_check(const OptimizerConfig& config, const Tree& params, const Tree& state);
std::vector<Array> adafactor_apply(const StepInputs& in, const Tree& state, Tree& new_state);
// The two dims Adafactor factors a shape over (second largest, largest), or {-1, -1}.
std::pair<int, int> adafactor_factored_dims(const OptimizerConfig& config, const Shape& shape);

// Muon (Jordan et al. 2024, with Moonlight's update scale): 2-D weight matrices (no
// vocabulary axis) get Nesterov momentum orthogonalized by Newton-Schulz; every other
// parameter gets AdamW. State {"m", "v"} (v is 0-d for Muon's matrices).
bool muon_param(const nn::ParamInfo& info, const Shape& shape);
Tree muon_init(const Tree& params, const std::vector<bool>& muon);
void muon_check(const Tree& params, const Tree& state, const std::vector<bool>& muon);
std::vector<Array> muon_apply(const StepInputs& in, const Tree& state, Tree& new_state);
// The Newton-Schulz iteration of Muon: an approximately orthogonal matrix with g's
// singular vectors (quintic coefficients 3.4445, -4.7750, 2.0315), computed in `dtype`
// (float32 or bfloat16) and returned in it.
Array newton_schulz(const Array& g, int steps, DType dtype = DType::Float32);

}  // namespace tessera::optim::detail
