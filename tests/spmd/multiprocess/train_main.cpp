// The parallel GPT training step with one process per device, under MPI or a TCP job:
// run by ctest as
//   mpirun -n 2 / -n 4 multiprocess_train                  (spmd.mpi_train_np2 / _np4)
//   tessera launch --nproc 2 / 4 --coordinator 127.0.0.1:0 -- multiprocess_train
//                                                          (spmd.tcp_train_np2 / _np4)
// The same tiny GPT, batches and AdamW settings as tests/spmd/test_parallel_train.cpp.
// Every rank trains the single-device reference locally (plain jit, no collectives),
// then every layout whose mesh has as many devices as there are ranks for 3 steps, and
// checks: the losses (relative 1e-5), every parameter after spmd::gather (relative
// 2-norm error 1e-5), and the collective bytes of one step (the layout's analytic
// count, plus at most 256 bytes of scalar reductions; what the rank measured sending
// to its peers equals the program's count). Rank 0 prints one line per layout with an
// FNV-1a hash of the gathered parameters (to compare runs by eye).
// It also trains pipeline layouts (train/pipeline_step.h: a stage per process,
// activations and gradients as point-to-point messages) of a 4-layer GPT against one
// device: pipeline=2 (1F1B, GPipe, and 1F1B keeping the activations instead of
// recomputing them) on 2 ranks; pipeline=2,data=2 (recomputing and keeping), pipeline=4
// and stages partitioned over tensor=2 or fsdp=2 (each recomputing and keeping; the processes keep their devices'
// shards of the state, with AdamW, SGD's momentum over tensor=2, and Adafactor over fsdp=2 and tensor=2 and Muon
// over fsdp=2, whose updates run as SPMD programs) on 4; the same bars. Each of
// these checks the stage-local state (a process holds less than the whole parameters and optimizer state; over the
// world each parameter and optimizer state leaf once per pipeline, the tied embedding twice; partitioned stages:
// shards of every optimizer's state) and the validation loss through the stages'
// forwards against one device's. And float16 with loss scaling through pipeline=2 on 2 ranks (check_pipeline_float16),
// and dropout through pipeline=2 with 1 and 2 micro-batches on 2 ranks and pipeline=2,data=2 on 4
// (check_pipeline_dropout: one device's accumulation keys). And a mixture of experts through pipeline=2 on 2 ranks,
// pipeline=2,data=2 and stages partitioned over expert=2 on 4 (check_pipeline_moe: the stages hand on routing figures;
// one device accumulating over the same micro-batches is the reference). And dropless expert parallelism without a
// pipeline, expert=2 on 2 ranks and data=2,expert=2 on 4 (check_moe_layout: ragged all-to-alls of the routed rows).
// Exits nonzero on any mismatch, on every rank.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "spmd/parallel_train_util.h"
#include "tessera/core/ops.h"
#include "tessera/data/loader.h"
#include "tessera/data/token_file.h"
#include "tessera/models/model.h"
#include "tessera/optim/optimizer.h"
#include "tessera/spmd/api.h"
#include "tessera/spmd/runtime.h"
#include "tessera/train/parallel.h"
#include "tessera/train/pipeline_step.h"
#include "tessera/train/train_step.h"

using namespace tessera;
using namespace tessera::train;

namespace {

int g_rank = 0;
int g_failures = 0;

void expect(bool ok, const std::string& what) {
  if (ok) return;
  ++g_failures;
  std::fprintf(stderr, "rank %d: FAILED %s\n", g_rank, what.c_str());
}

constexpr int64_t kBatch = testing::kTrainBatch, kSeq = testing::kTrainSeq, kSteps = testing::kTrainSteps;

struct TrainRun {
  std::vector<double> losses;
  std::vector<Array> params;  // host arrays (gathered), in Tree::leaves() order
  std::vector<std::string> paths;
  double summary_bytes = 0, measured_bytes = 0;
  std::vector<bool> skipped;   // loss scaling: each step's
  std::vector<double> scales;  // ... and its scale after the step
  // Pipelines: the bytes of parameters and optimizer state this process held after the
  // steps (stage-local), the whole trees', and the validation loss through the stages'
  // forwards against one device's Evaluator on the same (gathered) parameters.
  double held_param_bytes = 0, held_state_bytes = 0, whole_param_bytes = 0, whole_state_bytes = 0;
  double wte_bytes = 0;
  // Stages partitioned over the mesh keep their devices' shards (every optimizer; those
  // that read whole matrices update as an SPMD program): the bytes of one device's shard
  // of every parameter (and of the tied embedding); the whole parameters' without
  // partitioned stages.
  bool sharded_state = false;
  double shard_param_bytes = 0, shard_wte_bytes = 0;
  double shard_state_bytes = 0, shard_wte_state_bytes = 0, every_process_state_bytes = 0;
  double built_param_bytes = 0, built_state_bytes = 0;  // right after the stage-local init
  double eval_loss = 0, eval_want = 0;
  // Expert parallelism: all-to-alls per step, ragged ones among them, and the all-to-all
  // bytes this rank sent in the last step.
  int64_t all_to_all_calls = 0, ragged_calls = 0;
  double all_to_all_bytes = 0;
};

// The Llama form of the tiny model with 4 experts per layer (top 2, dropless).
models::ModelConfig tiny_moe() {
  models::ModelConfig c = testing::tiny_gpt();
  c.family = "llama";
  c.moe_experts = 4;
  c.moe_top_k = 2;
  c.moe_aux_loss_coef = 0.05;
  return c;
}

// 3 AdamW steps, on one device (empty mesh_text) or SPMD under the mesh's layout.
TrainRun run_layout(const std::string& mesh_text, bool moe = false) {
  models::Model model(moe ? tiny_moe() : testing::tiny_gpt());
  optim::OptimizerConfig oc = testing::test_adamw();
  optim::Optimizer optimizer(oc, model.specs());
  Tree params = model.init(7);
  Tree opt = optimizer.init(params);
  const std::optional<Layout> layout = testing::place_on_mesh(mesh_text, model, params, opt);
  TrainStep step(model, optimizer, 1, layout ? &*layout : nullptr);
  TrainRun run;
  for (int64_t s = 0; s < kSteps; ++s) {
    data::Batch b = testing::random_batch(kBatch, kSeq, 64, static_cast<uint64_t>(100 * s));
    run.losses.push_back(step.run(params, opt, {layout ? layout->shard_batch(b) : b}, 1e-2, std::nullopt).loss);
  }
  for (const auto& p : step.spmd_programs()) {
    run.summary_bytes += p->program().summary.per_device.total_bytes();
    run.measured_bytes += p->last_comm_stats().at(0).total_bytes();  // this rank's device, sent to its peers
    run.all_to_all_calls += p->program().summary.per_device.all_to_all_calls;
    run.all_to_all_bytes += p->last_comm_stats().at(0).all_to_all_bytes;
    for (const compiler::Node& n : p->program().local.nodes)
      if (!n.dead && n.primitive->name() == "ragged_all_to_all") ++run.ragged_calls;
  }
  // spmd::gather is collective: every rank gathers the same leaves in the same order.
  run.paths = params.paths();
  for (const Array& leaf : params.leaves()) run.params.push_back(spmd::gather(leaf));
  if (layout) {
    std::vector<Array> leaves = params.leaves();
    for (size_t i = 0; i < leaves.size(); ++i) {
      const spmd::Sharding* sh = spmd::sharding_of(leaves[i]);
      expect(sh != nullptr && *sh == layout->param(run.paths[i]), mesh_text + ": " + run.paths[i] + " lost its layout");
    }
  }
  return run;
}

// ||a - b|| / ||b|| over the elements.
double relative_error(const Array& a, const Array& b) {
  std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  double err = 0, mag = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    err += (x[i] - y[i]) * (x[i] - y[i]);
    mag += y[i] * y[i];
  }
  return std::sqrt(err) / (std::sqrt(mag) + 1e-30);
}

// FNV-1a (64-bit) over the bytes of every array.
uint64_t fnv1a(const std::vector<Array>& arrays) {
  uint64_t h = 1469598103934665603ull;
  for (const Array& a : arrays) {
    const auto* p = static_cast<const unsigned char*>(a.raw_data());
    for (size_t i = 0; i < a.nbytes(); ++i) h = (h ^ p[i]) * 1099511628211ull;
  }
  return h;
}

void check_layout(const std::string& mesh_text, const TrainRun& want) {
  TrainRun got = run_layout(mesh_text);
  double loss_err = 0;
  for (int64_t s = 0; s < kSteps; ++s) {
    const size_t i = static_cast<size_t>(s);
    const double e = std::abs(got.losses[i] - want.losses[i]) / std::abs(want.losses[i]);
    loss_err = std::max(loss_err, e);
    expect(e <= 1e-5,
           fmt::format("{}: step {} loss {} but one device gives {}", mesh_text, s, got.losses[i], want.losses[i]));
  }
  double param_err = 0;
  expect(got.params.size() == want.params.size(), mesh_text + ": parameter count");
  for (size_t i = 0; i < std::min(got.params.size(), want.params.size()); ++i) {
    if (got.params[i].shape() != want.params[i].shape()) {
      expect(false, fmt::format("{}: {} has shape {} but one device gives {}", mesh_text, want.paths[i],
                                to_string(got.params[i].shape()), to_string(want.params[i].shape())));
      continue;
    }
    const double e = relative_error(got.params[i], want.params[i]);
    param_err = std::max(param_err, e);
    expect(e <= 1e-5, fmt::format("{}: {} relative error {:.3g} (expected <= 1e-5)", mesh_text, want.paths[i], e));
  }
  models::Model model(testing::tiny_gpt());
  Layout layout(spmd::Mesh::parse(mesh_text), default_axis_rules(), model.specs());
  const double analytic = layout.analytic_step_bytes(testing::tiny_gpt().layers, testing::tiny_gpt().dim, kBatch, kSeq);
  // Scalar reductions (loss, token count, gradient norm) are not in the analytic count.
  expect(got.summary_bytes >= analytic && got.summary_bytes <= analytic + 256,
         fmt::format("{}: {} bytes per step, analytic {} (+ at most 256)", mesh_text, got.summary_bytes, analytic));
  if (g_rank == 0)
    std::printf(
        "%-16s losses %.7f %.7f %.7f  max rel err: loss %.2e params %.2e  bytes %.0f (analytic %.0f)  "
        "params fnv1a %016llx\n",
        mesh_text.c_str(), got.losses[0], got.losses[1], got.losses[2], loss_err, param_err, got.summary_bytes,
        analytic, static_cast<unsigned long long>(fnv1a(got.params)));
  std::fflush(stdout);
}

// Dropless expert parallelism across processes: the one-device losses and parameters,
// with the dispatch and combine (and their transposes) as ragged all-to-alls of the
// routed rows, which send less than the padded buffers' (experts / top_k) x (n-1)/n share.
void check_moe_layout(const std::string& mesh_text, const TrainRun& want) {
  const TrainRun got = run_layout(mesh_text, /*moe=*/true);
  const std::string what = mesh_text + " moe";
  double loss_err = 0, param_err = 0;
  for (size_t i = 0; i < want.losses.size(); ++i)
    loss_err = std::max(loss_err, std::abs(got.losses[i] - want.losses[i]) / std::abs(want.losses[i]));
  for (size_t i = 0; i < want.params.size(); ++i)
    param_err = std::max(param_err, relative_error(got.params[i], want.params[i]));
  expect(loss_err <= 1e-5, fmt::format("{}: loss relative error {:.3g} (expected <= 1e-5)", what, loss_err));
  expect(param_err <= 1e-5, fmt::format("{}: parameter relative error {:.3g} (expected <= 1e-5)", what, param_err));
  const models::ModelConfig c = tiny_moe();
  expect(got.ragged_calls == 4 * c.layers,
         fmt::format("{}: {} ragged all-to-alls per step (expected 4 per layer)", what, got.ragged_calls));
  const spmd::Mesh mesh = spmd::Mesh::parse(mesh_text);
  const double group_rows = static_cast<double>(kBatch * kSeq / mesh.size() * c.moe_top_k);
  const double padded = 4.0 * static_cast<double>(c.layers) * group_rows / static_cast<double>(c.moe_top_k) *
                        static_cast<double>(c.moe_experts) * c.dim * 4 / 2;
  expect(got.all_to_all_bytes > 0 && got.all_to_all_bytes < padded,
         fmt::format("{}: {} all-to-all bytes sent in the last step (padded buffers: {})", what, got.all_to_all_bytes,
                     padded));
  if (g_rank == 0)
    std::printf("%-24s losses %.7f %.7f %.7f  max rel err: loss %.2e params %.2e  all-to-all sent %.0f (padded %.0f)\n",
                what.c_str(), got.losses[0], got.losses[1], got.losses[2], loss_err, param_err, got.all_to_all_bytes,
                padded);
  std::fflush(stdout);
}

// 3 AdamW steps of a 4-layer GPT: on one device (empty mesh) or a pipeline layout. With
// float16: float16 compute and dynamic loss scaling from 2^24 (the first step overflows
// and is skipped; the scale backs off to 2^16).
// With dropout: model.dropout 0.1, the step keys param_key(5, "dropout/<step>").
// With moe: the Llama form of the model with 4 experts per layer (top 2).
// With split > 0 (dropout or moe): split / replicas pipeline micro-batches per replica, and
// one device accumulates over `split` row-parts of each batch: the pipeline's
// micro-batches, which draw one device's accumulation keys and have their own
// load-balancing terms. Without: 4 micro-batches, 1 with dropout.
TrainRun run_pipeline(const std::string& layout_text, PipelineKind kind, bool float16 = false, bool dropout = false,
                      bool moe = false, int split = 0) {
  // "pipeline=2 keep": the stages keep their activations (PipelineOptions::recompute = false);
  // " adafactor" / " muon": Adafactor or Muon instead of AdamW (their updates read whole
  // matrices: with partitioned stages an SPMD program over the shards, whose factored rows
  // and 0-d slots stay whole).
  const bool keep = layout_text.ends_with(" keep");
  const bool adafactor = layout_text.find(" adafactor") != std::string::npos;
  const bool sgd = layout_text.find(" sgd") != std::string::npos;  // SGD with momentum: shards too
  const bool muon = layout_text.find(" muon") != std::string::npos;
  const std::string mesh_text = layout_text.substr(0, layout_text.find(' '));
  models::ModelConfig c = testing::tiny_gpt();
  c.layers = 4;
  if (dropout) c.dropout = 0.1;
  if (moe) {
    c.family = "llama";
    c.moe_experts = 4;
    c.moe_top_k = 2;
    c.moe_aux_loss_coef = 0.05;
  }
  optim::OptimizerConfig oc = testing::test_adamw();
  if (adafactor) {
    oc.name = "adafactor";
    // As test_adamw's eps: the attention key bias's gradient is rounding noise, which a
    // tiny epsilon turns into full-size updates that differ between summation orders.
    oc.adafactor_eps = 1e-6;
  }
  if (sgd) oc.name = "sgd";
  if (muon) oc.name = "muon";
  if (float16) {
    c.compute_dtype = "float16";
    oc.loss_scale.mode = optim::LossScaling::Dynamic;
    oc.loss_scale.init_scale = 16777216.0;
    oc.loss_scale.backoff_factor = 1.0 / 256;
  }
  models::Model model(c);
  optim::Optimizer optimizer(oc, model.specs());
  Tree params, opt;
  std::optional<TrainStep> one;
  std::optional<PipelineTrainStep> piped;
  // Partitioned stages that keep their devices' shards: the parameters' layout inside them.
  std::optional<Layout> stage_layout;
  if (mesh_text.empty()) {
    one.emplace(model, optimizer, std::max(split, 1));
  } else {
    const spmd::Mesh mesh = spmd::Mesh::parse(mesh_text);
    PipelineOptions o;
    o.kind = kind;
    o.devices = mesh.axis_size("pipeline");
    const int replicas = mesh.has_axis("data") ? mesh.axis_size("data") : 1;
    o.micro_batches = split > 0 ? split / replicas : dropout ? 1 : 4;
    o.recompute = !keep;
    // FSDP, tensor or expert axes: one pipeline whose stages are partitioned over them.
    const bool partitioned = mesh.has_axis("fsdp") || mesh.has_axis("tensor") || mesh.has_axis("expert");
    if (partitioned) {
      o.mesh = mesh;
      if (PipelineTrainStep::shards_state(o, oc.name)) stage_layout.emplace(mesh, default_axis_rules(), model.specs());
    }
    piped.emplace(model, optimizer, 1, o, mesh.has_axis("data") && !partitioned ? mesh.axis_size("data") : 1, kSeq,
                  &mesh);
  }
  TrainRun run;
  if (piped) {
    // Built stage-local from the start: the held parameters (the same values as a whole
    // init's) and their moments only.
    params = model.init(7, [&](const std::string& path) { return piped->holds(path); });
    opt = piped->init_state(params);
    run.built_param_bytes = PipelineTrainStep::held_bytes(params);
    run.built_state_bytes = PipelineTrainStep::held_bytes(opt);
  } else {
    params = model.init(7);
    opt = optimizer.init(params);
  }
  for (int64_t s = 0; s < kSteps; ++s) {
    std::vector<data::Batch> b{testing::random_batch(kBatch, kSeq, 64, static_cast<uint64_t>(100 * s))};
    if (one && split > 1) {  // one device: the pipeline's micro-batches as accumulation steps
      const data::Batch whole = b.front();
      const int64_t rows = kBatch / split;
      b.clear();
      for (int64_t i = 0; i < split; ++i) {
        data::Batch part;
        part.tokens = slice_axis(whole.tokens, 0, i * rows, (i + 1) * rows).eval();
        part.targets = slice_axis(whole.targets, 0, i * rows, (i + 1) * rows).eval();
        b.push_back(part);
      }
    }
    std::optional<Array> key;
    if (dropout) key = nn::param_key(5, fmt::format("dropout/{}", s));
    const StepStats stats = one ? one->run(params, opt, b, 1e-2, key) : piped->run(params, opt, b, 1e-2, key);
    run.losses.push_back(stats.loss);
    run.skipped.push_back(stats.skipped);
    run.scales.push_back(stats.loss_scale);
  }
  if (piped) {
    run.measured_bytes = piped->last_sent_bytes();
    run.held_param_bytes = PipelineTrainStep::held_bytes(params);
    run.held_state_bytes = PipelineTrainStep::held_bytes(opt);
    // Validation batches from a token file (every rank writes and reads its own copy).
    const std::filesystem::path file =
        std::filesystem::temp_directory_path() / fmt::format("tessera_mp_val_{}_{}.bin", getpid(), g_rank);
    std::vector<int32_t> tokens(static_cast<size_t>(3 * kBatch * (kSeq + 1)));
    std::mt19937 rng(11);
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % 64);
    data::write_token_file(file, tokens, "byte", 256);
    data::DataLoader val(std::make_shared<const data::TokenFile>(file), kBatch, kSeq, 1, 0, 1, /*shuffle=*/false);
    run.eval_loss = piped->evaluate(params, val, 2);
    params = piped->gathered(params);  // collectives: every rank
    opt = piped->gathered(opt);
    run.eval_want = Evaluator(model)(params, val, 2);
    std::filesystem::remove(file);
  }
  run.whole_param_bytes = PipelineTrainStep::held_bytes(params);
  run.whole_state_bytes = PipelineTrainStep::held_bytes(opt);
  // The embedding two stages hold when it is tied.
  run.wte_bytes = c.resolved_tied() ? static_cast<double>(params.at("wte").leaf().nbytes()) : 0;
  run.sharded_state = stage_layout.has_value();
  const std::vector<std::string> paths = params.paths();
  const std::vector<Array> leaves = params.leaves();
  for (size_t i = 0; i < leaves.size(); ++i) {
    const Shape local = stage_layout ? stage_layout->param(paths[i]).local_shape(leaves[i].shape()) : leaves[i].shape();
    const double bytes = static_cast<double>(numel(local) * static_cast<int64_t>(itemsize(leaves[i].dtype())));
    run.shard_param_bytes += bytes;
    if (paths[i] == "wte" && c.resolved_tied()) run.shard_wte_bytes = bytes;
  }
  // The optimizer state the same way: a parameter-keyed leaf shaped like its parameter as
  // its shard, any other (Adafactor's factored rows, 0-d slots) whole; the leaves not keyed
  // by a parameter (the step count) on every process.
  for (const auto& [slot, subtree] : opt.items()) {
    const std::vector<Array> state = subtree.leaves();
    if (subtree.is_leaf() || subtree.paths() != paths) {
      for (const Array& leaf : state) run.every_process_state_bytes += static_cast<double>(leaf.nbytes());
      continue;
    }
    for (size_t i = 0; i < state.size(); ++i) {
      const Shape local = stage_layout && state[i].shape() == leaves[i].shape()
                              ? stage_layout->param(paths[i]).local_shape(state[i].shape())
                              : state[i].shape();
      const double bytes = static_cast<double>(numel(local) * static_cast<int64_t>(itemsize(state[i].dtype())));
      run.shard_state_bytes += bytes;
      if (paths[i] == "wte" && c.resolved_tied()) run.shard_wte_state_bytes += bytes;
    }
  }
  run.paths = params.paths();
  run.params = params.leaves();
  return run;
}

// Stage-local state: this process held less than the whole parameters and optimizer
// state, and over the world the processes held each parameter once per pipeline (the
// world / P processes at a coordinate each hold their stages'; with partitioned stages
// each its device's shard), the tied embedding twice (the first and the last stage's
// processes). The stage-local init built what the process held (partitioned: its stages'
// whole parameters, more than the shards it kept). And evaluation through the stages'
// forwards equals one device's on the same parameters.
void check_stage_local(const std::string& what, const spmd::Mesh& mesh, const TrainRun& got) {
  // Stages partitioned over the mesh keep shards, whatever the optimizer.
  const bool partitioned = mesh.has_axis("fsdp") || mesh.has_axis("tensor") || mesh.has_axis("expert");
  expect(got.sharded_state == partitioned,
         fmt::format("{}: the processes keep {} state", what, got.sharded_state ? "sharded" : "whole"));
  expect(got.held_param_bytes < got.whole_param_bytes,
         fmt::format("{}: this process held {} of {} parameter bytes (stage-local: less)", what, got.held_param_bytes,
                     got.whole_param_bytes));
  expect(got.held_state_bytes < got.whole_state_bytes,
         fmt::format("{}: this process held {} of {} optimizer state bytes (stage-local: less)", what,
                     got.held_state_bytes, got.whole_state_bytes));
  const bool built_as_held =
      got.sharded_state
          ? got.built_param_bytes > got.held_param_bytes && got.built_state_bytes > got.held_state_bytes
          : got.built_param_bytes == got.held_param_bytes && got.built_state_bytes == got.held_state_bytes;
  expect(built_as_held,
         fmt::format("{}: the stage-local init built {} parameter and {} state bytes; the steps held {} and {}{}", what,
                     got.built_param_bytes, got.built_state_bytes, got.held_param_bytes, got.held_state_bytes,
                     got.sharded_state ? " (expected more: the stages' whole, then their shards)" : ""));
  double held = got.held_param_bytes, held_state = got.held_state_bytes;
  spmd::run_on_devices({g_rank}, [&](int d) {
    spmd::communicator().all_reduce(d, spmd::world_group(), &held, &held, 1, DType::Float64);
    spmd::communicator().all_reduce(d, spmd::world_group(), &held_state, &held_state, 1, DType::Float64);
  });
  const double pipelines = static_cast<double>(mesh.size() / mesh.axis_size("pipeline"));
  const double want = pipelines * (got.shard_param_bytes + got.shard_wte_bytes);
  expect(held == want, fmt::format("{}: the processes held {} parameter bytes; expected {} ({} x ({} {} + the tied "
                                   "embedding {}))",
                                   what, held, want, pipelines, got.sharded_state ? "a device's shards" : "whole",
                                   got.shard_param_bytes, got.shard_wte_bytes));
  const double want_state = pipelines * (got.shard_state_bytes + got.shard_wte_state_bytes) +
                            static_cast<double>(mesh.size()) * got.every_process_state_bytes;
  expect(held_state == want_state,
         fmt::format("{}: the processes held {} optimizer state bytes; expected {} ({} x ({} {} + the tied embedding's "
                     "{}) + {} processes x {} held by each)",
                     what, held_state, want_state, pipelines, got.sharded_state ? "a device's shards" : "whole",
                     got.shard_state_bytes, got.shard_wte_state_bytes, mesh.size(), got.every_process_state_bytes));
  const double e = std::abs(got.eval_loss - got.eval_want) / got.eval_want;
  expect(e <= 1e-6, fmt::format("{}: validation loss {} through the stages, {} on one device (relative {:.3g})", what,
                                got.eval_loss, got.eval_want, e));
}

void check_pipeline(const std::string& mesh_text, PipelineKind kind, const TrainRun& want) {
  const std::string what = mesh_text + " " + to_string(kind);
  const TrainRun got = run_pipeline(mesh_text, kind);
  double loss_err = 0, param_err = 0;
  for (size_t i = 0; i < want.losses.size(); ++i) {
    const double e = std::abs(got.losses[i] - want.losses[i]) / std::abs(want.losses[i]);
    loss_err = std::max(loss_err, e);
    expect(e <= 1e-5,
           fmt::format("{}: step {} loss {} but one device gives {}", what, i, got.losses[i], want.losses[i]));
  }
  for (size_t i = 0; i < want.params.size(); ++i) {
    const double e = relative_error(got.params[i], want.params[i]);
    param_err = std::max(param_err, e);
    expect(e <= 1e-5, fmt::format("{}: {} relative error {:.3g} (expected <= 1e-5)", what, want.paths[i], e));
  }
  // Each micro-batch crosses each of the p - 1 boundaries twice, [rows, seq, dim] float32
  // each way, in every replica: 2 (p - 1) batch seq dim 4 bytes over the job. A stage
  // partitioned over tensor devices has the activation whole on each, and each sends it.
  const spmd::Mesh mesh = spmd::Mesh::parse(mesh_text.substr(0, mesh_text.find(' ')));
  const double copies = mesh.has_axis("tensor") ? mesh.axis_size("tensor") : 1;
  const double analytic = 2.0 * (mesh.axis_size("pipeline") - 1) * kBatch * kSeq * testing::tiny_gpt().dim * 4 * copies;
  expect(got.measured_bytes == analytic,
         fmt::format("{}: {} bytes handed between stages, analytic {}", what, got.measured_bytes, analytic));
  check_stage_local(what, mesh, got);
  if (g_rank == 0)
    std::printf(
        "%-24s losses %.7f %.7f %.7f  max rel err: loss %.2e params %.2e  sent %.0f (analytic %.0f)  held %.0f%% of "
        "the parameters\n",
        what.c_str(), got.losses[0], got.losses[1], got.losses[2], loss_err, param_err, got.measured_bytes, analytic,
        100 * got.held_param_bytes / got.whole_param_bytes);
  std::fflush(stdout);
}

// The largest relative error of got's losses and of its parameters against want's.
std::pair<double, double> largest_errors(const TrainRun& got, const TrainRun& want) {
  double loss_err = 0, param_err = 0;
  for (size_t i = 0; i < want.losses.size(); ++i)
    loss_err = std::max(loss_err, std::abs(got.losses[i] - want.losses[i]) / std::abs(want.losses[i]));
  for (size_t i = 0; i < want.params.size(); ++i)
    param_err = std::max(param_err, relative_error(got.params[i], want.params[i]));
  return {loss_err, param_err};
}

// float16 with loss scaling across processes: the same skipped steps and scales as one
// device, then its losses within 1e-4 and parameters within 2e-3 (float16 rounding in
// another summation order; tests/train/test_pipeline_step.cpp has the in-process case).
void check_pipeline_float16(const std::string& mesh_text, const TrainRun& want) {
  const std::string what = mesh_text + " float16";
  const TrainRun got = run_pipeline(mesh_text, PipelineKind::kOneFOneB, /*float16=*/true);
  expect(want.skipped == std::vector<bool>{true, false, false},
         "float16 one device: the first step should overflow at scale 2^24 and be skipped");
  expect(got.skipped == want.skipped, what + ": skipped steps differ from one device's");
  expect(got.scales == want.scales, what + ": loss scales differ from one device's");
  const auto [loss_err, param_err] = largest_errors(got, want);
  expect(loss_err <= 1e-4, fmt::format("{}: loss relative error {:.3g} (expected <= 1e-4)", what, loss_err));
  expect(param_err <= 2e-3, fmt::format("{}: parameter relative error {:.3g} (expected <= 2e-3)", what, param_err));
  if (g_rank == 0)
    std::printf("%-24s losses %.7f %.7f %.7f  scales %g %g %g  max rel err: loss %.2e params %.2e\n", what.c_str(),
                got.losses[0], got.losses[1], got.losses[2], got.scales[0], got.scales[1], got.scales[2], loss_err,
                param_err);
  std::fflush(stdout);
}

// Dropout across processes: each stage reads its micro-batch's key, the one one device
// draws for it accumulating over the step's micro-batches; so with `split` micro-batches
// the masks, losses and parameters are those of one device with `split` accumulation
// steps (1e-5), and with one (split 0) its plain step's.
void check_pipeline_dropout(const std::string& mesh_text, int split = 0) {
  const std::string what = mesh_text + fmt::format(" dropout m={}", std::max(split, 1));
  const TrainRun want = run_pipeline("", PipelineKind::kOneFOneB, false, /*dropout=*/true, false, split);
  const TrainRun got = run_pipeline(mesh_text, PipelineKind::kOneFOneB, false, /*dropout=*/true, false, split);
  const auto [loss_err, param_err] = largest_errors(got, want);
  expect(loss_err <= 1e-5, fmt::format("{}: loss relative error {:.3g} (expected <= 1e-5)", what, loss_err));
  expect(param_err <= 1e-5, fmt::format("{}: parameter relative error {:.3g} (expected <= 1e-5)", what, param_err));
  if (g_rank == 0)
    std::printf("%-24s losses %.7f %.7f %.7f  max rel err: loss %.2e params %.2e\n", what.c_str(), got.losses[0],
                got.losses[1], got.losses[2], loss_err, param_err);
  std::fflush(stdout);
}

// A mixture of experts across processes: the losses and parameters of one device that
// accumulates over the same micro-batches (1e-5), the stage-local state, evaluation's
// whole-batch load-balancing term, and the hand-overs: the stream as check_pipeline's,
// plus the routing figures [top_k + 1, experts] float32 both ways per micro-batch and
// boundary, whole on each device of a partitioned stage.
void check_pipeline_moe(const std::string& mesh_text) {
  const std::string what = mesh_text + " moe";
  const spmd::Mesh mesh = spmd::Mesh::parse(mesh_text);
  const int replicas = mesh.has_axis("data") ? mesh.axis_size("data") : 1;
  const int micro = 2 * replicas;
  const TrainRun want = run_pipeline("", PipelineKind::kOneFOneB, false, false, /*moe=*/true, micro);
  const TrainRun got = run_pipeline(mesh_text, PipelineKind::kOneFOneB, false, false, /*moe=*/true, micro);
  const auto [loss_err, param_err] = largest_errors(got, want);
  expect(loss_err <= 1e-5, fmt::format("{}: loss relative error {:.3g} (expected <= 1e-5)", what, loss_err));
  expect(param_err <= 1e-5, fmt::format("{}: parameter relative error {:.3g} (expected <= 1e-5)", what, param_err));
  check_stage_local(what, mesh, got);
  const double boundaries = mesh.axis_size("pipeline") - 1;
  const double inner = mesh.size() / mesh.axis_size("pipeline") / replicas;
  const double analytic = 2.0 * boundaries * (kBatch * kSeq * testing::tiny_gpt().dim + micro * 3 * 4 * inner) * 4;
  expect(got.measured_bytes == analytic,
         fmt::format("{}: {} bytes handed between stages, analytic {}", what, got.measured_bytes, analytic));
  if (g_rank == 0)
    std::printf("%-24s losses %.7f %.7f %.7f  max rel err: loss %.2e params %.2e  sent %.0f (analytic %.0f)\n",
                what.c_str(), got.losses[0], got.losses[1], got.losses[2], loss_err, param_err, got.measured_bytes,
                analytic);
  std::fflush(stdout);
}

}  // namespace

int main() {
  try {
    if (!spmd::is_multi_process()) {
      const bool launched = std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") ||
                            std::getenv("PMIX_RANK") || std::getenv("TESSERA_COORDINATOR");
      std::printf("multiprocess_train: %s\n", launched ? "started as a rank but the runtime is in-process"
                                                       : "not started by mpirun or tessera launch; nothing to check");
      return launched ? 1 : 0;
    }
    g_rank = spmd::local_devices().front();
    const int n = spmd::device_count();
    std::vector<std::string> layouts;
    if (n == 2) layouts = {"data=2", "fsdp=2", "tensor=2"};
    if (n == 4) layouts = {"data=4", "fsdp=4", "data=2,tensor=2", "fsdp=2,tensor=2"};
    if (layouts.empty()) {
      std::fprintf(stderr, "multiprocess_train: no layouts for %d ranks (run 2 or 4)\n", n);
      return 1;
    }
    const TrainRun want = run_layout("");
    if (g_rank == 0)
      std::printf("%-16s losses %.7f %.7f %.7f  params fnv1a %016llx\n", "one device", want.losses[0], want.losses[1],
                  want.losses[2], static_cast<unsigned long long>(fnv1a(want.params)));
    for (const std::string& l : layouts) check_layout(l, want);
    size_t checked = layouts.size();
    {
      const TrainRun want_moe = run_layout("", /*moe=*/true);
      check_moe_layout(n == 2 ? "expert=2" : "data=2,expert=2", want_moe);
      ++checked;
    }
    {
      const TrainRun want_4_layers = run_pipeline("", PipelineKind::kOneFOneB);
      std::vector<std::pair<std::string, PipelineKind>> pipelines;
      if (n == 2)
        pipelines = {{"pipeline=2", PipelineKind::kOneFOneB},
                     {"pipeline=2", PipelineKind::kGPipe},
                     {"pipeline=2 keep", PipelineKind::kOneFOneB}};
      if (n == 4)
        pipelines = {{"pipeline=2,data=2", PipelineKind::kOneFOneB},
                     {"pipeline=2,data=2 keep", PipelineKind::kOneFOneB},
                     {"pipeline=4", PipelineKind::kOneFOneB},
                     {"pipeline=2,tensor=2", PipelineKind::kOneFOneB},
                     {"pipeline=2,tensor=2 keep", PipelineKind::kOneFOneB},
                     {"pipeline=2,fsdp=2", PipelineKind::kGPipe},
                     {"pipeline=2,fsdp=2 keep", PipelineKind::kGPipe}};
      for (const auto& [mesh_text, kind] : pipelines) check_pipeline(mesh_text, kind, want_4_layers);
      checked += pipelines.size();
      if (n == 4) {  // partitioned stages whose processes keep their shards of the state
        check_pipeline("pipeline=2,fsdp=2 adafactor", PipelineKind::kOneFOneB,
                       run_pipeline(" adafactor", PipelineKind::kOneFOneB));
        check_pipeline("pipeline=2,tensor=2 adafactor", PipelineKind::kOneFOneB,
                       run_pipeline(" adafactor", PipelineKind::kOneFOneB));
        check_pipeline("pipeline=2,fsdp=2 muon", PipelineKind::kOneFOneB,
                       run_pipeline(" muon", PipelineKind::kOneFOneB));
        check_pipeline("pipeline=2,tensor=2 sgd", PipelineKind::kOneFOneB,
                       run_pipeline(" sgd", PipelineKind::kOneFOneB));
        checked += 4;
      }
      if (n == 2) {
        check_pipeline_float16("pipeline=2", run_pipeline("", PipelineKind::kOneFOneB, /*float16=*/true));
        check_pipeline_dropout("pipeline=2");
        check_pipeline_dropout("pipeline=2", 2);
        check_pipeline_moe("pipeline=2");
        checked += 4;
      }
      if (n == 4) {
        check_pipeline_moe("pipeline=2,data=2");
        check_pipeline_moe("pipeline=2,expert=2");
        check_pipeline_dropout("pipeline=2,data=2", 4);
        checked += 3;
      }
    }
    // Every rank learns the total, so they all exit with the same status.
    int64_t failures = g_failures;
    spmd::run_on_devices({g_rank}, [&](int d) {
      spmd::communicator().all_reduce(d, spmd::world_group(), &failures, &failures, 1, DType::Int64);
    });
    if (g_rank == 0)
      std::printf("multiprocess_train: %d ranks (%s), %zu layouts, %lld failed checks\n", n,
                  spmd::runtime_description().c_str(), checked, static_cast<long long>(failures));
    return failures == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: error: %s\n", g_rank, e.what());
    return 1;
  }
}
