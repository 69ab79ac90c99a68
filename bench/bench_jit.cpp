// bench_jit: one training step of a GPT-style decoder (transformer_step.h), run
//   (a) eagerly: every op evaluated as it is created (bench::run_eager), and
//   (b) compiled: tessera::jit over {params, opt, tokens, targets}, with the params
//       and optimizer state donated (updated in place),
// in the same process, the repetitions of the two interleaved so that a change in
// machine load hits both alike. Figures are medians. Both start from the same
// weights and take the same steps, so their losses must agree (printed as a check).
//
// AdamW's step count and learning rate are arrays (opt.step), so the timed steps are
// consecutive training steps of one compiled program (one trace).
//
// The table goes to stdout; the last line is one JSON object with every figure, plus
// jit_vs_eager_speed (jit tokens/s / eager tokens/s) and jit_vs_eager_memory (jit
// peak / eager peak). A variant's peak is what one step needs at its high-water mark:
//   state bytes (params, moments, tokens) + the allocator's peak rise during the step
//   (activations, gradients, new state not written in place) + its own arena (jit's
//   static buffer; eager's per-op programs need none to speak of).
// The process-wide allocator peak is printed too, but both variants' caches live in
// one process, so it is not a per-variant figure.
//
//   build/bin/bench_jit                                   4 layers, dim 256, seq 256, batch 8
//   build/bin/bench_jit --layers 1 --dim 64 --seq 32 --batch 2 --reps 2   (a smoke run)
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tessera/api/jit.h"
#include "tessera/base/allocator.h"
#include "tessera/base/statistics.h"
#include "tessera/tessera.h"
#include "transformer_step.h"

namespace ts = tessera;
namespace tb = tessera::bench;

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

struct Flags {
  tb::TransformerConfig config;
  int reps = 7;
};

Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> int64_t {
      if (i + 1 >= argc) ts::fail<ts::ValueError>("bench_jit: {} needs a value", arg);
      char* end = nullptr;
      long long v = std::strtoll(argv[++i], &end, 10);
      if (*end != '\0' || v <= 0)
        ts::fail<ts::ValueError>("bench_jit: {} wants a positive integer (got {})", arg, argv[i]);
      return v;
    };
    if (arg == "--layers")
      f.config.layers = value();
    else if (arg == "--dim")
      f.config.dim = value();
    else if (arg == "--heads")
      f.config.heads = value();
    else if (arg == "--seq")
      f.config.seq = value();
    else if (arg == "--batch")
      f.config.batch = value();
    else if (arg == "--vocab")
      f.config.vocab = value();
    else if (arg == "--reps")
      f.reps = static_cast<int>(value());
    else
      ts::fail<ts::ValueError>(
          "bench_jit: unknown flag {} (flags: --layers --dim --heads --seq --batch --vocab --reps)", arg);
  }
  return f;
}

// One step's timing and memory.
struct Sample {
  double seconds = 0;
  int64_t peak_rise_bytes = 0;     // allocator high-water mark during the step - bytes in use before it
  int64_t process_peak_bytes = 0;  // allocator high-water mark during the step
  float loss = 0;
};

// Model state of one variant; each step replaces it with the step's outputs.
struct State {
  ts::Tree params, opt;
};

template <typename Step>
Sample measure(State& state, const ts::Array& tokens, const ts::Array& targets, Step&& step) {
  ts::reset_peak_bytes_in_use();
  const int64_t in_use_before = ts::allocator_stats().bytes_in_use;
  auto start = clock_type::now();
  ts::Tree out;
  {
    // The args tree holds the only handles to the donated state while the step runs.
    ts::Tree args = tb::step_args(std::move(state.params), std::move(state.opt), tokens, targets);
    state = {};
    out = step(args);
    ts::eval(out.leaves());
  }
  Sample s;
  s.seconds = seconds_since(start);
  s.process_peak_bytes = ts::allocator_stats().peak_bytes_in_use;
  s.peak_rise_bytes = s.process_peak_bytes - in_use_before;
  state.params = out.at("params");
  state.opt = out.at("opt");
  s.loss = out.at("loss").leaf().item<float>();
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  try {
    flags = parse_flags(argc, argv);
  } catch (const ts::Error& e) {
    fmt::print(stderr, "{}\n", e.what());
    return 2;
  }
  const tb::TransformerConfig& c = flags.config;
  const ts::StaticArgs kStep = {};  // no static arguments: the step count is opt.step
  const double tokens_per_step = static_cast<double>(c.batch * c.seq);

  ts::Array tokens = tb::random_tokens(c, 1);
  ts::Array targets = tb::random_tokens(c, 2);  // synthetic next tokens
  auto step_fn = tb::transformer_step_fn(c);

  State eager{tb::init_params(c, 0), {}}, jitted{tb::init_params(c, 0), {}};
  eager.opt = tb::init_opt_state(eager.params);
  jitted.opt = tb::init_opt_state(jitted.params);
  size_t param_count = 0, state_bytes = 0;
  for (const ts::Array& p : eager.params.leaves()) param_count += static_cast<size_t>(p.size());
  for (const ts::Array& a : tb::step_args(eager.params, eager.opt, tokens, targets).leaves()) state_bytes += a.nbytes();

  ts::JitOptions options;
  options.donate_leaves = tb::state_leaf_indices(tb::step_args(jitted.params, jitted.opt, tokens, targets));
  options.name = "transformer_step";
  ts::Jitted compiled = ts::jit(step_fn, options);

  auto eager_step = [&](const ts::Tree& args) { return tb::run_eager([&] { return step_fn(args, kStep); }); };
  auto jit_step = [&](const ts::Tree& args) { return compiled(args, kStep); };

  fmt::print("bench_jit: {} layers, dim {}, {} heads, seq {}, batch {}, vocab {} ({:.2f} M params), {} reps\n",
             c.layers, c.dim, c.heads, c.seq, c.batch, c.vocab, static_cast<double>(param_count) / 1e6, flags.reps);

  // First calls: the jit one traces and compiles; both warm the buffer cache.
  Sample jit_first = measure(jitted, tokens, targets, jit_step);
  Sample eager_first = measure(eager, tokens, targets, eager_step);

  // The compiled program's own figures (the cached entry: no re-trace).
  size_t kernels = 0, arena_bytes = 0, plan_peak_bytes = 0;
  double compile_sec = 0;
  {
    ts::Lowered lowered = compiled.lowered(tb::step_args(jitted.params, jitted.opt, tokens, targets), kStep);
    const auto& stats = lowered.executable().stats();
    kernels = stats.kernels;
    arena_bytes = stats.arena_bytes;
    plan_peak_bytes = stats.peak_bytes;
    compile_sec = stats.compile_seconds;  // trace + passes + planning, measured by jit
  }

  std::vector<double> eager_s, jit_s, eager_rise, jit_rise, process_peak;
  double max_loss_diff = std::abs(jit_first.loss - eager_first.loss);
  for (int r = 0; r < flags.reps; ++r) {
    Sample e = measure(eager, tokens, targets, eager_step);
    Sample j = measure(jitted, tokens, targets, jit_step);
    eager_s.push_back(e.seconds);
    jit_s.push_back(j.seconds);
    eager_rise.push_back(static_cast<double>(e.peak_rise_bytes));
    jit_rise.push_back(static_cast<double>(j.peak_rise_bytes));
    process_peak.push_back(static_cast<double>(std::max(e.process_peak_bytes, j.process_peak_bytes)));
    max_loss_diff = std::max<double>(max_loss_diff, std::abs(e.loss - j.loss));
    fmt::print("  rep {}/{}: eager {:.1f} ms (loss {:.5f}), jit {:.1f} ms (loss {:.5f})\n", r + 1, flags.reps,
               e.seconds * 1e3, e.loss, j.seconds * 1e3, j.loss);
  }

  const double eager_sec = ts::median(eager_s), jit_sec = ts::median(jit_s);
  const double eager_tps = tokens_per_step / eager_sec, jit_tps = tokens_per_step / jit_sec;
  const double eager_peak = static_cast<double>(state_bytes) + ts::median(eager_rise);
  const double jit_peak = static_cast<double>(state_bytes + arena_bytes) + ts::median(jit_rise);
  if (const char* profile = std::getenv("TESSERA_PROFILE"); profile != nullptr && std::string(profile) == "1") {
    ts::Lowered lowered = compiled.lowered(tb::step_args(jitted.params, jitted.opt, tokens, targets), kStep);
    fmt::print("jit kernel profile (TESSERA_PROFILE=1):\n{}", lowered.executable().profile_text());
  }
  const double mib = 1 << 20;

  fmt::print("\n{:<8} {:>10} {:>10} {:>10} {:>12} {:>10}\n", "mode", "ms/step", "tokens/s", "peak MiB", "step rise MiB",
             "first ms");
  fmt::print("{:<8} {:>10.2f} {:>10.0f} {:>10.1f} {:>12.1f} {:>10.1f}\n", "eager", eager_sec * 1e3, eager_tps,
             eager_peak / mib, ts::median(eager_rise) / mib, eager_first.seconds * 1e3);
  fmt::print("{:<8} {:>10.2f} {:>10.0f} {:>10.1f} {:>12.1f} {:>10.1f}\n", "jit", jit_sec * 1e3, jit_tps, jit_peak / mib,
             ts::median(jit_rise) / mib, jit_first.seconds * 1e3);
  fmt::print(
      "jit/eager: speed {:.2f}x, memory {:.2f}x; jit compile {:.1f} ms, {} kernels, arena {:.1f} MiB, planned peak "
      "{:.1f} MiB; state {:.1f} MiB; process peak {:.1f} MiB; max |loss eager - jit| {:.2e}; traces {}\n",
      jit_tps / eager_tps, jit_peak / eager_peak, compile_sec * 1e3, kernels, static_cast<double>(arena_bytes) / mib,
      static_cast<double>(plan_peak_bytes) / mib, static_cast<double>(state_bytes) / mib,
      ts::median(process_peak) / mib, max_loss_diff, compiled.trace_count());

  fmt::print(
      "{{\"bench\": \"jit\", \"layers\": {}, \"dim\": {}, \"heads\": {}, \"seq\": {}, \"batch\": {}, \"vocab\": {}, "
      "\"params\": {}, \"reps\": {}, \"eager_ms\": {:.3f}, \"jit_ms\": {:.3f}, \"eager_tokens_per_s\": {:.1f}, "
      "\"jit_tokens_per_s\": {:.1f}, \"state_bytes\": {}, \"eager_peak_bytes\": {:.0f}, \"jit_peak_bytes\": {:.0f}, "
      "\"eager_step_rise_bytes\": {:.0f}, \"jit_step_rise_bytes\": {:.0f}, \"process_peak_bytes\": {:.0f}, "
      "\"eager_first_ms\": {:.3f}, \"jit_first_ms\": {:.3f}, \"jit_compile_ms\": {:.3f}, \"jit_kernels\": {}, "
      "\"jit_arena_bytes\": {}, \"jit_planned_peak_bytes\": {}, \"jit_traces\": {}, \"max_loss_diff\": {:.3e}, "
      "\"jit_vs_eager_speed\": {:.4f}, \"jit_vs_eager_memory\": {:.4f}}}\n",
      c.layers, c.dim, c.heads, c.seq, c.batch, c.vocab, param_count, flags.reps, eager_sec * 1e3, jit_sec * 1e3,
      eager_tps, jit_tps, state_bytes, eager_peak, jit_peak, ts::median(eager_rise), ts::median(jit_rise),
      ts::median(process_peak), eager_first.seconds * 1e3, jit_first.seconds * 1e3, compile_sec * 1e3, kernels,
      arena_bytes, plan_peak_bytes, compiled.trace_count(), max_loss_diff, jit_tps / eager_tps, jit_peak / eager_peak);
  return 0;
}
