// Shared by the training benchmarks (bench_train on the CPU, bench_gpu_train on a GPU):
// random token batches made before timing, and the median of step times.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "tessera/base/error.h"
#include "tessera/base/statistics.h"
#include "tessera/core/array.h"
#include "tessera/data/loader.h"

namespace tessera::bench {

// Uniform random tokens; targets are the tokens shifted by one (one window of seq + 1).
inline data::Batch random_batch(int64_t vocab, int64_t batch, int64_t seq, std::mt19937_64& gen) {
  std::uniform_int_distribution<int32_t> dist(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> window(static_cast<size_t>(batch * (seq + 1)));
  for (auto& t : window) t = dist(gen);
  std::vector<int32_t> tokens, targets;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < seq; ++t) {
      tokens.push_back(window[static_cast<size_t>(b * (seq + 1) + t)]);
      targets.push_back(window[static_cast<size_t>(b * (seq + 1) + t + 1)]);
    }
  return {Array::from_vector(tokens, {batch, seq}), Array::from_vector(targets, {batch, seq})};
}

// The value of flag argv[i] ("--steps 20"): advances i; a ValueError naming the program
// and flag when it is missing.
inline std::string flag_value(const char* program, int argc, char** argv, int& i) {
  const std::string flag = argv[i];
  if (i + 1 >= argc) fail<ValueError>("{}: {} needs a value", program, flag);
  return argv[++i];
}

// A non-negative integer flag value; a ValueError naming the program and flag otherwise.
inline int64_t flag_integer(const char* program, const std::string& flag, const std::string& value) {
  char* end = nullptr;
  const long long v = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || v < 0)
    fail<ValueError>("{}: {} wants a non-negative integer (got {})", program, flag, value);
  return static_cast<int64_t>(v);
}

// The flags of the GPU kernel benchmarks: --repeats (timed runs per case) and, where the
// program takes it (`with_tokens`), --tokens (rows of the training step's activations).
struct KernelBenchFlags {
  int64_t repeats = 20, tokens = 16384;
};
inline KernelBenchFlags parse_kernel_bench_flags(const char* program, int argc, char** argv, bool with_tokens) {
  KernelBenchFlags f;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const std::string value = flag_value(program, argc, argv, i);
    if (arg == "--repeats")
      f.repeats = std::max<int64_t>(1, flag_integer(program, arg, value));
    else if (with_tokens && arg == "--tokens")
      f.tokens = std::max<int64_t>(1, flag_integer(program, arg, value));
    else
      fail<ValueError>("{}: unknown flag {} (flags: --repeats{})", program, arg, with_tokens ? " --tokens" : "");
  }
  return f;
}

// A positive number flag value; a ValueError naming the program and flag otherwise.
inline double flag_positive_number(const char* program, const std::string& flag, const std::string& value) {
  size_t used = 0;
  double number = 0;
  try {
    number = std::stod(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != value.size() || !(number > 0))
    fail<ValueError>("{}: {} wants a positive number (got {})", program, flag, value);
  return number;
}

}  // namespace tessera::bench
