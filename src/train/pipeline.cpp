// Pipeline-parallel gradients on device threads (see pipeline.h).
#include "tessera/train/pipeline.h"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <ctime>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "spmd/combine_all_reduces.h"
#include "tessera/api/jit.h"
#include "tessera/base/error.h"
#include "tessera/base/thread_pool.h"
#include "tessera/compiler/compile.h"
#include "tessera/core/ops.h"
#include "tessera/core/random.h"
#include "tessera/core/transforms.h"
#include "tessera/nn/logical_sharding.h"
#include "tessera/spmd/api.h"
#include "tessera/spmd/partitioner.h"
#include "tessera/spmd/runtime.h"

namespace tessera::train {
namespace {

using Key = std::pair<int, int>;  // (micro-batch, stage [x devices per stage + index among them])
// What one stage hands the next: the residual stream (or its gradient), and for a
// mixture of experts the routing figures summed over the layers so far (or theirs).
using Handover = std::vector<Array>;

// Hand-overs from one stage's device to the next: a forward's outputs to the next
// stage, a backward's input gradients to the previous one. take() waits; a failing
// device wakes every waiter, which then throws.
class Mailbox {
 public:
  void put(const Key& key, const Handover& value) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      items_[key] = value;
    }
    cv_.notify_all();
  }
  Handover take(const Key& key) {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return failed_ || items_.count(key) > 0; });
    if (failed_)
      fail<Error>("pipeline: another device failed (micro-batch {}, stage {} was waiting)", key.first, key.second);
    Handover value = items_.at(key);
    items_.erase(key);
    return value;
  }
  void abort() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      failed_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<Key, Handover> items_;
  bool failed_ = false;
};

bool has_key(const Tree& tree, const std::string& key) { return tree.is_dict() && tree.items().count(key) > 0; }

std::vector<std::pair<int, int>> stage_ranges(const PipelineOptions& o, int stages, int layers) {
  if (o.stage_layers.empty()) return balance_stages(std::vector<double>(static_cast<size_t>(layers), 1.0), stages);
  if (static_cast<int>(o.stage_layers.size()) != stages)
    fail<ValueError>("pipeline: {} stage ranges for {} stages ({} devices x {} virtual stages)", o.stage_layers.size(),
                     stages, o.devices, o.virtual_stages);
  int next = 0;
  for (size_t s = 0; s < o.stage_layers.size(); ++s) {
    const auto [first, last] = o.stage_layers[s];
    if (first != next || last <= first)
      fail<ValueError>("pipeline: stage {} has layers [{}, {}); expected a non-empty range starting at layer {}", s,
                       first, last, next);
    next = last;
  }
  if (next != layers) fail<ValueError>("pipeline: the stages end at layer {}; the model has {} layers", next, layers);
  return o.stage_layers;
}

// The parameters stage s reads (Model::stage_forward's layout).
Tree stage_params(const Tree& params, const std::pair<int, int>& range, bool first, bool last, bool tied) {
  const std::vector<Tree>& layers = params.at("layers").elements();
  Tree t = Tree::dict();
  t["layers"] = Tree::list(std::vector<Tree>(layers.begin() + range.first, layers.begin() + range.second));
  if (first) {
    t["wte"] = params.at("wte");
    if (has_key(params, "wpe")) t["wpe"] = params.at("wpe");
  }
  if (last) {
    t["lnf"] = params.at("lnf");
    if (tied)
      t["wte"] = params.at("wte");
    else
      t["head"] = params.at("head");
  }
  return t;
}

// A program's first call traces and compiles it: those calls take one lock (shared by
// every executor), so no two compilations run at once; later calls only execute
// concurrently with the other devices'.
std::mutex& compile_mutex() {
  static std::mutex mutex;
  return mutex;
}

// This thread's CPU time (seconds).
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

std::vector<Array> part_keys(const Array& key, int64_t n) {
  return n == 1 ? std::vector<Array>{key} : random::split_keys(key, n);
}

double counted_targets(const Array& targets) {
  return sum(astype(not_equal(targets, scalar_like(-100, targets)), DType::Float64)).item<double>();
}

void add_into_tree(Tree& into, const Tree& add) {
  const std::vector<Array> a = into.leaves(), b = add.leaves();
  if (a.size() != b.size()) fail<Error>("add_into_tree: {} leaves and {}", a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].shape() != b[i].shape() || a[i].dtype() != b[i].dtype())
      fail<Error>("add_into_tree: leaf {} is {} and {}", i, type_string(a[i]), type_string(b[i]));
    add_into(a[i].mutable_raw_data(), b[i].raw_data(), static_cast<size_t>(a[i].size()), a[i].dtype());
  }
}

Tree copy_tree(const Tree& tree) {
  return tree.map([](const Array& g) { return Array::from_data(g.raw_data(), g.shape(), g.dtype()); });
}

bool stage_reads(const std::string& path, const std::pair<int, int>& layers, bool first, bool last, bool tied) {
  const std::string top = path.substr(0, path.find('.'));
  if (top == "layers") {
    const size_t end = path.find('.', 7);
    const int layer = std::stoi(path.substr(7, end == std::string::npos ? std::string::npos : end - 7));
    return layer >= layers.first && layer < layers.second;
  }
  if (top == "wte") return first || (last && tied);
  if (top == "wpe") return first;
  return last;  // lnf, head
}

std::vector<bool> device_reads(const Tree& params, const std::vector<std::pair<int, int>>& stage_layers, int devices,
                               int d, bool tied) {
  const std::vector<std::string> paths = params.paths();
  const int stages = static_cast<int>(stage_layers.size());
  std::vector<bool> reads(paths.size(), false);
  for (size_t i = 0; i < paths.size(); ++i)
    for (int s = d; s < stages && !reads[i]; s += devices)
      reads[i] = stage_reads(paths[i], stage_layers[static_cast<size_t>(s)], s == 0, s == stages - 1, tied);
  return reads;
}

std::vector<double> pipeline_layer_costs(const models::Model& model, int64_t seq) {
  const models::ModelConfig& c = model.config();
  const Tree shapes = model.placeholders();
  std::vector<double> costs;
  // A token runs through top_k of a layer's experts: their active share of the weights.
  const double active = c.moe() ? static_cast<double>(c.moe_top_k) / static_cast<double>(c.moe_experts) : 1.0;
  for (const Tree& layer : shapes.at("layers").elements()) {
    double n = 0;
    const std::vector<std::string> paths = layer.paths();
    const std::vector<Array> leaves = layer.leaves();
    for (size_t i = 0; i < leaves.size(); ++i) {
      const bool expert = paths[i].starts_with("moe.") && !paths[i].starts_with("moe.router");
      n += static_cast<double>(leaves[i].size()) * (expert ? active : 1.0);
    }
    costs.push_back(6 * n + 12.0 * static_cast<double>(seq) * static_cast<double>(c.dim));
  }
  if (!costs.empty()) costs.back() += 6.0 * static_cast<double>(c.dim) * static_cast<double>(c.padded_vocab());
  return costs;
}

PipelineExecutor::PipelineExecutor(const models::Model& model, const PipelineOptions& options, int64_t seq)
    : model_(model),
      options_(options),
      schedule_(make_pipeline_schedule(options.kind, options.devices, options.micro_batches, options.virtual_stages)) {
  const int stages = schedule_.stages();
  stage_layers_ = options.stage_layers.empty() ? balance_stages(pipeline_layer_costs(model, seq), stages)
                                               : stage_ranges(options, stages, static_cast<int>(model.config().layers));
  compiled_.reset(new std::atomic<bool>[2 * static_cast<size_t>(stages)]);
  for (int i = 0; i < 2 * stages; ++i) compiled_[static_cast<size_t>(i)] = false;
  eval_compiled_.reset(new std::atomic<bool>[static_cast<size_t>(stages)]);
  for (int i = 0; i < stages; ++i) eval_compiled_[static_cast<size_t>(i)] = false;
  const spmd::Mesh& mesh = options.mesh;
  if (mesh.ndim() > 0) {
    if (!mesh.has_axis("pipeline") || mesh.axis_size("pipeline") != options.devices)
      fail<ValueError>("pipeline: the mesh {} needs a pipeline axis of the {} pipeline devices", mesh.to_string(),
                       options.devices);
    pipeline_axis_ = mesh.axis_index("pipeline");
    for (int a = 0; a < mesh.ndim(); ++a)
      if (a != pipeline_axis_) inner_axes_.push_back(a);
    inner_size_ = mesh.group_size(inner_axes_);
    if (inner_size_ > 1) layout_.emplace(mesh, options.rules, model.specs());
  }
  const models::Model* m = &model_;
  const bool routed = routed_ = model.config().balances_load();
  for (int s = 0; s < stages; ++s) {
    const int64_t first = stage_layers_[static_cast<size_t>(s)].first;
    const bool embed = s == 0, loss = s == stages - 1;
    // Stage s from its arguments: "x" (and "r", the routing figures of the stages before),
    // "t" on the last stage, "seg"/"pos" when packed, "key" with dropout.
    auto run_stage = [m, first, embed, loss](const Tree& p_tree, const Array& x, const std::optional<Array>& r,
                                             const Tree& args) {
      std::optional<models::Packing> packing;
      if (args.items().count("seg")) packing = models::Packing{args.at("seg").leaf(), args.at("pos").leaf()};
      std::optional<Array> key;
      if (args.items().count("key")) key = args.at("key").leaf();
      return m->stage_forward(p_tree, x, first, embed, loss ? std::optional<Array>(args.at("t").leaf()) : std::nullopt,
                              packing, key, r);
    };
    auto routing_in = [routed, embed](const Tree& args) -> std::optional<Array> {
      if (!routed || embed) return std::nullopt;
      return args.at("r").leaf();
    };
    // The forward's outputs: "y" (and "r") handed to the next stage, or on the last stage
    // the "loss" (and, with a load-balancing term, "ce" without it and the figures "r").
    forward_fn_.push_back(detail::to_jit_fn([run_stage, routing_in, routed, loss](const Tree& args) -> Tree {
      const models::Model::StageOutput o = run_stage(args.at("p"), args.at("x").leaf(), routing_in(args), args);
      Tree out = Tree::dict();
      out[loss ? "loss" : "y"] = Tree(o.out);
      if (routed) out["r"] = Tree(o.routing);
      if (routed && loss) out["ce"] = Tree(o.cross_entropy);
      return out;
    }));
    // The stage's vjp at the gradients of its outputs, "dy" (and "dr" before the last
    // stage): "dp", and past the first stage "dx" (and "dr"); with the output, also "out"
    // (its hand-over or loss: what partial evaluation splits when activations are kept).
    auto stage_vjp = [run_stage, routed, embed, loss](const Tree& args, bool with_output) -> Tree {
      const Tree& p_tree = args.at("p");
      const Array x = args.at("x").leaf();
      const std::vector<Array> p_leaves = p_tree.leaves();
      std::vector<Array> primals = p_leaves;
      const bool routing_primal = routed && !embed;
      if (!embed) primals.push_back(x);  // token ids carry no gradient
      if (routing_primal) primals.push_back(args.at("r").leaf());
      const size_t np = p_leaves.size();
      const ArrayFn stage_fn = [&](const std::vector<Array>& in) -> std::vector<Array> {
        const Tree p_in = p_tree.with_leaves(std::vector<Array>(in.begin(), in.begin() + static_cast<int64_t>(np)));
        const models::Model::StageOutput o =
            run_stage(p_in, embed ? x : in[np], routing_primal ? std::optional<Array>(in[np + 1]) : std::nullopt, args);
        if (loss || !routed) return {o.out};
        return {o.out, o.routing};
      };
      std::vector<Array> cotangents{args.at("dy").leaf()};
      if (routed && !loss) cotangents.push_back(args.at("dr").leaf());
      const std::pair<std::vector<Array>, std::vector<Array>> result = vjp(stage_fn, primals, cotangents);
      const std::vector<Array>& grads = result.second;
      Tree out = Tree::dict();
      out["dp"] = p_tree.with_leaves(std::vector<Array>(grads.begin(), grads.begin() + static_cast<int64_t>(np)));
      if (!embed) out["dx"] = Tree(grads[np]);
      if (routing_primal) out["dr"] = Tree(grads[np + 1]);
      if (with_output) {
        Tree handed = Tree::dict();
        handed[loss ? "loss" : "y"] = Tree(result.first[0]);
        if (routed && !loss) handed["r"] = Tree(result.first[1]);
        out["out"] = handed;
      }
      return out;
    };
    backward_fn_.push_back(detail::to_jit_fn([stage_vjp](const Tree& args) { return stage_vjp(args, false); }));
    keep_fn_.push_back(detail::to_jit_fn([stage_vjp](const Tree& args) { return stage_vjp(args, true); }));
    forward_.push_back(Jitted(forward_fn_.back(), {}));
    backward_.push_back(Jitted(backward_fn_.back(), {}));
    eval_forward_.push_back(Jitted(forward_fn_.back(), {}));
  }
  kept_.resize(static_cast<size_t>(stages));
  kept_compiled_.reset(new std::atomic<bool>[static_cast<size_t>(stages)]);
  for (int i = 0; i < stages; ++i) kept_compiled_[static_cast<size_t>(i)] = false;
}

PipelineExecutor::KeptProgram PipelineExecutor::kept_program(int stage, const Tree& args, const std::vector<int>& inner,
                                                             ShardedProgram* layouts) const {
  KeptProgram k;
  Tree out_structure;
  // Partitioned stages split the per-device program: its forward's collectives go with the
  // forward, its backward's with the backward (all-reduces combined within each part only).
  compiler::Graph g =
      sharded()
          ? partition_stage(stage, keep_fn_[static_cast<size_t>(stage)], args, &out_structure, layouts, false).local
          : trace(keep_fn_[static_cast<size_t>(stage)], args, {}, &out_structure);
  g.name = fmt::format("stage{}", stage);
  const std::vector<std::string> parameters = args.paths(), outputs = out_structure.paths();
  std::vector<bool> unknown, recomputed_from;
  for (const std::string& path : parameters) {
    unknown.push_back(path == "dy" || path == "dr");
    // Partitioned: what the backward reads of the parameters alone (FSDP's all-gathered
    // weights, their casts) it computes again rather than keeping per micro-batch.
    if (sharded()) recomputed_from.push_back(path.starts_with("p."));
  }
  std::vector<size_t> known_outputs, unknown_outputs;
  for (size_t i = 0; i < outputs.size(); ++i)
    (outputs[i].starts_with("out.") ? known_outputs : unknown_outputs).push_back(i);
  k.split = compiler::partial_eval(g, unknown, known_outputs, unknown_outputs, recomputed_from);
  k.split.known.name = fmt::format("stage{}_forward", stage);
  k.split.unknown.name = fmt::format("stage{}_backward", stage);
  if (sharded()) {
    spmd::combine_all_reduces(k.split.known);
    spmd::combine_all_reduces(k.split.unknown);
    k.forward_collectives = per_run_line(spmd::collective_stats(k.split.known));
    k.backward_collectives = per_run_line(spmd::collective_stats(k.split.unknown));
  }
  k.backward_parameters = k.split.unknown_parameters;
  Tree::Dict grads = out_structure.items();
  k.out_structure = grads.at("out");
  grads.erase("out");
  k.grads_structure = Tree::dict(grads);
  k.forward.resize(static_cast<size_t>(inner_size_));
  k.backward.resize(static_cast<size_t>(inner_size_));
  for (int j : inner) {
    std::unique_ptr<compiler::Executable>& forward = k.forward[static_cast<size_t>(j)];
    forward = compiler::compile(k.split.known);
    // The residuals are read once, by this backward: their buffers may hold its outputs,
    // unless the forward returns one by reference (a folded constant, an argument such as
    // a parameter, or a view sharing another value's buffer).
    const std::vector<bool> own = forward->owned_outputs();
    const size_t first = k.split.known.outputs.size() - k.split.residuals;
    std::vector<bool> donated(k.split.unknown.parameters.size(), false);
    for (size_t i = 0; i < k.split.residuals; ++i) donated[i] = own[first + i];
    k.backward[static_cast<size_t>(j)] = compiler::compile(k.split.unknown, {}, donated);
  }
  return k;
}

int PipelineExecutor::compiled_programs() const {
  int n = 0;
  for (int i = 0; i < 2 * schedule_.stages(); ++i) n += compiled_[static_cast<size_t>(i)].load() ? 1 : 0;
  return n;
}

Tree PipelineExecutor::stage_args(const Tree& params, int s) const {
  const int stages = schedule_.stages();
  Tree args = Tree::dict();
  args["p"] = stage_params(params, stage_layers_[static_cast<size_t>(s)], s == 0, s == stages - 1,
                           model_.config().resolved_tied());
  return args;
}

std::vector<Array> PipelineExecutor::handed(const Tree& forward_out, bool last) {
  std::vector<Array> arrays{forward_out.at(last ? "loss" : "y").leaf()};
  if (!last && has_key(forward_out, "r")) arrays.push_back(forward_out.at("r").leaf());
  return arrays;
}

void PipelineExecutor::set_handed(Tree& args, const std::vector<Array>& arrays, bool gradient) {
  args[gradient ? "dy" : "x"] = Tree(arrays.at(0));
  if (arrays.size() > 1) args[gradient ? "dr" : "r"] = Tree(arrays[1]);
}

std::vector<Array> PipelineExecutor::types_of(const std::vector<Array>& arrays) {
  std::vector<Array> types;
  for (const Array& a : arrays) types.push_back(Array::placeholder(a.shape(), a.dtype()));
  return types;
}

Tree PipelineExecutor::trace_args(const Tree& params, int s, const std::vector<Array>& input, const Shape& micro,
                                  bool packed) const {
  Tree args = stage_args(params, s);
  set_handed(args, input, false);
  if (s == schedule_.stages() - 1) args["t"] = Tree(Array::placeholder(micro, DType::Int32));
  if (packed) {
    args["seg"] = Tree(Array::placeholder(micro, DType::Int32));
    args["pos"] = Tree(Array::placeholder(micro, DType::Int32));
  }
  if (model_.config().needs_step_key()) {
    const Array key = nn::param_key(0, "dropout/0");  // a key's shape and dtype
    args["key"] = Tree(Array::placeholder(key.shape(), key.dtype()));
  }
  return args;
}

void PipelineExecutor::compile(const Tree& params, const Shape& tokens_shape, bool packed) {
  const int stages = schedule_.stages();
  const Shape micro = micro_shape(tokens_shape);
  std::vector<Array> input{Array::placeholder(micro, DType::Int32)};  // the stage's: tokens, then the hand-overs
  std::lock_guard<std::mutex> lock(compile_mutex());
  // Stages partitioned over the mesh: the model's activation constraints follow its rules.
  std::optional<nn::LogicalShardingScope> scope;
  if (sharded()) scope.emplace(layout_->mesh(), layout_->rules());
  // The devices whose programs this process compiles, by inner index: every one
  // in-process; with ranks only this process's device, for its own stages.
  const bool remote = !options_.ranks.empty();
  const int here = remote ? local_index() : -1;
  std::vector<int> all(static_cast<size_t>(inner_size_));
  for (int j = 0; j < inner_size_; ++j) all[static_cast<size_t>(j)] = j;
  const std::vector<int> mine =
      remote && sharded() ? std::vector<int>{coordinates(spmd::local_devices().front()).second} : all;
  stage_outputs_.clear();
  sharded_forward_.clear();
  sharded_backward_.clear();
  sharded_eval_.clear();
  traced_text_.assign(2 * static_cast<size_t>(stages), "");
  for (int s = 0; s < stages; ++s) {
    // With processes, another process's stage is only traced (for its output type).
    const bool here_runs = !remote || s % schedule_.devices == here;
    const std::vector<int> inner = here_runs ? mine : std::vector<int>{};
    Tree args = trace_args(params, s, input, micro, packed);
    if (sharded()) {
      sharded_forward_.push_back(partition_program(s, forward_fn_[static_cast<size_t>(s)], args, inner));
      if (model_.config().needs_step_key()) {  // evaluation's forward: no key, no dropout
        Tree::Dict items = args.items();
        items.erase("key");
        sharded_eval_.push_back(partition_program(s, forward_fn_[static_cast<size_t>(s)], Tree::dict(items), inner));
      }
    } else if (here_runs && !keeps()) {
      traced_text_[2 * static_cast<size_t>(s)] = forward_[static_cast<size_t>(s)].lowered(args).text();
    }
    compiled_[2 * static_cast<size_t>(s)] = here_runs;
    // The stage's output type: what the next stage receives and this backward is seeded with
    // (a partitioned program has it from its trace; otherwise the forward is traced for it).
    Tree out;
    if (sharded())
      out = sharded_forward_.back().out_structure;
    else
      (void)trace(forward_fn_[static_cast<size_t>(s)], args, {}, &out);
    const std::vector<Array> output = types_of(handed(out, s == stages - 1));
    stage_outputs_.push_back(output);
    set_handed(args, output, true);
    if (!here_runs) {
      // Another process's stage: nothing of its backward runs or is read here (its forward
      // was traced above for its output's type).
      if (sharded()) sharded_backward_.emplace_back();
    } else if (keeps()) {
      ShardedProgram layouts;  // partitioned: the argument and output layouts
      KeptProgram& k = kept_[static_cast<size_t>(s)];
      k = kept_program(s, args, inner, &layouts);
      if (sharded()) sharded_backward_.push_back(std::move(layouts));
      kept_compiled_[static_cast<size_t>(s)] = true;
      traced_text_[2 * static_cast<size_t>(s)] = k.split.known.text() + (sharded() ? k.forward_collectives + "\n" : "");
      traced_text_[2 * static_cast<size_t>(s) + 1] =
          k.split.unknown.text() + (sharded() ? k.backward_collectives + "\n" : "");
    } else if (sharded()) {
      sharded_backward_.push_back(partition_program(s, backward_fn_[static_cast<size_t>(s)], args, inner));
    } else {
      traced_text_[2 * static_cast<size_t>(s) + 1] = backward_[static_cast<size_t>(s)].lowered(args).text();
    }
    compiled_[2 * static_cast<size_t>(s) + 1] = here_runs;
    input = output;
  }
  compiled_tokens_ = tokens_shape;
  compiled_packed_ = packed;
}

int PipelineExecutor::local_index() const {
  const std::vector<int>& ranks = options_.ranks;
  const std::vector<int> mine = spmd::local_devices();
  const auto it = std::find(ranks.begin(), ranks.end(), mine.empty() ? -1 : mine.front());
  if (static_cast<int>(ranks.size()) != schedule_.devices || it == ranks.end())
    fail<ValueError>("pipeline: ranks [{}] must list the {} pipeline devices, this process's ({}) among them",
                     fmt::join(ranks, ", "), schedule_.devices, mine.empty() ? -1 : mine.front());
  return static_cast<int>(it - ranks.begin());
}

PipelineResult PipelineExecutor::run(const Tree& params, const Array& tokens, const Array& targets, double seed_value,
                                     const std::optional<models::Packing>& packing, const std::optional<Array>& key) {
  std::vector<Array> keys;
  if (key) keys = part_keys(*key, schedule_.micro_batches);
  eval(keys);  // the device threads read them at once
  return execute(params, tokens, targets, seed_value, packing, keys, false);
}

PipelineResult PipelineExecutor::run_with_keys(const Tree& params, const Array& tokens, const Array& targets,
                                               double seed_value, const std::optional<models::Packing>& packing,
                                               const std::vector<Array>& keys) {
  if (!keys.empty() && static_cast<int>(keys.size()) != schedule_.micro_batches)
    fail<ValueError>("pipeline: {} keys for {} micro-batches", keys.size(), schedule_.micro_batches);
  for (const Array& k : keys)
    if (!k.is_evaluated()) fail<ValueError>("pipeline: the micro-batches' keys must be evaluated (eval them first)");
  return execute(params, tokens, targets, seed_value, packing, keys, false);
}

PipelineResult PipelineExecutor::forward_loss(const Tree& params, const Array& tokens, const Array& targets,
                                              const std::optional<models::Packing>& packing) {
  return execute(params, tokens, targets, 1.0, packing, {}, true);
}

PipelineResult PipelineExecutor::execute(const Tree& params, const Array& tokens, const Array& targets,
                                         double seed_value, const std::optional<models::Packing>& packing,
                                         const std::vector<Array>& keys_mb, bool forward_only) {
  if (tokens.ndim() != 2 || targets.shape() != tokens.shape())
    fail<ShapeError>("pipeline: tokens {} and targets {} must both be [batch, seq]", tessera::to_string(tokens.shape()),
                     tessera::to_string(targets.shape()));
  const int64_t batch = tokens.shape(0);
  const int stages = schedule_.stages(), p = schedule_.devices, m = schedule_.micro_batches, inner = inner_size_;
  if (batch % m != 0)
    fail<ValueError>("pipeline: the batch of {} rows does not split into {} equal micro-batches", batch, m);
  PipelineResult result;
  result.schedule = schedule_;
  result.stage_layers = stage_layers_;

  // Processes: this one runs its own pipeline device; hand-overs to and from the others
  // are point-to-point messages, tagged by micro-batch, receiving stage and direction.
  const bool remote = !options_.ranks.empty();
  const int here = remote ? local_index() : -1;
  // Partitioned stages run a thread per mesh device: the runtime must have them (a
  // ValueError naming TESSERA_CPU_DEVICES otherwise).
  if (sharded() && !remote) spmd::check_mesh(options_.mesh);
  // Partitioned stages (and the processes' receive buffers) need the programs compiled first.
  const bool packed = packing.has_value();
  if (packing && (packing->segments.shape() != tokens.shape() || packing->positions.shape() != tokens.shape()))
    fail<ShapeError>("pipeline: packing segments {} and positions {} must have the tokens' shape {}",
                     tessera::to_string(packing->segments.shape()), tessera::to_string(packing->positions.shape()),
                     tessera::to_string(tokens.shape()));
  if ((remote || sharded()) && (compiled_tokens_ != tokens.shape() || compiled_packed_ != packed))
    compile(params, tokens.shape(), packed);

  std::vector<Tree> parts;
  for (int s = 0; s < stages; ++s) parts.push_back(stage_args(params, s).at("p"));
  const int64_t rows = batch / m;
  std::vector<Array> tokens_mb, targets_mb, segments_mb, positions_mb;
  for (int mb = 0; mb < m; ++mb) {
    tokens_mb.push_back(slice_axis(tokens, 0, mb * rows, (mb + 1) * rows).eval());
    targets_mb.push_back(slice_axis(targets, 0, mb * rows, (mb + 1) * rows).eval());
    if (packing) {
      segments_mb.push_back(astype(slice_axis(packing->segments, 0, mb * rows, (mb + 1) * rows), DType::Int32).eval());
      positions_mb.push_back(
          astype(slice_axis(packing->positions, 0, mb * rows, (mb + 1) * rows), DType::Int32).eval());
    }
  }
  const bool keyed = model_.config().needs_step_key();
  if (!forward_only && keyed != !keys_mb.empty())
    fail<ValueError>("pipeline: the model {} dropout or int8 backward GEMMs, so a step key must be {}",
                     keyed ? "has" : "has no", keyed ? "given" : "omitted");
  // Each micro-batch's loss is a sum over its counted targets; the backward pass
  // starts from `seed` (1 / the counted targets for a mean).
  const Array seed = full(Shape{}, seed_value, DType::Float32).eval();

  // A hand-over's arrays go as separate messages (the routing figures after the stream).
  const int arrays = routed_ ? 2 : 1;
  if (remote && int64_t{m} * stages * 2 * arrays > spmd::Communicator::kMaxTag)
    fail<ValueError>("pipeline: {} micro-batches x {} stages need more message tags than the {} there are", m, stages,
                     spmd::Communicator::kMaxTag + 1);
  auto tag = [stages, arrays](int mb, int s, bool forward, int part) {
    return ((mb * stages + s) * 2 + (forward ? 0 : 1)) * arrays + part;
  };
  const int me = remote ? options_.ranks[static_cast<size_t>(here)] : -1;
  std::vector<Array> posted;  // arrays of sends in flight: kept until wait_sends
  auto device_of = [&](int s) { return options_.ranks[static_cast<size_t>(s % p)]; };
  auto receive = [&](int from_stage, int mb, int s, bool forward) {
    Handover received;
    const std::vector<Array>& types = stage_outputs_[static_cast<size_t>(forward ? from_stage : s)];
    for (size_t part = 0; part < types.size(); ++part) {
      const Array& type = types[part];
      // A partitioned stage's device receives its shard of the stream (or its gradient);
      // the routing figures are whole on each of them.
      const Shape shape = sharded() && part == 0 && type.ndim() > 0
                              ? layout_->batch(type.ndim()).local_shape(type.shape())
                              : type.shape();
      Array x = Array::empty(shape, type.dtype());
      spmd::communicator().recv(me, device_of(from_stage), tag(mb, s, forward, static_cast<int>(part)),
                                x.mutable_raw_data(), x.nbytes());
      received.push_back(x);
    }
    return received;
  };
  auto post = [&](int to_stage, int mb, bool forward, const Handover& handover) {
    for (size_t part = 0; part < handover.size(); ++part) {
      const Array& x = handover[part];
      posted.push_back(x);
      spmd::communicator().send(me, device_of(to_stage), tag(mb, to_stage, forward, static_cast<int>(part)),
                                x.raw_data(), x.nbytes());
    }
  };

  // Evaluation of a model with a step key runs its keyless forwards (eval_forward_).
  const bool keyless = forward_only && keyed;
  auto call = [&](std::vector<Jitted>& programs, size_t index, size_t which, const Tree& args) {
    std::atomic<bool>& done = keyless ? eval_compiled_[index] : compiled_[2 * index + which];
    if (done.load()) return programs[index](args);
    std::lock_guard<std::mutex> lock(compile_mutex());
    Tree out = programs[index](args);
    done = true;
    return out;
  };

  // Hand-overs in-process, keyed by (micro-batch, receiving stage x devices per stage +
  // the device's index among them).
  Mailbox activations, gradients;
  std::vector<std::optional<Tree>> accumulated(static_cast<size_t>(stages * inner));
  // Per micro-batch, the last stage's loss; in evaluation with a load-balancing loss its
  // cross-entropy alone and its routing figures (the caller takes the batch's term).
  std::vector<Array> loss_parts(static_cast<size_t>(m)), routing_parts(static_cast<size_t>(m));
  const bool batch_routing = forward_only && routed_;
  result.measured.devices.resize(static_cast<size_t>(p));
  std::vector<double> sent(static_cast<size_t>(p * inner), 0.0);  // per device thread
  std::vector<double> collective(static_cast<size_t>(p * inner), 0.0);
  std::vector<double> cpu(static_cast<size_t>(p), 0.0);  // CPU seconds in ops, per pipeline device
  std::mutex error_mutex;
  std::exception_ptr error;
  const auto start = std::chrono::steady_clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  // Pipeline device d; with partitioned stages the one at index j among the stage's
  // devices, mesh device `dev`. The timeline shows index 0 of each pipeline device.
  auto device = [&](int d, int j, int dev) {
    std::optional<SerialKernelsScope> serial;  // the device threads already share the cores
    if (p > 1 && !sharded()) serial.emplace();
    const size_t slot = static_cast<size_t>(d * inner + j);
    const bool shown = j == 0 || remote;
    std::map<Key, Handover> saved;                // each in-flight micro-batch's stage input
    std::map<Key, std::vector<Array>> residuals;  // ... and without recompute, its kept activations
    // Without recompute: stage s's split programs, traced and compiled on first use.
    auto kept_for = [&](int s, const Tree& forward_args) -> KeptProgram& {
      std::atomic<bool>& done = kept_compiled_[static_cast<size_t>(s)];
      if (!done.load()) {
        std::lock_guard<std::mutex> lock(compile_mutex());
        if (!done.load()) {
          Tree out;
          (void)trace(forward_fn_[static_cast<size_t>(s)], forward_args, {}, &out);
          Tree with_dy = forward_args;
          set_handed(with_dy, types_of(handed(out, s == stages - 1)), true);
          kept_[static_cast<size_t>(s)] = kept_program(s, with_dy, {0});
          compiled_[2 * static_cast<size_t>(s)] = true;
          compiled_[2 * static_cast<size_t>(s) + 1] = true;
          done = true;
        }
      }
      return kept_[static_cast<size_t>(s)];
    };
    std::vector<std::optional<Tree>> local_params(static_cast<size_t>(stages));
    // This device's part of a stage's parameters (its shards when partitioned).
    auto params_for = [&](int s) -> const Tree& {
      const Tree& whole = parts[static_cast<size_t>(s)];
      if (!sharded()) return whole;
      std::optional<Tree>& local = local_params[static_cast<size_t>(s)];
      if (!local) {
        const ShardedProgram& program = sharded_forward_[static_cast<size_t>(s)];
        const std::vector<std::string> paths = whole.paths();
        std::vector<Array> leaves = whole.leaves();
        for (size_t i = 0; i < leaves.size(); ++i)
          leaves[i] = spmd::shard_for_device(leaves[i], program.in.at("p." + paths[i]), dev);
        local = whole.with_leaves(leaves);
      }
      return *local;
    };
    auto rows_of = [&](const Array& x) { return sharded() ? spmd::shard_for_device(x, layout_->batch(2), dev) : x; };
    auto run_program = [&](bool forward, int s, const Tree& args) -> Tree {
      if (!sharded())
        return call(forward ? (keyless ? eval_forward_ : forward_) : backward_, static_cast<size_t>(s), forward ? 0 : 1,
                    args);
      const ShardedProgram& program =
          (forward ? (keyless ? sharded_eval_ : sharded_forward_) : sharded_backward_)[static_cast<size_t>(s)];
      return program.out_structure.with_leaves(program.per_device[static_cast<size_t>(j)]->run(args.leaves()));
    };
    const spmd::CommStats before = sharded() ? spmd::communicator().stats(dev) : spmd::CommStats{};
    try {
      for (const PipelineOp& op : schedule_.ops[static_cast<size_t>(d)]) {
        if (forward_only && !op.forward) continue;  // a schedule's forwards alone keep its order
        const int s = op.stage, mb = op.micro_batch;
        const bool last = s == stages - 1;
        const int here_key = s * inner + j, next_key = (s + 1) * inner + j, previous_key = (s - 1) * inner + j;
        Tree args = Tree::dict();
        args["p"] = params_for(s);
        if (last) args["t"] = Tree(rows_of(targets_mb[static_cast<size_t>(mb)]));
        if (packed) {
          args["seg"] = Tree(rows_of(segments_mb[static_cast<size_t>(mb)]));
          args["pos"] = Tree(rows_of(positions_mb[static_cast<size_t>(mb)]));
        }
        if (!keys_mb.empty())
          args["key"] = Tree(keys_mb[static_cast<size_t>(mb)]);  // whole on every device of the stage
        // A slot starts when its inputs are here: waiting for them is idle time (the bubble).
        double began = 0, cpu_began = 0;
        if (op.forward) {
          const Handover input = s == 0   ? Handover{rows_of(tokens_mb[static_cast<size_t>(mb)])}
                                 : remote ? receive(s - 1, mb, s, true)
                                          : activations.take({mb, here_key});
          began = seconds();
          cpu_began = thread_cpu_seconds();
          if (!forward_only) saved[{mb, s}] = input;
          set_handed(args, input, false);
          Handover output;
          if (keeps() && !forward_only) {
            // The forward returns its hand-over (or loss), then the activations its backward reads.
            KeptProgram& k = kept_for(s, args);
            std::vector<Array> outputs = k.forward[static_cast<size_t>(j)]->run(args.leaves());
            const size_t n = k.out_structure.leaves().size();
            output =
                handed(k.out_structure.with_leaves(std::vector<Array>(outputs.begin(), outputs.begin() + n)), last);
            residuals[{mb, s}] = std::vector<Array>(outputs.begin() + n, outputs.end());
          } else {
            const Tree out = run_program(true, s, args);
            output = handed(out, last);
            if (last && batch_routing && j == 0) {
              output = {out.at("ce").leaf()};
              routing_parts[static_cast<size_t>(mb)] = out.at("r").leaf();
            }
          }
          if (last) {
            if (j == 0) loss_parts[static_cast<size_t>(mb)] = output.front();  // replicated over the stage's devices
          } else {
            for (const Array& a : output) sent[slot] += static_cast<double>(a.nbytes());
            if (remote)
              post(s + 1, mb, true, output);
            else
              activations.put({mb, next_key}, output);
          }
        } else {
          set_handed(args, saved.at({mb, s}), false);
          set_handed(args,
                     last     ? Handover{seed}
                     : remote ? receive(s + 1, mb, s, false)
                              : gradients.take({mb, here_key}),
                     true);
          began = seconds();
          cpu_began = thread_cpu_seconds();
          Tree out;
          if (keeps()) {
            KeptProgram& k = kept_[static_cast<size_t>(s)];
            std::vector<Array> inputs = std::move(residuals.at({mb, s}));
            residuals.erase({mb, s});
            const std::vector<Array> leaves = args.leaves();
            for (size_t i : k.backward_parameters) inputs.push_back(leaves[i]);
            out = k.grads_structure.with_leaves(k.backward[static_cast<size_t>(j)]->run(inputs));
          } else {
            out = run_program(false, s, args);
          }
          saved.erase({mb, s});
          // The stage's gradients summed over micro-batches in place: a private copy of the
          // first, the later ones added into it (the stage holds two gradient trees at most).
          std::optional<Tree>& acc = accumulated[static_cast<size_t>(here_key)];
          if (!acc)
            acc = m > 1 ? copy_tree(out.at("dp")) : out.at("dp");
          else
            add_into_tree(*acc, out.at("dp"));
          if (s > 0) {
            Handover back{out.at("dx").leaf()};
            if (has_key(out, "dr")) back.push_back(out.at("dr").leaf());
            for (const Array& a : back) sent[slot] += static_cast<double>(a.nbytes());
            if (remote)
              post(s - 1, mb, false, back);
            else
              gradients.put({mb, previous_key}, back);
          }
        }
        if (shown) {
          result.measured.devices[static_cast<size_t>(d)].push_back({op, began, seconds()});
          cpu[static_cast<size_t>(d)] += thread_cpu_seconds() - cpu_began;
        }
      }
      if (sharded()) collective[slot] = (spmd::communicator().stats(dev) - before).total_bytes();
    } catch (...) {
      {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
      activations.abort();
      gradients.abort();
      // Partitioned stages run under spmd::run_on_devices, which wakes the devices
      // waiting in the stages' collectives.
      if (sharded()) throw;
    }
  };
  const int j_here = remote && sharded() ? coordinates(me).second : 0;
  try {
    if (remote) {
      auto body = [&](int) {
        device(here, j_here, me);
        if (!error) spmd::communicator().wait_sends(me);
      };
      if (sharded())
        spmd::run_on_devices({me}, body);  // the stage programs' collectives need the device context
      else
        body(me);
    } else if (sharded()) {
      std::vector<int> devices(static_cast<size_t>(options_.mesh.size()));
      for (int dev = 0; dev < options_.mesh.size(); ++dev) devices[static_cast<size_t>(dev)] = dev;
      spmd::run_on_devices(devices, [&](int dev) {
        const auto [c, j] = coordinates(dev);
        device(c, j, dev);
      });
    } else {
      std::vector<std::thread> threads;
      for (int d = 1; d < p; ++d) threads.emplace_back(device, d, 0, d);
      device(0, 0, 0);
      for (std::thread& t : threads) t.join();
    }
  } catch (...) {
    if (!error) throw;
  }
  if (error) std::rethrow_exception(error);

  // The measured timeline: busy time, idle share, micro-batches in flight.
  PipelineTimeline& t = result.measured;
  int ran = 0;  // devices whose ops ran here
  for (size_t d = 0; d < t.devices.size(); ++d) {
    ran += t.devices[d].empty() ? 0 : 1;
    int held = 0, peak = 0;
    for (const auto& slot : t.devices[d]) {
      t.makespan = std::max(t.makespan, slot.end);
      t.busy += slot.end - slot.start;
      held += slot.op.forward ? 1 : -1;
      peak = std::max(peak, held);
    }
    t.peak_in_flight.push_back(peak);
  }
  t.bubble_fraction = t.makespan > 0 ? 1 - t.busy / (ran * t.makespan) : 0;
  for (double bytes : sent) result.sent_bytes += bytes;
  for (double bytes : collective) result.stage_collective_bytes += bytes;
  for (double seconds : cpu) t.cpu_busy += seconds;

  double total = 0;
  for (const Array& part : loss_parts)  // micro-batch order; only the last stage's device has them
    if (part.valid()) total += part.item<double>();
  result.loss = total * seed_value;
  for (const Array& part : routing_parts) {
    if (!part.valid()) continue;
    const std::vector<float> figures = part.to_vector<float>();
    result.routing.resize(figures.size(), 0.0);
    for (size_t i = 0; i < figures.size(); ++i) result.routing[i] += figures[i];
  }

  if (forward_only) return result;

  // Each stage's gradients, whole. Partitioned stages on this process's device contribute
  // zeros unless it is the stage's first device; other processes' stages are missing.
  std::vector<std::optional<Tree>> stage_grads(static_cast<size_t>(stages));
  for (int s = 0; s < stages; ++s) {
    if (!sharded()) {
      stage_grads[static_cast<size_t>(s)] = accumulated[static_cast<size_t>(s)];
      continue;
    }
    if (remote && s % p != here) continue;
    stage_grads[static_cast<size_t>(s)] =
        assemble_stage_grads(s, parts[static_cast<size_t>(s)], accumulated, remote ? j_here : -1);
  }
  result.grads = assemble_grads(params, std::move(stage_grads));
  return result;
}

Tree PipelineExecutor::assemble_grads(const Tree& params, std::vector<std::optional<Tree>> stage_grads) const {
  const int stages = schedule_.stages();
  const bool tied = model_.config().resolved_tied();
  // A stage that ran elsewhere: placeholders (no data) of its parameters' types.
  for (int s = 0; s < stages; ++s)
    if (!stage_grads[static_cast<size_t>(s)])
      stage_grads[static_cast<size_t>(s)] =
          stage_args(params, s).at("p").map([](const Array& a) { return Array::placeholder(a.shape(), a.dtype()); });
  Tree grads = Tree::dict();
  std::vector<Tree> layer_grads;
  for (int s = 0; s < stages; ++s)
    for (const Tree& layer : stage_grads[static_cast<size_t>(s)]->at("layers").elements()) layer_grads.push_back(layer);
  grads["layers"] = Tree::list(std::move(layer_grads));
  const Tree& first = *stage_grads.front();
  const Tree& last = *stage_grads.back();
  grads["wte"] = first.at("wte");
  if (has_key(first, "wpe")) grads["wpe"] = first.at("wpe");
  grads["lnf"] = last.at("lnf");
  if (tied && stages > 1) {
    // The tied embedding's two parts; with processes, the one of a stage that ran here.
    const Array& a = first.at("wte").leaf();
    const Array& b = last.at("wte").leaf();
    // (A placeholder has no data; this device's gradient shards are sharded arrays.)
    auto here = [](const Array& g) { return g.is_evaluated() || spmd::sharding_of(g) != nullptr; };
    const bool a_here = here(a), b_here = here(b);
    grads["wte"] = Tree(a_here && b_here ? add(a, b).eval() : a_here ? a : b);
  } else if (!tied) {
    grads["head"] = last.at("head");
  }
  if (!grads.same_structure(params))
    fail<Error>("pipeline: the stages' gradients do not cover the parameters (an unexpected parameter name?)");
  return grads;
}

PipelineResult pipeline_value_and_grad(const models::Model& model, const Tree& params, const Array& tokens,
                                       const Array& targets, const PipelineOptions& o) {
  if (tokens.ndim() != 2 || targets.shape() != tokens.shape())
    fail<ShapeError>("pipeline: tokens {} and targets {} must both be [batch, seq]", tessera::to_string(tokens.shape()),
                     tessera::to_string(targets.shape()));
  if (o.micro_batches < 1 || tokens.shape(0) % o.micro_batches != 0)
    fail<ValueError>("pipeline: the batch of {} rows does not split into {} equal micro-batches", tokens.shape(0),
                     o.micro_batches);
  // The loss is a mean over the targets that count.
  const double counted = counted_targets(targets);
  if (!(counted > 0)) fail<ValueError>("pipeline: every target is -100 (ignored): the loss has no terms");
  PipelineExecutor executor(model, o, tokens.shape(1));
  return executor.run(params, tokens, targets, 1.0 / counted);
}

}  // namespace tessera::train
