// bench_lowp_gemm: the CPU's low-precision GEMM kernels on a transformer's shapes, in the
// three layouts training runs (forward Y = X W, dX = dY W^T, dW = X^T dY): float32
// sgemm, bfloat16 (AMX TDPBF16PS where the CPU has it) and int8 AQT (quantization
// included: AMX TDPBSSD where the CPU has it). Rounds interleave the three; the table
// gives the median time of each and TFLOP/s, and int8 over bf16.
//
//   build/bin/bench_lowp_gemm [--tokens 2048] [--dim 256] [--rounds 7] [--threads 0]
//
// The last line is one JSON object (int8_vs_bf16_min over the shapes).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/kernels/matmul.h"
#include "backend/cpu/kernels/matmul_amx.h"
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
    std::mt19937 gen(7);
    std::uniform_real_distribution<float> dist(-1, 1);
    struct Row {
      std::string name;
      double flops;
      std::vector<double> f32, bf16, int8;
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
      Row row{
          sh.name, 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k), {}, {}, {}};
      const ts::cpu::Int8Rounding nearest, stochastic{true, 99};
      // dX and dW round the incoming gradient stochastically, as training does.
      const bool grad_a = sh.name.find("dX") != std::string::npos, grad_b = sh.name.find("dW") != std::string::npos;
      auto f32 = [&] { ts::cpu::matmul(ts::DType::Float32, s, a.data(), b.data(), c.data()); };
      auto bf16 = [&] { ts::cpu::matmul(ts::DType::BFloat16, s, ab.data(), bb.data(), cb.data()); };
      auto int8 = [&] {
        ts::cpu::quantized_matmul(ts::DType::BFloat16, s, ab.data(), bb.data(), cb.data(),
                                  grad_a ? stochastic : nearest, grad_b ? stochastic : nearest);
      };
      f32(), bf16(), int8();  // warm-up (scratch, pool)
      for (int64_t r = 0; r < f.rounds; ++r) {
        row.f32.push_back(seconds(f32));
        row.bf16.push_back(seconds(bf16));
        row.int8.push_back(seconds(int8));
      }
      rows.push_back(std::move(row));
    }
    fmt::print("bench_lowp_gemm: tokens {}, dim {}, {} threads, median of {} interleaved rounds\n", t, d,
               ts::num_threads(), f.rounds);
    fmt::print("bf16 GEMM: {}\nint8 GEMM: {}\n", ts::cpu::bf16_gemm_path().description,
               ts::cpu::int8_gemm_path().description);
    fmt::print(
        "| GEMM | m x n x k | f32 ms | bf16 ms | int8 ms | f32 TFLOP/s | bf16 TFLOP/s | int8 TFLOP/s | int8/bf16 |\n");
    fmt::print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    nlohmann::json out = {{"bench", "lowp_gemm"},
                          {"tokens", t},
                          {"dim", d},
                          {"threads", ts::num_threads()},
                          {"bf16_path", ts::cpu::bf16_gemm_path().description},
                          {"int8_path", ts::cpu::int8_gemm_path().description}};
    double worst = 1e30, total_bf16 = 0, total_int8 = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      const double f32 = ts::median(r.f32), bf16 = ts::median(r.bf16), int8 = ts::median(r.int8);
      const ts::cpu::MatmulShape& s = shapes[i].s;
      fmt::print("| {} | {}x{}x{} | {:.3f} | {:.3f} | {:.3f} | {:.2f} | {:.2f} | {:.2f} | {:.2f} |\n", r.name, s.m, s.n,
                 s.k, 1e3 * f32, 1e3 * bf16, 1e3 * int8, r.flops / f32 / 1e12, r.flops / bf16 / 1e12,
                 r.flops / int8 / 1e12, bf16 / int8);
      worst = std::min(worst, bf16 / int8);
      total_bf16 += bf16;
      total_int8 += int8;
      out["gemms"].push_back({{"name", r.name},
                              {"m", s.m},
                              {"n", s.n},
                              {"k", s.k},
                              {"f32_ms", 1e3 * f32},
                              {"bf16_ms", 1e3 * bf16},
                              {"int8_ms", 1e3 * int8}});
    }
    fmt::print("all {} GEMMs: bf16 {:.2f} ms, int8 {:.2f} ms: int8/bf16 {:.2f}x\n", rows.size(), 1e3 * total_bf16,
               1e3 * total_int8, total_bf16 / total_int8);
    out["int8_vs_bf16_min"] = worst;
    out["int8_vs_bf16_total"] = total_bf16 / total_int8;
    fmt::print("{}\n", out.dump());
    return 0;
  } catch (const ts::Error& e) {
    fmt::print(stderr, "{}\n", e.what());
    return 1;
  }
}
