// Shared by the compilation-cache tests (test_compilation_cache.cpp: the store;
// test_compilation_cache_index.cpp: the per-call index): a two-layer MLP's SGD step,
// bitwise comparison, raw file access and a fixture with a fresh cache directory.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <thread>

#include "core/test_util.h"
#include "tessera/base/version.h"
#include "tessera/compiler/compilation_cache.h"
#include "tessera/compiler/compile.h"
#include "tessera/tessera.h"

namespace tessera::test {

namespace fs = std::filesystem;
using compiler::CacheKey;
using compiler::CompilationCache;

inline Tree mlp_params(uint32_t seed) {
  Tree p;
  p["w1"] = random_array({8, 16}, seed, DType::Float32, -0.5, 0.5);
  p["b1"] = random_array({16}, seed + 1, DType::Float32, -0.1, 0.1);
  p["w2"] = random_array({16, 4}, seed + 2, DType::Float32, -0.5, 0.5);
  p["b2"] = random_array({4}, seed + 3, DType::Float32, -0.1, 0.1);
  return p;
}

// One SGD step of a two-layer MLP with step size `lr` (a traced constant).
inline JitFn sgd_step(float lr) {
  return [lr](const Tree& args, const StaticArgs&) -> Tree {
    auto loss_of = [&](const Tree& p) {
      Array h = gelu(add(matmul(args.at("x").leaf(), p.at("w1").leaf()), p.at("b1").leaf()));
      Array out = add(matmul(h, p.at("w2").leaf()), p.at("b2").leaf());
      return mean(square(subtract(out, args.at("y").leaf())));
    };
    auto [loss, g] = value_and_grad(loss_of)(args.at("params"));
    Tree updated =
        tree_map([lr](const Array& w, const Array& d) { return subtract(w, multiply(d, Array::scalar(lr))); },
                 args.at("params"), g);
    return Tree{{"params", updated}, {"loss", loss}};
  };
}

inline Tree step_args(uint32_t seed) {
  return Tree{{"params", mlp_params(seed)},
              {"x", random_array({32, 8}, seed + 10, DType::Float32)},
              {"y", random_array({32, 4}, seed + 11, DType::Float32)}};
}

inline void expect_bitwise(const Tree& a, const Tree& b, const std::string& what) {
  std::vector<Array> la = a.leaves(), lb = b.leaves();
  ASSERT_EQ(la.size(), lb.size()) << what;
  for (size_t i = 0; i < la.size(); ++i) {
    ASSERT_EQ(la[i].shape(), lb[i].shape()) << what << " leaf " << i;
    EXPECT_EQ(std::memcmp(la[i].raw_data(), lb[i].raw_data(), la[i].nbytes()), 0)
        << what << ": leaf " << i << " differs";
  }
}

inline std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
inline void write_bytes(const fs::path& p, const std::string& b) { std::ofstream(p, std::ios::binary) << b; }

inline std::vector<fs::path> entry_files(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& d : fs::directory_iterator(dir))
    if (d.path().extension() == ".tsxc") out.push_back(d.path());
  return out;
}

class CompilationCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           fmt::format("tessera_cc_{}_{}", ::getpid(), ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    compiler::set_compilation_cache(dir_.string());
  }
  void TearDown() override {
    compiler::set_compilation_cache("");
    fs::remove_all(dir_);
  }
  // A fresh jit (its in-memory signature cache empty) and a fresh process-wide cache
  // object: what a new process sees, with only the directory in common.
  Tree run_fresh(const JitFn& fn, const Tree& args, JitOptions options = {}) {
    compiler::set_compilation_cache(dir_.string());
    Jitted j(fn, std::move(options));
    return j(args);
  }
  fs::path dir_;
};

}  // namespace tessera::test
