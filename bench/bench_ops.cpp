// bench_ops: throughput of tessera's ops through the public Array API (op + eval),
// each beside its baseline measured in the same run:
//   * GEMMs (GFLOP/s) vs the raw BLAS call on the same buffers;
//   * memory-bound ops (GB/s, bytes read + written once) vs memcpy on the same pool.
// Every figure is the median of several timed runs. The table goes to stdout; the
// last line is one JSON object with every figure, plus matmul_vs_blas_min and
// bandwidth_vs_memcpy_min (the worst ratio of each kind).
//
//   build/bin/bench_ops            full sizes (64 MiB operands)
//   build/bin/bench_ops --quick    small sizes (a smoke run)
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backend/cpu/kernels/matmul.h"
#include "backend/cpu/kernels/optim.h"
#include "tessera/ir/primitives/linalg.h"
#include "tessera/tessera.h"

namespace ts = tessera;

namespace {

struct Row {
  std::string name, kind, unit;
  double value = 0, baseline = 0;
  double ratio() const { return baseline > 0 ? value / baseline : 0; }
};

// Seconds per call of `fn` and of `baseline`, each the median over `runs` runs of
// `iters` calls, with the runs of the two interleaved so that a change in machine
// load hits both sides of the ratio alike. One warm-up call each (it also fills the
// buffer cache).
struct Timing {
  double op = 0, baseline = 0;
};
Timing time_pair(const std::function<void()>& fn, const std::function<void()>& baseline, int runs = 9,
                 double min_run_seconds = 0.03) {
  using clock = std::chrono::steady_clock;
  auto iters_for = [&](const std::function<void()>& f) {
    f();
    auto t0 = clock::now();
    f();
    double one = std::chrono::duration<double>(clock::now() - t0).count();
    return std::max(1, static_cast<int>(min_run_seconds / std::max(one, 1e-7)));
  };
  int iters_op = iters_for(fn), iters_base = iters_for(baseline);
  auto run = [&](const std::function<void()>& f, int iters) {
    auto start = clock::now();
    for (int i = 0; i < iters; ++i) f();
    return std::chrono::duration<double>(clock::now() - start).count() / iters;
  };
  std::vector<double> a, b;
  for (int r = 0; r < runs; ++r) {
    a.push_back(run(fn, iters_op));
    b.push_back(run(baseline, iters_base));
  }
  auto median = [](std::vector<double>& v) {
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  };
  return {median(a), median(b)};
}

// Seconds per call of fn alone (median of 9 runs).
double time_one(const std::function<void()>& fn) {
  return time_pair(fn, [] {}).op;
}

ts::Array randn(uint64_t seed, const ts::Shape& shape) { return ts::random::normal(ts::key(seed), shape).eval(); }

// memcpy of `bytes` split over the same thread pool the kernels use.
class ParallelMemcpy {
 public:
  explicit ParallelMemcpy(size_t bytes) : src_(bytes, 1), dst_(bytes, 0) {}
  void operator()() {
    ts::parallel_for(static_cast<int64_t>(src_.size()), 1 << 20, [&](int64_t b, int64_t e) {
      std::memcpy(dst_.data() + b, src_.data() + b, static_cast<size_t>(e - b));
    });
  }
  double bytes_moved() const { return 2.0 * static_cast<double>(src_.size()); }

 private:
  std::vector<char> src_, dst_;
};

}  // namespace

int main(int argc, char** argv) {
  bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  std::vector<Row> rows;

  // ---- GEMMs: tessera matmul vs the raw cblas_sgemm on the same operands ----
  // Timed in two phases: every tessera GEMM first, the raw-BLAS baselines at the very
  // end of the program. The baselines run OpenBLAS with its own threads, and once
  // those exist, tessera kernels timed afterwards measured up to 2x slower (OpenBLAS's
  // workers keep competing for the cores, even 250 ms later), while tessera itself
  // only ever calls OpenBLAS single-threaded.
  struct GemmRow {
    std::string name;
    double flops;
    std::function<void()> op, baseline;
    double op_seconds = 0;
  };
  std::vector<GemmRow> gemm_rows;
  struct Gemm {
    const char* name;
    int64_t m, k, n;
  };
  std::vector<Gemm> gemms = {{"matmul 2048x768x3072", 2048, 768, 3072},
                             {"matmul 2048x3072x768", 2048, 3072, 768},
                             {"matmul 2048x768x768", 2048, 768, 768}};
  if (quick) gemms = {{"matmul 256x128x384", 256, 128, 384}};
  std::vector<ts::Array> keep;  // operands live until the baselines ran
  std::vector<std::vector<float>> outputs(gemms.size() + 2);
  for (size_t gi = 0; gi < gemms.size(); ++gi) {
    const Gemm g = gemms[gi];
    ts::Array a = randn(1, {g.m, g.k}), b = randn(2, {g.k, g.n});
    keep.insert(keep.end(), {a, b});
    outputs[gi].assign(static_cast<size_t>(g.m * g.n), 0.0f);
    float* c = outputs[gi].data();
    gemm_rows.push_back(
        {g.name, 2.0 * static_cast<double>(g.m * g.n * g.k), [a, b] { ts::matmul(a, b).eval(); },
         [a, b, g, c] { ts::cpu::blas_sgemm(g.m, g.n, g.k, a.data<float>(), b.data<float>(), false, c); }});
  }
  // Attention's batched GEMMs at GPT-2 small shapes: batch*heads = 8*12, T = 256, D = 64.
  // Raw BLAS: one cblas_sgemm per batch entry, OpenBLAS given every thread.
  {
    int64_t bh = quick ? 8 : 96, t = 256, d = 64;
    ts::Array q = randn(3, {bh, t, d}), k = randn(4, {bh, t, d}), p = randn(5, {bh, t, t});
    keep.insert(keep.end(), {q, k, p});
    double flops = 2.0 * static_cast<double>(bh * t * t * d);
    outputs[gemms.size()].assign(static_cast<size_t>(bh * t * t), 0.0f);
    float* c1 = outputs[gemms.size()].data();
    outputs[gemms.size() + 1].assign(static_cast<size_t>(bh * t * d), 0.0f);
    float* c2 = outputs[gemms.size() + 1].data();
    gemm_rows.push_back({fmt::format("batched q@k^T [{}x{}x{}x{}]", bh, t, d, t), flops,
                         [q, k] { ts::matmul_op(q, k, false, true).eval(); },
                         [=] {
                           for (int64_t i = 0; i < bh; ++i)
                             ts::cpu::blas_sgemm(t, t, d, q.data<float>() + i * t * d, k.data<float>() + i * t * d,
                                                 true, c1 + i * t * t);
                         }});
    gemm_rows.push_back({fmt::format("batched p@v [{}x{}x{}x{}]", bh, t, t, d), flops,
                         [p, k] { ts::matmul(p, k).eval(); },
                         [=] {
                           for (int64_t i = 0; i < bh; ++i)
                             ts::cpu::blas_sgemm(t, d, t, p.data<float>() + i * t * t, k.data<float>() + i * t * d,
                                                 false, c2 + i * t * d);
                         }});
  }
  for (GemmRow& g : gemm_rows) g.op_seconds = time_one(g.op);

  // ---- memory-bound ops vs memcpy (GB/s of bytes read + written) ----
  const int64_t rows_n = quick ? 256 : 8192, cols = quick ? 1024 : 2048;  // 16M or 256K floats
  const int64_t n = rows_n * cols;
  const double f = 4.0 * static_cast<double>(n);  // bytes of one f32 operand
  ParallelMemcpy memcpy_baseline(static_cast<size_t>(f));
  std::vector<double> memcpy_rates;
  ts::Array x = randn(6, {rows_n, cols}), y = randn(7, {rows_n, cols});
  ts::Array w = randn(8, {cols}), bias = randn(9, {cols});
  ts::Array targets =
      ts::astype(ts::random::uniform(ts::key(10), {rows_n}, ts::DType::Float32, 0, static_cast<double>(cols)),
                 ts::DType::Int64)
          .eval();
  ts::Array xb = ts::astype(x, ts::DType::BFloat16).eval();
  // Each op is timed interleaved with a memcpy of one operand's bytes.
  auto bandwidth_row = [&](const std::string& name, double bytes, const std::function<void()>& op) {
    Timing t = time_pair(op, [&] { memcpy_baseline(); });
    double memcpy_rate = memcpy_baseline.bytes_moved() / t.baseline / 1e9;
    memcpy_rates.push_back(memcpy_rate);
    rows.push_back({name, "bandwidth", "GB/s", bytes / t.op / 1e9, memcpy_rate});
  };
  auto bandwidth = [&](const std::string& name, double bytes, const std::function<ts::Array()>& op) {
    bandwidth_row(name, bytes, [&] { op().eval(); });
  };
  bandwidth("add", 3 * f, [&] { return x + y; });
  bandwidth("multiply (row broadcast)", 2 * f, [&] { return x * w; });
  bandwidth("exp", 2 * f, [&] { return ts::exp(x); });
  bandwidth("gelu (tanh)", 2 * f, [&] { return ts::gelu(x); });
  bandwidth("cast f32->bf16", 1.5 * f, [&] { return ts::astype(x, ts::DType::BFloat16); });
  bandwidth("bf16 add", 1.5 * f, [&] { return xb + xb; });
  bandwidth("transpose", 2 * f, [&] { return ts::transpose(x); });
  bandwidth("sum (last axis)", f, [&] { return ts::sum(x, {-1}); });
  bandwidth("softmax", 2 * f, [&] { return ts::softmax(x); });
  bandwidth("layer_norm", 2 * f, [&] { return ts::layer_norm(x, w, bias); });
  bandwidth("rms_norm", 2 * f, [&] { return ts::rms_norm(x, w); });
  bandwidth("cross_entropy fwd", f, [&] { return ts::cross_entropy(x, targets, -100, ts::Reduction::None); });
  {
    // Forward + backward: read logits twice, write dlogits once.
    auto loss_grad = ts::grad([&](const std::vector<ts::Array>& in) { return ts::cross_entropy(in[0], targets); });
    bandwidth_row("cross_entropy fwd+bwd", 3 * f, [&] { loss_grad({x})[0].eval(); });
  }
  {
    // AdamW over n float32 parameters: reads p, g, m, v; writes p, m, v.
    std::vector<float> p(static_cast<size_t>(n), 0.1f), g(static_cast<size_t>(n), 0.01f), m(static_cast<size_t>(n)),
        v(static_cast<size_t>(n));
    ts::cpu::AdamWConfig config;
    bandwidth_row("adamw (kernel, in place)", 7 * f, [&] {
      ts::cpu::adamw_update(ts::DType::Float32, p.data(), g.data(), m.data(), v.data(), n, config);
    });
  }

  // ---- attention (GFLOP/s, for the record; no baseline) ----
  {
    int64_t b = quick ? 1 : 8, h = 12, t = 256, d = 64;
    ts::Array q = randn(11, {b, h, t, d}), k = randn(12, {b, h, t, d}), v = randn(13, {b, h, t, d});
    double causal_pairs = static_cast<double>(t) * static_cast<double>(t + 1) / 2;
    double fwd_flops = 4.0 * static_cast<double>(b * h * d) * causal_pairs;
    auto nothing = [] {};
    double fwd = time_pair([&] { ts::scaled_dot_product_attention(q, k, v).eval(); }, nothing).op;
    rows.push_back({fmt::format("attention fwd causal B{} H{} T{} D{}", b, h, t, d), "attention", "GFLOP/s",
                    fwd_flops / fwd / 1e9, 0});
    auto g = ts::grad([&](const std::vector<ts::Array>& in) {
      return ts::sum(ts::scaled_dot_product_attention(in[0], in[1], in[2]));
    });
    double both = time_pair(
                      [&] {
                        auto grads = g({q, k, v});
                        ts::eval(grads);
                      },
                      nothing)
                      .op;
    rows.push_back({fmt::format("attention fwd+bwd causal B{} H{} T{} D{}", b, h, t, d), "attention", "GFLOP/s",
                    3.5 * fwd_flops / both / 1e9, 0});
    // Packed rows: 4 documents of T/4 tokens (segment ids). Rated by the dense causal
    // FLOPs, so the rate above the causal rows is what tile skipping saves.
    std::vector<int32_t> ids(static_cast<size_t>(b * t));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(static_cast<int64_t>(i) % t / (t / 4));
    const ts::Array segments = ts::Array::from_vector(ids, {b, t});
    double packed =
        time_pair([&] { ts::scaled_dot_product_attention(q, k, v, true, std::nullopt, std::nullopt, segments).eval(); },
                  nothing)
            .op;
    rows.push_back({fmt::format("attention fwd causal, 4 packed documents B{} H{} T{} D{}", b, h, t, d), "attention",
                    "GFLOP/s (dense causal)", fwd_flops / packed / 1e9, 0});
    auto gp = ts::grad([&](const std::vector<ts::Array>& in) {
      return ts::sum(ts::scaled_dot_product_attention(in[0], in[1], in[2], true, std::nullopt, std::nullopt, segments));
    });
    double packed_both = time_pair(
                             [&] {
                               auto grads = gp({q, k, v});
                               ts::eval(grads);
                             },
                             nothing)
                             .op;
    rows.push_back({fmt::format("attention fwd+bwd causal, 4 packed documents B{} H{} T{} D{}", b, h, t, d),
                    "attention", "GFLOP/s (dense causal)", 3.5 * fwd_flops / packed_both / 1e9, 0});
  }

  // ---- the raw-BLAS baselines, last (see the GEMM section) ----
  for (size_t gi = 0; gi < gemm_rows.size(); ++gi) {
    const GemmRow& g = gemm_rows[gi];
    rows.insert(rows.begin() + static_cast<std::ptrdiff_t>(gi),
                Row{g.name, "gemm", "GFLOP/s", g.flops / g.op_seconds / 1e9, g.flops / time_one(g.baseline) / 1e9});
  }

  // ---- report ----
  std::sort(memcpy_rates.begin(), memcpy_rates.end());
  const double memcpy_rate = memcpy_rates[memcpy_rates.size() / 2];
  fmt::print(
      "tessera {} bench_ops: {} threads, memcpy {:.1f} GB/s median (read + write, same pool, timed "
      "interleaved with each op)\n",
      ts::version(), ts::num_threads(), memcpy_rate);
  fmt::print("{:<44} {:>10} {:>10} {:>8}\n", "op", "tessera", "baseline", "ratio");
  double matmul_min = 1e9, bandwidth_min = 1e9;
  std::string json =
      fmt::format("{{\"bench\":\"ops\",\"version\":\"{}\",\"threads\":{},\"quick\":{},\"memcpy_gbs\":{:.3f}",
                  ts::version(), ts::num_threads(), quick, memcpy_rate);
  json += ",\"results\":[";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::string base = r.baseline > 0 ? fmt::format("{:.1f}", r.baseline) : "-";
    std::string ratio = r.baseline > 0 ? fmt::format("{:.2f}", r.ratio()) : "-";
    fmt::print("{:<44} {:>10.1f} {:>10} {:>8}  {}\n", r.name, r.value, base, ratio, r.unit);
    if (r.kind == "gemm") matmul_min = std::min(matmul_min, r.ratio());
    if (r.kind == "bandwidth") bandwidth_min = std::min(bandwidth_min, r.ratio());
    json += fmt::format(
        "{}{{\"name\":\"{}\",\"kind\":\"{}\",\"unit\":\"{}\",\"value\":{:.3f},\"baseline\":{:.3f},"
        "\"ratio\":{:.4f}}}",
        i ? "," : "", r.name, r.kind, r.unit, r.value, r.baseline, r.ratio());
  }
  json +=
      fmt::format("],\"matmul_vs_blas_min\":{:.4f},\"bandwidth_vs_memcpy_min\":{:.4f}}}", matmul_min, bandwidth_min);
  fmt::print("matmul_vs_blas_min {:.2f} (target >= 0.95), bandwidth_vs_memcpy_min {:.2f} (target >= 0.6)\n", matmul_min,
             bandwidth_min);
  fmt::print("{}\n", json);
  return 0;
}
