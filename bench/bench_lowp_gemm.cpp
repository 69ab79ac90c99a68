// bench_lowp_gemm: the CPU's low-precision GEMM kernels on a transformer's shapes, in the
// three layouts training runs (forward Y = X W, dX = dY W^T, dW = X^T dY): float32
// sgemm; bfloat16 on every kernel this machine runs (float32 sgemm on widened operands,
// AVX512-BF16 VDPBF16PS, AMX TDPBF16PS); int8 AQT, quantization included, on every kernel
// (the float64 reference, AVX512-VNNI VPDPBUSD, AMX TDPBSSD). Rounds interleave all of
// them; the table gives each one's median GFLOP/s, the totals line each one's summed
// median time over the shapes.
//
//   build/bin/bench_lowp_gemm [--tokens 2048] [--dim 256] [--rounds 7] [--threads 0]
//
// The last line is one JSON object (per GEMM and kernel the median ms; the totals).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/kernels/matmul.h"
#include "backend/cpu/kernels/matmul_int8.h"
#include "tessera/base/error.h"
#include "tessera/base/statistics.h"
#include "tessera/base/thread_pool.h"
#include "train_bench_util.h"

namespace ts = tessera;
using Clock = std::chrono::steady_clock;

namespace {

struct Flags {
  int64_t tokens = 2048, dim = 256, rounds = 7, threads = 0;
};

Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const std::string value = ts::bench::flag_value("bench_lowp_gemm", argc, argv, i);
    const int64_t v = ts::bench::flag_integer("bench_lowp_gemm", arg, value);
    if (arg == "--tokens")
      f.tokens = std::max<int64_t>(1, v);
    else if (arg == "--dim")
      f.dim = std::max<int64_t>(1, v);
    else if (arg == "--rounds")
      f.rounds = std::max<int64_t>(1, v);
    else if (arg == "--threads")
      f.threads = v;
    else
      ts::fail<ts::ValueError>("bench_lowp_gemm: unknown flag {} (flags: --tokens --dim --rounds --threads)", arg);
  }
  return f;
}

struct Shape {
  std::string name;
  ts::cpu::MatmulShape s;
};

double seconds(const std::function<void()>& fn) {
  const auto t0 = Clock::now();
  fn();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Flags f = parse_flags(argc, argv);
    if (f.threads > 0) ts::set_num_threads(static_cast<int>(f.threads));
    const int64_t t = f.tokens, d = f.dim;
    // A block's projections: qkv (d -> 3d), out (d -> d), fc (d -> 4d), proj (4d -> d).
    std::vector<Shape> shapes;
    for (const auto& [what, in, out] : std::vector<std::tuple<std::string, int64_t, int64_t>>{
             {"qkv", d, 3 * d}, {"out", d, d}, {"fc", d, 4 * d}, {"proj", 4 * d, d}}) {
      ts::cpu::MatmulShape fwd, dx, dw;
      fwd.m = t, fwd.k = in, fwd.n = out;                  // X [t, in] W [in, out]
      dx.m = t, dx.k = out, dx.n = in, dx.trans_b = true;  // dY [t, out] W^T
      dw.m = in, dw.k = t, dw.n = out, dw.trans_a = true;  // X^T [in, t] dY [t, out]
      shapes.push_back({what + " fwd", fwd});
      shapes.push_back({what + " dX", dx});
      shapes.push_back({what + " dW", dw});
    }
    // The kernels timed: float32, then each bf16 and int8 kernel this machine runs.
    struct Kernel {
      std::string name;
      bool bf16 = false, int8 = false;
      ts::cpu::Bf16Kernel bf16_kernel{};
      ts::cpu::Int8Kernel int8_kernel{};
    };
    std::vector<Kernel> kernels{{"f32"}};
    for (auto k : {ts::cpu::Bf16Kernel::Float32, ts::cpu::Bf16Kernel::Avx512Bf16, ts::cpu::Bf16Kernel::Amx})
      if (ts::cpu::bf16_kernel_usable(k))
        kernels.push_back({fmt::format("bf16:{}", ts::cpu::bf16_kernel_name(k)), true, false, k, {}});
    for (auto k : {ts::cpu::Int8Kernel::Reference, ts::cpu::Int8Kernel::Avx512Vnni, ts::cpu::Int8Kernel::Amx})
      if (ts::cpu::int8_kernel_usable(k))
        kernels.push_back({fmt::format("int8:{}", ts::cpu::int8_kernel_name(k)), false, true, {}, k});
    std::mt19937 gen(7);
    std::uniform_real_distribution<float> dist(-1, 1);
    struct Row {
      std::string name;
      double flops;
      std::vector<std::vector<double>> times;  // [kernel][round], seconds
    };
    std::vector<Row> rows;
    for (const Shape& sh : shapes) {
      const ts::cpu::MatmulShape& s = sh.s;
      std::vector<float> a(static_cast<size_t>(s.m * s.k)), b(static_cast<size_t>(s.k * s.n)),
          c(static_cast<size_t>(s.m * s.n));
      for (float& x : a) x = dist(gen);
      for (float& x : b) x = dist(gen);
      std::vector<ts::bfloat16> ab(a.size()), bb(b.size()), cb(c.size());
      ts::cpu::cast_span(ts::DType::Float32, a.data(), ts::DType::BFloat16, ab.data(), static_cast<int64_t>(a.size()));
      ts::cpu::cast_span(ts::DType::Float32, b.data(), ts::DType::BFloat16, bb.data(), static_cast<int64_t>(b.size()));
      Row row{sh.name, 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k),
              std::vector<std::vector<double>>(kernels.size())};
      const ts::cpu::Int8Rounding nearest, stochastic{true, 99};
      // dX and dW round the incoming gradient stochastically, as training does.
      const bool grad_a = sh.name.find("dX") != std::string::npos, grad_b = sh.name.find("dW") != std::string::npos;
      auto run = [&](const Kernel& k) {
        if (k.bf16) {
          ts::cpu::matmul_bf16(k.bf16_kernel, s, ab.data(), bb.data(), cb.data());
        } else if (k.int8) {
          ts::cpu::quantized_matmul(k.int8_kernel, ts::DType::BFloat16, s, ab.data(), bb.data(), cb.data(),
                                    grad_a ? stochastic : nearest, grad_b ? stochastic : nearest);
        } else {
          ts::cpu::matmul(ts::DType::Float32, s, a.data(), b.data(), c.data());
        }
      };
      for (const Kernel& k : kernels) run(k);  // warm-up (scratch, pool)
      for (int64_t r = 0; r < f.rounds; ++r)
        for (size_t k = 0; k < kernels.size(); ++k) row.times[k].push_back(seconds([&] { run(kernels[k]); }));
      rows.push_back(std::move(row));
    }
    fmt::print("bench_lowp_gemm: tokens {}, dim {}, {} threads, median of {} interleaved rounds\n", t, d,
               ts::num_threads(), f.rounds);
    fmt::print("bf16 GEMM path: {}\nint8 GEMM path: {}\n", ts::cpu::bf16_gemm_path().description,
               ts::cpu::int8_gemm_path().description);
    std::string header = "| GEMM | m x n x k |", rule = "| --- | --- |";
    for (const Kernel& k : kernels) {
      header += fmt::format(" {} GFLOP/s |", k.name);
      rule += " --- |";
    }
    fmt::print("{}\n{}\n", header, rule);
    nlohmann::json out = {{"bench", "lowp_gemm"},
                          {"tokens", t},
                          {"dim", d},
                          {"threads", ts::num_threads()},
                          {"rounds", f.rounds},
                          {"bf16_path", ts::cpu::bf16_gemm_path().description},
                          {"int8_path", ts::cpu::int8_gemm_path().description}};
    std::vector<double> total(kernels.size(), 0.0);
    double all_flops = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      const ts::cpu::MatmulShape& s = shapes[i].s;
      std::string line = fmt::format("| {} | {}x{}x{} |", r.name, s.m, s.n, s.k);
      nlohmann::json ms;
      for (size_t k = 0; k < kernels.size(); ++k) {
        const double median = ts::median(r.times[k]);
        line += fmt::format(" {:.1f} |", r.flops / median / 1e9);
        ms[kernels[k].name] = 1e3 * median;
        total[k] += median;
      }
      all_flops += r.flops;
      fmt::print("{}\n", line);
      out["gemms"].push_back({{"name", r.name}, {"m", s.m}, {"n", s.n}, {"k", s.k}, {"ms", ms}});
    }
    std::string totals = fmt::format("all {} GEMMs (sum of medians):", rows.size());
    for (size_t k = 0; k < kernels.size(); ++k) {
      totals += fmt::format(" {} {:.2f} ms ({:.1f} GFLOP/s, {:.2f}x f32);", kernels[k].name, 1e3 * total[k],
                            all_flops / total[k] / 1e9, total[0] / total[k]);
      out["total_ms"][kernels[k].name] = 1e3 * total[k];
    }
    fmt::print("{}\n{}\n", totals, out.dump());
    return 0;
  } catch (const ts::Error& e) {
    fmt::print(stderr, "{}\n", e.what());
    return 1;
  }
}
