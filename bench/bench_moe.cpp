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
// With --expert-devices S (S >= 2 virtual CPU devices, an `expert` mesh axis splitting the
// experts and the tokens), the dropless block under expert parallelism in its two forms:
//   ragged    the grouped form: each group's rows for another device's experts go there
//             by a ragged all-to-all of those rows only, and run as that device's grouped GEMMs;
//   padded    the buffers form: all-to-alls of the [experts, tokens, dim] buffers.
// Each device's all-to-all bytes as the communicator counted them, against the analytic
// count: for ragged, exactly the rows crossing between devices (read from the router's
// choices for each device's tokens), 2 x (rows out + rows in) x dim x 4 B per pass (the
// dispatch and combine, then their transposes), plus the experts' counts (S-1)/S x E x 8 B;
// for padded, 4 x (S-1)/S x the buffer.
//
//   build/bin/bench_moe [--dim 256] [--hidden 512] [--experts 8] [--top-k 2] [--tokens 2048] [--rounds 7]
//                       [--expert-devices 2]
//
// The last line is one JSON object with every figure, grouped_vs_buffers_speedup, and with
// expert devices ragged_vs_padded_speedup and comm_bytes_vs_analytic_max (the largest
// measured / analytic ratio over devices and forms, 1 when every byte is accounted for).
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
#include "tessera/nn/logical_sharding.h"
#include "tessera/nn/moe.h"
#include "tessera/nn/param.h"
#include "tessera/spmd/api.h"
#include "tessera/spmd/runtime.h"
#include "tessera/spmd/spmd_executable.h"
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

struct ParallelForm {
  std::string name;
  ts::nn::MoE moe;
  std::vector<double> ms;
  std::vector<double> sent, analytic;  // all-to-all bytes per device, one pass
};

// The dropless block's training pass on `devices` virtual devices over an expert axis:
// ragged (grouped GEMMs) against padded (buffers). Returns the JSON fragment.
std::string expert_parallel(const ts::nn::MoE& base, const ts::Tree& params, const ts::Array& x, int64_t devices,
                            int64_t rounds, double* speedup, double* bytes_ratio_max) {
  namespace spmd = ts::spmd;
  const int64_t tokens = x.shape(0), dim = base.dim, per_device = base.experts / devices;
  if (base.experts % devices != 0 || tokens % devices != 0)
    ts::fail<ts::ValueError>("bench_moe: --expert-devices {} must divide the {} experts and the {} tokens", devices,
                             base.experts, tokens);
  // Rows each device's tokens (one routing group) send to each device's experts.
  std::vector<std::vector<double>> rows(static_cast<size_t>(devices), std::vector<double>(devices, 0.0));
  const int64_t group = tokens / devices;
  for (int64_t d = 0; d < devices; ++d) {
    const ts::Array counts = base(params, ts::slice_axis(x, 0, d * group, (d + 1) * group)).tokens_per_expert;
    const std::vector<double> c = counts.to_vector<double>();
    for (int64_t e = 0; e < base.experts; ++e) rows[d][e / per_device] += c[static_cast<size_t>(e)];
  }
  const ts::spmd::Mesh mesh = ts::spmd::Mesh::parse(fmt::format("expert={}", devices));
  const int previous = spmd::device_count();
  spmd::set_cpu_devices(static_cast<int>(devices));
  const ts::nn::LogicalRules rules{{"batch", {"expert"}}, {"experts", {"expert"}}, {"moe_groups", {}}};
  std::vector<ParallelForm> forms{{"ragged", base, {}, {}, {}}, {"padded", base, {}, {}, {}}};
  forms[1].moe.grouped_gemm = false;
  const ts::Tree placed = ts::spmd::device_put(params, [&](const std::string& path, const ts::Array&) {
    return spmd::NamedSharding(mesh, path.starts_with("router") ? spmd::P(spmd::None, "expert") : spmd::P("expert"));
  });
  const ts::Tree args{{"p", placed},
                      {"x", ts::Tree(spmd::device_put(x, spmd::NamedSharding(mesh, spmd::P("expert"))))}};
  std::vector<ts::Jitted> steps;
  std::vector<ts::Lowered> lowered;
  {
    const ts::nn::LogicalShardingScope scope(mesh, rules);  // while tracing
    for (ParallelForm& f : forms) {
      const ts::nn::MoE* moe = &f.moe;
      steps.push_back(ts::jit([moe](const ts::Tree& a) -> ts::Tree {
        auto loss = [moe](const ts::Tree& in) { return ts::sum(ts::square((*moe)(in.at("p"), in.at("x").leaf()).y)); };
        auto [value, grads] = ts::value_and_grad(loss)(a);
        return ts::Tree{{"grads", grads}, {"loss", value}};
      }));
      lowered.push_back(steps.back().lowered(args));
    }
  }
  for (int64_t r = 0; r <= rounds; ++r)
    for (size_t i = 0; i < forms.size(); ++i) {
      const auto t0 = Clock::now();
      (void)steps[i](args).at("loss").leaf();
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      if (r > 0) forms[i].ms.push_back(ms);
    }
  const double row_bytes = static_cast<double>(dim) * 4;
  const double buffer = static_cast<double>(base.experts * group * dim) * 4;  // [experts, tokens of a group, dim]
  *bytes_ratio_max = 0;
  for (size_t i = 0; i < forms.size(); ++i) {
    const std::vector<spmd::CommStats>& stats = lowered[i].spmd()->last_comm_stats();
    for (int64_t d = 0; d < devices; ++d) {
      double out = 0, in = 0;
      for (int64_t q = 0; q < devices; ++q)
        if (q != d) {
          out += rows[d][q];
          in += rows[q][d];
        }
      forms[i].sent.push_back(stats[static_cast<size_t>(d)].all_to_all_bytes);
      // (ragged: + the all-to-all that hands each device its experts' counts of every
      // group, int64 [groups, experts] of which (S-1)/S leave.)
      const double counts = static_cast<double>(devices - 1) / devices * static_cast<double>(base.experts) * 8;
      forms[i].analytic.push_back(i == 0 ? 2 * (out + in) * row_bytes + counts
                                         : 4 * static_cast<double>(devices - 1) / devices * buffer);
      *bytes_ratio_max = std::max(*bytes_ratio_max, forms[i].sent.back() / forms[i].analytic.back());
    }
  }
  spmd::set_cpu_devices(previous);
  *speedup = median(forms[1].ms) / median(forms[0].ms);
  fmt::print("expert parallelism over {} virtual CPU devices (expert={}), dropless, one pass:\n", devices, devices);
  fmt::print("{:<8} {:>9} {:>28} {:>28} {:>10}\n", "form", "ms", "all-to-all B, device 0", "analytic, device 0",
             "vs padded");
  std::string json;
  for (const ParallelForm& f : forms) {
    fmt::print("{:<8} {:>9.2f} {:>28.0f} {:>28.0f} {:>9.2f}x\n", f.name, median(f.ms), f.sent[0], f.analytic[0],
               median(forms[1].ms) / median(f.ms));
    std::string sent, analytic;
    for (size_t d = 0; d < f.sent.size(); ++d) {
      sent += fmt::format("{}{:.0f}", d ? "," : "", f.sent[d]);
      analytic += fmt::format("{}{:.0f}", d ? "," : "", f.analytic[d]);
    }
    json += fmt::format("{}{{\"form\":\"{}\",\"ms\":{:.3f},\"all_to_all_bytes\":[{}],\"analytic_bytes\":[{}]}}",
                        json.empty() ? "" : ",", f.name, median(f.ms), sent, analytic);
  }
  return fmt::format("\"expert_devices\":{},\"expert_parallel\":[{}]", devices, json);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    int64_t dim = 256, hidden = 512, experts = 8, top_k = 2, tokens = 2048, rounds = 7, expert_devices = 0;
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
      else if (flag == "--expert-devices")
        expert_devices = value;
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
    std::string parallel;
    if (expert_devices >= 2) {
      double speedup = 0, ratio = 0;
      parallel = expert_parallel(base, params, x, expert_devices, rounds, &speedup, &ratio);
      parallel +=
          fmt::format(",\"ragged_vs_padded_speedup\":{:.4f},\"comm_bytes_vs_analytic_max\":{:.6f}", speedup, ratio);
      fmt::print("measured / analytic all-to-all bytes, largest over devices and forms: {:.6f}\n", ratio);
    }
    fmt::print(
        "{{\"bench\":\"moe\",\"dim\":{},\"hidden\":{},\"experts\":{},\"top_k\":{},\"tokens\":{},\"rounds\":{},"
        "\"forms\":[{}],\"max_output_difference\":{:.3g},\"grouped_vs_buffers_speedup\":{:.4f}{}{}}}\n",
        dim, hidden, experts, top_k, tokens, rounds, json, difference, buffers_ms / median(forms[0].ms),
        parallel.empty() ? "" : ",", parallel);
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_moe: {}\n", e.what());
    return 1;
  }
}
