#include "tessera/plan/host_calibration.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <mutex>

#include "tessera/api/jit.h"
#include "tessera/base/error.h"
#include "tessera/base/thread_pool.h"
#include "tessera/compiler/compile.h"
#include "tessera/core/ops.h"
#include "tessera/models/model.h"
#include "tessera/nn/param.h"
#include "tessera/optim/optimizer.h"
#include "tessera/plan/step_model.h"
#include "tessera/spmd/runtime.h"
#include "tessera/train/config.h"
#include "tessera/train/parallel.h"
#include "tessera/train/train_step.h"

namespace tessera::plan {
namespace {

using Clock = std::chrono::steady_clock;

struct Program {
  std::unique_ptr<compiler::Executable> exe;
  std::vector<Array> args;
  // More copies of the arguments, cycled through by time_run (kernel timing): in a program
  // a kernel's inputs come from other kernels, not from the cache its last run warmed.
  std::vector<std::vector<Array>> more_args;
};

// Arguments cycled through so that each run reads inputs the previous runs did not touch:
// at least this many bytes of them (several times a core's L2).
constexpr double kColdInputBytes = 16e6;
constexpr int kMaxInputCopies = 16;

// fn traced on arguments of these shapes and compiled without fusion (every op its own
// kernel, as the calibration counts them).
Program build(const std::function<std::vector<Array>(const std::vector<Array>&)>& fn,
              const std::vector<std::pair<Shape, DType>>& shapes) {
  std::vector<Tree> leaves;
  Program p;
  for (const auto& [shape, dtype] : shapes) {
    leaves.emplace_back(Array::placeholder(shape, dtype));
    p.args.push_back(astype(full(shape, 0.01), dtype).eval());
  }
  const JitFn jfn = [&fn](const Tree& a, const StaticArgs&) {
    std::vector<Tree> outs;
    for (const Array& o : fn(a.leaves())) outs.emplace_back(o);
    return Tree::list(std::move(outs));
  };
  compiler::CompileOptions options;
  options.fuse = false;
  p.exe = compiler::compile(trace(jfn, Tree::list(std::move(leaves))), options);
  return p;
}

// Seconds per run: the best of `trials` trials of repeated runs (each at least
// `min_seconds`).
double time_run(Program& p, double min_seconds = 0.02, int trials = 3) {
  p.exe->run(p.args);  // warm-up
  double best = 1e30;
  for (int trial = 0; trial < trials; ++trial) {
    int runs = 0;
    const Clock::time_point start = Clock::now();
    double elapsed = 0;
    do {
      const size_t copy = static_cast<size_t>(runs) % (p.more_args.size() + 1);
      p.exe->run(copy == 0 ? p.args : p.more_args[copy - 1]);
      ++runs;
      elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    } while (elapsed < min_seconds);
    best = std::min(best, elapsed / runs);
  }
  return best;
}

// Fits seconds = overhead-free time of f FLOPs to rate(f) = r f / (f + h), i.e.
// t = f / r + h / r: least squares of t against f over the samples.
std::pair<double, double> fit_curve(const std::vector<std::pair<double, double>>& flops_seconds) {
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const auto& [f, t] : flops_seconds) {
    n += 1;
    sx += f;
    sy += t;
    sxx += f * f;
    sxy += f * t;
  }
  const double slope = (n * sxy - sx * sy) / (n * sxx - sx * sx);  // 1 / r
  const double intercept = (sy - slope * sx) / n;                  // h / r
  const double r = 1 / std::max(slope, 1e-30);
  return {r, std::max(0.0, intercept) * r};
}

KernelRates measure(DType dtype) {
  KernelRates k;
  // Per-kernel overhead: a chain of tiny ops.
  {
    constexpr int kOps = 64;
    Program p = build(
        [](const std::vector<Array>& a) {
          Array x = a[0];
          for (int i = 0; i < kOps; ++i) x = i % 2 == 0 ? x * 1.0001 : x + 0.5;
          return std::vector<Array>{x};
        },
        {{{16}, DType::Float32}});
    k.kernel_overhead = time_run(p) / static_cast<double>(p.exe->stats().kernels);
  }
  // Bandwidth: the same chain on arrays far larger than the caches, bytes as the cost
  // model counts them.
  {
    Program p = build(
        [](const std::vector<Array>& a) {
          Array x = a[0];
          for (int i = 0; i < 6; ++i) x = i % 2 == 0 ? x * 1.0001 : x + 0.5;
          return std::vector<Array>{x};
        },
        {{{4 << 20}, DType::Float32}});
    const double t = time_run(p) - k.kernel_overhead * static_cast<double>(p.exe->stats().kernels);
    k.bandwidth = p.exe->stats().bytes_moved / std::max(t, 1e-9);
  }
  // GEMMs in the compute dtype.
  {
    std::vector<std::pair<double, double>> samples;
    for (int64_t n : {64, 128, 256, 512}) {
      Program p = build([](const std::vector<Array>& a) { return std::vector<Array>{matmul(a[0], a[1])}; },
                        {{{n, n}, dtype}, {{n, n}, dtype}});
      const double t = time_run(p) - k.kernel_overhead * static_cast<double>(p.exe->stats().kernels);
      samples.emplace_back(p.exe->stats().flops, std::max(t, 1e-9));
    }
    std::tie(k.gemm_flops, k.gemm_half_flops) = fit_curve(samples);
  }
  return k;
}

// Filled arrays of these types: small floats, index 0 for integer arrays (a valid index
// of any gather or target), 1 for integer scalars (step counters are 1-based), false for
// booleans.
Array filled(const compiler::TensorType& type) {
  if (type.dtype != DType::Bool && !is_floating(type.dtype) && type.shape.empty())
    return full(type.shape, 1, type.dtype).eval();
  if (!is_floating(type.dtype)) return zeros(type.shape, type.dtype).eval();
  return astype(full(type.shape, 0.01), type.dtype).eval();
}

double host_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0;
}

}  // namespace

goodput::AcceleratorSpec HostRates::accelerator() const {
  goodput::AcceleratorSpec a;
  a.key = "host";
  a.name = fmt::format("this CPU host ({} cores, measured)", cores);
  a.kind = "cpu";
  a.peak_flops = parallel.gemm_flops;
  a.dtype = dtype + " measured GEMM";
  a.peak_int8 = parallel.gemm_flops;
  a.memory = host_memory_bytes();
  a.memory_bandwidth = parallel.bandwidth;
  a.matrix_tile = {1, 1, 1};
  a.matrix_units = cores;
  a.gemm_efficiency = 1;
  a.attention_efficiency = {1, 1};  // unused: every kernel of a host plan is timed
  a.memory_efficiency = 1;
  a.kernel_overhead = parallel.kernel_overhead;
  a.links.push_back({"shared memory", 0, collective_bandwidth, collective_latency, "switch"});
  a.source = "measured by tessera plan (plan/host_calibration.h)";
  return a;
}

std::string HostRates::text() const {
  auto rates = [](const char* label, const KernelRates& k) {
    return fmt::format("  {:<9} GEMM {:.1f} GFLOP/s (half at {:.2g} FLOP), stream {:.1f} GB/s, {:.1f} us per kernel\n",
                       label, k.gemm_flops / 1e9, k.gemm_half_flops, k.bandwidth / 1e9, k.kernel_overhead * 1e6);
  };
  return fmt::format("host calibration ({} cores, {} GEMMs, {:.2f} s):\n", cores, dtype, seconds) +
         rates("1 thread", serial) + rates("threads", parallel) +
         fmt::format(
             "  collectives {:.1f} GB/s, {:.1f} us per step; a step takes {:.1f} ms + its GEMMs + "
             "{:.2f}x its other kernels on one device, {:.1f} ms + {:.2f}x on one virtual device per "
             "core, {:.1f} ms + {:.2f}x on two per core\n",
             collective_bandwidth / 1e9, collective_latency * 1e6, step_overhead_one * 1e3, step_factor_one,
             step_overhead_many * 1e3, step_factor_many, step_overhead_over * 1e3, step_factor_over);
}

double host_kernel_seconds(const compiler::Graph& graph, const compiler::Node& node, bool serial) {
  static std::mutex mutex;
  static std::map<std::string, double> cache;
  std::string key =
      fmt::format("{}{} {}(", serial ? "serial " : "", node.primitive->name(), node.primitive->attributes());
  for (compiler::ValueId v : node.inputs) {
    const compiler::Value& value = graph.values[static_cast<size_t>(v)];
    key += compiler::to_string(value.type) + (value.kind == compiler::ValueKind::Constant ? "c," : ",");
  }
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  compiler::Graph one;
  Program p;
  std::vector<compiler::ValueId> inputs;
  for (compiler::ValueId v : node.inputs) {
    const compiler::Value& value = graph.values[static_cast<size_t>(v)];
    if (value.kind == compiler::ValueKind::Constant) {
      inputs.push_back(one.add_constant(value.constant));
    } else {
      inputs.push_back(one.add_parameter(value.type));
      p.args.push_back(filled(value.type));
    }
  }
  std::vector<compiler::TensorType> types;
  for (compiler::ValueId v : node.outputs) types.push_back(graph.values[static_cast<size_t>(v)].type);
  one.outputs = one.add_node(node.primitive, inputs, types);
  // A grouped GEMM's group sizes (its last input, [batches, groups]) split the rows evenly,
  // as a balanced router would: zeros would time an empty product.
  if (node.primitive->name().starts_with("grouped_matmul") && !p.args.empty() && p.args.back().ndim() == 2 &&
      !is_floating(p.args.back().dtype())) {
    const Shape& sizes = p.args.back().shape();
    const int64_t rows = graph.values[static_cast<size_t>(node.inputs[0])].type.shape.at(1);
    const int64_t per = rows / std::max<int64_t>(1, sizes[1]);
    p.args.back() = astype(full(sizes, static_cast<double>(per)), p.args.back().dtype()).eval();
  }
  double input_bytes = 0;
  for (const Array& a : p.args) input_bytes += static_cast<double>(a.nbytes());
  const int copies =
      input_bytes > 0 ? std::min<int>(kMaxInputCopies, static_cast<int>(kColdInputBytes / input_bytes)) : 0;
  for (int c = 0; c < copies; ++c) {
    std::vector<Array> copy;
    // Integer inputs (indices, group sizes) are read, not streamed: the copies share them.
    for (const Array& a : p.args)
      copy.push_back(is_floating(a.dtype()) ? filled(compiler::TensorType{a.shape(), a.dtype()}) : a);
    p.more_args.push_back(std::move(copy));
  }
  compiler::CompileOptions options;
  options.fuse = options.fold_constants = options.simplify = options.remat = options.schedule = false;
  p.exe = compiler::compile(std::move(one), options);
  double seconds = 0;
  if (serial) {
    SerialKernelsScope scope;
    seconds = time_run(p, 0.02, 3);
  } else {
    seconds = time_run(p, 0.02, 3);
  }
  cache.emplace(key, seconds);
  return seconds;
}

const HostRates& calibrate_host(DType compute_dtype) {
  static std::mutex mutex;
  static std::map<DType, HostRates> cache;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = cache.find(compute_dtype); it != cache.end()) return it->second;
  const Clock::time_point start = Clock::now();
  HostRates h;
  h.cores = num_threads();
  h.dtype = std::string(name(compute_dtype));
  h.parallel = measure(compute_dtype);
  {
    SerialKernelsScope serial;
    h.serial = measure(compute_dtype);
  }
  // Virtual devices exchange data through shared memory: a copy at stream bandwidth
  // each way, and a rendezvous per ring step.
  h.collective_bandwidth = h.serial.bandwidth / 2;
  h.collective_latency = 20e-6;
  h.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return cache.emplace(compute_dtype, h).first->second;
}

namespace {

// The reference step: a 2-layer GPT of width 128 on batches of 4 x 128 tokens, AdamW.
train::TrainConfig reference_config(DType dtype) {
  train::TrainConfig c;
  c.model = {.family = "gpt2", .vocab = 256, .dim = 128, .layers = 2, .heads = 2, .context = 128};
  c.model.compute_dtype = std::string(name(dtype));
  c.loop.batch = 4;
  c.loop.seq = 128;
  return c;
}

// Median seconds of `steps` real steps of the reference config on `devices` devices.
double measure_reference_step(const train::TrainConfig& config, int devices, int steps) {
  const models::Model model(config.model);
  const optim::Optimizer optimizer(config.optimizer_config(), model.specs());
  if (devices > 1 && spmd::device_count() < devices) spmd::set_cpu_devices(devices);
  const train::Layout layout = devices > 1 ? train::Layout(spmd::Mesh::parse(fmt::format("data={}", devices)),
                                                           train::default_axis_rules(), model.specs())
                                           : train::Layout::one_device(model.specs());
  Tree params = layout.shard_params(model.init(0));
  Tree opt = layout.shard_opt_state(optimizer.init(params));
  data::Batch batch;
  batch.tokens = zeros({config.loop.batch, config.loop.seq}, DType::Int32).eval();
  batch.targets = zeros({config.loop.batch, config.loop.seq}, DType::Int32).eval();
  const std::vector<data::Batch> micro = {layout.shard_batch(batch)};
  train::TrainStep step(model, optimizer, 1, &layout);
  std::vector<double> times;
  for (int i = 0; i < steps + 2; ++i) {
    const Clock::time_point start = Clock::now();
    step.run(params, opt, micro, 1e-4, std::nullopt);
    if (i >= 2) times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

const HostRates& calibrate_host_steps(DType compute_dtype) {
  static std::mutex mutex;
  static std::map<DType, HostRates> cache;
  const HostRates& base = calibrate_host(compute_dtype);
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = cache.find(compute_dtype); it != cache.end()) return it->second;
  const Clock::time_point start = Clock::now();
  HostRates h = base;
  const train::TrainConfig config = reference_config(compute_dtype);
  const goodput::AcceleratorSpec host = h.accelerator();
  StepModelOptions options;
  options.host = &h;  // factors 1: the sum of the kernels
  const int many = std::max(2, h.cores);
  // Three sizes of the reference step (batch 4, 8 and 16) fit measured - GEMMs = overhead
  // + factor * (other kernels) by least squares, on one device and on `many` and 2 x
  // `many` virtual devices. GEMM and attention kernels count as timed alone (they are
  // compute-bound); what a step adds is the memory-bound kernels' (inputs from other
  // kernels, not hot in cache) and the program's own work.
  auto fit = [&](int devices, double* overhead, double* factor) {
    const PlanLayout layout{.data = devices};
    std::vector<std::pair<double, double>> other_measured;  // (other kernels, measured - GEMMs)
    for (int64_t batch : {4, 8, 16}) {
      train::TrainConfig sized = config;
      sized.loop.batch = batch;
      const StepEstimate est = estimate_step(sized, layout, host, options);
      double compute_bound = 0;
      for (const OpClassCost& op : est.ops)
        if (op.kind == "gemm" || op.kind == "attention") compute_bound += op.seconds;
      const double other = est.compute_seconds - compute_bound;
      const double measured = measure_reference_step(sized, devices, 9) - est.exposed_collective_seconds;
      other_measured.emplace_back(other, measured - compute_bound);
    }
    double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (const auto& [x, y] : other_measured) {
      n += 1, sx += x, sy += y, sxx += x * x, sxy += x * y;
    }
    *factor = std::clamp((n * sxy - sx * sy) / std::max(n * sxx - sx * sx, 1e-30), 0.5, 4.0);
    *overhead = std::max(0.0, (sy - *factor * sx) / n);
  };
  fit(1, &h.step_overhead_one, &h.step_factor_one);
  fit(many, &h.step_overhead_many, &h.step_factor_many);
  fit(2 * many, &h.step_overhead_over, &h.step_factor_over);
  h.seconds += std::chrono::duration<double>(Clock::now() - start).count();
  return cache.emplace(compute_dtype, h).first->second;
}

}  // namespace tessera::plan
