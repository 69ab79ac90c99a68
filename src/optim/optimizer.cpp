// Optimizer (optim/optimizer.h): AdamW through the fused adamw_update kernel, SGD with
// momentum from plain ops. The learning rate and step count are arrays and nothing
// reads a value, so apply() traces under jit into one program for every step.
#include "tessera/optim/optimizer.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <map>
#include <optional>

#include "optim/rules.h"
#include "tessera/core/ops.h"

namespace tessera::optim {

namespace {

// "a", "b", "c" (at most `limit`, then "...") for error messages.
std::string some_paths(const std::vector<std::string>& paths, size_t limit = 4) {
  std::string out;
  for (size_t i = 0; i < paths.size() && i < limit; ++i) out += (i ? ", \"" : "\"") + paths[i] + "\"";
  if (paths.size() > limit) out += ", ...";
  return out.empty() ? "none" : out;
}

std::vector<std::string> spec_paths(const nn::ParamSpecs& specs) {
  std::vector<std::string> paths;
  for (const auto& [path, info] : specs) paths.push_back(path);
  return paths;
}

// `other` must hold a leaf for every parameter, at the same path and of the same shape;
// of the parameter's dtype, or of its accumulation dtype when `state` (moments).
void check_like_params(const char* what, const Tree& params, const Tree& other, bool state) {
  std::vector<std::string> p_paths = params.paths(), o_paths = other.paths();
  if (p_paths != o_paths) {
    std::vector<std::string> want = p_paths, got = o_paths, missing, extra;
    std::sort(want.begin(), want.end());
    std::sort(got.begin(), got.end());
    std::set_difference(want.begin(), want.end(), got.begin(), got.end(), std::back_inserter(missing));
    std::set_difference(got.begin(), got.end(), want.begin(), want.end(), std::back_inserter(extra));
    if (missing.empty() && extra.empty())
      fail<ValueError>("optimizer: {} holds the params' paths in another order {} (expected {})", what,
                       some_paths(o_paths), some_paths(p_paths));
    fail<ValueError>("optimizer: {} does not match the params: lacks {}; has extra {} (expected the same paths)", what,
                     some_paths(missing), some_paths(extra));
  }
  std::vector<Array> p = params.leaves(), o = other.leaves();
  for (size_t i = 0; i < p.size(); ++i) {
    DType expected = state ? accumulation_dtype(p[i].dtype()) : p[i].dtype();
    if (o[i].shape() != p[i].shape() || o[i].dtype() != expected)
      fail<ValueError>("optimizer: {} \"{}\" is {} (expected {}{} like the parameter {})", what, o_paths[i],
                       type_string(o[i]), short_name(expected), to_string(p[i].shape()), type_string(p[i]));
  }
}

void check_state_keys(const Tree& state, std::vector<std::string> keys, const std::string& optimizer, bool loss_scale) {
  if (loss_scale) {
    keys.push_back("loss_scale");
    std::sort(keys.begin(), keys.end());
  }
  std::vector<std::string> got;
  if (state.is_dict())
    for (const auto& [key, value] : state.items()) got.push_back(key);
  if (got != keys)
    fail<ValueError>("optimizer: {} state has keys {} (expected {}; make it with Optimizer::init)", optimizer,
                     some_paths(got), some_paths(keys));
  auto check_scalar = [](const Tree& node, const char* path, DType dtype) {
    if (!node.is_leaf() || node.leaf().ndim() != 0 || node.leaf().dtype() != dtype)
      fail<ValueError>("optimizer: state \"{}\" is {} (expected a {} scalar)", path,
                       node.is_leaf() ? type_string(node.leaf()) : std::string("not an array"), name(dtype));
  };
  check_scalar(state.at("step"), "step", DType::Int64);
  if (loss_scale) {
    const Tree& ls = state.at("loss_scale");
    std::vector<std::string> ls_keys;
    if (ls.is_dict())
      for (const auto& [key, value] : ls.items()) ls_keys.push_back(key);
    if (ls_keys != std::vector<std::string>{"good_steps", "scale"})
      fail<ValueError>(
          "optimizer: state \"loss_scale\" has keys {} (expected \"good_steps\", \"scale\"; make it with "
          "Optimizer::init)",
          some_paths(ls_keys));
    check_scalar(ls.at("scale"), "loss_scale.scale", DType::Float32);
    check_scalar(ls.at("good_steps"), "loss_scale.good_steps", DType::Int64);
  }
}

// x is finite (not inf, not NaN): |x| < inf is false for both.
Array is_finite(const Array& x) { return less(abs(x), scalar_like(std::numeric_limits<double>::infinity(), x)); }

std::vector<std::string> with_step(std::vector<std::string> keys) {
  keys.push_back("step");
  std::sort(keys.begin(), keys.end());
  return keys;
}

Tree moments_like(const Tree& params) {
  return params.map([](const Array& p) { return zeros(p.shape(), accumulation_dtype(p.dtype())); });
}

}  // namespace

Optimizer::Optimizer(OptimizerConfig config, nn::ParamSpecs specs)
    : config_(std::move(config)), specs_(std::move(specs)) {
  config_.validate();
}

std::vector<bool> Optimizer::muon_mask(const Tree& params) const {
  std::vector<bool> mask;
  const std::vector<Array> leaves = params.leaves();
  const std::vector<std::string> paths = params.paths();
  for (size_t i = 0; i < leaves.size(); ++i) {
    decays(paths[i]);  // a spec for every path (ValueError naming it otherwise)
    mask.push_back(detail::muon_param(specs_.at(paths[i]), leaves[i].shape()));
  }
  return mask;
}

bool Optimizer::decays(const std::string& path) const {
  auto it = specs_.find(path);
  if (it == specs_.end())
    fail<ValueError>("optimizer: parameter \"{}\" is not in the parameter specs (which hold {} paths: {})", path,
                     specs_.size(), some_paths(spec_paths(specs_)));
  const auto& no_decay = config_.no_decay;
  return config_.weight_decay > 0 && std::find(no_decay.begin(), no_decay.end(), it->second.kind) == no_decay.end();
}

Tree Optimizer::init(const Tree& params) const {
  std::vector<Array> leaves = params.leaves();
  std::vector<std::string> paths = params.paths();
  for (size_t i = 0; i < leaves.size(); ++i) {
    decays(paths[i]);  // every parameter must have a spec
    if (!is_floating(leaves[i].dtype()))
      fail<ValueError>("optimizer: parameter \"{}\" is {} (expected a floating dtype)", paths[i],
                       type_string(leaves[i]));
  }
  Array step = zeros({}, DType::Int64);
  Tree state;
  if (config_.name == "adamw") {
    state = Tree{{"m", moments_like(params)}, {"v", moments_like(params)}};
  } else if (config_.name == "sgd") {
    state = Tree{{"momentum", moments_like(params)}};
  } else if (config_.name == "lion") {
    state = detail::lion_init(params);
  } else if (config_.name == "adafactor") {
    state = detail::adafactor_init(config_, params);
  } else {
    state = detail::muon_init(params, muon_mask(params));
  }
  state["step"] = step;
  if (scales_loss())
    state["loss_scale"] = Tree{{"scale", full({}, config_.loss_scale.initial(), DType::Float32)},
                               {"good_steps", zeros({}, DType::Int64)}};
  return state;
}

Array Optimizer::loss_scale(const Tree& state) const {
  if (!scales_loss())
    fail<ValueError>("optimizer: loss_scale() without loss scaling (config loss_scale is {})",
                     loss_scaling_name(config_.loss_scale.mode));
  check_state_keys(state, with_step(detail::state_keys(config_.name)), config_.name, true);
  return state.at("loss_scale").at("scale").leaf();
}

Array Optimizer::squared_norm(const Tree& grads, const Tree& state) const {
  if (!scales_loss()) return global_squared_norm(grads);
  // As apply() unscales: multiplied by 1 / scale in each gradient's dtype.
  const Array inverse = divide(scalar_like(1, loss_scale(state)), loss_scale(state));
  return global_squared_norm(grads.map([&](const Array& g) { return multiply(g, astype(inverse, g.dtype())); }));
}

Optimizer::Update Optimizer::apply(const Tree& params, const Tree& grads, const Tree& state, const Array& lr,
                                   const Array& squared_norm) const {
  const bool adamw = config_.name == "adamw";
  const bool scaling = scales_loss();
  check_like_params("grads", params, grads, false);
  check_state_keys(state, with_step(detail::state_keys(config_.name)), config_.name, scaling);
  if (adamw) {
    check_like_params("state m", params, state.at("m"), true);
    check_like_params("state v", params, state.at("v"), true);
  } else if (config_.name == "sgd") {
    check_like_params("state momentum", params, state.at("momentum"), true);
  } else if (config_.name == "lion") {
    detail::lion_check(params, state);
  } else if (config_.name == "adafactor") {
    detail::adafactor_check(config_, params, state);
  } else {
    detail::muon_check(params, state, muon_mask(params));
  }
  if (!lr.valid() || lr.ndim() != 0 || !is_floating(lr.dtype()))
    fail<ValueError>("optimizer: lr is {} (expected a floating scalar)", lr.valid() ? type_string(lr) : "empty");
  std::vector<std::string> paths = params.paths();
  std::vector<bool> decay(paths.size());
  for (size_t i = 0; i < paths.size(); ++i) decay[i] = decays(paths[i]);

  Update out;
  Tree unscaled = grads;
  Array scale;
  if (scaling) {
    // Gradients of the scaled loss: divide by the scale (a power of two for the
    // dynamic scaler, so exactly), in the gradients' dtype.
    scale = state.at("loss_scale").at("scale").leaf();
    const Array inverse = divide(scalar_like(1, scale), scale);
    unscaled = grads.map([&](const Array& g) { return multiply(g, astype(inverse, g.dtype())); });
  }
  Tree g_tree = unscaled;
  // AdamW folds the clip factor into its update (grad_scale, one per gradient dtype);
  // the other rules get clipped gradients.
  std::optional<Array> clip_scale;
  if (config_.clip_norm > 0 && adamw) {
    std::tie(clip_scale, out.grad_norm) = clip_factor(unscaled, config_.clip_norm, squared_norm);
  } else if (config_.clip_norm > 0) {
    std::tie(g_tree, out.grad_norm) = clip_by_global_norm(unscaled, config_.clip_norm, squared_norm);
  } else {
    out.grad_norm = squared_norm.valid() ? astype(sqrt(squared_norm), DType::Float32) : global_norm(unscaled);
  }
  // The step count is 1-based in the update (bias correction): the state holds how
  // many updates were applied before this one.
  Array step = add(state.at("step").leaf(), Array::scalar(1, DType::Int64));
  std::vector<Array> p = params.leaves(), g = g_tree.leaves(), new_p(p.size());

  if (config_.name == "lion" || config_.name == "adafactor" || config_.name == "muon") {
    std::vector<const nn::ParamInfo*> infos;
    for (const std::string& path : paths) infos.push_back(&specs_.at(path));
    const detail::StepInputs in{config_, paths, infos, decay, p, g, lr, step};
    Tree rule_state;
    if (config_.name == "lion") {
      new_p = detail::lion_apply(in, state, rule_state);
    } else if (config_.name == "adafactor") {
      new_p = detail::adafactor_apply(in, state, rule_state);
    } else {
      new_p = detail::muon_apply(in, state, rule_state);
    }
    rule_state["step"] = step;
    out.state = rule_state;
  } else if (adamw) {
    AdamWConfig with_decay{
        .beta1 = config_.beta1, .beta2 = config_.beta2, .eps = config_.eps, .weight_decay = config_.weight_decay};
    AdamWConfig without_decay = with_decay;
    without_decay.weight_decay = 0;
    std::vector<Array> m = state.at("m").leaves(), v = state.at("v").leaves();
    std::map<DType, Array> scale_as;  // the clip factor in each gradient dtype, cast once
    for (size_t i = 0; i < p.size(); ++i) {
      const AdamWConfig& config = decay[i] ? with_decay : without_decay;
      std::vector<Array> r;
      if (clip_scale) {
        auto it = scale_as.find(g[i].dtype());
        if (it == scale_as.end()) it = scale_as.emplace(g[i].dtype(), astype(*clip_scale, g[i].dtype())).first;
        r = adamw_update(p[i], g[i], m[i], v[i], lr, step, it->second, config);
      } else {
        r = adamw_update(p[i], g[i], m[i], v[i], lr, step, config);
      }
      new_p[i] = r[0];
      m[i] = r[1];
      v[i] = r[2];
    }
    out.state = Tree{{"m", state.at("m").with_leaves(m)}, {"v", state.at("v").with_leaves(v)}, {"step", step}};
  } else {
    // buf' = momentum buf + g;  d = buf' (or g + momentum buf' for Nesterov);
    // p' = p - lr (d + wd p) with wd only on decayed leaves. Computed in the moments'
    // dtype (float32 for low-precision parameters), rounded back to the parameter's.
    std::vector<Array> buf = state.at("momentum").leaves();
    for (size_t i = 0; i < p.size(); ++i) {
      DType acc = buf[i].dtype();
      Array gi = astype(g[i], acc), pi = astype(p[i], acc);
      buf[i] = buf[i] * config_.momentum + gi;
      Array d = config_.nesterov ? gi + buf[i] * config_.momentum : buf[i];
      if (decay[i]) d = d + pi * config_.weight_decay;
      new_p[i] = astype(subtract(pi, multiply(astype(lr, acc), d)), p[i].dtype());
    }
    out.state = Tree{{"momentum", state.at("momentum").with_leaves(buf)}, {"step", step}};
  }
  out.params = params.with_leaves(new_p);
  if (scaling) apply_loss_scale(params, state, scale, out);
  return out;
}

// Loss scaling's second half: the norm of the unscaled gradients is finite iff every
// gradient is (a sum of squares past float32's range counts as an overflow too). On a
// non-finite step every updated leaf (params, moments, step) keeps its old value, the
// scale backs off and the good-step count restarts; after growth_interval good steps
// in a row the scale grows (when the grown scale is still finite) and the count restarts.
void Optimizer::apply_loss_scale(const Tree& params, const Tree& state, const Array& scale, Update& out) const {
  const LossScaleConfig& ls = config_.loss_scale;
  const Array finite = is_finite(out.grad_norm);
  out.skipped = logical_not(finite);
  std::vector<Array> old_p = params.leaves(), new_p = out.params.leaves();
  for (size_t i = 0; i < new_p.size(); ++i) new_p[i] = where(finite, new_p[i], old_p[i]);
  out.params = out.params.with_leaves(new_p);
  // The optimizer's own state (moments, step): the same selection, leaf by leaf.
  Tree new_state = out.state;
  for (const auto& [key, subtree] : out.state.items()) {
    std::vector<Array> before = state.at(key).leaves(), after = subtree.leaves();
    for (size_t i = 0; i < after.size(); ++i) after[i] = where(finite, after[i], before[i]);
    new_state[key] = subtree.with_leaves(after);
  }
  const Array good = state.at("loss_scale").at("good_steps").leaf();
  const Array zero = zeros({}, DType::Int64);
  Array new_scale = scale, new_good = where(finite, add(good, Array::scalar(1, DType::Int64)), zero);
  if (ls.mode == LossScaling::Dynamic) {
    const Array grow = logical_and(finite, greater_equal(new_good, Array::scalar(ls.growth_interval, DType::Int64)));
    const Array grown = multiply(scale, scalar_like(ls.growth_factor, scale));
    const Array backed_off = multiply(scale, scalar_like(ls.backoff_factor, scale));
    new_scale = where(finite, where(logical_and(grow, is_finite(grown)), grown, scale), backed_off);
    new_good = where(grow, zero, new_good);
  }
  new_state["loss_scale"] = Tree{{"scale", new_scale}, {"good_steps", new_good}};
  out.state = new_state;
}

}  // namespace tessera::optim
