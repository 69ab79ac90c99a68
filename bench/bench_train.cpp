// bench_train: training throughput of tessera's trainer step (models/ + optim/ +
// train/TrainStep: forward, backward, global-norm clip, AdamW, all one compiled
// program with the state updated in place) on the shapes the peers are measured on.
//
// Same work as ../shared/peers/torch_gpt_cpu.py: pre-LN GPT-2 (learned positions,
// tied head, tanh GELU), AdamW lr 3e-4 betas (0.9, 0.95) eps 1e-8, weight decay 0.1
// on every 2-D parameter (embeddings included, as the peer does) and none on biases
// and norms, clip 1.0; uniform random tokens, batches made before timing. The first
// --warmup steps are not timed; then --steps steps are timed one by one and
// tokens/s = batch * seq / median step time.
//
//   build/bin/bench_train --preset tiny|small [--steps 20] [--warmup 3] [--threads 2] [--batch 8] [--seq 256]
//                         [--peak-gflops G] [--compute-dtype float32|bfloat16|float16]
//                         [--quant attention,mlp,head] [--quant-backward int8|float]
//
// --quant runs those matmuls as int8 GEMMs (AQT, the [quant] config); with int8
// backward GEMMs each step gets its own random key (stochastic rounding), as in training.
//
// MFU is printed against the calibration GEMM measured here in the compute dtype (what this machine's GEMM
// reaches) and, with --peak-gflops, against the peak you give (e.g. cores x FMA width x
// clock; run_train_bench.py passes its own). Without it there is no peak column: no
// figure is assumed.
// A table goes to stdout; the last line is one JSON object (run_train_bench.py reads it).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "tessera/base/thread_pool.h"
#include "tessera/models/model.h"
#include "tessera/optim/optimizer.h"
#include "tessera/tessera.h"
#include "tessera/train/train_step.h"
#include "tessera/train/trainer.h"
#include "train_bench_util.h"

namespace ts = tessera;

namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  std::string preset = "tiny";
  int64_t steps = 20, warmup = 3, batch = 8, seq = 256;
  int threads = 2;
  uint64_t seed = 0;
  double peak_gflops = 0;                 // 0: not given
  std::string compute_dtype = "float32";  // model.compute_dtype: float32 | bfloat16 | float16
  std::vector<std::string> quant;         // quant.targets
  std::string quant_backward = "int8";    // quant.backward
};

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(',', start), text.size());
    if (end > start) out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const std::string value = ts::bench::flag_value("bench_train", argc, argv, i);
    auto integer = [&] { return ts::bench::flag_integer("bench_train", arg, value); };
    if (arg == "--preset")
      f.preset = value;
    else if (arg == "--steps")
      f.steps = std::max<int64_t>(1, integer());
    else if (arg == "--warmup")
      f.warmup = integer();
    else if (arg == "--batch")
      f.batch = std::max<int64_t>(1, integer());
    else if (arg == "--seq")
      f.seq = std::max<int64_t>(1, integer());
    else if (arg == "--threads")
      f.threads = static_cast<int>(integer());
    else if (arg == "--seed")
      f.seed = static_cast<uint64_t>(integer());
    else if (arg == "--peak-gflops")
      f.peak_gflops = ts::bench::flag_positive_number("bench_train", arg, value);
    else if (arg == "--compute-dtype")
      f.compute_dtype = value;
    else if (arg == "--quant")
      f.quant = split_commas(value);
    else if (arg == "--quant-backward")
      f.quant_backward = value;
    else
      ts::fail<ts::ValueError>(
          "bench_train: unknown flag {} (flags: --preset --steps --warmup --batch --seq --threads --seed "
          "--peak-gflops --compute-dtype --quant --quant-backward)",
          arg);
  }
  return f;
}

int run(const Flags& f) {
  if (f.threads > 0) ts::set_num_threads(f.threads);
  ts::models::ModelConfig config = ts::models::preset(f.preset);
  config.context = std::max(config.context, f.seq);
  config.compute_dtype = f.compute_dtype;
  config.quant_targets = f.quant;
  config.quant_backward = f.quant_backward;
  ts::models::Model model(config);
  ts::optim::OptimizerConfig adamw;
  adamw.no_decay = {ts::nn::ParamKind::Bias, ts::nn::ParamKind::Norm};
  ts::optim::Optimizer optimizer(adamw, model.specs());
  ts::Tree params = model.init(f.seed);
  ts::Tree opt_state = optimizer.init(params);
  ts::train::TrainStep step(model, optimizer, 1);

  std::mt19937_64 gen(f.seed + 1);
  std::vector<ts::data::Batch> batches;
  for (int64_t i = 0; i < f.warmup + f.steps; ++i)
    batches.push_back(ts::bench::random_batch(config.vocab, f.batch, f.seq, gen));

  const double lr = 3e-4;
  std::vector<double> times, losses;
  const auto run_start = Clock::now();
  double first_step_s = 0;
  for (int64_t i = 0; i < f.warmup + f.steps; ++i) {
    const auto t0 = Clock::now();
    std::optional<ts::Array> key;
    if (config.needs_step_key()) key = ts::key(f.seed * 1000003 + static_cast<uint64_t>(i));
    const ts::train::StepStats s = step.run(params, opt_state, {batches[static_cast<size_t>(i)]}, lr, key);
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (i == 0) first_step_s = dt;
    losses.push_back(s.loss);
    if (i >= f.warmup) times.push_back(dt);
  }
  const double total_s = std::chrono::duration<double>(Clock::now() - run_start).count();
  const double step_s = ts::median(times);
  const double tokens_per_s = static_cast<double>(f.batch * f.seq) / step_s;
  const double flops_per_token = model.flops_per_token(f.seq);
  const double gflops = flops_per_token * tokens_per_s / 1e9;
  // The compute dtype's GEMM (a bf16 run against the bf16 kernel's rate).
  const ts::train::CalibrationGemm gemm{.dtype = config.compute()};
  const double peak = ts::train::calibrate_peak_flops(0.4, gemm).peak_flops;

  const std::string quant =
      f.quant.empty() ? "none" : fmt::format("{} ({} backward)", fmt::join(f.quant, ","), f.quant_backward);
  fmt::print(
      "bench_train: {} ({} {} layers, dim {}, heads {}, vocab {}), {} compute, int8 matmuls: {}, batch {} x seq {}, {} "
      "threads\n",
      f.preset, config.family, config.layers, config.dim, config.heads, config.vocab, f.compute_dtype, quant, f.batch,
      f.seq, ts::num_threads());
  const std::string given_peak_header =
      f.peak_gflops > 0 ? fmt::format(" MFU vs {:g} GFLOP/s (--peak-gflops) |", f.peak_gflops) : "";
  const std::string given_peak_cell = f.peak_gflops > 0 ? fmt::format(" {:.1f}% |", 100 * gflops / f.peak_gflops) : "";
  fmt::print("| params | flops/token | step ms (median of {}) | tokens/s | GFLOP/s |{} vs {} GEMM {:.0f} |\n", f.steps,
             given_peak_header, gemm.name(), peak / 1e9);
  fmt::print("| --- | --- | --- | --- | --- |{} --- |\n", f.peak_gflops > 0 ? " --- |" : "");
  fmt::print("| {:.2f}M | {:.1f}M | {:.1f} | {:.0f} | {:.1f} |{} {:.1f}% |\n",
             static_cast<double>(model.parameter_count()) / 1e6, flops_per_token / 1e6, 1e3 * step_s, tokens_per_s,
             gflops, given_peak_cell, 100 * gflops * 1e9 / peak);
  if (const char* profile = std::getenv("TESSERA_PROFILE"); profile != nullptr && std::string(profile) != "0")
    fmt::print("kernel profile (TESSERA_PROFILE=1, all {} steps):\n{}", f.warmup + f.steps, step.profile_text());
  std::string loss_list;
  for (double l : losses) loss_list += fmt::format("{}{:.6f}", loss_list.empty() ? "" : ", ", l);
  fmt::print(
      "{{\"bench\": \"train\", \"peer\": \"tessera\", \"preset\": \"{}\", \"family\": \"{}\", \"layers\": {}, \"dim\": "
      "{}, "
      "\"heads\": {}, \"vocab\": {}, \"compute_dtype\": \"{}\", \"quant\": \"{}\", \"batch\": {}, \"seq\": {}, "
      "\"threads\": {}, "
      "\"params\": {}, \"flops_per_token\": "
      "{:.0f}, "
      "\"steps\": {}, \"warmup\": {}, \"step_ms\": {:.3f}, \"first_step_ms\": {:.3f}, \"tokens_per_s\": {:.1f}, "
      "\"achieved_gflops\": {:.2f}, \"peak_gflops\": {}, \"mfu\": {}, \"calibration_gemm_gflops\": {:.1f}, \"traces\": "
      "{}, "
      "\"compiled_flops_per_step\": {:.0f}, \"total_s\": {:.2f}, \"losses\": [{}]}}\n",
      f.preset, config.family, config.layers, config.dim, config.heads, config.vocab, f.compute_dtype, quant, f.batch,
      f.seq, ts::num_threads(), model.parameter_count(), flops_per_token, f.steps, f.warmup, 1e3 * step_s,
      1e3 * first_step_s, tokens_per_s, gflops, f.peak_gflops > 0 ? fmt::format("{:g}", f.peak_gflops) : "null",
      f.peak_gflops > 0 ? fmt::format("{:.4f}", gflops / f.peak_gflops) : "null", peak / 1e9, step.trace_count(),
      step.compiled_flops(), total_s, loss_list);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse_flags(argc, argv));
  } catch (const ts::Error& e) {
    fmt::print(stderr, "{}\n", e.what());
    return 1;
  }
}
