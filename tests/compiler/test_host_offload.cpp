// The offload checkpoint policy: named activations wait for the backward pass in
// host memory. Values are bitwise those of no remat and of full remat; the memory
// plan moves the offloaded bytes from the device peak into a host arena and says so;
// a name no op carries is an error that says which names are there.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "core/test_util.h"
#include "tessera/compiler/memory_plan.h"
#include "tessera/compiler/passes/offload.h"
#include "tessera/ir/primitives/elementwise.h"
#include "tessera/ir/primitives/layout.h"
#include "tessera/ir/primitives/reduce.h"
#include "tessera/tessera.h"

namespace tessera::test {
namespace {

using compiler::BufferAssignment;
using compiler::Graph;
using compiler::TensorType;
using compiler::ValueId;

struct Compiled {
  std::vector<Array> outputs;
  compiler::ExecutableStats stats;
  compiler::MemoryPlan plan;
  std::string text;
  std::string bytes;  // the serialized executable
};

// value_and_grad of a stack of layers, each checkpointed with `policy` (or not at
// all); every layer names the two values its backward pass reads.
Compiled run(const Array& x, int layers, const CheckpointPolicy* policy) {
  auto fn = [=](const Tree& args) -> Tree {
    auto loss = [&](const std::vector<Array>& a) {
      Array h = a[0];
      for (int l = 0; l < layers; ++l) {
        ArrayFn layer = [](const std::vector<Array>& in) {
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
  options.fuse = false;  // keeps sin and cos as the values the policy names
  auto f = jit(fn, JitOptions{{}, options, "layers"});
  Compiled c;
  c.outputs = f(Tree(x)).leaves();
  auto lowered = f.lowered(Tree(x));
  c.stats = lowered.executable().stats();
  c.plan = lowered.executable().plan();
  c.text = lowered.optimized_text();
  c.bytes = lowered.executable().serialize();
  return c;
}

void expect_bitwise(const Compiled& a, const Compiled& b, const std::string& what) {
  ASSERT_EQ(a.outputs.size(), b.outputs.size());
  for (size_t i = 0; i < a.outputs.size(); ++i)
    EXPECT_EQ(std::memcmp(a.outputs[i].raw_data(), b.outputs[i].raw_data(), a.outputs[i].nbytes()), 0)
        << what << ": output " << i << " differs";
}

size_t count(const std::string& text, const std::string& word) {
  size_t n = 0;
  for (size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) ++n;
  return n;
}

TEST(HostOffload, ValuesAreBitwiseThoseOfNoRematAndFullRemat) {
  Array x = random_array({128, 256}, 5, DType::Float32);
  const int layers = 6;
  CheckpointPolicy full = CheckpointPolicy::full(), offload = CheckpointPolicy::offload({"s", "c"});
  Compiled plain = run(x, layers, nullptr);
  Compiled with_full = run(x, layers, &full);
  Compiled with_offload = run(x, layers, &offload);
  expect_bitwise(plain, with_offload, "offload vs no remat");
  expect_bitwise(with_full, with_offload, "offload vs full remat");
  // Every layer's s and c went out and came back (the last layer's too: its backward
  // starts after the loss, not right after its forward).
  EXPECT_EQ(count(with_offload.text, "offload_to_host"), static_cast<size_t>(2 * layers)) << with_offload.text;
  EXPECT_EQ(count(with_offload.text, "load_from_host"), static_cast<size_t>(2 * layers));
}

TEST(HostOffload, ThePlanMovesTheOffloadedBytesFromTheDevicePeakToTheHostArena) {
  Array x = random_array({128, 256}, 5, DType::Float32);
  const int layers = 6;
  const size_t value_bytes = 128 * 256 * sizeof(float);
  CheckpointPolicy saved = CheckpointPolicy::save_named({"s", "c"}), offload = CheckpointPolicy::offload({"s", "c"});
  Compiled on_device = run(x, layers, &saved);
  Compiled on_host = run(x, layers, &offload);
  expect_bitwise(on_device, on_host, "offload vs save_named");
  std::printf("peak bytes: save_named %zu, offload %zu (saved %zu); offloaded %zu bytes, host arena %zu bytes\n",
              on_device.stats.peak_bytes, on_host.stats.peak_bytes,
              on_device.stats.peak_bytes - on_host.stats.peak_bytes, on_host.stats.offloaded_bytes,
              on_host.stats.host_bytes);
  EXPECT_EQ(on_device.stats.offloaded_bytes, 0u);
  EXPECT_EQ(on_device.stats.host_bytes, 0u);
  EXPECT_EQ(on_host.plan.offloaded_values, 2 * layers);
  EXPECT_EQ(on_host.stats.offloaded_bytes, 2 * layers * value_bytes);
  // Every offloaded value is live on the host across the forward -> backward turn at
  // once: the host arena holds them all, side by side.
  EXPECT_EQ(on_host.stats.host_bytes, 2 * layers * value_bytes);
  // The device saves them all except those the backward pass holds at the offload
  // program's peak, which is no longer at the turn but in the backward pass of layer
  // 4: its s and c loaded back (prefetched) while two gradient temporaries of layer 5
  // are still live (the scheduler hoists the product that reads layer 5's c last).
  ASSERT_GT(on_device.stats.peak_bytes, on_host.stats.peak_bytes);
  const size_t saved_bytes = on_device.stats.peak_bytes - on_host.stats.peak_bytes;
  EXPECT_LE(saved_bytes, on_host.stats.offloaded_bytes);
  EXPECT_GE(saved_bytes, on_host.stats.offloaded_bytes - 4 * value_bytes);
  // The arena the executable allocates on the device shrinks too.
  EXPECT_LT(on_host.stats.arena_bytes, on_device.stats.arena_bytes);
}

TEST(HostOffload, HostBuffersSurviveSerializationAndPoisonedFreedBytes) {
  Array x = random_array({32, 64}, 2, DType::Float32);
  CheckpointPolicy offload = CheckpointPolicy::offload({"s"});
  Compiled c = run(x, 3, &offload);
  std::unique_ptr<compiler::Executable> loaded = compiler::Executable::deserialize(c.bytes);
  EXPECT_EQ(loaded->plan().host_arena_bytes, c.plan.host_arena_bytes);
  EXPECT_EQ(loaded->plan().offloaded_bytes, c.plan.offloaded_bytes);
  EXPECT_EQ(loaded->serialize(), c.bytes);
  // Every arena byte not live at a kernel is NaN before it runs: a load planned over a
  // live buffer, or a value read after its offload freed it, shows up as a difference.
  loaded->set_poison_freed(true);
  std::vector<Array> again = loaded->run({x});
  ASSERT_EQ(again.size(), c.outputs.size());
  for (size_t i = 0; i < again.size(); ++i)
    EXPECT_EQ(std::memcmp(again[i].raw_data(), c.outputs[i].raw_data(), again[i].nbytes()), 0) << "output " << i;
}

TEST(HostOffload, ANameNoOpCarriesIsAnErrorListingTheNamesThere) {
  Array x = random_array({8, 8}, 1, DType::Float32);
  CheckpointPolicy typo = CheckpointPolicy::offload({"s", "attn_out"});
  try {
    run(x, 2, &typo);
    FAIL() << "expected a ValueError";
  } catch (const ValueError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'attn_out'"), std::string::npos) << what;
    EXPECT_NE(what.find("names it carries: c, s"), std::string::npos) << what;
    EXPECT_NE(what.find("offload[s, attn_out]"), std::string::npos) << what;
  }
  EXPECT_EQ(CheckpointPolicy::offload({"a", "b"}).text(), "offload[a, b]");
}

// ---- the pass and the planner on a hand-built graph ----

PrimitivePtr unary(UnaryKind k) { return std::make_shared<Unary>(k); }

// a = exp(p) is named "a" in an offload region and read by the region (its output y =
// sum(a)) and, after a big temporary m = exp(q) (8 KiB) made in between, by the
// "backward" (mul, outside the region). Offloading a frees its 4 KiB across m.
Graph turn_graph(const CheckpointPolicy& policy) {
  Graph g;
  const TensorType small{{1024}, DType::Float32}, big{{2048}, DType::Float32}, one{{}, DType::Float32};
  auto sum = [] { return std::make_shared<Reduce>(ReduceKind::Sum, std::vector<int>{0}); };
  g.remat_regions = {policy};
  const ValueId p = g.add_parameter(small), q = g.add_parameter(big);
  const ValueId a = g.add_node1(unary(UnaryKind::Exp), {p}, small);
  g.nodes.back().remat_region = 0;
  g.nodes.back().remat_name = "a";
  const ValueId y = g.add_node1(sum(), {a}, one);
  g.nodes.back().remat_region = 0;
  g.nodes.back().remat_name = "__output__";
  const ValueId m = g.add_node1(unary(UnaryKind::Exp), {q}, big);
  const ValueId sm = g.add_node1(sum(), {m}, one);
  const ValueId z = g.add_node1(std::make_shared<Binary>(BinaryKind::Mul), {a, a}, small);
  const ValueId sz = g.add_node1(sum(), {z}, one);
  g.outputs = {y, sm, sz};
  return g;
}

TEST(HostOffloadPass, MovesTheNamedValueOutAfterItsForwardUseAndBackBeforeItsBackwardUse) {
  Graph g = turn_graph(CheckpointPolicy::offload({"a"}));
  compiler::HostOffload().run(g);
  g.verify();
  // exp, neg, offload (after the last forward reader), then load before mul: the
  // prefetch distance reaches back to right after the offload here.
  ASSERT_EQ(g.nodes.size(), 8u) << g.text();
  EXPECT_EQ(g.nodes[2].primitive->name(), "offload_to_host") << g.text();
  EXPECT_EQ(g.nodes[3].primitive->name(), "load_from_host") << g.text();
  EXPECT_EQ(g.nodes[4].primitive->name(), "exp") << g.text();
  EXPECT_EQ(g.nodes[6].primitive->name(), "multiply") << g.text();
  EXPECT_EQ(g.nodes[6].inputs[0], g.nodes[3].outputs[0]) << "the backward reader reads the loaded copy";

  compiler::MemoryPlan with = compiler::plan_memory(g);
  EXPECT_EQ(with.values[static_cast<size_t>(g.nodes[2].outputs[0])].kind, BufferAssignment::Kind::Host) << with.text(g);
  EXPECT_EQ(with.offloaded_bytes, 4096u);
  EXPECT_EQ(with.host_arena_bytes, 4096u);
  EXPECT_NE(with.text(g).find("host [0, 4096)"), std::string::npos) << with.text(g);
}

TEST(HostOffloadPass, TheDevicePeakDropsByTheOffloadedBytesLiveAcrossTheTurn) {
  Graph kept = turn_graph(CheckpointPolicy::save_named({"a"}));
  Graph moved = turn_graph(CheckpointPolicy::offload({"a"}));
  // kPrefetchNodes scalar ops between m and the backward reader keep the load (that
  // many nodes before the reader) after m: the device peak, at m, holds a under
  // save_named and not under offload.
  for (Graph* g : {&kept, &moved}) {
    const int mul = 4;
    ValueId t = g->nodes[3].outputs[0];
    for (int i = 0; i < compiler::HostOffload::kPrefetchNodes; ++i)
      t = g->insert_node(mul + i, unary(UnaryKind::Neg), {t}, {g->type(t)})[0];
    g->outputs[1] = t;
  }
  compiler::HostOffload().run(kept);  // save_named: no change
  compiler::HostOffload().run(moved);
  const compiler::MemoryPlan device = compiler::plan_memory(kept);
  const compiler::MemoryPlan host = compiler::plan_memory(moved);
  EXPECT_EQ(device.offloaded_bytes, 0u);
  EXPECT_EQ(host.offloaded_bytes, 4096u);
  EXPECT_EQ(device.peak_bytes - host.peak_bytes, host.offloaded_bytes) << moved.text() << host.text(moved);
}

TEST(HostOffloadPass, ValuesWithNoGainAreLeftAlone) {
  // Read back right after the forward use: nothing to offload.
  Graph g;
  const TensorType t{{16}, DType::Float32};
  g.remat_regions = {CheckpointPolicy::offload({"a"})};
  const ValueId p = g.add_parameter(t);
  const ValueId a = g.add_node1(unary(UnaryKind::Exp), {p}, t);
  g.nodes.back().remat_region = 0;
  g.nodes.back().remat_name = "a";
  const ValueId b = g.add_node1(unary(UnaryKind::Neg), {a}, t);
  g.outputs = {b};
  compiler::HostOffload().run(g);
  EXPECT_EQ(g.nodes.size(), 2u) << g.text();
}

}  // namespace
}  // namespace tessera::test
