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
#include "tessera/core/transforms.h"

namespace tessera::plan {
namespace {

using Clock = std::chrono::steady_clock;

struct Program {
  std::unique_ptr<compiler::Executable> exe;
  std::vector<Array> args;
};

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

// Seconds per run: the best of three trials of repeated runs (each at least 20 ms).
double time_run(Program& p) {
  p.exe->run(p.args);  // warm-up
  double best = 1e30;
  for (int trial = 0; trial < 3; ++trial) {
    int runs = 0;
    const Clock::time_point start = Clock::now();
    double elapsed = 0;
    do {
      p.exe->run(p.args);
      ++runs;
      elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    } while (elapsed < 0.02);
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
  const double intercept = (sy - slope * sx) / n;                   // h / r
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
  // Attention, forward and backward (the gradient program of a causal attention).
  {
    std::vector<std::pair<double, double>> samples;
    for (int64_t t_len : {64, 256}) {
      Program p = build(
          [](const std::vector<Array>& a) {
            auto loss = [](const std::vector<Array>& x) { return sum(scaled_dot_product_attention(x[0], x[1], x[2])); };
            return grad(loss)(a);
          },
          {{{1, 4, t_len, 64}, dtype}, {{1, 4, t_len, 64}, dtype}, {{1, 4, t_len, 64}, dtype}});
      double attention_flops = 0;
      for (const auto& [op, f] : p.exe->stats().flops_by_op)
        if (op.find("attention") != std::string::npos) attention_flops += f;
      // The program's other kernels (the sum and its gradient) are a few small ones.
      const double t = time_run(p) - k.kernel_overhead * static_cast<double>(p.exe->stats().kernels);
      samples.emplace_back(attention_flops, std::max(t, 1e-9));
    }
    std::tie(k.attention_flops, k.attention_half_flops) = fit_curve(samples);
  }
  return k;
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
  a.memory_efficiency = 1;
  a.kernel_overhead = parallel.kernel_overhead;
  a.links.push_back({"shared memory", 0, collective_bandwidth, collective_latency, "switch"});
  a.source = "measured by tessera plan (plan/host_calibration.h)";
  return a;
}

std::string HostRates::text() const {
  auto rates = [](const char* label, const KernelRates& k) {
    return fmt::format(
        "  {:<9} GEMM {:.1f} GFLOP/s (half at {:.2g} FLOP), attention {:.1f} GFLOP/s (half at {:.2g}), "
        "stream {:.1f} GB/s, {:.1f} us per kernel\n",
        label, k.gemm_flops / 1e9, k.gemm_half_flops, k.attention_flops / 1e9, k.attention_half_flops,
        k.bandwidth / 1e9, k.kernel_overhead * 1e6);
  };
  return fmt::format("host calibration ({} cores, {} GEMMs, {:.2f} s):\n", cores, dtype, seconds) +
         rates("1 thread", serial) + rates("threads", parallel) +
         fmt::format("  collectives {:.1f} GB/s, {:.1f} us per step\n", collective_bandwidth / 1e9,
                     collective_latency * 1e6);
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

}  // namespace tessera::plan
