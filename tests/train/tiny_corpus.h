// A learnable byte stream for trainer tests: short phrases in a random order, written
// as train/val token files (byte tokenizer) under `dir`/data.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "tessera/data/token_file.h"
#include "tessera/models/model.h"
#include "tessera/train/trainer.h"

namespace tessera::test {

// Trainer options for tests: no progress line; stop after `stop_at` steps (0: run to the end).
// A 2-layer, 32-wide GPT over 64 tokens with context 16: compiles and steps in milliseconds.
inline models::ModelConfig tiny_gpt_config(const std::string& compute_dtype = "float32") {
  models::ModelConfig c;
  c.vocab = 64;
  c.dim = 32;
  c.layers = 2;
  c.heads = 2;
  c.context = 16;
  c.compute_dtype = compute_dtype;
  return c;
}

inline train::TrainerOptions quiet_trainer(int64_t stop_at = 0) {
  train::TrainerOptions o;
  o.progress = false;
  o.stop_at_step = stop_at;
  return o;
}

// Every leaf of `a` has the same bytes as the same leaf of `b` (same structure); a
// mismatch names the leaf's path.
inline void expect_bitwise_equal(const Tree& a, const Tree& b) {
  ASSERT_TRUE(a.same_structure(b));
  const std::vector<Array> x = a.leaves(), y = b.leaves();
  const std::vector<std::string> paths = a.paths();
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(x[i].nbytes(), y[i].nbytes()) << paths[i];
    EXPECT_EQ(std::memcmp(x[i].raw_data(), y[i].raw_data(), x[i].nbytes()), 0) << paths[i] << " differs";
  }
}

// An empty directory under the system temp dir named after the running test and this
// process (two build trees' suites may run the same test at once).
inline std::filesystem::path fresh_test_dir(const std::string& prefix) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      (prefix + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "_" +
       std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  return dir;
}

// `chars` bytes of text; the first `train_chars` go to data/train.bin, the rest to
// data/val.bin.
inline void write_tiny_corpus(const std::filesystem::path& dir, size_t chars, size_t train_chars) {
  std::filesystem::create_directories(dir / "data");
  std::mt19937 gen(7);
  const std::vector<std::string> words = {"the cat ", "a dog ", "sat on ", "the mat. ", "ran far. "};
  std::string text;
  while (text.size() < chars) text += words[gen() % words.size()];
  std::vector<int32_t> tokens(text.begin(), text.end());
  const auto split = tokens.begin() + static_cast<std::ptrdiff_t>(train_chars);
  data::write_token_file(dir / "data/train.bin", std::vector<int32_t>(tokens.begin(), split), "byte", 256);
  data::write_token_file(dir / "data/val.bin", std::vector<int32_t>(split, tokens.end()), "byte", 256);
}

}  // namespace tessera::test
