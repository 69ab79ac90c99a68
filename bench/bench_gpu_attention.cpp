// bench_gpu_attention: tessera's flash-attention kernels (backend/cuda/kernels/
// flash_attention.h) on attention shapes of GPT-2 124M training (batch 16, 12 heads,
// 1024 tokens, head_dim 64, causal, bf16) and a few neighbours, each with both
// generations of tensor-core kernels (TESSERA_ATTENTION_KERNEL = v1, v2) and cuDNN's fused
// attention (cudnn_attention.h, where the library loads): median time of
// --repeats runs between CUDA events for the forward and for the backward (delta, dK/dV
// and dQ kernels together), TFLOP/s by the usual count (forward 4 B H T S D, halved when
// causal; backward 2.5 times the forward), and the largest difference of v2's outputs
// from v1's (all round to bf16, so a few bf16 ulps of the values).
//
//   build/bin/bench_gpu_attention [--repeats 20]
//
// A table goes to stdout; the last line is one JSON object with every row.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessera/backend/cuda.h"
#include "train_bench_util.h"

#if TESSERA_HAS_CUDA
#include <cuda_runtime_api.h>

#include "backend/cuda/kernels/cuda_check.h"
#include "backend/cuda/kernels/cudnn_attention.h"
#include "backend/cuda/kernels/flash_attention.h"
#include "backend/cuda/runtime.h"
#include "gpu_bench_util.h"
#endif

namespace ts = tessera;

#if TESSERA_HAS_CUDA
namespace {

struct Case {
  std::string name;
  int64_t B, H, T, D;
  bool causal;
};

float bf16_to_float(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

std::vector<uint16_t> download16(const void* d, int64_t n) {
  std::vector<uint16_t> h(static_cast<size_t>(n));
  TESSERA_CUDA_CHECK(cudaMemcpy(h.data(), d, static_cast<size_t>(n) * 2, cudaMemcpyDeviceToHost));
  return h;
}

double max_abs_diff(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(static_cast<double>(bf16_to_float(a[i])) - bf16_to_float(b[i]));
    m = std::isfinite(d) ? std::max(m, d) : INFINITY;
  }
  return m;
}

template <class F>
double median_ms(int64_t repeats, cudaStream_t stream, F&& f) {
  cudaEvent_t e0, e1;
  TESSERA_CUDA_CHECK(cudaEventCreate(&e0));
  TESSERA_CUDA_CHECK(cudaEventCreate(&e1));
  f();  // warm-up (shared-memory attributes, caches)
  std::vector<double> times;
  for (int64_t r = 0; r < repeats; ++r) {
    TESSERA_CUDA_CHECK(cudaEventRecord(e0, stream));
    f();
    TESSERA_CUDA_CHECK(cudaEventRecord(e1, stream));
    TESSERA_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    TESSERA_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    times.push_back(ms);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return ts::median(times);
}

int run(int64_t repeats) {
  if (!ts::cuda::available()) {
    fmt::print(stderr, "bench_gpu_attention: no GPU: {}\n", ts::cuda::unavailable_reason());
    return 2;
  }
  const std::vector<Case> cases = {
      {"gpt2-124m causal", 16, 12, 1024, 64, true},
      {"gpt2-124m full", 16, 12, 1024, 64, false},
      {"T=2048 causal", 8, 12, 2048, 64, true},
      {"D=128 causal", 16, 6, 1024, 128, true},
  };
  const int device = 0;
  ts::cuda::set_device(device);
  cudaStream_t stream = ts::cuda::stream(device);
  const ts::cuda::DeviceInfo info = ts::cuda::device_info(device);

  nlohmann::json rows = nlohmann::json::array();
  fmt::print(
      "| case | kernels | fwd ms | fwd TFLOP/s | bwd ms | bwd TFLOP/s | max |out - out_v1| | max |dq - dq_v1| |\n"
      "| --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (const Case& c : cases) {
    const int64_t nq = c.B * c.H * c.T * c.D, rows_n = c.B * c.H * c.T;
    void* q = ts::bench::random_bf16_on_device(nq, 1);
    void* k = ts::bench::random_bf16_on_device(nq, 2);
    void* v = ts::bench::random_bf16_on_device(nq, 3);
    void* dout = ts::bench::random_bf16_on_device(nq, 4);
    void *out = nullptr, *dq = nullptr, *dk = nullptr, *dv = nullptr;
    float *lse = nullptr, *scratch = nullptr;
    for (void** p : {&out, &dq, &dk, &dv}) TESSERA_CUDA_CHECK(cudaMalloc(p, static_cast<size_t>(nq) * 2));
    TESSERA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&lse), static_cast<size_t>(rows_n) * 4));
    ts::cuda::FlashAttentionShape s;
    s.batch = c.B;
    s.heads = s.kv_heads = c.H;
    s.q_len = s.kv_len = c.T;
    s.head_dim = c.D;
    s.causal = c.causal;
    s.scale = 1.0 / std::sqrt(static_cast<double>(c.D));
    TESSERA_CUDA_CHECK(
        cudaMalloc(reinterpret_cast<void**>(&scratch), ts::cuda::flash_attention_backward_scratch_bytes(s)));
    const double fwd_flops =
        4.0 * static_cast<double>(c.B * c.H) * static_cast<double>(c.T) * c.T * c.D * (c.causal ? 0.5 : 1.0);
    std::vector<uint16_t> out_v1, dq_v1;
    const ts::cuda::FlashAttentionLayout dense = ts::cuda::contiguous_attention_layout(s);
    std::shared_ptr<void> workspace;  // cuDNN's, grown on request
    size_t workspace_bytes = 0;
    const ts::cuda::CudnnWorkspace grow = [&](size_t bytes) {
      if (bytes > workspace_bytes) {
        TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
        void* p = nullptr;
        TESSERA_CUDA_CHECK(cudaMalloc(&p, bytes));
        workspace.reset(p, cudaFree);
        workspace_bytes = bytes;
      }
      return workspace.get();
    };
    for (const char* version : {"v1", "v2", "cudnn"}) {
      const bool cudnn = std::strcmp(version, "cudnn") == 0;
      if (cudnn && !ts::cuda::cudnn_library().loaded) {
        fmt::print("| {} | cudnn | {} | | | | | |\n", c.name, ts::cuda::cudnn_description());
        continue;
      }
      ::setenv("TESSERA_ATTENTION_KERNEL", version, 1);
      const auto forward = [&] {
        if (cudnn && ts::cuda::cudnn_attention_forward(ts::DType::BFloat16, s, dense, q, k, v, out, lse, grow, stream))
          return;
        ts::cuda::flash_attention_forward(ts::DType::BFloat16, s, q, k, v, out, lse, stream);
      };
      const auto backward = [&] {
        if (cudnn && ts::cuda::cudnn_attention_backward(ts::DType::BFloat16, s, dense, q, k, v, out, lse, dout, dq, dk,
                                                        dv, grow, stream))
          return;
        ts::cuda::flash_attention_backward(ts::DType::BFloat16, s, q, k, v, out, lse, dout, dq, dk, dv, scratch,
                                           stream);
      };
      const double fwd_ms = median_ms(repeats, stream, forward);
      forward();  // out, lse of this version for its backward
      const double bwd_ms = median_ms(repeats, stream, backward);
      TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
      std::vector<uint16_t> out_h = download16(out, nq), dq_h = download16(dq, nq);
      double d_out = 0, d_dq = 0;
      if (out_v1.empty()) {
        out_v1 = std::move(out_h);
        dq_v1 = std::move(dq_h);
      } else {
        d_out = max_abs_diff(out_h, out_v1);
        d_dq = max_abs_diff(dq_h, dq_v1);
      }
      const double fwd_tflops = fwd_flops / (fwd_ms * 1e-3) / 1e12,
                   bwd_tflops = 2.5 * fwd_flops / (bwd_ms * 1e-3) / 1e12;
      fmt::print("| {} | {} | {:.3f} | {:.0f} | {:.3f} | {:.0f} | {:.2e} | {:.2e} |\n", c.name, version, fwd_ms,
                 fwd_tflops, bwd_ms, bwd_tflops, d_out, d_dq);
      std::fflush(stdout);
      rows.push_back({{"name", c.name},
                      {"kernels", version},
                      {"B", c.B},
                      {"H", c.H},
                      {"T", c.T},
                      {"D", c.D},
                      {"causal", c.causal},
                      {"fwd_ms", fwd_ms},
                      {"fwd_tflops", fwd_tflops},
                      {"bwd_ms", bwd_ms},
                      {"bwd_tflops", bwd_tflops},
                      {"max_abs_diff_out_vs_v1", d_out},
                      {"max_abs_diff_dq_vs_v1", d_dq}});
    }
    ::unsetenv("TESSERA_ATTENTION_KERNEL");
    for (void* p : {q, k, v, dout, out, dq, dk, dv}) cudaFree(p);
    cudaFree(lse);
    cudaFree(scratch);
  }
  nlohmann::json line{{"bench", "gpu_attention"},
                      {"device", info.name},
                      {"cudnn", ts::cuda::cudnn_description()},
                      {"repeats", repeats},
                      {"rows", rows}};
  fmt::print("{}\n", line.dump());
  return 0;
}

}  // namespace
#else
namespace {
// A CPU-only build keeps the flag checks (bad flags: exit 1; no GPU code: exit 2).
int run(int64_t repeats) {
  fmt::print(stderr,
             "bench_gpu_attention: built without CUDA, nothing to time ({} repeats asked for); rebuild where nvcc "
             "is found\n",
             repeats);
  return 2;
}
}  // namespace
#endif

int main(int argc, char** argv) {
  try {
    const ts::bench::KernelBenchFlags f = ts::bench::parse_kernel_bench_flags("bench_gpu_attention", argc, argv, false);
    return run(f.repeats);
  } catch (const ts::Error& e) {  // bad flags: the message and exit 1
    fmt::print(stderr, "{}\n", e.what());
    return 1;
  }
}
