// The training step over pipeline replicas (see pipeline_step.h).
#include "tessera/train/pipeline_step.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <exception>
#include <thread>

#include "tessera/base/error.h"
#include "tessera/core/ops.h"
#include "tessera/spmd/api.h"
#include "tessera/spmd/runtime.h"

namespace tessera::train {

PipelineTrainStep::PipelineTrainStep(const models::Model& model, const optim::Optimizer& optimizer,
                                     int64_t accumulation, const PipelineOptions& pipeline, int replicas, int64_t seq,
                                     const spmd::Mesh* mesh)
    : model_(model), optimizer_(optimizer), accumulation_(accumulation), replicas_(replicas), mesh_(pipeline.mesh) {
  if (accumulation < 1) fail<ValueError>("pipeline step: {} accumulation micro-batches; expected >= 1", accumulation);
  if (replicas < 1) fail<ValueError>("pipeline step: {} data-parallel replicas; expected >= 1", replicas);
  if (spmd::is_multi_process()) {
    if (mesh == nullptr || mesh->size() != spmd::device_count() || !mesh->has_axis("pipeline"))
      fail<ValueError>("pipeline step: {} processes need a mesh of {} devices with a pipeline axis (got {})",
                       spmd::device_count(), spmd::device_count(), mesh ? mesh->to_string() : "none");
    const int me = spmd::local_devices().front();
    world_mesh_ = *mesh;
    PipelineOptions o = pipeline;
    o.ranks = mesh->group(me, {mesh->axis_index("pipeline")});
    multi_process_ = true;
    shard_state_ = shards_state(pipeline, optimizer.config().name);
    spmd_update_ = shard_state_ && updates_whole_matrices(optimizer.config().name);
    o.gradient_shards = shard_state_;
    // With the stages partitioned over the mesh the data axis is inside them (one replica).
    replica_here_ = replicas > 1 ? mesh->coords(me)[static_cast<size_t>(mesh->axis_index("data"))] : 0;
    executors_.emplace_back(model, o, seq);
    return;
  }
  for (int r = 0; r < replicas; ++r) executors_.emplace_back(model, pipeline, seq);
}

bool PipelineTrainStep::shards_state(const PipelineOptions& pipeline, const std::string& optimizer) {
  bool partitioned = false;
  for (int a = 0; a < pipeline.mesh.ndim(); ++a)
    partitioned = partitioned || (pipeline.mesh.axis_name(a) != "pipeline" && pipeline.mesh.axis_size(a) > 1);
  (void)optimizer;
  return partitioned;
}

bool PipelineTrainStep::updates_whole_matrices(const std::string& optimizer) {
  return optimizer == "adafactor" || optimizer == "muon";
}

data::Batch PipelineTrainStep::rows_of(const data::Batch& batch, int replica) const {
  if (batch.segments.has_value() != batch.positions.has_value())
    fail<ValueError>("pipeline step: a batch has {} but no {} (packed documents need both)",
                     batch.segments ? "segments" : "positions", batch.segments ? "positions" : "segments");
  const int64_t rows = batch.tokens.shape(0), r = replicas_;
  if (rows % r != 0)
    fail<ValueError>("pipeline step: a micro-batch of {} sequences does not split over {} data-parallel replicas", rows,
                     r);
  const int64_t n = rows / r;
  auto mine = [&](const Array& a) { return slice_axis(a, 0, replica * n, (replica + 1) * n).eval(); };
  data::Batch out{mine(batch.tokens), mine(batch.targets)};
  if (batch.segments) {
    out.segments = mine(*batch.segments);
    out.positions = mine(*batch.positions);
  }
  return out;
}

std::optional<models::Packing> PipelineTrainStep::packing_of(const data::Batch& rows) {
  if (!rows.segments) return std::nullopt;
  return models::Packing{*rows.segments, *rows.positions};
}

Jitted& PipelineTrainStep::update_program(const Tree& args) {
  if (!update_) {
    // Several processes divide the summed gradients before taking their norm: the update
    // gets the mean.
    const double scale = multi_process_ ? 1.0 : 1.0 / static_cast<double>(accumulation_);
    const optim::Optimizer* optimizer = &optimizer_;
    auto update = [optimizer, scale](const Tree& a) -> Tree {
      // The parts in their fixed order: replicas within accumulation steps.
      const std::vector<Tree>& parts = a.at("grads").elements();
      std::vector<Array> total = parts.front().leaves();
      for (size_t i = 1; i < parts.size(); ++i) {
        const std::vector<Array> g = parts[i].leaves();
        for (size_t j = 0; j < total.size(); ++j) total[j] = total[j] + g[j];
      }
      if (scale != 1.0)
        for (Array& g : total) g = g * scale;
      const Tree mean = a.at("params").with_leaves(total);
      // With loss scaling the gradients are the scaled loss's: apply() unscales them and
      // skips the update when one is not finite. Stage-local parts take the whole model's
      // squared gradient norm.
      const Array squared = a.items().count("squared_norm") ? a.at("squared_norm").leaf() : Array();
      optim::Optimizer::Update u = optimizer->apply(a.at("params"), mean, a.at("opt"), a.at("lr").leaf(), squared);
      Tree out{{"params", u.params}, {"opt", u.state}, {"grad_norm", u.grad_norm}};
      if (u.skipped.valid()) out["skipped"] = u.skipped;
      return out;
    };
    JitOptions options;
    options.name = "pipeline_update";
    options.donate_leaves = leaves_under(args, {"params", "opt", "grads"});
    if (spmd_update_) {
      // The SPMD update keeps every parameter and state leaf in the layout it came in.
      Tree like{{"params", args.at("params")}, {"opt", args.at("opt")}, {"grad_norm", Array::scalar(0.0)}};
      if (optimizer_.scales_loss()) like["skipped"] = Array::scalar(0.0);
      for (const Array& leaf : like.leaves()) {
        const spmd::Sharding* s = spmd::sharding_of(leaf);
        options.out_shardings.push_back(s ? std::optional<spmd::Sharding>(*s) : std::nullopt);
      }
    }
    update_.emplace(jit(update, options));
  }
  return *update_;
}

double PipelineTrainStep::loss_scale_of(const Tree& opt_state) const {
  return optimizer_.scales_loss() ? optimizer_.loss_scale(opt_state).item<double>() : 1.0;
}

StepStats PipelineTrainStep::apply_update(Tree& params, Tree& opt_state, std::vector<Tree> parts, double lr,
                                          double loss_sum, const Array& squared_norm) {
  Tree args{{"params", params},
            {"opt", opt_state},
            {"grads", Tree::list(std::move(parts))},
            {"lr", Array::scalar(lr, DType::Float32)}};
  if (squared_norm.valid()) args["squared_norm"] = squared_norm;
  Tree out = update_program(args)(args);
  params = out.at("params");
  opt_state = out.at("opt");
  StepStats stats{.loss = loss_sum / static_cast<double>(accumulation_),
                  .grad_norm = out.at("grad_norm").leaf().item<double>()};
  if (optimizer_.scales_loss()) {
    stats.skipped = out.at("skipped").leaf().item<double>() != 0;
    stats.loss_scale = optimizer_.loss_scale(opt_state).item<double>();
  }
  return stats;
}

void PipelineTrainStep::compile(const Tree& params, const Tree& opt_state, const data::Batch& micro_batch) {
  const data::Batch rows = rows_of(micro_batch, 0);
  for (PipelineExecutor& executor : executors_)
    executor.compile(params, rows.tokens.shape(), rows.segments.has_value());
  // The update sums R x k gradient trees in-process; over processes it takes this
  // process's leaves, their mean gradient (summed already) and the squared norm.
  if (multi_process_) {
    const Placement& p = placement_for(params);
    // The update on this process's shards, or (spmd_update_) an SPMD program on them.
    const Tree held = select(params, p.held);
    const Tree mine = spmd_update_ ? held : local_shards(held);
    const Tree state = select_state(opt_state, p.held);
    const Tree args{{"params", mine},
                    {"opt", spmd_update_ ? state : local_shards(state)},
                    {"grads", Tree::list({mine})},
                    {"lr", Array::scalar(0.0, DType::Float32)},
                    {"squared_norm", Array::scalar(0.0, DType::Float64)}};
    (void)update_program(args).lowered(args);
    return;
  }
  std::vector<Tree> parts(static_cast<size_t>(replicas_ * accumulation_), params);
  const Tree args{
      {"params", params}, {"opt", opt_state}, {"grads", Tree::list(parts)}, {"lr", Array::scalar(0.0, DType::Float32)}};
  (void)update_program(args).lowered(args);
}

std::vector<std::vector<std::vector<Array>>> PipelineTrainStep::keys_of(const std::optional<Array>& key) const {
  std::vector<std::vector<std::vector<Array>>> keys;
  if (!key) return keys;
  const int64_t m = executors_.front().schedule().micro_batches;
  // Evaluated here: the replicas' threads read them at once.
  std::vector<Array> all = part_keys(*key, accumulation_ * replicas_ * m);
  eval(all);
  auto next = all.begin();
  for (int64_t i = 0; i < accumulation_; ++i) {
    keys.emplace_back();
    for (int r = 0; r < replicas_; ++r) {
      keys.back().emplace_back(next, next + m);
      next += m;
    }
  }
  return keys;
}

StepStats PipelineTrainStep::run(Tree& params, Tree& opt_state, const std::vector<data::Batch>& micro, double lr,
                                 const std::optional<Array>& key) {
  if (static_cast<int64_t>(micro.size()) != accumulation_)
    fail<ValueError>("pipeline step: {} micro-batches given, {} expected", micro.size(), accumulation_);
  if (multi_process_) return run_multi_process(params, opt_state, micro, lr, key);
  const auto keys = keys_of(key);  // PipelineExecutor::run_with_keys checks they are needed
  const int r_count = replicas_;
  std::vector<Tree> parts;
  double loss = 0, busy = 0, capacity = 0;
  last_sent_bytes_ = 0;
  last_collective_bytes_ = 0;
  last_timelines_.assign(static_cast<size_t>(r_count), PipelineTimeline{});
  // Loss scaling: the backward passes start from scale / counted (the scaled mean loss's
  // gradient); the scale is a power of two, so dividing the loss by it is exact.
  const double scale = loss_scale_of(opt_state);
  for (size_t i = 0; i < micro.size(); ++i) {
    const data::Batch& batch = micro[i];
    const double counted = counted_targets(batch.targets);
    if (!(counted > 0)) fail<ValueError>("pipeline step: every target of a micro-batch is -100 (ignored)");
    std::vector<PipelineResult> results(static_cast<size_t>(r_count));
    for_each_replica([&](int r) {
      const data::Batch rows = rows_of(batch, r);
      results[static_cast<size_t>(r)] = executors_[static_cast<size_t>(r)].run_with_keys(
          params, rows.tokens, rows.targets, scale / counted, packing_of(rows),
          keys.empty() ? std::vector<Array>{} : keys[i][static_cast<size_t>(r)]);
    });
    for (int r = 0; r < r_count; ++r) {
      PipelineResult& result = results[static_cast<size_t>(r)];
      loss += result.loss / scale;  // replica order: a fixed sum
      parts.push_back(std::move(result.grads));
      busy += result.measured.busy;
      last_sent_bytes_ += result.sent_bytes;
      last_collective_bytes_ += result.stage_collective_bytes;
      capacity += result.measured.makespan * result.schedule.devices;
      last_timelines_[static_cast<size_t>(r)] = std::move(result.measured);
    }
  }
  last_bubble_ = capacity > 0 ? 1 - busy / capacity : 0;
  return apply_update(params, opt_state, std::move(parts), lr, loss);
}

void PipelineTrainStep::for_each_replica(const std::function<void(int)>& fn) const {
  std::vector<std::exception_ptr> errors(static_cast<size_t>(replicas_));
  auto replica = [&](int r) {
    try {
      fn(r);
    } catch (...) {
      errors[static_cast<size_t>(r)] = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  for (int r = 1; r < replicas_; ++r) threads.emplace_back(replica, r);
  replica(0);
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

double PipelineTrainStep::evaluate(const Tree& params, data::DataLoader& loader, int64_t batches) {
  if (batches < 1) fail<ValueError>("evaluate: batches must be >= 1 (got {})", batches);
  loader.set_position({});
  const int64_t n = std::min<int64_t>(batches, static_cast<int64_t>(loader.batches_per_epoch()));
  // Per batch: its loss summed over the replicas' rows (several processes: this process's
  // part, 0 unless it runs a last stage), then with a load-balancing loss the routing
  // figures summed over the replicas' micro-batches; and its counted targets.
  const models::ModelConfig& c = model_.config();
  const size_t figures = c.balances_load() ? static_cast<size_t>((c.moe_top_k + 1) * c.moe_experts) : 0;
  const size_t width = 1 + figures;
  std::vector<double> sums(static_cast<size_t>(n) * width, 0.0), counted(static_cast<size_t>(n), 0.0);
  auto add = [&](int64_t i, const PipelineResult& result) {
    double* row = &sums[static_cast<size_t>(i) * width];
    row[0] += result.loss;
    for (size_t f = 0; f < result.routing.size() && f < figures; ++f) row[1 + f] += result.routing[f];
  };
  for (int64_t i = 0; i < n; ++i) {
    const data::Batch batch = loader.next_batch();
    counted[static_cast<size_t>(i)] = counted_targets(batch.targets);
    if (!(counted[static_cast<size_t>(i)] > 0))
      fail<ValueError>("evaluate: every target of validation batch {} is -100 (ignored)", i);
    if (multi_process_) {
      const data::Batch rows = rows_of(batch, replica_here_);
      add(i, executors_.front().forward_loss(params, rows.tokens, rows.targets, packing_of(rows)));
      continue;
    }
    std::vector<PipelineResult> parts(static_cast<size_t>(replicas_));
    for_each_replica([&](int r) {
      const data::Batch rows = rows_of(batch, r);
      parts[static_cast<size_t>(r)] =
          executors_[static_cast<size_t>(r)].forward_loss(params, rows.tokens, rows.targets, packing_of(rows));
    });
    for (const PipelineResult& part : parts) add(i, part);  // replica order
  }
  if (multi_process_)
    spmd::communicator().all_reduce(spmd::local_devices().front(), spmd::world_group(), sums.data(), sums.data(),
                                    sums.size(), DType::Float64);
  // The whole batch's load-balancing term from the figures of its equal parts, as one
  // device's Evaluator computes it over the batch.
  const int64_t parts = int64_t{replicas_} * executors_.front().schedule().micro_batches;
  double total = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double* row = &sums[static_cast<size_t>(i) * width];
    total += row[0] / counted[static_cast<size_t>(i)] +
             model_.load_balancing_term(std::vector<double>(row + 1, row + width), parts);
  }
  return total / static_cast<double>(n);
}

StepStats PipelineTrainStep::run_multi_process(Tree& params, Tree& opt_state, const std::vector<data::Batch>& micro,
                                               double lr, const std::optional<Array>& key) {
  place(params, opt_state);  // the first step frees what other processes' stages hold
  const Placement& p = *placement_;
  PipelineExecutor& executor = executors_.front();
  const int me = spmd::local_devices().front();
  std::optional<Tree> local;  // gradients of this process's parameters, summed over accumulation steps in order
  // loss, busy seconds, device seconds, handed-over bytes, the stages' collective bytes:
  // summed over the processes.
  std::array<double, 5> figures{};
  last_timelines_.assign(1, PipelineTimeline{});
  const double scale = loss_scale_of(opt_state);  // every process holds the same loss scale
  const auto keys = keys_of(key);
  for (size_t i = 0; i < micro.size(); ++i) {
    const data::Batch& batch = micro[i];
    const double counted = counted_targets(batch.targets);  // every process reads the whole micro-batch
    if (!(counted > 0)) fail<ValueError>("pipeline step: every target of a micro-batch is -100 (ignored)");
    const data::Batch rows = rows_of(batch, replica_here_);
    PipelineResult result =
        executor.run_with_keys(params, rows.tokens, rows.targets, scale / counted, packing_of(rows),
                               keys.empty() ? std::vector<Array>{} : keys[i][static_cast<size_t>(replica_here_)]);
    // Summed in place over the accumulation steps, into a copy of the first (sharded
    // state: this device's gradient shards).
    const Tree mine = local_shards(select(result.grads, p.held));
    if (local)
      add_into_tree(*local, mine);
    else
      local = accumulation_ > 1 ? copy_tree(mine) : mine;
    figures[0] += result.loss / scale;
    figures[1] += result.measured.busy;
    figures[2] += result.measured.makespan;  // one device ran here
    figures[3] += result.sent_bytes;
    figures[4] += result.stage_collective_bytes;
    last_timelines_.front() = std::move(result.measured);
  }
  spmd::Communicator& comm = spmd::communicator();
  const std::vector<int> world = spmd::world_group();
  comm.all_reduce(me, world, figures.data(), figures.data(), figures.size(), DType::Float64);

  // Each gradient summed over the processes that hold its parameter (sharded state: its
  // piece; each stage's is complete already, so only a tied embedding's two). Those of
  // this process's pipeline coordinate alone first; then the ones shared with other
  // coordinates (a tied embedding), in the parameters' order on every process, so no two
  // processes wait on each other's groups in opposite orders.
  const std::vector<std::string> local_paths = local->paths();
  std::vector<Array> leaves = local->leaves();
  const Tree structure = local->map([](const Array& g) { return Array::placeholder(g.shape(), g.dtype()); });
  local.reset();  // `leaves` holds the gradients alone: each is freed when its sum replaces it
  const double inverse_k = 1.0 / static_cast<double>(accumulation_);
  std::vector<bool> counted(leaves.size(), false);
  for (int pass = 0; pass < 2; ++pass)
    for (size_t j = 0; j < leaves.size(); ++j) {
      const size_t i = p.index.at(local_paths[j]);
      const std::vector<int>& owners = shard_state_ ? p.peers[i] : p.owners[i];
      if ((owners == p.coordinate_group) != (pass == 0)) continue;
      Array& g = leaves[j];
      if (owners.size() > 1) {
        Array out = Array::empty(g.shape(), g.dtype());
        comm.all_reduce(me, owners, g.raw_data(), out.mutable_raw_data(), static_cast<size_t>(g.size()), g.dtype());
        g = out;
      }
      if (accumulation_ > 1) g = (g * inverse_k).eval();  // the mean over the accumulation steps
      counted[j] = p.counted[i];
    }
  const Tree mean = structure.with_leaves(leaves);
  // The whole model's squared gradient norm: each process's parameters that it is the
  // lowest holder of, summed over the world in rank order.
  double squared = optimizer_.squared_norm(select(mean, counted), opt_state).item<double>();
  comm.all_reduce(me, world, &squared, &squared, 1, DType::Float64);
  last_bubble_ = figures[2] > 0 ? 1 - figures[1] / figures[2] : 0;
  last_sent_bytes_ = figures[3];
  last_collective_bytes_ = figures[4];
  const Tree mine = select(params, p.held), mine_state = select_state(opt_state, p.held);
  if (spmd_update_) {
    // The sharded leaves go in as they are held (the gradients as shards of the same
    // layouts), and come back so.
    Tree updated = mine, updated_state = mine_state;
    const StepStats stats = apply_update(updated, updated_state, {sharded_like(mean, mine)}, lr, figures[0],
                                         Array::scalar(squared, DType::Float64));
    params = merge(params, updated);
    opt_state = merge_state(opt_state, updated_state);
    return stats;
  }
  Tree updated = local_shards(mine), updated_state = local_shards(mine_state);
  const StepStats stats =
      apply_update(updated, updated_state, {mean}, lr, figures[0], Array::scalar(squared, DType::Float64));
  params = merge(params, sharded_like(updated, mine));
  opt_state = merge_state(opt_state, sharded_like(updated_state, mine_state));
  return stats;
}

std::string PipelineTrainStep::describe() const {
  const PipelineSchedule& s = schedule();
  std::vector<std::string> stages;
  for (size_t i = 0; i < stage_layers().size(); ++i) {
    const auto [first, last] = stage_layers()[i];
    stages.push_back(
        fmt::format("stage {} (device {}): layers {}-{}", i, static_cast<int>(i) % s.devices, first, last - 1));
  }
  const PipelineExecutor& executor = executors_.front();
  const int per_stage = executor.devices_per_stage();
  // "pipeline 2 x data 2" (replicas of the pipeline) or "pipeline 2 x (fsdp=2, tensor=2)"
  // (each stage partitioned over the mesh's other axes).
  std::string layout = fmt::format("pipeline {} x data {}", s.devices, replicas_);
  if (per_stage > 1) {
    std::vector<std::string> axes;
    for (int a = 0; a < mesh_.ndim(); ++a)
      if (mesh_.axis_name(a) != "pipeline")
        axes.push_back(fmt::format("{}={}", mesh_.axis_name(a), mesh_.axis_size(a)));
    layout = fmt::format("pipeline {} x ({}) inside each stage", s.devices, fmt::join(axes, ", "));
  }
  const int devices = s.devices * replicas_ * per_stage;
  std::string text = multi_process_ ? fmt::format("{} ({} processes, one device each: {})\n", layout, devices,
                                                  spmd::runtime_description())
                                    : fmt::format("{} ({} device threads in this process)\n", layout, devices);
  text += fmt::format("  {}\n", fmt::join(stages, "; "));
  if (multi_process_ && placement_)
    text += fmt::format(
        "  stage-local state: this process holds {:.2f} of the model's {:.2f} MB of parameters{}, and their "
        "gradients and optimizer moments\n",
        placement_->held_bytes / 1e6, placement_->whole_bytes / 1e6,
        shard_state_ ? " (its device's shards of its stages')"
        : per_stage > 1
            ? fmt::format(" (its stages' whole: {}'s update reads whole matrices)", optimizer_.config().name)
            : "");
  text += fmt::format(
      "  schedule {}, {} micro-batches per replica and step{}, analytic bubble {:.1f}%, measured {}\n",
      to_string(s.kind), s.micro_batches,
      s.kind == PipelineKind::kInterleaved ? fmt::format(", {} virtual stages", s.virtual_stages) : "",
      100 * analytic_bubble_fraction(s),
      last_timelines_.empty() ? std::string("(no step ran)") : fmt::format("{:.1f}% (last step)", 100 * last_bubble_));
  if (per_stage > 1 && !last_timelines_.empty())
    text += fmt::format(
        "  collectives inside the stages: {:.3f} MB sent by the devices in the last step; hand-overs "
        "between stages {:.3f} MB\n",
        last_collective_bytes_ / 1e6, last_sent_bytes_ / 1e6);
  // Each stage program's collectives per run (they run once per micro-batch).
  const std::string stages_text = executor.stage_summary();
  for (size_t begin = 0; begin < stages_text.size();) {
    const size_t end = stages_text.find('\n', begin);
    text += "  " + stages_text.substr(begin, end - begin + 1);
    begin = end + 1;
  }
  if (!last_timelines_.empty() && last_timelines_.front().makespan > 0) {
    const PipelineTimeline& t = last_timelines_.front();
    text += multi_process_  ? "  the last step of this process's device, measured (one column = 1/60 of it):\n"
            : per_stage > 1 ? "  the last step, measured on each stage's first device (one column = 1/60 of it):\n"
                            : "  the last step of replica 0, measured (one column = 1/60 of it):\n";
    const std::string timeline = render_timeline(t, s, t.makespan / 60);
    size_t begin = 0;
    for (size_t line = 0; begin < timeline.size(); ++line) {
      const size_t end = timeline.find('\n', begin);
      // Several processes: each knows its own device's ops only (and not the others' idle
      // time, so not the line's bubble either; the figure above is the job's).
      const bool shown = !multi_process_ || (line < t.devices.size() && !t.devices[line].empty());
      if (shown) text += "    " + timeline.substr(begin, end - begin) + "\n";
      begin = end == std::string::npos ? timeline.size() : end + 1;
    }
  }
  return text;
}

}  // namespace tessera::train
