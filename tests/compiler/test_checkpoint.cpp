// checkpoint policies through jit: none, full and save_named change memory and
// FLOPs, never values.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>

#include "core/test_util.h"
#include "tessera/tessera.h"

namespace tessera::test {
namespace {

struct Compiled {
  std::vector<Array> outputs;
  compiler::ExecutableStats stats;
  std::string text;
};

// value_and_grad of a stack of layers, each checkpointed with `policy` (or not at all).
Compiled run(const Array& x, int layers, const CheckpointPolicy* policy) {
  auto fn = [=](const Tree& args) -> Tree {
    auto loss = [&](const std::vector<Array>& a) {
      Array h = a[0];
      for (int l = 0; l < layers; ++l) {
        ArrayFn layer = [](const std::vector<Array>& in) {
          // Two named intermediates the backward pass of the product reads.
          Array s = checkpoint_name(sin(in[0]), "s");
          Array c = checkpoint_name(cos(in[0]), "c");
          return std::vector<Array>{tanh(multiply(s, c))};
        };
        h = (policy ? checkpoint(layer, *policy) : layer)({h})[0];
      }
      return sum(h);
    };
    auto [value, grads] = value_and_grad(loss)({args.leaves()[0]});
    return Tree::list({Tree(value), Tree(grads[0])});
  };
  compiler::CompileOptions options;
  options.fuse = false;  // the effect of remat alone
  auto f = jit(fn, JitOptions{{}, options, "layers"});
  Compiled c;
  c.outputs = f(Tree(x)).leaves();
  auto lowered = f.lowered(Tree(x));
  c.stats = lowered.executable().stats();
  c.text = lowered.optimized_text();
  return c;
}

void expect_same_values(const Compiled& a, const Compiled& b, const std::string& what) {
  ASSERT_EQ(a.outputs.size(), b.outputs.size());
  for (size_t i = 0; i < a.outputs.size(); ++i)
    EXPECT_EQ(std::memcmp(a.outputs[i].raw_data(), b.outputs[i].raw_data(), a.outputs[i].nbytes()), 0)
        << what << ": output " << i << " differs";
}

TEST(Checkpoint, PoliciesTradeMemoryForFlopsWithoutChangingValues) {
  Array x = random_array({128, 256}, 3, DType::Float32);
  const int layers = 6;
  CheckpointPolicy none = CheckpointPolicy::none(), full = CheckpointPolicy::full(),
                   named = CheckpointPolicy::save_named({"s"});
  Compiled plain = run(x, layers, nullptr);
  Compiled with_none = run(x, layers, &none);
  Compiled with_full = run(x, layers, &full);
  Compiled with_named = run(x, layers, &named);
  expect_same_values(plain, with_none, "none");
  expect_same_values(plain, with_full, "full");
  expect_same_values(plain, with_named, "save_named");

  std::printf("arena / MFLOP: plain %zu / %.2f, full %zu / %.2f, save_named %zu / %.2f\n", plain.stats.arena_bytes,
              plain.stats.flops / 1e6, with_full.stats.arena_bytes, with_full.stats.flops / 1e6,
              with_named.stats.arena_bytes, with_named.stats.flops / 1e6);
  EXPECT_EQ(with_none.stats.flops, plain.stats.flops) << "policy none recomputes nothing";
  EXPECT_EQ(with_none.stats.arena_bytes, plain.stats.arena_bytes);
  // full recomputes sin and cos of every layer; save_named keeps sin, recomputes cos.
  EXPECT_GT(with_full.stats.flops, with_named.stats.flops);
  EXPECT_GT(with_named.stats.flops, plain.stats.flops);
  EXPECT_LT(with_full.stats.arena_bytes, with_named.stats.arena_bytes);
  EXPECT_LT(with_named.stats.arena_bytes, plain.stats.arena_bytes);
}

TEST(Checkpoint, ReservedAndEmptyNamesAreErrors) {
  Array x = random_array({3}, 1, DType::Float32);
  EXPECT_THROW(checkpoint_name(x, ""), ValueError);
  EXPECT_THROW(checkpoint_name(x, "__output__"), ValueError);
  EXPECT_EQ(CheckpointPolicy::save_named({"a", "b"}).text(), "save_named[a, b]");
}

}  // namespace
}  // namespace tessera::test
