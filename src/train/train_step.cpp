#include "tessera/train/train_step.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "tessera/base/error.h"
#include "tessera/core/ops.h"
#include "tessera/core/random.h"
#include "tessera/core/transforms.h"
#include "tessera/nn/logical_sharding.h"

namespace tessera::train {

namespace {

std::optional<Array> key_of(const Tree& args) {
  if (args.items().contains("key")) return args.at("key").leaf();
  return std::nullopt;
}

// The compilation cache index's identity of the step's programs: everything they trace
// from besides their arguments' types (JitOptions::cache_identity). Every field of the
// model and optimizer configs that can change between runs of one binary must be here
// (a new field changes the binary, whose build identity the index key also holds).
std::string model_identity(const models::ModelConfig& c) {
  return fmt::format(
      "model family={} vocab={} vocab_pad_to={} dim={} layers={} heads={} kv_heads={} mlp_dim={} context={} "
      "dropout={} norm_eps={} rope_theta={} rope_scaling={} rope_factor={} rope_low={} rope_high={} rope_context={} "
      "tied={} init_std={} compute_dtype={} quant_targets={} quant_backward={} remat={} moe_experts={} moe_top_k={} "
      "moe_capacity_factor={} moe_aux_loss_coef={} moe_groups={}",
      c.family, c.vocab, c.vocab_pad_to, c.dim, c.layers, c.heads, c.kv_heads, c.mlp_dim, c.context, c.dropout,
      c.norm_eps, c.rope_theta, c.rope_scaling, c.rope_factor, c.rope_low_freq_factor, c.rope_high_freq_factor,
      c.rope_original_context, c.tied_embeddings ? int(*c.tied_embeddings) : -1, c.init_std, c.compute_dtype,
      fmt::join(c.quant_targets, ","), c.quant_backward, c.remat, c.moe_experts, c.moe_top_k, c.moe_capacity_factor,
      c.moe_aux_loss_coef, c.moe_groups);
}

std::string step_identity(const models::Model& model, const optim::Optimizer& optimizer, int64_t micro_batches,
                          const Layout& layout, const Tree& params) {
  const optim::OptimizerConfig& o = optimizer.config();
  const optim::LossScaleConfig& ls = o.loss_scale;
  std::string decay;  // the weight-decay mask (the optimizer's specs)
  for (const std::string& path : params.paths()) decay += optimizer.decays(path) ? '1' : '0';
  return fmt::format(
      "{}\noptimizer name={} beta1={} beta2={} eps={} weight_decay={} momentum={} nesterov={} clip_norm={} "
      "decay={} loss_scale mode={} static={} init={} growth_interval={} growth={} backoff={}\n"
      "micro_batches={} layout={}",
      model_identity(model.config()), o.name, o.beta1, o.beta2, o.eps, o.weight_decay, o.momentum, o.nesterov,
      o.clip_norm, decay, optim::loss_scaling_name(ls.mode), ls.static_scale, ls.init_scale, ls.growth_interval,
      ls.growth_factor, ls.backoff_factor, micro_batches, layout.describe());
}

// `outputs`: a tree shaped like the program's result (its leaves' layouts are pinned
// on a mesh of several devices). `identity`: JitOptions::cache_identity.
JitOptions jit_options(std::vector<int> donate, std::string name, const Layout& layout, const Tree& outputs,
                       const std::string& device, std::string identity) {
  JitOptions options;
  options.cache_identity = std::move(identity);
  options.device = device;
  options.donate_leaves = std::move(donate);
  options.name = std::move(name);
  options.out_shardings = layout.shardings_for(outputs);
  return options;
}

Array scalar_like() { return Array::placeholder({}, DType::Float32); }

// The layout's rules for activations' logical axes (nn/logical_sharding.h: a mixture of
// experts' dispatch) while the programs are traced; nothing on one device.
struct ActivationLayout {
  explicit ActivationLayout(const Layout& layout) {
    if (!layout.splits_nothing()) scope.emplace(layout.mesh(), layout.rules());
  }
  std::optional<nn::LogicalShardingScope> scope;
};

// tokens, targets and, for packed documents, segments and positions (data::Batch).
Tree batch_args(const data::Batch& batch, const std::optional<Array>& key) {
  Tree args{{"tokens", batch.tokens}, {"targets", batch.targets}};
  if (batch.segments.has_value() != batch.positions.has_value())
    fail<ValueError>("TrainStep: a batch has {} but no {} (packed documents need both)",
                     batch.segments ? "segments" : "positions", batch.segments ? "positions" : "segments");
  if (batch.segments) {
    args["segments"] = *batch.segments;
    args["positions"] = *batch.positions;
  }
  if (key) args["key"] = *key;
  return args;
}

std::optional<models::Packing> packing_of(const Tree& args) {
  if (!args.items().contains("segments")) return std::nullopt;
  return models::Packing{args.at("segments").leaf(), args.at("positions").leaf()};
}

// The loss and its gradients for the parameters. With loss scaling the backward pass
// starts from `scale` instead of 1: the gradients of loss * scale, while the value
// returned is the unscaled loss.
std::pair<Array, Tree> loss_and_grads(const models::Model& model, const optim::Optimizer& optimizer, const Tree& a,
                                      const std::optional<Array>& scale) {
  const std::optional<Array> key = key_of(a);
  const std::optional<models::Packing> packing = packing_of(a);
  auto loss_of = [&](const Tree& p) {
    return model.loss(p, a.at("tokens").leaf(), a.at("targets").leaf(), key, packing);
  };
  const Tree& params = a.at("params");
  if (!optimizer.scales_loss()) return value_and_grad(loss_of)(params);
  auto [outputs, grads] =
      vjp([&](const std::vector<Array>& leaves) { return std::vector<Array>{loss_of(params.with_leaves(leaves))}; },
          params.leaves(), {astype(*scale, DType::Float32)});
  return {outputs[0], params.with_leaves(grads)};
}

// One of the step's programs: the traced function, a tree shaped like its result, the
// argument leaves it may overwrite, its name. TrainStep jits it; trace_programs only
// traces it (the planner).
struct ProgramDef {
  JitFn fn;
  Tree outputs;
  std::vector<int> donate;
  std::string name;
};

ProgramDef fused_def(const models::Model& model, const optim::Optimizer& optimizer, const Tree& args) {
  auto step = [&model, &optimizer](const Tree& a) -> Tree {
    std::optional<Array> scale;
    if (optimizer.scales_loss()) scale = optimizer.loss_scale(a.at("opt"));
    auto [loss, grads] = loss_and_grads(model, optimizer, a, scale);
    optim::Optimizer::Update update = optimizer.apply(a.at("params"), grads, a.at("opt"), a.at("lr").leaf());
    Tree out{{"params", update.params}, {"opt", update.state}, {"loss", loss}, {"grad_norm", update.grad_norm}};
    if (update.skipped.valid()) out["skipped"] = update.skipped;
    return out;
  };
  Tree outputs{
      {"params", args.at("params")}, {"opt", args.at("opt")}, {"loss", scalar_like()}, {"grad_norm", scalar_like()}};
  if (optimizer.scales_loss()) outputs["skipped"] = Array::placeholder({}, DType::Bool);
  return {detail::to_jit_fn(step), outputs, leaves_under(args, {"params", "opt"}), "train_step"};
}

ProgramDef grad_def(const models::Model& model, const optim::Optimizer& optimizer, bool first, const Tree& args) {
  auto grad_step = [&model, &optimizer, first](const Tree& a) -> Tree {
    std::optional<Array> scale;
    if (optimizer.scales_loss()) scale = a.at("scale").leaf();
    auto [loss, grads] = loss_and_grads(model, optimizer, a, scale);
    if (!first) {
      std::vector<Array> sum = a.at("grads").leaves(), g = grads.leaves();
      for (size_t j = 0; j < sum.size(); ++j) sum[j] = sum[j] + g[j];
      grads = grads.with_leaves(sum);
    }
    return Tree{{"grads", grads}, {"loss", loss}};
  };
  Tree outputs{{"grads", args.at("params")}, {"loss", scalar_like()}};
  return {detail::to_jit_fn(grad_step), outputs, first ? std::vector<int>{} : leaves_under(args, {"grads"}),
          first ? "grad_first" : "grad_accumulate"};
}

ProgramDef update_def(const optim::Optimizer& optimizer, int64_t micro_batches, const Tree& args) {
  const double scale = 1.0 / static_cast<double>(micro_batches);
  auto update_step = [&optimizer, scale](const Tree& a) -> Tree {
    Tree mean = a.at("grads").map([scale](const Array& g) { return g * scale; });
    optim::Optimizer::Update update = optimizer.apply(a.at("params"), mean, a.at("opt"), a.at("lr").leaf());
    Tree out{{"params", update.params}, {"opt", update.state}, {"grad_norm", update.grad_norm}};
    if (update.skipped.valid()) out["skipped"] = update.skipped;
    return out;
  };
  Tree outputs{{"params", args.at("params")}, {"opt", args.at("opt")}, {"grad_norm", scalar_like()}};
  if (optimizer.scales_loss()) outputs["skipped"] = Array::placeholder({}, DType::Bool);
  return {detail::to_jit_fn(update_step), outputs, leaves_under(args, {"params", "opt", "grads"}), "update"};
}

// The arguments of each program, as compile() and trace_programs() build them.
struct StepArgs {
  std::optional<Tree> fused, grad_first, grad_add, update;
};

}  // namespace

std::vector<int> leaves_under(const Tree& args, const std::vector<std::string>& prefixes) {
  std::vector<int> indices;
  const std::vector<std::string> paths = args.paths();
  for (size_t i = 0; i < paths.size(); ++i)
    for (const std::string& prefix : prefixes)
      if (paths[i].starts_with(prefix + ".") || paths[i] == prefix) indices.push_back(static_cast<int>(i));
  return indices;
}

TrainStep::TrainStep(const models::Model& model, const optim::Optimizer& optimizer, int64_t micro_batches,
                     const Layout* layout, std::string device)
    : model_(model),
      optimizer_(optimizer),
      micro_batches_(micro_batches),
      layout_(layout != nullptr ? *layout : Layout::one_device(model.specs())),
      device_(std::move(device)) {
  if (micro_batches < 1) fail<ValueError>("TrainStep: micro_batches must be >= 1 (got {})", micro_batches);
}

Jitted& TrainStep::fused_program(const Tree& args) {
  if (!fused_) {
    ProgramDef def = fused_def(model_, optimizer_, args);
    fused_.emplace(
        jit(def.fn, jit_options(def.donate, def.name, layout_, def.outputs, device_,
                                step_identity(model_, optimizer_, micro_batches_, layout_, args.at("params")))));
    const Lowered lowered = fused_->lowered(args);
    compiled_flops_ = lowered.executable().stats().flops;
    executables_.push_back(lowered.executable_ptr());
    if (lowered.spmd_ptr()) spmd_.push_back(lowered.spmd_ptr());
  }
  return *fused_;
}

std::map<std::string, double> TrainStep::flops_by_op() const {
  std::map<std::string, double> out;
  for (const auto& exe : executables_)
    for (const auto& [op, flops] : exe->stats().flops_by_op) out[op] += flops;
  return out;
}

Jitted& TrainStep::grad_program(bool first, const Tree& args) {
  std::optional<Jitted>& program = first ? grad_first_ : grad_add_;
  if (!program) {
    ProgramDef def = grad_def(model_, optimizer_, first, args);
    program.emplace(
        jit(def.fn, jit_options(def.donate, def.name, layout_, def.outputs, device_,
                                step_identity(model_, optimizer_, micro_batches_, layout_, args.at("params")))));
    const Lowered lowered = program->lowered(args);
    compiled_flops_ += lowered.executable().stats().flops * (first ? 1.0 : micro_batches_ - 1.0);
    executables_.push_back(lowered.executable_ptr());
    if (lowered.spmd_ptr()) spmd_.push_back(lowered.spmd_ptr());
  }
  return *program;
}

Jitted& TrainStep::update_program(const Tree& args) {
  if (!update_) {
    ProgramDef def = update_def(optimizer_, micro_batches_, args);
    update_.emplace(
        jit(def.fn, jit_options(def.donate, def.name, layout_, def.outputs, device_,
                                step_identity(model_, optimizer_, micro_batches_, layout_, args.at("params")))));
    const Lowered lowered = update_->lowered(args);
    compiled_flops_ += lowered.executable().stats().flops;
    executables_.push_back(lowered.executable_ptr());
    if (lowered.spmd_ptr()) spmd_.push_back(lowered.spmd_ptr());
  }
  return *update_;
}

namespace {

StepArgs step_args(const optim::Optimizer& optimizer, int64_t micro_batches, const Tree& params, const Tree& opt_state,
                   const data::Batch& micro_batch, const std::optional<Array>& dropout_key) {
  const Array lr = Array::scalar(0, DType::Float32);
  StepArgs out;
  if (micro_batches == 1) {
    Tree args = batch_args(micro_batch, dropout_key);
    args["params"] = params;
    args["opt"] = opt_state;
    args["lr"] = lr;
    out.fused = args;
    return out;
  }
  // Gradients have the parameters' structure and types, so params stand in for them.
  std::optional<Array> key;
  if (dropout_key)
    key = dropout_key->is_evaluated() ? std::optional(random::split_keys(*dropout_key, 2)[0])
                                      : std::optional(Array::placeholder(dropout_key->shape(), dropout_key->dtype()));
  Tree args = batch_args(micro_batch, key);
  args["params"] = params;
  if (optimizer.scales_loss()) args["scale"] = optimizer.loss_scale(opt_state);
  out.grad_first = args;
  args["grads"] = params;
  out.grad_add = args;
  out.update = Tree{{"params", params}, {"opt", opt_state}, {"grads", params}, {"lr", lr}};
  return out;
}

}  // namespace

void TrainStep::compile(const Tree& params, const Tree& opt_state, const data::Batch& micro_batch,
                        const std::optional<Array>& dropout_key) {
  check_packing(micro_batch);
  const ActivationLayout activations(layout_);
  const StepArgs args = step_args(optimizer_, micro_batches_, params, opt_state, micro_batch, dropout_key);
  if (args.fused) {
    fused_program(*args.fused);
    return;
  }
  grad_program(/*first=*/true, *args.grad_first);
  grad_program(/*first=*/false, *args.grad_add);
  update_program(*args.update);
}

std::vector<TracedProgram> TrainStep::trace_programs(const Tree& params, const Tree& opt_state,
                                                     const data::Batch& micro_batch,
                                                     const std::optional<Array>& dropout_key) const {
  const ActivationLayout activations(layout_);
  const StepArgs args = step_args(optimizer_, micro_batches_, params, opt_state, micro_batch, dropout_key);
  std::vector<TracedProgram> out;
  auto add = [&](const ProgramDef& def, const Tree& a, double runs) {
    TracedProgram p;
    p.name = def.name;
    p.graph = trace(def.fn, a);
    p.graph.name = def.name;
    p.parameter_names = a.paths();
    if (!layout_.splits_nothing()) {
      p.parameter_shardings = layout_.shardings_for(a);
      p.output_shardings = layout_.shardings_for(def.outputs);
      p.output_shardings.resize(p.graph.outputs.size());
    }
    p.donated.assign(a.leaves().size(), false);
    for (int d : def.donate) p.donated[static_cast<size_t>(d)] = true;
    p.runs_per_step = runs;
    out.push_back(std::move(p));
  };
  if (args.fused) {
    add(fused_def(model_, optimizer_, *args.fused), *args.fused, 1);
    return out;
  }
  add(grad_def(model_, optimizer_, true, *args.grad_first), *args.grad_first, 1);
  add(grad_def(model_, optimizer_, false, *args.grad_add), *args.grad_add, static_cast<double>(micro_batches_ - 1));
  add(update_def(optimizer_, micro_batches_, *args.update), *args.update, 1);
  return out;
}

StepStats TrainStep::run(Tree& params, Tree& opt_state, const std::vector<data::Batch>& micro, double lr,
                         const std::optional<Array>& dropout_key) {
  if (static_cast<int64_t>(micro.size()) != micro_batches_)
    fail<ValueError>("TrainStep::run: {} micro-batches given, {} expected", micro.size(), micro_batches_);
  const ActivationLayout activations(layout_);
  const bool needs_key = model_.config().needs_step_key();
  if (needs_key != dropout_key.has_value())
    fail<ValueError>("TrainStep::run: the model {} dropout or int8 backward GEMMs, so a step key must be {}",
                     needs_key ? "has" : "has no", needs_key ? "given" : "omitted");
  const Array lr_array = Array::scalar(lr, DType::Float32);
  for (const data::Batch& batch : micro) check_packing(batch);

  if (micro_batches_ == 1) {
    Tree args = batch_args(micro[0], dropout_key);
    args["params"] = params;
    args["opt"] = opt_state;
    args["lr"] = lr_array;
    Tree out = fused_program(args)(args);
    params = out.at("params");
    opt_state = out.at("opt");
    return stats_of(out, out.at("loss").leaf().item<double>());
  }

  // Accumulation: grads summed over micro-batches in order, then one update with the mean.
  std::vector<Array> keys;
  if (dropout_key) keys = random::split_keys(*dropout_key, micro_batches_);
  double loss_sum = 0;
  for (int64_t i = 0; i < micro_batches_; ++i) {
    const auto index = static_cast<size_t>(i);
    Tree args = batch_args(micro[index], dropout_key ? std::optional(keys[index]) : std::nullopt);
    args["params"] = params;
    if (optimizer_.scales_loss()) args["scale"] = optimizer_.loss_scale(opt_state);
    if (i > 0) args["grads"] = grad_sum_;
    Tree out = grad_program(i == 0, args)(args);
    grad_sum_ = out.at("grads");
    loss_sum += out.at("loss").leaf().item<double>();
  }
  Tree args{{"params", params}, {"opt", opt_state}, {"grads", grad_sum_}, {"lr", lr_array}};
  Tree out = update_program(args)(args);
  grad_sum_ = Tree();
  params = out.at("params");
  opt_state = out.at("opt");
  return stats_of(out, loss_sum / static_cast<double>(micro_batches_));
}

void TrainStep::check_packing(const data::Batch& batch) {
  const bool packed = batch.segments.has_value();
  if (!packed_) packed_ = packed;
  if (*packed_ != packed)
    fail<ValueError>(
        "TrainStep: a batch {} segment ids, but the step was compiled for batches {} (packed and plain batches need "
        "separate TrainSteps)",
        packed ? "has" : "has no", *packed_ ? "with them" : "without");
}

StepStats TrainStep::stats_of(const Tree& out, double loss) const {
  StepStats stats{.loss = loss, .grad_norm = out.at("grad_norm").leaf().item<double>()};
  if (optimizer_.scales_loss()) {
    stats.skipped = out.at("skipped").leaf().item<double>() != 0;
    stats.loss_scale = out.at("opt").at("loss_scale").at("scale").leaf().item<double>();
  }
  return stats;
}

std::string TrainStep::profile_text() const {
  std::string text;
  for (const auto* program : {&fused_, &grad_first_, &grad_add_, &update_})
    if (*program) text += (*program)->profile_text();
  return text;
}

int TrainStep::trace_count() const {
  int count = 0;
  for (const auto* program : {&fused_, &grad_first_, &grad_add_, &update_})
    if (*program) count += (*program)->trace_count();
  return count;
}

size_t TrainStep::peak_bytes() const {
  size_t peak = 0;
  for (const auto& e : executables_) peak = std::max(peak, e->stats().peak_bytes);
  return peak;
}

size_t TrainStep::offloaded_bytes() const {
  size_t bytes = 0;
  for (const auto& e : executables_) bytes += e->stats().offloaded_bytes;
  return bytes;
}

size_t TrainStep::host_bytes() const {
  size_t bytes = 0;
  for (const auto& e : executables_) bytes += e->stats().host_bytes;
  return bytes;
}

namespace {
Jitted eval_program(const models::Model& model, const std::string& device) {
  return jit(
      [&model](const Tree& a) -> Tree {
        return Tree(
            model.loss(a.at("params"), a.at("tokens").leaf(), a.at("targets").leaf(), std::nullopt, packing_of(a)));
      },
      jit_options({}, "eval", Layout::one_device(model.specs()), Tree(), device, model_identity(model.config())));
}
}  // namespace

Evaluator::Evaluator(const models::Model& model, const Layout* layout, const std::string& device)
    : forward_(eval_program(model, device)),
      packed_forward_(eval_program(model, device)),
      layout_(layout != nullptr ? *layout : Layout::one_device(model.specs())) {}

double Evaluator::operator()(const Tree& params, data::DataLoader& loader, int64_t batches) {
  if (batches < 1) fail<ValueError>("evaluate: batches must be >= 1 (got {})", batches);
  loader.set_position({});
  const ActivationLayout activations(layout_);
  double total = 0;
  const int64_t n = std::min<int64_t>(batches, static_cast<int64_t>(loader.batches_per_epoch()));
  for (int64_t i = 0; i < n; ++i) {
    data::Batch batch = layout_.next_batch(loader, loader.batch_size());
    Tree args = batch_args(batch, std::nullopt);
    args["params"] = params;
    total += (batch.segments ? packed_forward_ : forward_)(args).leaf().item<double>();
  }
  return total / static_cast<double>(n);
}

double evaluate(const models::Model& model, const Tree& params, data::DataLoader& loader, int64_t batches) {
  return Evaluator(model)(params, loader, batches);
}

}  // namespace tessera::train
