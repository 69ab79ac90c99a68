// bench_gpu_gemm: tessera's GPU GEMM (cuBLASLt through backend/cuda/kernels/gemm.h) on
// the GEMM shapes of a GPT-2 124M training step, bf16 in and out, fp32 accumulation:
// median time of --repeats runs between CUDA events, TFLOP/s, and which path ran
// (restaged operands for rows that are not 16-byte aligned, gemm.h).
//
//   build/bin/bench_gpu_gemm [--repeats 20] [--tokens 16384]
//
// A table goes to stdout; the last line is one JSON object with every row.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessera/backend/cuda.h"
#include "train_bench_util.h"

#if TESSERA_HAS_CUDA
#include <cuda_runtime_api.h>

#include "backend/cuda/kernels/cuda_check.h"
#include "backend/cuda/kernels/gemm.h"
#include "backend/cuda/runtime.h"
#include "gpu_bench_util.h"
#endif

namespace ts = tessera;

#if TESSERA_HAS_CUDA
namespace {

struct Case {
  std::string name;
  ts::cuda::GemmShape shape;
};

int run(int64_t repeats, int64_t tokens) {
  if (!ts::cuda::available()) {
    fmt::print(stderr, "bench_gpu_gemm: no GPU: {}\n", ts::cuda::unavailable_reason());
    return 2;
  }
  const int64_t d = 768, ff = 3072, vocab = 50257, padded = 50304;
  auto mm = [](int64_t m, int64_t n, int64_t k, bool ta, bool tb) {
    ts::cuda::GemmShape s;
    s.m = m;
    s.n = n;
    s.k = k;
    s.trans_a = ta;
    s.trans_b = tb;
    return s;
  };
  const std::vector<Case> cases = {
      {"qkv fwd [T,768]x[768,2304]", mm(tokens, 3 * d, d, false, false)},
      {"fc1 fwd [T,768]x[768,3072]", mm(tokens, ff, d, false, false)},
      {"fc2 dW [3072,T]x[T,768]", mm(ff, d, tokens, true, false)},
      {"logits fwd V=50257", mm(tokens, vocab, d, false, false)},
      {"logits fwd V=50304", mm(tokens, padded, d, false, false)},
      {"logits dX V=50257 (k=V)", mm(tokens, d, vocab, false, true)},
      {"logits dX V=50304 (k=V)", mm(tokens, d, padded, false, true)},
      {"logits dW V=50257", mm(d, vocab, tokens, true, false)},
      {"logits dW V=50304", mm(d, padded, tokens, true, false)},
  };
  const int device = 0;
  ts::cuda::set_device(device);
  cudaStream_t stream = ts::cuda::stream(device);
  ts::cuda::GemmContext ctx;
  ctx.handle = ts::cuda::cublaslt(device);
  ctx.stream = stream;
  const ts::cuda::DeviceInfo info = ts::cuda::device_info(device);
  ctx.sm_major = info.sm_major;
  ctx.sm_minor = info.sm_minor;
  TESSERA_CUDA_CHECK(cudaMalloc(&ctx.workspace, ts::cuda::kGemmWorkspaceBytes));
  ctx.workspace_bytes = ts::cuda::kGemmWorkspaceBytes;

  nlohmann::json rows = nlohmann::json::array();
  fmt::print(
      "| gemm | m | n | k | ms (median of {}) | TFLOP/s | restaged |\n| --- | --- | --- | --- | --- | --- | --- |\n",
      repeats);
  for (const Case& c : cases) {
    for (bool restage : {false, true}) {
      ts::cuda::GemmOptions opt = ts::cuda::gemm_options();
      opt.restage = restage;
      ts::cuda::set_gemm_options(opt);
      const ts::cuda::GemmShape& s = c.shape;
      void* a = ts::bench::random_bf16_on_device(s.m * s.k, 1);
      void* b = ts::bench::random_bf16_on_device(s.k * s.n, 2);
      void* out = nullptr;
      TESSERA_CUDA_CHECK(cudaMalloc(&out, static_cast<size_t>(s.m * s.n) * 2));
      const size_t staging = ts::cuda::gemm_staging_bytes(ts::DType::BFloat16, s);
      ctx.staging = nullptr;
      ctx.staging_bytes = staging;
      if (staging > 0) TESSERA_CUDA_CHECK(cudaMalloc(&ctx.staging, staging));
      cudaEvent_t e0, e1;
      TESSERA_CUDA_CHECK(cudaEventCreate(&e0));
      TESSERA_CUDA_CHECK(cudaEventCreate(&e1));
      ts::cuda::gemm(ts::DType::BFloat16, s, a, b, out, {}, ctx);  // warm-up: algorithm choice
      std::vector<double> times;
      for (int64_t r = 0; r < repeats; ++r) {
        TESSERA_CUDA_CHECK(cudaEventRecord(e0, stream));
        ts::cuda::gemm(ts::DType::BFloat16, s, a, b, out, {}, ctx);
        TESSERA_CUDA_CHECK(cudaEventRecord(e1, stream));
        TESSERA_CUDA_CHECK(cudaEventSynchronize(e1));
        float ms = 0;
        TESSERA_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        times.push_back(ms);
      }
      const ts::cuda::GemmReport report = ts::cuda::last_gemm_report();
      const double ms = ts::median(times);
      const double tflops =
          2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k) / (ms * 1e-3) / 1e12;
      fmt::print("| {} | {} | {} | {} | {:.3f} | {:.0f} | {} |\n", c.name, s.m, s.n, s.k, ms, tflops, report.staged);
      std::fflush(stdout);
      rows.push_back({{"name", c.name},
                      {"m", s.m},
                      {"n", s.n},
                      {"k", s.k},
                      {"restage", restage},
                      {"staged", report.staged},
                      {"ms", ms},
                      {"tflops", tflops}});
      cudaEventDestroy(e0);
      cudaEventDestroy(e1);
      cudaFree(a);
      cudaFree(b);
      cudaFree(out);
      if (ctx.staging != nullptr) cudaFree(ctx.staging);
    }
  }
  cudaFree(ctx.workspace);
  nlohmann::json line{{"bench", "gpu_gemm"}, {"device", info.name}, {"repeats", repeats}, {"rows", rows}};
  fmt::print("{}\n", line.dump());
  return 0;
}

}  // namespace
#else
namespace {
// A CPU-only build keeps the flag checks, so a script that calls it learns the same
// things (bad flags: exit 1; no GPU code: exit 2).
int run(int64_t repeats, int64_t tokens) {
  fmt::print(stderr,
             "bench_gpu_gemm: built without CUDA, nothing to time ({} repeats of {} tokens asked for); "
             "rebuild where nvcc is found\n",
             repeats, tokens);
  return 2;
}
}  // namespace
#endif

int main(int argc, char** argv) {
  try {
    const ts::bench::KernelBenchFlags f = ts::bench::parse_kernel_bench_flags("bench_gpu_gemm", argc, argv, true);
    return run(f.repeats, f.tokens);
  } catch (const ts::Error& e) {  // bad flags: the message and exit 1
    fmt::print(stderr, "{}\n", e.what());
    return 1;
  }
}
