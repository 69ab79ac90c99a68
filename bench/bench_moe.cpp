// bench_moe: a mixture-of-experts block's training pass (nn/moe.h: router, dispatch, the
// experts' SwiGLU GEMMs, combine; forward and backward of sum(y^2) for the block's
// parameters and input) in its three forms, on the CPU:
//   grouped   dropless, the assignments sorted by expert and run as grouped GEMMs
//             (the default with the experts on every device);
//   buffers   dropless through the capacity buffers [experts, tokens, dim] (what expert
//             parallelism uses: experts / top_k times the active expert FLOPs);
//   capacity  capacity factor 1.25 through the buffers (assignments past it dropped).
// Rounds are interleaved (one pass of each form per round) and the figures are medians.
// The FLOPs are the compiled programs' (Primitive::cost). grouped and buffers compute the
// same function: their outputs' largest difference is printed.
//
//   build/bin/bench_moe [--dim 256] [--hidden 512] [--experts 8] [--top-k 2] [--tokens 2048] [--rounds 7]
//
// The last line is one JSON object with every figure and grouped_vs_buffers_speedup.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "tessera/api/jit.h"
#include "tessera/base/error.h"
#include "tessera/core/ops.h"
#include "tessera/core/random.h"
#include "tessera/core/transforms.h"
#include "tessera/nn/moe.h"
#include "tessera/nn/param.h"
#include "train_bench_util.h"

namespace ts = tessera;

namespace {

using Clock = std::chrono::steady_clock;

struct Form {
  std::string name;
  ts::nn::MoE moe;
  std::vector<double> ms;
  double flops = 0, expert_flops = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  try {
    int64_t dim = 256, hidden = 512, experts = 8, top_k = 2, tokens = 2048, rounds = 7;
    for (int i = 1; i < argc; ++i) {
      const std::string flag = argv[i];
      const int64_t value = std::stoll(ts::bench::flag_value("bench_moe", argc, argv, i));
      if (flag == "--dim")
        dim = value;
      else if (flag == "--hidden")
        hidden = value;
      else if (flag == "--experts")
        experts = value;
      else if (flag == "--top-k")
        top_k = value;
      else if (flag == "--tokens")
        tokens = value;
      else if (flag == "--rounds")
        rounds = std::max<int64_t>(1, value);
      else
        ts::fail<ts::ValueError>("bench_moe: unknown flag {}", flag);
    }
    const ts::nn::MoE base{.dim = dim, .hidden = hidden, .experts = experts, .top_k = top_k};
    std::vector<Form> forms;
    forms.push_back({"grouped", base, {}, 0, 0});
    forms.push_back({"buffers", base, {}, 0, 0});
    forms.back().moe.grouped_gemm = false;
    forms.push_back({"capacity 1.25", base, {}, 0, 0});
    forms.back().moe.capacity_factor = 1.25;
    forms.back().moe.grouped_gemm = false;

    const ts::Tree params = base.init(ts::nn::ParamScope(1));
    const ts::Array x = ts::random::normal(ts::key(2), {tokens, dim}).eval();
    const ts::Tree args{{"p", params}, {"x", ts::Tree(x)}};
    std::vector<ts::Jitted> steps;
    for (Form& f : forms) {
      const ts::nn::MoE* moe = &f.moe;
      steps.push_back(ts::jit([moe](const ts::Tree& a) -> ts::Tree {
        auto loss = [moe](const ts::Tree& in) { return ts::sum(ts::square((*moe)(in.at("p"), in.at("x").leaf()).y)); };
        auto [value, grads] = ts::value_and_grad(loss)(a);
        return ts::Tree{{"grads", grads}, {"loss", value}};
      }));
      const auto& stats = steps.back().lowered(args).executable().stats();
      f.flops = stats.flops;
      for (const auto& [op, flops] : stats.flops_by_op)
        if (op == "grouped_matmul" || op == "grouped_matmul_weight_grad" || op == "matmul") f.expert_flops += flops;
    }
    // The same function: the dropless forms' outputs.
    auto forward = [&](const ts::nn::MoE& moe) { return moe(params, x).y.eval(); };
    const double difference = ts::max(ts::abs(forward(forms[0].moe) - forward(forms[1].moe))).item<double>();
    for (int64_t r = 0; r <= rounds; ++r)  // round 0 warms up
      for (size_t i = 0; i < forms.size(); ++i) {
        const auto t0 = Clock::now();
        (void)steps[i](args).at("loss").leaf().item<double>();
        const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        if (r > 0) forms[i].ms.push_back(ms);
      }
    fmt::print(
        "bench_moe: MoE block forward + backward, dim {}, hidden {}, {} experts, top-{}, {} tokens, float32, "
        "median of {} interleaved rounds\n",
        dim, hidden, experts, top_k, tokens, rounds);
    fmt::print("{:<15} {:>9} {:>12} {:>20} {:>12}\n", "form", "ms", "GFLOP", "matmul-family GFLOP", "vs buffers");
    std::string json;
    const double buffers_ms = median(forms[1].ms);
    for (const Form& f : forms) {
      const double ms = median(f.ms);
      fmt::print("{:<15} {:>9.2f} {:>12.3f} {:>20.3f} {:>11.2f}x\n", f.name, ms, f.flops / 1e9, f.expert_flops / 1e9,
                 buffers_ms / ms);
      json += fmt::format("{}{{\"form\":\"{}\",\"ms\":{:.3f},\"flops\":{:.0f},\"matmul_flops\":{:.0f}}}",
                          json.empty() ? "" : ",", f.name, ms, f.flops, f.expert_flops);
    }
    fmt::print("grouped and buffers outputs differ by at most {:.3g}\n", difference);
    fmt::print(
        "{{\"bench\":\"moe\",\"dim\":{},\"hidden\":{},\"experts\":{},\"top_k\":{},\"tokens\":{},\"rounds\":{},"
        "\"forms\":[{}],\"max_output_difference\":{:.3g},\"grouped_vs_buffers_speedup\":{:.4f}}}\n",
        dim, hidden, experts, top_k, tokens, rounds, json, difference, buffers_ms / median(forms[0].ms));
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_moe: {}\n", e.what());
    return 1;
  }
}
