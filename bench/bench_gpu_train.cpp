// bench_gpu_train: GPT-2 training throughput and MFU on one GPU, against PyTorch and
// JAX on the same GPU in the same call.
//
// tessera's trainer step (forward, backward, clipping, AdamW, one compiled program,
// parameters and optimizer state resident on the GPU, bf16 compute with f32 master
// weights) on the GPT-2 124M shape: vocab 50257 (tessera pads its embedding table to
// 50304, model.vocab_pad_to; the classes and FLOPs are 50257's), 12 layers, 12 heads,
// dim 768, seq 1024. Batches of uniform random tokens are made before timing; --warmup steps
// are not timed (compilation, autotuning, CUDA graph capture); each timed step ends
// when its loss is on the host, and tokens/s = batch * seq / median step time.
//
// MFU = model FLOPs per token * tokens/s / peak, with model FLOPs per token
// = 6 N + 6 L T d (N = every parameter, the causal-attention convention of llm.c and
// MaxText) and peak = the device's dense bf16 peak (989 TFLOP/s on H100 / H200).
//
// The peers (bench/peers/gpt2_torch_gpu.py: torch.compile + SDPA flash attention;
// bench/peers/gpt2_jax_gpu.py: jax.jit, same model) run afterwards with the preset's
// shape (vocab, layers, heads, dim), batch, seq and steps, after tessera has released
// its device memory; their last output line is a JSON object with tokens_per_s. They
// implement GPT-2 in bfloat16 only: another family or dtype needs --peers none.
// `params_hash` (FNV-1a of the final parameters) tells two runs apart bitwise.
//
// --remat none,offload trains once per listed model.remat policy (none | full | offload)
// in this process, from the same parameters and batches: the first is the headline run;
// `remat_runs` has each one's step time, allocator peak, planned device peak and
// params_hash (equal: the policies change memory, not values).
//
// --quant attention,mlp,head runs those matmuls as int8 GEMMs (AQT, forward and both
// backward GEMMs: the [quant] config; backend/cuda/kernels/quantized_gemm.h); MFU stays
// against the bf16 peak.
//
//   build/bin/bench_gpu_train [--preset gpt2-124m] [--batch 16] [--seq 1024] [--steps 20] [--warmup 5]
//                             [--dtype bfloat16] [--peers torch,jax|none] [--python python3]
//                             [--remat none[,full][,offload]] [--quant attention,mlp,head]
//
// A table goes to stdout; the last line is one JSON object with every figure, `mfu`
// and `vs_best_peer` (tessera tokens/s over the faster peer's).
#include <fmt/format.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tessera/backend/cuda.h"
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
  std::string preset = "gpt2-124m";
  int64_t steps = 20, warmup = 5, batch = 16, seq = 1024;
  std::string dtype = "bfloat16";
  std::string peers = "torch,jax";
  std::string python = "python3";
  std::string device = "cuda";
  std::vector<std::string> remat{"none"};
  std::vector<std::string> quant;  // quant.targets (int8 backward)
};

Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const std::string value = ts::bench::flag_value("bench_gpu_train", argc, argv, i);
    auto integer = [&] { return ts::bench::flag_integer("bench_gpu_train", arg, value); };
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
    else if (arg == "--dtype")
      f.dtype = value;
    else if (arg == "--peers")
      f.peers = value;
    else if (arg == "--python")
      f.python = value;
    else if (arg == "--device")
      f.device = value;
    else if (arg == "--remat") {
      f.remat.clear();
      std::stringstream list(value);
      for (std::string policy; std::getline(list, policy, ',');) f.remat.push_back(policy);
      if (f.remat.empty()) ts::fail<ts::ValueError>("bench_gpu_train: --remat needs a policy (none, full, offload)");
    } else if (arg == "--quant") {
      std::stringstream list(value);
      for (std::string target; std::getline(list, target, ',');) f.quant.push_back(target);
    } else
      ts::fail<ts::ValueError>(
          "bench_gpu_train: unknown flag {} (flags: --preset --steps --warmup --batch --seq --dtype --peers --python "
          "--device --remat --quant)",
          arg);
  }
  return f;
}

struct PeerResult {
  std::string name;
  std::optional<nlohmann::json> json;
  std::string error;
};

// Runs a peer script and returns its last JSON line (stderr is passed through).
// The peer trains the model tessera trained: the preset's shape is passed along.
PeerResult run_peer(const Flags& f, const ts::models::ModelConfig& c, const std::string& name,
                    const std::string& script) {
  PeerResult r{name, std::nullopt, ""};
  const std::string command =
      fmt::format("{} {} --vocab {} --layers {} --heads {} --dim {} --batch {} --seq {} --steps {} --warmup {}",
                  f.python, script, c.vocab, c.layers, c.heads, c.dim, f.batch, f.seq, f.steps, f.warmup);
  fmt::print("running peer {}: {}\n", name, command);
  std::fflush(stdout);
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    r.error = "could not start: " + command;
    return r;
  }
  std::string last_json;
  std::array<char, 4096> line{};
  while (std::fgets(line.data(), static_cast<int>(line.size()), pipe) != nullptr) {
    std::string text(line.data());
    fmt::print("  [{}] {}", name, text);
    if (!text.empty() && text[0] == '{') last_json = text;
  }
  const int status = pclose(pipe);
  if (status != 0) r.error = fmt::format("exited with status {}", status);
  if (!last_json.empty()) {
    try {
      r.json = nlohmann::json::parse(last_json);
    } catch (const std::exception& e) {
      r.error = std::string("unreadable JSON line: ") + e.what();
    }
  } else if (r.error.empty()) {
    r.error = "printed no JSON line";
  }
  return r;
}

// FNV-1a (64-bit) over the parameters' bytes in tree order: two runs of the same
// binary, config and seed on one GPU must print the same value (determinism).
std::string params_hash(const ts::Tree& params) {
  uint64_t h = 1469598103934665603ull;
  for (const ts::Array& leaf : params.leaves()) {
    const ts::Array host = leaf.eval();
    const auto* bytes = static_cast<const unsigned char*>(host.raw_data());
    for (size_t i = 0; i < host.nbytes(); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  }
  return fmt::format("{:016x}", h);
}

// One policy's training run: every step timed, the device memory it needed.
struct Measured {
  std::string remat;
  double step_s = 0, first_step_s = 0;
  std::vector<double> losses;
  std::string hash;
  size_t peak_allocated_bytes = 0;  // the caching allocator's peak over the run
  size_t plan_peak_bytes = 0;       // the memory plan's device peak of the step program
};

Measured train(const Flags& f, ts::models::ModelConfig config, const std::string& remat,
               const std::vector<ts::data::Batch>& batches, int device_index) {
  config.remat = remat;
  ts::models::Model model(config);
  ts::optim::OptimizerConfig adamw;  // lr 3e-4, betas (0.9, 0.95), wd 0.1, clip 1.0: the peers' settings
  adamw.no_decay = {ts::nn::ParamKind::Bias, ts::nn::ParamKind::Norm};
  ts::optim::Optimizer optimizer(adamw, model.specs());
  ts::cuda::reset_peak_memory(device_index);
  auto params = std::make_unique<ts::Tree>(model.init(0));
  auto opt_state = std::make_unique<ts::Tree>(optimizer.init(*params));
  auto step = std::make_unique<ts::train::TrainStep>(model, optimizer, 1, nullptr, f.device);
  Measured m;
  m.remat = remat;
  std::vector<double> times;
  for (int64_t i = 0; i < f.warmup + f.steps; ++i) {
    const auto t0 = Clock::now();
    const ts::train::StepStats s =
        step->run(*params, *opt_state, {batches[static_cast<size_t>(i)]}, 3e-4, std::nullopt);
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (i == 0) m.first_step_s = dt;
    m.losses.push_back(s.loss);
    if (i >= f.warmup) times.push_back(dt);
  }
  if (const char* profile = std::getenv("TESSERA_PROFILE"); profile != nullptr && *profile != '0')
    fmt::print("kernel profile (TESSERA_PROFILE={}, steps run without CUDA graphs are timed):\n{}", profile,
               step->profile_text());
  m.peak_allocated_bytes = ts::cuda::memory_stats(device_index).peak_allocated_bytes;
  m.plan_peak_bytes = step->peak_bytes();
  m.hash = params_hash(*params);
  m.step_s = ts::median(times);
  // The next run (or the peers) get the GPU as tessera found it.
  step.reset();
  opt_state.reset();
  params.reset();
  ts::cuda::empty_cache(device_index);
  fmt::print("remat={}: step {:.2f} ms, allocator peak {:.0f} MiB, planned device peak {:.0f} MiB\n", remat,
             1e3 * m.step_s, static_cast<double>(m.peak_allocated_bytes) / (1 << 20),
             static_cast<double>(m.plan_peak_bytes) / (1 << 20));
  std::fflush(stdout);
  return m;
}

int run(const Flags& f) {
  if (!ts::cuda::available()) {
    fmt::print(stderr, "bench_gpu_train: no GPU: {}\n", ts::cuda::unavailable_reason());
    return 2;
  }
  const ts::compiler::DeviceSpec device = ts::compiler::DeviceSpec::parse(f.device);
  const ts::cuda::DeviceInfo info = ts::cuda::device_info(device.index);
  ts::models::ModelConfig config = ts::models::preset(f.preset);
  config.context = std::max(config.context, f.seq);
  config.compute_dtype = f.dtype;
  config.remat = f.remat.front();
  config.quant_targets = f.quant;
  config.quant_backward = "int8";
  ts::models::Model model(config);
  const bool with_peers = f.peers != "none" && !f.peers.empty();
  if (with_peers && (config.family != "gpt2" || f.dtype != "bfloat16" || config.resolved_kv_heads() != config.heads))
    ts::fail<ts::ValueError>(
        "bench_gpu_train: the peers train GPT-2 (multi-head attention) with bfloat16 compute; preset '{}' with "
        "--dtype {} would compare different models (use --peers none)",
        f.preset, f.dtype);
  std::mt19937_64 gen(1);
  std::vector<ts::data::Batch> batches;
  for (int64_t i = 0; i < f.warmup + f.steps; ++i)
    batches.push_back(ts::bench::random_batch(config.vocab, f.batch, f.seq, gen));

  std::vector<Measured> runs;
  for (const std::string& remat : f.remat) runs.push_back(train(f, config, remat, batches, device.index));
  const Measured& main_run = runs.front();
  const double step_s = main_run.step_s;
  const double first_step_s = main_run.first_step_s;
  const std::vector<double>& losses = main_run.losses;
  const std::string& hash = main_run.hash;
  const double tokens_per_s = static_cast<double>(f.batch * f.seq) / step_s;
  const double n_params = static_cast<double>(model.parameter_count());
  const double flops_per_token = 6.0 * n_params + 6.0 * static_cast<double>(config.layers * f.seq * config.dim);
  // The peak of configs/accelerators.toml (compiled in), as `tessera train --device cuda` uses.
  const ts::goodput::DeviceRecord peak = ts::train::cuda_device_peak(info);
  const double mfu = flops_per_token * tokens_per_s / peak.peak_flops_per_device;

  std::vector<PeerResult> peers;
  std::stringstream names(f.peers);
  for (std::string name; std::getline(names, name, ',');) {
    if (name == "none" || name.empty()) continue;
    if (name != "torch" && name != "jax")
      ts::fail<ts::ValueError>("bench_gpu_train: unknown peer '{}' (torch, jax or none)", name);
    peers.push_back(run_peer(f, config, name, fmt::format("bench/peers/gpt2_{}_gpu.py", name)));
  }
  double best_peer = 0;
  std::string best_name;
  for (const PeerResult& p : peers)
    if (p.json && p.json->contains("tokens_per_s") && (*p.json)["tokens_per_s"].get<double>() > best_peer) {
      best_peer = (*p.json)["tokens_per_s"].get<double>();
      best_name = p.name;
    }

  fmt::print("\nbench_gpu_train: {} ({} layers, dim {}, heads {}, vocab {}), batch {} x seq {}, {} compute, {}\n",
             f.preset, config.layers, config.dim, config.heads, config.vocab, f.batch, f.seq, f.dtype, info.name);
  fmt::print("| runner | step ms (median of {}) | tokens/s | MFU | vs tessera |\n| --- | --- | --- | --- | --- |\n",
             f.steps);
  fmt::print("| tessera | {:.2f} | {:.0f} | {:.1f}% | 1.00 |\n", 1e3 * step_s, tokens_per_s, 100 * mfu);
  for (const PeerResult& p : peers) {
    if (!p.json || !p.json->contains("tokens_per_s")) {
      fmt::print("| {} | failed: {} | | | |\n", p.name, p.error);
      continue;
    }
    const double tps = (*p.json)["tokens_per_s"].get<double>();
    fmt::print("| {} | {:.2f} | {:.0f} | {:.1f}% | {:.2f} |\n", p.name, 1e3 * f.batch * f.seq / tps, tps,
               100 * flops_per_token * tps / peak.peak_flops_per_device, tps / tokens_per_s);
  }
  nlohmann::json out;
  out["bench"] = "gpu_train";
  out["device"] = info.name;
  out["driver_version"] = info.driver_version;
  out["runtime_version"] = info.runtime_version;
  out["cudnn"] = ts::cuda::cudnn_status();
  const char* attention_kernel = std::getenv("TESSERA_ATTENTION_KERNEL");
  out["attention_kernel"] = attention_kernel != nullptr && *attention_kernel != '\0' ? attention_kernel : "auto";
  out["preset"] = f.preset;
  out["batch"] = f.batch;
  out["seq"] = f.seq;
  out["dtype"] = f.dtype;
  out["quant"] = f.quant;
  out["params"] = model.parameter_count();
  out["flops_per_token"] = flops_per_token;
  out["peak_flops"] = peak.peak_flops_per_device;
  out["peak_source"] = peak.source;
  out["steps"] = f.steps;
  out["warmup"] = f.warmup;
  out["step_ms"] = 1e3 * step_s;
  out["first_step_ms"] = 1e3 * first_step_s;
  out["tokens_per_s"] = tokens_per_s;
  out["mfu"] = mfu;
  out["peak_allocated_bytes"] = main_run.peak_allocated_bytes;
  out["remat"] = main_run.remat;
  for (const Measured& r : runs)
    out["remat_runs"].push_back({{"remat", r.remat},
                                 {"step_ms", 1e3 * r.step_s},
                                 {"peak_allocated_bytes", r.peak_allocated_bytes},
                                 {"plan_peak_bytes", r.plan_peak_bytes},
                                 {"params_hash", r.hash}});
  out["losses"] = losses;
  out["params_hash"] = hash;
  for (const PeerResult& p : peers) {
    if (p.json)
      out["peers"][p.name] = *p.json;
    else
      out["peers"][p.name] = {{"error", p.error}};
  }
  out["best_peer"] = best_name;
  out["vs_best_peer"] = best_peer > 0 ? nlohmann::json(tokens_per_s / best_peer) : nlohmann::json(nullptr);
  fmt::print("{}\n", out.dump());
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
