// bench_gpu_reduce: the reduce_sum kernels of a GPT-2 124M training step (batch 16 x
// 1024 tokens, bf16 compute, float32 master weights) under both reduction plans,
// TESSERA_CUDA_REDUCE=column and legacy (backend/cuda/kernels/reduce.h):
//
//   * per shape: the bias gradients (column sums of dY [tokens, N] bf16 for N = 768,
//     2304, 3072) and a gradient norm's sums of squares (one float32 row per weight),
//     median time of --repeats launches between CUDA events, GB/s read;
//   * per step: the step's bias gradients (4 per layer) and sums of squares (one per
//     parameter tensor: 148) -- 196 of the 198 reduce_sum launches of the profile in
//     bench/results/2026-11-23-gpu-h100.md -- each on its own buffer so nothing stays
//     in L2, captured once as a CUDA graph (as the executable replays a step) and
//     replayed: median ms.
//
//   build/bin/bench_gpu_reduce [--repeats 20] [--tokens 16384]
//
// A table goes to stdout; the last line is one JSON object with every row. The values
// reduced are a constant fill (timing does not depend on them; test_cuda checks them).
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessera/backend/cuda.h"
#include "tessera/base/statistics.h"
#include "train_bench_util.h"

#if TESSERA_HAS_CUDA
#include <cuda_runtime_api.h>

#include "backend/cuda/kernels/cuda_check.h"
#include "backend/cuda/kernels/reduce.h"
#include "backend/cuda/runtime.h"
#endif

namespace ts = tessera;

#if TESSERA_HAS_CUDA
namespace {

namespace cu = ts::cuda;

// One reduction: x [shape] of dtype over axes, with its own input buffer.
struct Reduction {
  std::string name;
  ts::DType dtype;
  std::vector<int64_t> shape;
  std::vector<int> axes;
  void* x = nullptr;
  void* out = nullptr;
  int64_t in_bytes = 0;
};

Reduction make(std::string name, ts::DType dtype, std::vector<int64_t> shape, std::vector<int> axes) {
  Reduction r{std::move(name), dtype, std::move(shape), std::move(axes)};
  int64_t n = 1, out = 1;
  for (size_t d = 0; d < r.shape.size(); ++d) {
    n *= r.shape[d];
    if (std::find(r.axes.begin(), r.axes.end(), static_cast<int>(d)) == r.axes.end()) out *= r.shape[d];
  }
  r.in_bytes = n * static_cast<int64_t>(ts::itemsize(dtype));
  TESSERA_CUDA_CHECK(cudaMalloc(&r.x, static_cast<size_t>(r.in_bytes)));
  TESSERA_CUDA_CHECK(cudaMemset(r.x, 0x3c, static_cast<size_t>(r.in_bytes)));  // about 0.0115 in bf16 and f32
  TESSERA_CUDA_CHECK(cudaMalloc(&r.out, static_cast<size_t>(out) * ts::itemsize(dtype)));
  return r;
}

cu::ReducePlan plan_of(const Reduction& r) {
  cu::ReducePlan plan;
  if (!cu::plan_reduce(r.dtype, r.shape, r.axes, &plan))
    ts::fail<ts::Error>("bench_gpu_reduce: cannot plan {}", r.name);
  return plan;
}

void launch(const Reduction& r, const cu::ReducePlan& plan, void* scratch, cudaStream_t stream) {
  TESSERA_CUDA_CHECK(cu::reduce(ts::ReduceKind::Sum, r.dtype, plan, r.x, r.out, scratch, stream));
}

const char* path_name(cu::ReducePath p) { return p == cu::ReducePath::Column ? "column" : "legacy"; }

const char* kind_name(cu::ReducePlan::Kind k) {
  switch (k) {
    case cu::ReducePlan::Kind::Rows:
      return "rows";
    case cu::ReducePlan::Kind::ColumnStrips:
      return "column strips";
    case cu::ReducePlan::Kind::Columns:
      return "columns";
    default:
      return "other";
  }
}

// The step's reductions in the order of the backward pass (the bias gradient of a layer
// with the sums of squares of that layer's gradients).
std::vector<Reduction> step_reductions(int64_t tokens) {
  const ts::DType bf16 = ts::DType::BFloat16, f32 = ts::DType::Float32;
  const int64_t d = 768, ff = 3072, layers = 12, vocab = 50257, context = 1024;
  std::vector<Reduction> rs;
  auto norm = [&](const std::string& name, std::vector<int64_t> shape) {
    std::vector<int> axes(shape.size());
    for (size_t i = 0; i < axes.size(); ++i) axes[i] = static_cast<int>(i);
    rs.push_back(make("sum of squares " + name, f32, std::move(shape), std::move(axes)));
  };
  norm("ln_f.w", {d});
  norm("ln_f.b", {d});
  for (int64_t l = 0; l < layers; ++l) {
    rs.push_back(make("bias fc2", bf16, {tokens, d}, {0}));
    norm("fc2.b", {d});
    norm("fc2.w", {ff, d});
    rs.push_back(make("bias fc1", bf16, {tokens, ff}, {0}));
    norm("fc1.b", {ff});
    norm("fc1.w", {d, ff});
    norm("ln2.w", {d});
    norm("ln2.b", {d});
    rs.push_back(make("bias attn-out", bf16, {tokens, d}, {0}));
    norm("attn-out.b", {d});
    norm("attn-out.w", {d, d});
    rs.push_back(make("bias qkv", bf16, {tokens, 3 * d}, {0}));
    norm("qkv.b", {3 * d});
    norm("qkv.w", {d, 3 * d});
    norm("ln1.w", {d});
    norm("ln1.b", {d});
  }
  norm("wpe", {context, d});
  norm("wte", {vocab, d});
  return rs;
}

int run(int64_t repeats, int64_t tokens) {
  if (!cu::available()) {
    fmt::print(stderr, "bench_gpu_reduce: no GPU: {}\n", cu::unavailable_reason());
    return 2;
  }
  const int device = 0;
  cu::set_device(device);
  cudaStream_t stream = cu::stream(device);
  const cu::DeviceInfo info = cu::device_info(device);
  std::vector<Reduction> step = step_reductions(tokens);
  size_t scratch_bytes = 0;
  for (cu::ReducePath path : {cu::ReducePath::Column, cu::ReducePath::Legacy}) {
    cu::set_reduce_path(path);
    for (const Reduction& r : step) scratch_bytes = std::max(scratch_bytes, plan_of(r).scratch_bytes);
  }
  void* scratch = nullptr;
  TESSERA_CUDA_CHECK(cudaMalloc(&scratch, std::max<size_t>(scratch_bytes, 256)));
  cudaEvent_t e0, e1;
  TESSERA_CUDA_CHECK(cudaEventCreate(&e0));
  TESSERA_CUDA_CHECK(cudaEventCreate(&e1));
  auto time_ms = [&](auto&& work) {
    work();  // warm-up
    std::vector<double> times;
    for (int64_t i = 0; i < repeats; ++i) {
      TESSERA_CUDA_CHECK(cudaEventRecord(e0, stream));
      work();
      TESSERA_CUDA_CHECK(cudaEventRecord(e1, stream));
      TESSERA_CUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      TESSERA_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      times.push_back(ms);
    }
    return ts::median(times);
  };

  nlohmann::json rows = nlohmann::json::array();
  fmt::print(
      "| reduction | shape | plan | path | ms (median of {}) | GB/s read |\n| --- | --- | --- | --- | --- | --- |\n",
      repeats);
  // One of each distinct shape (the first occurrence in the step).
  std::vector<const Reduction*> distinct;
  for (const Reduction& r : step)
    if (std::none_of(distinct.begin(), distinct.end(), [&](const Reduction* o) { return o->shape == r.shape; }))
      distinct.push_back(&r);
  for (const Reduction* r : distinct)
    for (cu::ReducePath path : {cu::ReducePath::Column, cu::ReducePath::Legacy}) {
      cu::set_reduce_path(path);
      const cu::ReducePlan plan = plan_of(*r);
      const double ms = time_ms([&] { launch(*r, plan, scratch, stream); });
      const double gbs = static_cast<double>(r->in_bytes) / (ms * 1e-3) / 1e9;
      std::string shape;
      for (int64_t s : r->shape) shape += (shape.empty() ? "" : "x") + std::to_string(s);
      fmt::print("| {} | {} {} | {} ({} chunks) | {} | {:.4f} | {:.0f} |\n", r->name, ts::name(r->dtype), shape,
                 kind_name(plan.kind), plan.chunks, path_name(path), ms, gbs);
      std::fflush(stdout);
      rows.push_back({{"name", r->name},
                      {"shape", r->shape},
                      {"dtype", ts::name(r->dtype)},
                      {"plan", kind_name(plan.kind)},
                      {"chunks", plan.chunks},
                      {"path", path_name(path)},
                      {"ms", ms},
                      {"gb_per_s", gbs}});
    }

  // The whole step's reductions as one CUDA graph.
  nlohmann::json steps = nlohmann::json::object();
  int64_t step_bytes = 0;
  for (const Reduction& r : step) step_bytes += r.in_bytes;
  for (cu::ReducePath path : {cu::ReducePath::Column, cu::ReducePath::Legacy}) {
    cu::set_reduce_path(path);
    std::vector<cu::ReducePlan> plans;
    for (const Reduction& r : step) plans.push_back(plan_of(r));
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    TESSERA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (size_t i = 0; i < step.size(); ++i) launch(step[i], plans[i], scratch, stream);
    TESSERA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    TESSERA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    const double ms = time_ms([&] { TESSERA_CUDA_CHECK(cudaGraphLaunch(exec, stream)); });
    fmt::print("step ({} reductions, {:.2f} GB read, one CUDA graph), {}: {:.3f} ms ({:.0f} GB/s)\n", step.size(),
               static_cast<double>(step_bytes) / 1e9, path_name(path), ms,
               static_cast<double>(step_bytes) / (ms * 1e-3) / 1e9);
    std::fflush(stdout);
    steps[path_name(path)] = ms;
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(scratch);
  for (Reduction& r : step) {
    cudaFree(r.x);
    cudaFree(r.out);
  }
  nlohmann::json line{
      {"bench", "gpu_reduce"},          {"device", info.name},      {"repeats", repeats}, {"tokens", tokens},
      {"step_reductions", step.size()}, {"step_bytes", step_bytes}, {"step_ms", steps},   {"rows", rows}};
  fmt::print("{}\n", line.dump());
  return 0;
}

}  // namespace
#else
namespace {
// A CPU-only build keeps the flag checks (bad flags: exit 1; no GPU code: exit 2).
int run(int64_t repeats, int64_t tokens) {
  fmt::print(stderr,
             "bench_gpu_reduce: built without CUDA, nothing to time ({} repeats of {} tokens asked for); "
             "rebuild where nvcc is found\n",
             repeats, tokens);
  return 2;
}
}  // namespace
#endif

int main(int argc, char** argv) {
  try {
    const ts::bench::KernelBenchFlags f = ts::bench::parse_kernel_bench_flags("bench_gpu_reduce", argc, argv, true);
    return run(f.repeats, f.tokens);
  } catch (const ts::Error& e) {  // bad flags: the message and exit 1
    fmt::print(stderr, "{}\n", e.what());
    return 1;
  }
}
