#include "tessera/plan/step_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>

#include "tessera/api/jit.h"
#include "tessera/base/allocator.h"
#include "tessera/base/error.h"
#include "tessera/compiler/compile.h"
#include "tessera/core/abstract_creation.h"
#include "tessera/models/model.h"
#include "tessera/nn/param.h"
#include "tessera/optim/optimizer.h"
#include "tessera/plan/host_calibration.h"
#include "tessera/plan/systolic.h"
#include "tessera/spmd/collectives.h"
#include "tessera/spmd/partitioner.h"
#include "tessera/spmd/ragged_all_to_all.h"
#include "tessera/train/parallel.h"
#include "tessera/train/pipeline.h"
#include "tessera/train/pipeline_step.h"
#include "tessera/train/train_step.h"
#include "train/pipeline_config.h"

namespace tessera::plan {

std::string PlanLayout::mesh() const {
  std::vector<std::string> parts;
  if (pipeline > 1) parts.push_back(fmt::format("pipeline={}", pipeline));
  if (data > 1) parts.push_back(fmt::format("data={}", data));
  if (fsdp > 1) parts.push_back(fmt::format("fsdp={}", fsdp));
  if (expert > 1) parts.push_back(fmt::format("expert={}", expert));
  if (tensor > 1) parts.push_back(fmt::format("tensor={}", tensor));
  if (parts.empty()) return "data=1";
  std::string out = parts[0];
  for (size_t i = 1; i < parts.size(); ++i) out += "," + parts[i];
  return out;
}

std::string PlanLayout::name() const {
  return pipeline_micro_batches > 0 ? fmt::format("{} m={}", mesh(), pipeline_micro_batches) : mesh();
}

PlanLayout PlanLayout::parse(const std::string& layout_name) {
  // " m=N": the pipeline's micro-batches.
  std::string text = layout_name;
  int64_t micro_batches = 0;
  if (const size_t space = layout_name.find(' '); space != std::string::npos) {
    text = layout_name.substr(0, space);
    const std::string rest = layout_name.substr(space + 1);
    size_t used = 0;
    try {
      if (rest.starts_with("m=")) micro_batches = std::stoll(rest.substr(2), &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used + 2 != rest.size() || micro_batches < 1)
      fail<ConfigError>("layout '{}': after the mesh expected ' m=N' (N pipeline micro-batches, N >= 1), got '{}'",
                        layout_name, rest);
  }
  spmd::Mesh mesh = [&] {
    try {
      return spmd::Mesh::parse(text);
    } catch (const ValueError& e) {
      fail<ConfigError>("mesh '{}': {}", text, e.what());
    }
  }();
  PlanLayout layout;
  for (int a = 0; a < mesh.ndim(); ++a) {
    const std::string& name = mesh.axis_name(a);
    const int64_t size = mesh.axis_size(a);
    if (name == "data") {
      layout.data = size;
    } else if (name == "fsdp") {
      layout.fsdp = size;
    } else if (name == "tensor") {
      layout.tensor = size;
    } else if (name == "expert") {
      layout.expert = size;
    } else if (name == "pipeline") {
      layout.pipeline = size;
    } else {
      fail<ConfigError>("mesh '{}': the planner lays out the axes pipeline, data, fsdp, expert and tensor (got '{}')",
                        text, name);
    }
  }
  if (micro_batches > 0 && layout.pipeline < 2)
    fail<ConfigError>("layout '{}': pipeline micro-batches (m={}) need a pipeline axis", layout_name, micro_batches);
  layout.pipeline_micro_batches = micro_batches;
  return layout;
}

double collective_seconds(const std::string& kind, double bytes, int64_t group, int64_t stride,
                          const goodput::AcceleratorSpec& accelerator) {
  if (group <= 1 || bytes <= 0) return 0;
  if (accelerator.links.empty())
    fail<ConfigError>("{}: [{}] has no interconnect level to run collectives over", accelerator.source,
                      accelerator.key);
  double seconds = 0;
  int64_t below = 1;  // group members inside one domain of the levels already costed
  for (size_t i = 0; i < accelerator.links.size() && below < group; ++i) {
    const goodput::InterconnectLevel& level = accelerator.links[i];
    const bool last = i + 1 == accelerator.links.size();
    int64_t members = level.devices == 0 || last ? group : std::clamp<int64_t>(level.devices / stride, 1, group);
    if (members <= below) continue;
    const double f = std::ceil(static_cast<double>(members) / static_cast<double>(below));
    const double data = bytes / static_cast<double>(below);
    // A ring over f members moves (f - 1) / f of the data per pass; an all-reduce is a
    // reduce-scatter plus an all-gather. Switched networks use trees for the latency
    // (NCCL's tree all-reduce): log2 steps instead of f - 1.
    const bool ring = level.topology == "ring" || level.topology.starts_with("torus");
    const double steps = ring ? f - 1 : std::ceil(std::log2(f));
    if (kind == "all_reduce") {
      seconds += 2 * (f - 1) / f * data / level.bandwidth + 2 * steps * level.latency;
    } else if (kind == "all_gather" || kind == "reduce_scatter" || kind == "all_to_all") {
      seconds += (f - 1) / f * data / level.bandwidth + steps * level.latency;
    } else {
      fail<ValueError>("collective_seconds: unknown collective '{}'", kind);
    }
    below = members;
  }
  return seconds;
}

namespace {

// What one device can do, from the catalog or a calibrated host.
struct DeviceRates {
  double gemm_f32 = 0, gemm_16 = 0, gemm_int8 = 0;       // achievable FLOP/s of a large aligned GEMM
  double attention_forward = 0, attention_backward = 0;  // bf16 / fp16; float32 at half
  double bandwidth = 0;                                  // achievable bytes/s
  double overhead = 0;                                   // seconds per kernel
  bool measured = false;     // a calibrated host: each kernel is timed (host_kernel_seconds)
  bool serial = false;       // ... on one thread (virtual devices)
  double slowdown = 1;       // ... and shares the cores with this many times as many devices
  double step_factor = 1;    // HostRates::step_factor_one / _many (memory-bound kernels)
  double step_overhead = 0;  // HostRates::step_overhead_one / _many, per program run
  bool synchronous_collectives = false;
  double peak_for_mfu = 0;
  double capacity = 0;
};

DeviceRates rates_for(const goodput::AcceleratorSpec& acc, const HostRates* host, int64_t chips) {
  DeviceRates r;
  r.capacity = acc.memory;
  if (host != nullptr) {
    // Every kernel is timed (cost_program); what else a kernel-less node or a collective
    // costs comes from the measured stream rate and overhead. Virtual devices in one
    // process run one thread each and share the cores and the memory.
    r.capacity = acc.memory / static_cast<double>(chips);
    const KernelRates& k = chips > 1 ? host->serial : host->parallel;
    const double share = chips > host->cores ? static_cast<double>(host->cores) / static_cast<double>(chips) : 1.0;
    r.bandwidth = k.bandwidth * share;
    r.overhead = k.kernel_overhead / share;
    r.measured = true;
    r.serial = chips > 1;
    r.slowdown = 1 / share;
    r.step_factor = chips > host->cores ? host->step_factor_over
                    : chips > 1         ? host->step_factor_many
                                        : host->step_factor_one;
    r.step_overhead = chips > host->cores ? host->step_overhead_over
                      : chips > 1         ? host->step_overhead_many
                                          : host->step_overhead_one;
    r.synchronous_collectives = true;
    r.peak_for_mfu = host->parallel.gemm_flops;
    return r;
  }
  r.gemm_16 = acc.peak_flops * acc.gemm_efficiency;
  r.gemm_int8 = acc.peak_int8 * acc.gemm_efficiency;
  r.gemm_f32 = r.gemm_16 / 2;
  r.attention_forward = acc.peak_flops * acc.attention_efficiency[0];
  r.attention_backward = acc.peak_flops * acc.attention_efficiency[1];
  r.bandwidth = acc.memory_bandwidth * acc.memory_efficiency;
  r.overhead = acc.kernel_overhead;
  r.synchronous_collectives = acc.kind == "cpu";
  r.peak_for_mfu = acc.peak_flops;
  return r;
}

bool is_gemm(const std::string& name) {
  return name == "matmul" || name == "matmul_epilogue" || name == "quantized_matmul" || name == "batched_matmul" ||
         name == "linear" || name == "dot_general" || name == "grouped_matmul" || name == "grouped_matmul_weight_grad";
}

bool is_attention(const std::string& name) { return name.find("attention") != std::string::npos; }

struct NodeCost {
  std::string kind;
  double seconds = 0, utilization = 0;
};

// A GEMM's batch, m, n from its output [..., m, n] (leading dims fold into rows when
// the second operand is a 2-D weight), k from its FLOPs (2 m n k per product).
NodeCost gemm_cost(const compiler::Graph& g, const compiler::Node& node, const Cost& c, const DeviceRates& r,
                   const goodput::AcceleratorSpec& acc, bool attention) {
  const compiler::TensorType& out = g.values[static_cast<size_t>(node.outputs[0])].type;
  const Shape& s = out.shape;
  int64_t batch = 1, m = 1, n = s.empty() ? 1 : s.back();
  for (size_t i = 0; i + 2 < s.size(); ++i) batch *= s[i];
  if (s.size() >= 2) m = s[s.size() - 2];
  const Shape& qkv = g.values[static_cast<size_t>(node.inputs[0])].type.shape;
  if (attention && node.primitive->name().starts_with("attention_packed") && qkv.size() == 5) {
    // qkv [B, T, Hkv, G + 2, D]: B x Hkv x G heads of [T x T] scores over D.
    batch = qkv[0] * qkv[2] * (qkv[3] - 2);
    m = qkv[1];
    n = qkv[4];
  }
  if (!attention && node.inputs.size() >= 2 && g.values[static_cast<size_t>(node.inputs[1])].type.shape.size() == 2) {
    m *= batch;
    batch = 1;
  }
  const double outputs = static_cast<double>(batch) * static_cast<double>(m) * static_cast<double>(n);
  const int64_t k = std::max<int64_t>(1, std::llround(c.flops / (2 * std::max(outputs, 1.0))));
  const DType in = g.values[static_cast<size_t>(node.inputs[0])].type.dtype;
  const bool int8 = node.primitive->name() == "quantized_matmul" ||
                    node.primitive->attributes().find("int8=true") != std::string::npos;
  const bool f32 = in == DType::Float32 && !int8;
  const bool backward = node.primitive->name().ends_with("_grad");
  double rate = attention ? (backward ? r.attention_backward : r.attention_forward) / (f32 ? 2 : 1)
                : int8    ? r.gemm_int8
                : f32     ? r.gemm_f32
                          : r.gemm_16;
  NodeCost cost{attention ? "attention" : "gemm", 0, 1};
  // Attention's tile GEMMs: [seq x seq] scores over head_dim, per batch and head.
  const MatrixUnitUse use = attention ? matrix_unit_use(std::max<int64_t>(1, batch), m, m, std::max<int64_t>(1, n),
                                                        acc.matrix_tile, acc.matrix_units)
                                      : matrix_unit_use(batch, std::max<int64_t>(1, m), std::max<int64_t>(1, n), k,
                                                        acc.matrix_tile, acc.matrix_units);
  cost.utilization = use.utilization();
  rate *= cost.utilization;
  cost.seconds = std::max(c.flops / rate, c.bytes / r.bandwidth) + r.overhead;
  return cost;
}

struct ProgramCost {
  double compute = 0, batch_collectives = 0, tensor_collectives = 0;
  std::map<std::pair<std::string, std::string>, OpClassCost> ops;
};

// The mesh stride of a collective's group: devices between consecutive members, the
// product of the sizes of the mesh axes after its innermost axis (row-major layout).
int64_t group_stride(const spmd::Mesh& mesh, const std::vector<int>& axes) {
  int innermost = 0;
  for (int a : axes) innermost = std::max(innermost, a);
  int64_t stride = 1;
  for (int a = innermost + 1; a < mesh.ndim(); ++a) stride *= mesh.axis_size(a);
  return stride;
}

// Whether a collective over these axes is over the batch axes (data, fsdp): those can
// overlap compute; the others are on the critical path.
bool over_batch_axes(const spmd::Mesh& mesh, const std::vector<int>& axes) {
  bool over_batch = true;
  for (int a : axes) {
    const std::string& axis = mesh.axis_name(a);
    over_batch = over_batch && (axis == "data" || axis == "fsdp");
  }
  return over_batch;
}

ProgramCost cost_program(const compiler::Graph& g, const DeviceRates& r, const goodput::AcceleratorSpec& acc) {
  ProgramCost out;
  std::vector<Array> handles(g.values.size());
  auto handle = [&](compiler::ValueId v) -> const Array& {
    Array& h = handles[static_cast<size_t>(v)];
    if (!h.valid()) {
      const compiler::Value& value = g.values[static_cast<size_t>(v)];
      h = value.kind == compiler::ValueKind::Constant ? value.constant
                                                      : Array::placeholder(value.type.shape, value.type.dtype);
    }
    return h;
  };
  for (const compiler::Node& node : g.nodes) {
    if (node.dead) continue;
    std::vector<Array> ins, outs;
    for (compiler::ValueId v : node.inputs) ins.push_back(handle(v));
    for (compiler::ValueId v : node.outputs) outs.push_back(handle(v));
    const std::string name = node.primitive->name();
    const Cost c = node.primitive->cost(ins, outs);
    NodeCost cost;
    double sent = c.bytes;
    const auto* coll = dynamic_cast<const spmd::Collective*>(node.primitive.get());
    if (const auto* ragged = dynamic_cast<const spmd::RaggedAllToAll*>(node.primitive.get())) {
      // Expert parallelism's dropless dispatch or combine: timed as an all-to-all of the
      // groups' rows with the router spreading them evenly ((S-1)/S of them leave).
      const compiler::ValueId side = ragged->combine() ? node.outputs[0] : node.inputs[0];
      const double bytes = static_cast<double>(g.values[static_cast<size_t>(side)].type.nbytes());
      cost.kind = "collective";
      cost.seconds = collective_seconds("all_to_all", bytes, ragged->group_size(),
                                        group_stride(ragged->mesh(), ragged->axes()), acc);
      sent = ragged->planned_bytes(bytes);
      (over_batch_axes(ragged->mesh(), ragged->axes()) ? out.batch_collectives : out.tensor_collectives) +=
          cost.seconds;
    } else if (coll != nullptr && coll->kind() != spmd::CollectiveKind::ShardSlice &&
               coll->kind() != spmd::CollectiveKind::ShardPad) {
      const compiler::TensorType& in = g.values[static_cast<size_t>(node.inputs[0])].type;
      const compiler::TensorType& res = g.values[static_cast<size_t>(node.outputs[0])].type;
      const double bytes =
          static_cast<double>(coll->kind() == spmd::CollectiveKind::AllGather ? res.nbytes() : in.nbytes());
      cost.kind = "collective";
      cost.seconds = collective_seconds(name, bytes, coll->group_size(), group_stride(coll->mesh(), coll->axes()), acc);
      const int64_t n = coll->group_size();
      sent = bytes * static_cast<double>(n - 1) / static_cast<double>(n) * (name == "all_reduce" ? 2 : 1);
      (over_batch_axes(coll->mesh(), coll->axes()) ? out.batch_collectives : out.tensor_collectives) += cost.seconds;
    } else if (coll != nullptr) {
      // shard_slice / shard_pad: this device's block, a local copy.
      cost.kind = "memory";
      cost.seconds = c.bytes / r.bandwidth + r.overhead;
    } else if (node.primitive->aliases_input(0) >= 0) {
      cost.kind = "view";  // no kernel: the output is a view of an input
    } else if (r.measured) {
      cost.kind = is_attention(name) && c.flops > 0 ? "attention" : is_gemm(name) && c.flops > 0 ? "gemm" : "memory";
      // A GEMM timed alone is what it takes in the step (compute-bound: cold inputs cost
      // it little); the step factor is for the memory-bound kernels.
      const bool compute = cost.kind != "memory";
      cost.seconds = host_kernel_seconds(g, node, r.serial) * r.slowdown * (compute ? 1.0 : r.step_factor);
      cost.utilization = 1;
    } else if (is_attention(name) && c.flops > 0) {
      cost = gemm_cost(g, node, c, r, acc, /*attention=*/true);
    } else if (is_gemm(name) && c.flops > 0) {
      cost = gemm_cost(g, node, c, r, acc, /*attention=*/false);
    } else {
      cost.kind = "memory";
      cost.seconds = c.bytes / r.bandwidth + r.overhead;
    }
    if (cost.kind == "view") continue;
    if (cost.kind != "collective") out.compute += cost.seconds;
    OpClassCost& agg = out.ops[{name, cost.kind}];
    agg.op = name;
    agg.kind = cost.kind;
    agg.kernels += 1;
    agg.flops += cost.kind == "collective" ? 0 : c.flops;
    agg.bytes += sent;
    agg.seconds += cost.seconds;
    agg.utilization += cost.utilization * c.flops;  // FLOP-weighted; divided at the end
  }
  return out;
}

// Placeholders with the optimizer state's types: init run with creation ops that make
// placeholders (nothing allocated, whatever the model's size).
Tree abstract_opt_state(const optim::Optimizer& optimizer, const Tree& params) {
  AbstractCreationScope abstract;
  return optimizer.init(params);
}

// What a block of `bytes` takes on a CPU device: the host allocator's capacity (none for
// an empty arena).
double host_block_bytes(size_t bytes) { return static_cast<double>(bytes > 0 ? buffer_capacity(bytes) : 0); }

using OpTable = std::map<std::pair<std::string, std::string>, OpClassCost>;

// Adds `runs` runs of a program's per-op costs to a step's table.
void add_ops(OpTable& table, const ProgramCost& cost, double runs) {
  for (const auto& [key, v] : cost.ops) {
    OpClassCost& agg = table[key];
    agg.op = v.op;
    agg.kind = v.kind;
    agg.kernels += static_cast<int64_t>(std::llround(runs * static_cast<double>(v.kernels)));
    agg.flops += runs * v.flops;
    agg.bytes += runs * v.bytes;
    agg.seconds += runs * v.seconds;
    agg.utilization += runs * v.utilization;
  }
}

// A program's collective seconds on the critical path, per run. Tensor-axis collectives
// sit between the kernels that need them: exposed. The runtime hides up to
// collective_overlap of the batch-axis ones under compute.
double exposed_seconds(const ProgramCost& cost, const DeviceRates& rates, const goodput::AcceleratorSpec& acc) {
  double exposed = cost.tensor_collectives + cost.batch_collectives;
  if (!rates.synchronous_collectives)
    exposed -= std::min(acc.collective_overlap * cost.batch_collectives, cost.compute);
  return exposed;
}

// What every estimate takes from the prepared step and the device.
StepEstimate start_estimate(const PreparedStep& prepared, const goodput::AcceleratorSpec& accelerator,
                            const DeviceRates& rates) {
  StepEstimate est;
  est.accelerator = accelerator.key;
  est.layout = prepared.layout;
  est.global_batch = prepared.global_batch;
  est.seq = prepared.seq;
  est.micro_batches = prepared.micro_batches;
  est.remat = prepared.remat;
  // A CPU device's tensors and arenas are blocks of tessera's host allocator.
  est.memory = accelerator.kind == "cpu" ? prepared.host_memory : prepared.memory;
  est.memory_capacity = rates.capacity;
  return est;
}

// The op table by time, throughput, MFU and fit, once step_seconds is known.
void finish_estimate(StepEstimate& est, OpTable& ops, const PreparedStep& prepared, const DeviceRates& rates) {
  for (auto& [key, v] : ops) {
    if (v.flops > 0) v.utilization /= v.flops;
    est.ops.push_back(v);
  }
  std::sort(est.ops.begin(), est.ops.end(), [](const OpClassCost& a, const OpClassCost& b) {
    return a.seconds != b.seconds ? a.seconds > b.seconds : a.op < b.op;
  });
  est.model_flops = prepared.model_flops;
  est.tokens_per_second =
      static_cast<double>(prepared.global_batch) * static_cast<double>(prepared.seq) / est.step_seconds;
  est.mfu = est.model_flops / (est.step_seconds * static_cast<double>(prepared.layout.chips()) * rates.peak_for_mfu);
  est.fits = est.memory.peak <= est.memory_capacity;
}

// The validation program's arena (train::Evaluator: the loss on a micro-batch) under `tl`.
size_t eval_arena_bytes(const models::Model& model, const train::Layout& tl, const spmd::Mesh& mesh,
                        const data::Batch& batch, const compiler::CompileOptions& compile) {
  const Tree args{{"params", model.placeholders()}, {"targets", batch.targets}, {"tokens", batch.tokens}};
  const JitFn loss = [&model](const Tree& a, const StaticArgs&) {
    return Tree(model.loss(a.at("params"), a.at("tokens").leaf(), a.at("targets").leaf()));
  };
  compiler::Graph eval = trace(loss, args);
  if (!tl.splits_nothing()) {
    spmd::PartitionOptions popts;
    popts.parameter_names = args.paths();
    eval = spmd::partition(eval, mesh, tl.shardings_for(args), {}, popts).local;
  }
  return compiler::optimize(std::move(eval), compile).plan.arena_bytes;
}

// A pipeline layout (train/pipeline_step.h): each stage's forward and backward program
// (partitioned over the other axes when those split), the optimizer update, and the
// memory a chip holds, a process per chip: the parameters its stages read and their
// optimizer state (stage-local; its shards of them when the stages are partitioned,
// PipelineTrainStep::shards_state: Adafactor's factored rows and Muon's update are costed
// on the shards' shapes, a little under the whole rows and gathered matrices a process
// uses), their gradients twice (a stage's sum over micro-batches
// and the next backward's), its stages' program arenas, the stage inputs of the
// micro-batches it holds at once (the schedule's peak), the buffers of its sends (until
// the pass ends), its update's arena, and for a model
// with a step key the evaluation forwards' arenas (evaluation runs the stages' forwards,
// without the key). The chip of the pipeline coordinate that holds the most is reported.
PreparedStep prepare_pipeline_step(const train::TrainConfig& config, const PlanLayout& layout,
                                   const compiler::CompileOptions& compile) {
  train::TrainConfig c = config;
  c.parallel.mesh = layout.mesh();
  if (layout.pipeline_micro_batches > 0) c.parallel.pipeline_micro_batches = layout.pipeline_micro_batches;
  const std::optional<train::PipelinePlan> plan = train::pipeline_plan(c);
  if (!plan) fail<ConfigError>("plan: mesh {} has no pipeline axis", layout.mesh());
  const models::Model model(config.model);
  const optim::Optimizer optimizer(config.optimizer_config(), model.specs());
  const train::PipelineExecutor executor(model, plan->options, config.loop.seq);
  const Tree params = model.placeholders();
  const int64_t rows = config.micro_batch_size() / plan->replicas;
  const int64_t k = config.micro_batches();

  PreparedStep prepared;
  prepared.layout = layout;
  prepared.layout.pipeline_micro_batches = executor.schedule().micro_batches;  // resolved
  prepared.global_batch = config.loop.batch;
  prepared.seq = config.loop.seq;
  prepared.micro_batches = k;
  prepared.remat = config.model.remat;
  prepared.model_flops = model.flops_per_token(config.loop.seq) * static_cast<double>(config.loop.batch) *
                         static_cast<double>(config.loop.seq);
  PreparedPipeline pipe;
  pipe.kind = executor.schedule().kind;
  pipe.devices = executor.schedule().devices;
  pipe.micro_batches = executor.schedule().micro_batches;
  pipe.virtual_stages = executor.schedule().virtual_stages;
  pipe.accumulation = k;
  pipe.stage_layers = executor.stage_layers();
  pipe.devices_per_stage = executor.devices_per_stage();

  const int stages = executor.schedule().stages(), p = pipe.devices, m = pipe.micro_batches;
  const train::PipelineTimeline replay = train::simulate(executor.schedule());  // the peak in flight per device
  std::vector<double> arenas(static_cast<size_t>(p), 0), host_arenas(static_cast<size_t>(p), 0);
  // A model with a step key evaluates with its own keyless forwards (their arenas too).
  const bool keyless_eval = config.model.needs_step_key();
  std::vector<double> eval_arenas(static_cast<size_t>(p), 0), host_eval_arenas(static_cast<size_t>(p), 0);
  const bool packed = config.data.uses_pipeline() && config.data.pipeline.packing == "documents";
  std::vector<train::PipelineExecutor::StageGraphs> graphs =
      executor.trace_stages(params, Shape{rows, config.loop.seq}, packed);
  for (int s = 0; s < stages; ++s) {
    train::PipelineExecutor::StageGraphs& g = graphs[static_cast<size_t>(s)];
    const auto d = static_cast<size_t>(s % p);
    double residual_host_bytes = 0;  // the backward's first parameters are the residuals
    for (size_t i = 0; i < g.residuals; ++i)
      residual_host_bytes += host_block_bytes(g.backward.type(g.backward.parameters[i]).nbytes());
    pipe.input_bytes.push_back(g.input_bytes);
    for (const bool forward : {true, false}) {
      compiler::OptimizedProgram optimized =
          compiler::optimize(std::move(forward ? g.forward : g.backward), compile,
                             std::vector<bool>((forward ? g.forward_names : g.backward_names).size(), false));
      arenas[d] += static_cast<double>(optimized.plan.arena_bytes);
      host_arenas[d] += host_block_bytes(optimized.plan.arena_bytes);
      if (forward && keyless_eval) {
        eval_arenas[d] += static_cast<double>(optimized.plan.arena_bytes);
        host_eval_arenas[d] += host_block_bytes(optimized.plan.arena_bytes);
      }
      PreparedProgram program;
      program.name = fmt::format("stage{}_{}", s, forward ? "forward" : "backward");
      program.runs_per_step = static_cast<double>(m * k);
      program.graph = std::move(optimized.graph);
      (forward ? pipe.forward : pipe.backward).push_back(prepared.programs.size());
      prepared.programs.push_back(std::move(program));
    }
    // The stage inputs a device keeps (and without recompute the activations its forward
    // kept for the backward, each its own block): its peak of micro-batches in flight.
    arenas[d] += (g.input_bytes + g.residual_bytes) * replay.peak_in_flight[d];
    host_arenas[d] +=
        (host_block_bytes(static_cast<size_t>(g.input_bytes)) + residual_host_bytes) * replay.peak_in_flight[d];
  }
  // A process's point-to-point sends keep their buffers until the step's pass ends
  // (Communicator::wait_sends): every micro-batch's output of a stage with a next one and
  // input gradient of a stage with a previous one.
  for (int s = 0; s < stages; ++s) {
    const auto d = static_cast<size_t>(s % p);
    std::vector<double> sent;
    if (s + 1 < stages) sent.push_back(pipe.input_bytes[static_cast<size_t>(s + 1)]);
    if (s > 0) sent.push_back(pipe.input_bytes[static_cast<size_t>(s)]);
    for (const double bytes : sent) {
      arenas[d] += m * bytes;
      host_arenas[d] += m * host_block_bytes(static_cast<size_t>(bytes));
    }
  }
  // Per pipeline coordinate: what its chips hold, and its update (the optimizer on those
  // parameters, given the whole model's squared gradient norm).
  const bool tied = model.config().resolved_tied();
  const std::vector<Array> leaves = params.leaves();
  std::vector<std::vector<bool>> reads;
  for (int d = 0; d < p; ++d) reads.push_back(train::device_reads(params, pipe.stage_layers, p, d, tied));
  const int64_t chips_per_coordinate = layout.chips() / p;
  // Partitioned stages: a chip keeps its shards of the state.
  const bool sharded_state = train::PipelineTrainStep::shards_state(plan->options, config.optimizer_config().name);
  const std::vector<std::string> paths = params.paths();
  std::vector<Array> held_leaves = leaves;  // what a chip keeps of each parameter
  if (sharded_state)
    for (size_t i = 0; i < leaves.size(); ++i)
      held_leaves[i] =
          Array::placeholder(executor.param_sharding(paths[i])->local_shape(leaves[i].shape()), leaves[i].dtype());
  const Tree held_params = params.with_leaves(held_leaves);
  double best_peak = -1;
  bool have_update = false;
  for (int d = 0; d < p; ++d) {
    const std::vector<bool>& held = reads[static_cast<size_t>(d)];
    const Tree mine = train::PipelineTrainStep::select(held_params, held);
    const Tree opt_state = abstract_opt_state(optimizer, mine);
    const Tree args{{"grads", mine},
                    {"lr", Array::placeholder({}, DType::Float32)},
                    {"opt", opt_state},
                    {"params", mine},
                    {"squared_norm", Array::placeholder({}, DType::Float64)}};
    const JitFn update = [&optimizer](const Tree& a, const StaticArgs&) {
      const optim::Optimizer::Update u =
          optimizer.apply(a.at("params"), a.at("grads"), a.at("opt"), a.at("lr").leaf(), a.at("squared_norm").leaf());
      return Tree{{"opt", u.state}, {"params", u.params}};
    };
    compiler::OptimizedProgram optimized = compiler::optimize(trace(update, args), compile, {});
    std::array<MemoryBreakdown, 2> mem;  // device, host
    for (const bool host : {false, true}) {
      MemoryBreakdown& breakdown = mem[host ? 1 : 0];
      const auto block = [host](double bytes) { return host ? host_block_bytes(static_cast<size_t>(bytes)) : bytes; };
      for (const Array& leaf : mine.leaves()) breakdown.parameters += block(static_cast<double>(leaf.nbytes()));
      for (const Array& leaf : opt_state.leaves()) breakdown.optimizer += block(static_cast<double>(leaf.nbytes()));
      breakdown.gradients = 2 * breakdown.parameters;
      breakdown.activations = (host ? host_arenas : arenas)[static_cast<size_t>(d)] +
                              block(static_cast<double>(optimized.plan.arena_bytes));
      breakdown.eval = (host ? host_eval_arenas : eval_arenas)[static_cast<size_t>(d)];
      breakdown.peak =
          breakdown.parameters + breakdown.optimizer + breakdown.gradients + breakdown.activations + breakdown.eval;
    }
    if (!(mem[0].peak > best_peak)) continue;
    best_peak = mem[0].peak;
    prepared.memory = mem[0];
    prepared.host_memory = mem[1];
    pipe.gradient_reductions.clear();
    for (size_t i = 0; i < leaves.size(); ++i) {
      if (!held[i]) continue;
      int64_t coordinates = 0;
      for (const std::vector<bool>& r : reads) coordinates += r[i] ? 1 : 0;
      // Sharded state: a piece's gradient is complete in its stage; only a tied
      // embedding's are summed, between its stages' chips of the same piece.
      pipe.gradient_reductions.emplace_back(static_cast<double>(held_leaves[i].nbytes()),
                                            sharded_state ? coordinates : coordinates * chips_per_coordinate);
    }
    PreparedProgram program;
    program.name = "pipeline_update";
    program.runs_per_step = 1;
    program.graph = std::move(optimized.graph);
    if (!have_update) {
      pipe.update = prepared.programs.size();
      prepared.programs.push_back(std::move(program));
      have_update = true;
    } else {
      prepared.programs[pipe.update] = std::move(program);
    }
  }
  prepared.pipeline = std::move(pipe);
  return prepared;
}

// A pipeline layout's step: each stage program costed as a program, the schedule
// replayed with those costs (a hop between stage devices: the stage input over the
// innermost link), times the accumulation steps; then the update and, with a process
// per chip (not on a CPU host, which runs the pipeline as threads of one process), the
// all-reduces of each held parameter's gradient over the chips that hold it.
StepEstimate cost_pipeline_step(const PreparedStep& prepared, const goodput::AcceleratorSpec& accelerator,
                                const DeviceRates& rates) {
  const PreparedPipeline& pipe = *prepared.pipeline;
  const int64_t chips = prepared.layout.chips();
  StepEstimate est = start_estimate(prepared, accelerator, rates);
  OpTable ops;
  auto program_seconds = [&](size_t index, double runs, bool counted, double* collectives) {
    const PreparedProgram& program = prepared.programs[index];
    const ProgramCost cost = cost_program(program.graph, rates, accelerator);
    if (counted) {
      *collectives += runs * (cost.batch_collectives + cost.tensor_collectives);
      add_ops(ops, cost, runs);
      est.programs.push_back(fmt::format("{} x{}", program.name, runs));
    }
    return cost.compute + rates.step_overhead + exposed_seconds(cost, rates, accelerator);
  };
  const train::PipelineSchedule schedule =
      train::make_pipeline_schedule(pipe.kind, pipe.devices, pipe.micro_batches, pipe.virtual_stages);
  const int stages = schedule.stages();
  const double runs = static_cast<double>(pipe.micro_batches * pipe.accumulation);
  std::vector<double> forward(static_cast<size_t>(stages)), backward(static_cast<size_t>(stages));
  double collectives = 0;
  for (int s = 0; s < stages; ++s) {
    const bool device_0 = s % pipe.devices == 0;  // the ops table shows pipeline device 0's programs
    forward[static_cast<size_t>(s)] =
        program_seconds(pipe.forward[static_cast<size_t>(s)], runs, device_0, &collectives);
    backward[static_cast<size_t>(s)] =
        program_seconds(pipe.backward[static_cast<size_t>(s)], runs, device_0, &collectives);
  }
  // A hop moves a stage input from one pipeline coordinate to the next: a point-to-point
  // send of its bytes, costed as a 2-member all-gather (one block each way). The replay
  // takes one hop time for every boundary: the slowest, which crosses from one
  // interconnect domain to the next when the pipeline spans several (the members then a
  // domain apart).
  double input = 0;
  for (double b : pipe.input_bytes) input = std::max(input, b);
  const int64_t domain =
      accelerator.links.empty() || accelerator.links[0].devices == 0 ? chips : accelerator.links[0].devices;
  const int64_t apart = chips > domain ? std::max(pipe.devices_per_stage, domain) : pipe.devices_per_stage;
  const double hop = chips > 1 ? collective_seconds("all_gather", 2 * input, 2, apart, accelerator) : 0;
  const train::PipelineTimeline timeline = train::simulate(schedule, forward, backward, hop);
  double update_collectives = 0;
  const double update = program_seconds(pipe.update, 1, true, &update_collectives);
  // One all-reduce per parameter the chip holds, over the chips that hold it
  // (train/pipeline_step.h); none has a peer without data replicas, but for a tied embedding.
  double all_reduce = 0, reduced_bytes = 0;
  int64_t reductions = 0;
  if (accelerator.kind != "cpu")
    for (const auto& [bytes, members] : pipe.gradient_reductions) {
      if (members < 2) continue;
      all_reduce += collective_seconds("all_reduce", bytes, members, 1, accelerator);
      reduced_bytes += 2 * bytes * static_cast<double>(members - 1) / static_cast<double>(members);
      ++reductions;
    }
  est.pipeline_bubble = timeline.bubble_fraction;
  est.compute_seconds = static_cast<double>(pipe.accumulation) * timeline.busy / pipe.devices + update;
  est.collective_seconds = collectives + all_reduce;
  est.exposed_collective_seconds = all_reduce;
  est.step_seconds = static_cast<double>(pipe.accumulation) * timeline.makespan + update + all_reduce;
  if (all_reduce > 0) {
    OpClassCost& agg = ops[{"all_reduce (gradients, holders)", "collective"}];
    agg.op = "all_reduce (gradients, holders)";
    agg.kind = "collective";
    agg.kernels += reductions;
    agg.bytes += reduced_bytes;
    agg.seconds += all_reduce;
  }
  finish_estimate(est, ops, prepared, rates);
  return est;
}

}  // namespace

compiler::CompileOptions compile_options_for(const goodput::AcceleratorSpec& accelerator) {
  return compiler::for_device(accelerator.kind == "gpu");
}

PreparedStep prepare_step(const train::TrainConfig& config, const PlanLayout& layout,
                          const compiler::CompileOptions& compile) {
  if (layout.pipeline > 1) return prepare_pipeline_step(config, layout, compile);
  const int64_t chips = layout.chips();
  if (chips < 1) fail<ConfigError>("plan: a layout needs at least one chip (mesh {})", layout.mesh());
  const models::Model model(config.model);
  const optim::Optimizer optimizer(config.optimizer_config(), model.specs());
  const spmd::Mesh mesh = spmd::Mesh::parse(layout.mesh());
  const train::Layout tl = chips == 1
                               ? train::Layout::one_device(model.specs())
                               : train::Layout(mesh, train::parse_axis_rules(config.parallel.rules), model.specs());
  const int64_t micro = config.micro_batch_size();
  if (micro % tl.data_parallel_size() != 0)
    fail<ConfigError>("plan: the micro-batch of {} sequences does not split over {} data-parallel devices (mesh {})",
                      micro, tl.data_parallel_size(), layout.mesh());

  const Tree params = model.placeholders();
  const Tree opt_state = abstract_opt_state(optimizer, params);
  data::Batch batch;
  batch.tokens = Array::placeholder({micro, config.loop.seq}, DType::Int32);
  batch.targets = Array::placeholder({micro, config.loop.seq}, DType::Int32);
  std::optional<Array> key;
  if (config.model.needs_step_key()) key = nn::param_key(0, "dropout/0");
  const train::TrainStep step(model, optimizer, config.micro_batches(), &tl);

  PreparedStep prepared;
  prepared.layout = layout;
  prepared.global_batch = config.loop.batch;
  prepared.seq = config.loop.seq;
  prepared.micro_batches = config.micro_batches();
  prepared.remat = config.model.remat;
  const double tokens = static_cast<double>(config.loop.batch) * static_cast<double>(config.loop.seq);
  prepared.model_flops = model.flops_per_token(config.loop.seq) * tokens;
  for (train::TracedProgram& program : step.trace_programs(params, opt_state, batch, key)) {
    compiler::Graph local = std::move(program.graph);
    if (!tl.splits_nothing()) {
      spmd::PartitionOptions popts;
      popts.parameter_names = program.parameter_names;
      local = spmd::partition(local, mesh, program.parameter_shardings, program.output_shardings, popts).local;
    }
    compiler::OptimizedProgram optimized = compiler::optimize(std::move(local), compile, program.donated);
    PreparedProgram p;
    p.name = program.name;
    p.runs_per_step = program.runs_per_step;

    // Memory: each program keeps its own arena for the whole run (they are allocated when
    // compiled), so the arenas add up; the training state (parameters, optimizer state,
    // the gradient accumulator) is the largest set any program takes.
    for (const bool host : {false, true}) {
      const auto block = [host](size_t bytes) { return host ? host_block_bytes(bytes) : static_cast<double>(bytes); };
      MemoryBreakdown& m = host ? prepared.host_memory : prepared.memory;
      m.activations += block(optimized.plan.arena_bytes);
      m.host += block(optimized.plan.host_arena_bytes);
      double parameters = 0, optimizer_state = 0, gradients = 0;
      for (size_t i = 0; i < optimized.graph.parameters.size() && i < program.parameter_names.size(); ++i) {
        const double bytes =
            block(optimized.graph.values[static_cast<size_t>(optimized.graph.parameters[i])].type.nbytes());
        const std::string& name = program.parameter_names[i];
        if (name.starts_with("params.")) parameters += bytes;
        if (name.starts_with("opt.")) optimizer_state += bytes;
        if (name.starts_with("grads.")) gradients += bytes;
      }
      m.parameters = std::max(m.parameters, parameters);
      m.optimizer = std::max(m.optimizer, optimizer_state);
      m.gradients = std::max(m.gradients, gradients);
    }
    p.graph = std::move(optimized.graph);
    prepared.programs.push_back(std::move(p));
  }
  // The validation program (train::Evaluator: the loss on a micro-batch, the same layout).
  const size_t eval = eval_arena_bytes(model, tl, mesh, batch, compile);
  prepared.memory.eval = static_cast<double>(eval);
  prepared.host_memory.eval = host_block_bytes(eval);
  for (MemoryBreakdown* m : {&prepared.memory, &prepared.host_memory})
    m->peak = m->parameters + m->optimizer + m->gradients + m->activations + m->eval;
  return prepared;
}

StepEstimate cost_step(const PreparedStep& prepared, const goodput::AcceleratorSpec& accelerator,
                       const StepModelOptions& options) {
  const DeviceRates rates = rates_for(accelerator, options.host, prepared.layout.chips());
  if (prepared.pipeline) return cost_pipeline_step(prepared, accelerator, rates);
  StepEstimate est = start_estimate(prepared, accelerator, rates);
  OpTable ops;
  for (const PreparedProgram& program : prepared.programs) {
    const ProgramCost cost = cost_program(program.graph, rates, accelerator);
    const double runs = program.runs_per_step;
    est.compute_seconds += runs * (cost.compute + rates.step_overhead);
    est.collective_seconds += runs * (cost.batch_collectives + cost.tensor_collectives);
    est.exposed_collective_seconds += runs * exposed_seconds(cost, rates, accelerator);
    add_ops(ops, cost, runs);
    est.programs.push_back(fmt::format("{} x{}", program.name, runs));
  }
  est.step_seconds = est.compute_seconds + est.exposed_collective_seconds;
  finish_estimate(est, ops, prepared, rates);
  return est;
}

StepEstimate estimate_step(const train::TrainConfig& config, const PlanLayout& layout,
                           const goodput::AcceleratorSpec& accelerator, const StepModelOptions& options) {
  return cost_step(prepare_step(config, layout, compile_options_for(accelerator)), accelerator, options);
}

}  // namespace tessera::plan
