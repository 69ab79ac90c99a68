// jit of sharded programs: each sharded run equals the single-device run.
#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>

#include "spmd_test_util.h"
#include "tessera/core/transforms.h"
#include "tessera/spmd/spmd_executable.h"

namespace tessera {
namespace {

using spmd::Mesh;
using spmd::NamedSharding;
using spmd::None;
using spmd::P;
using testing::expect_close;
using testing::random_array;
using testing::VirtualDevices;

TEST(SpmdJit, ParallelMatmulMatchesSingleDevice) {
  VirtualDevices devices(8);
  Mesh mesh = Mesh::parse("data=2,model=4");
  Array x = random_array({64, 64}, 1);
  Array xs = spmd::device_put(x, NamedSharding(mesh, P("data", "model")));
  auto f = jit([](const Array& m) { return matmul(m, m.T()); });
  Array y = f(xs);
  ASSERT_NE(spmd::sharding_of(y), nullptr);
  Array expected = jit([](const Array& m) { return matmul(m, m.T()); })(x);
  expect_close(y, expected, 1e-6, "x @ x.T");
  std::string text = f.lowered(Tree(xs)).text();
  EXPECT_NE(text.find("all_gather"), std::string::npos) << text;
}

TEST(SpmdJit, ParallelMatmulWithOutputSharding) {
  VirtualDevices devices(8);
  Mesh mesh = Mesh::parse("data=2,model=4");
  Array x = random_array({32, 64}, 2);
  JitOptions options;
  options.out_shardings = {spmd::Sharding::from_spec(mesh, P("data", "model"), 2)};
  auto f = jit([](const Array& m) { return matmul(m, m.T()); }, options);
  Array y = f(spmd::device_put(x, NamedSharding(mesh, P("data", "model"))));
  EXPECT_EQ(spmd::sharding_of(y)->to_string(), "P('data', 'model')");
  expect_close(y, matmul(x, x.T()), 1e-6, "x @ x.T sharded out");
  std::string text = f.lowered(Tree(spmd::device_put(x, NamedSharding(mesh, P("data", "model"))))).text();
  EXPECT_NE(text.find("reduce_scatter"), std::string::npos) << text;
}

struct Layout {
  const char* name;
  const char* mesh;
  std::vector<spmd::PartitionSpec> specs;  // x, w1, b1, w2, b2
};

Array mlp_loss(const std::vector<Array>& a) {
  Array h = gelu(add(matmul(a[0], a[1]), a[2]));
  Array y = add(matmul(h, a[3]), a[4]);
  return mean(square(y));
}

class MlpLayouts : public ::testing::TestWithParam<Layout> {};

TEST_P(MlpLayouts, ForwardAndBackwardMatchSingleDevice) {
  const Layout& layout = GetParam();
  Mesh mesh = Mesh::parse(layout.mesh);
  VirtualDevices devices(mesh.size());
  std::vector<Array> args = {random_array({32, 16}, 3), random_array({16, 64}, 4, 0.3), random_array({64}, 5, 0.1),
                             random_array({64, 16}, 6, 0.3), random_array({16}, 7, 0.1)};
  auto step = [](const std::vector<Array>& a) {
    auto [loss, grads] = value_and_grad(mlp_loss, {1, 2, 3, 4})(a);
    std::vector<Array> out = {loss};
    out.insert(out.end(), grads.begin(), grads.end());
    return out;
  };
  std::vector<Array> expected = jit(step)(args);
  std::vector<Array> sharded;
  JitOptions options;
  for (size_t i = 0; i < args.size(); ++i)
    sharded.push_back(spmd::device_put(args[i], NamedSharding(mesh, layout.specs[i])));
  options.out_shardings.push_back(std::nullopt);
  for (size_t i = 1; i < args.size(); ++i)
    options.out_shardings.push_back(spmd::Sharding::from_spec(mesh, layout.specs[i], args[i].ndim()));
  auto f = jit(step, options);
  std::vector<Array> got = f(sharded);
  ASSERT_EQ(got.size(), expected.size());
  const char* names[] = {"loss", "dw1", "db1", "dw2", "db2"};
  for (size_t i = 0; i < got.size(); ++i) expect_close(got[i], expected[i], 1e-5, names[i]);
  for (size_t i = 1; i < got.size(); ++i) EXPECT_EQ(spmd::sharding_of(got[i])->spec(), layout.specs[i]) << names[i];
  if (std::getenv("TESSERA_TEST_VERBOSE")) std::cout << f.lowered(Tree::list({sharded.begin(), sharded.end()})).text();
}

INSTANTIATE_TEST_SUITE_P(
    Spmd, MlpLayouts,
    ::testing::Values(
        Layout{"dp8", "data=8", {P("data"), P(), P(), P(), P()}},
        Layout{"dp2", "data=2", {P("data"), P(), P(), P(), P()}},
        Layout{"fsdp4", "fsdp=4", {P("fsdp"), P("fsdp"), P("fsdp"), P("fsdp"), P("fsdp")}},
        Layout{"tp4", "model=4", {P(), P(None, "model"), P("model"), P("model"), P()}},
        Layout{"dp2_tp4", "data=2,model=4", {P("data"), P(None, "model"), P("model"), P("model", None), P()}},
        Layout{
            "fsdp2_tp2", "fsdp=2,model=2", {P("fsdp"), P("fsdp", "model"), P("model"), P("model", "fsdp"), P("fsdp")}}),
    [](const ::testing::TestParamInfo<Layout>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// checkpoint() regions survive partitioning: the sharded program recomputes the
// region in the backward pass (more FLOPs per device) and gives the same numbers.
TEST(SpmdJit, RematerializationRegionsAreKept) {
  testing::VirtualDevices devices(2);
  spmd::Mesh mesh = spmd::Mesh::parse("data=2");
  auto program = [](CheckpointPolicy policy) {
    return [policy](const std::vector<Array>& a) {
      auto block = checkpoint(
          [](const std::vector<Array>& in) {
            return std::vector<Array>{tanh(matmul(gelu(matmul(in[0], in[1])), transpose(in[1])))};
          },
          policy);
      auto loss = [&](const std::vector<Array>& p) { return mean(square(block({p[0], p[1]})[0])); };
      auto [value, grads] = value_and_grad(loss, {1})(a);
      return std::vector<Array>{value, grads[0]};
    };
  };
  std::vector<Array> args = {
      spmd::device_put(testing::random_array({16, 32}, 1), spmd::NamedSharding(mesh, spmd::P("data"))),
      testing::random_array({32, 64}, 2, 0.3)};
  auto plain = jit(program(CheckpointPolicy::none()));
  auto remat = jit(program(CheckpointPolicy::full()));
  std::vector<Array> a = plain(args), b = remat(args);
  testing::expect_close(b[0], a[0], 1e-6, "loss");
  testing::expect_close(b[1], a[1], 1e-6, "grad");
  double flops_plain = plain.lowered(args).executable().stats().flops;
  double flops_remat = remat.lowered(args).executable().stats().flops;
  EXPECT_GT(flops_remat, flops_plain * 1.1) << "the region was not recomputed";
}

// FSDP under remat: a layer's weights are gathered again for its backward pass (the
// gather belongs to the checkpointed layer and is recomputed with it), as FSDP and
// MaxText do, instead of holding every layer's gathered weights from the forward pass
// to the backward. Same numbers; one more gather per weight; a lower device peak.
TEST(SpmdJit, FsdpGathersWeightsAgainForTheBackwardUnderRemat) {
  testing::VirtualDevices devices(2);
  spmd::Mesh mesh = spmd::Mesh::parse("fsdp=2");
  constexpr int kLayers = 4;
  auto program = [](CheckpointPolicy policy) {
    return [policy](const std::vector<Array>& a) {
      auto loss = [&](const std::vector<Array>& p) {
        Array h = p[0];
        for (int l = 0; l < kLayers; ++l) {
          auto layer = checkpoint(
              [](const std::vector<Array>& in) { return std::vector<Array>{tanh(matmul(in[0], in[1]))}; }, policy);
          h = layer({h, p[1 + static_cast<size_t>(l)]})[0];
        }
        return mean(square(h));
      };
      std::vector<int> weights;
      for (int l = 0; l < kLayers; ++l) weights.push_back(1 + l);
      auto [value, grads] = value_and_grad(loss, weights)(a);
      // Each gradient's square norm, so the replicated gradients are not outputs the
      // program holds at its end.
      std::vector<Array> out = {value};
      for (const Array& g : grads) out.push_back(sum(square(g)));
      return out;
    };
  };
  std::vector<Array> args = {
      spmd::device_put(testing::random_array({16, 1024}, 1), spmd::NamedSharding(mesh, spmd::P("fsdp")))};
  for (int l = 0; l < kLayers; ++l)
    args.push_back(spmd::device_put(testing::random_array({1024, 1024}, static_cast<uint32_t>(2 + l), 0.02),
                                    spmd::NamedSharding(mesh, spmd::P("fsdp"))));
  auto plain = jit(program(CheckpointPolicy::none()));
  auto remat = jit(program(CheckpointPolicy::full()));
  std::vector<Array> a = plain(args), b = remat(args);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) testing::expect_close(b[i], a[i], 1e-6, "output " + std::to_string(i));
  auto gathers = [&](auto& f) {
    const std::string text = f.lowered(args).optimized_text();
    size_t n = 0;
    for (size_t at = text.find("all_gather("); at != std::string::npos; at = text.find("all_gather(", at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(gathers(plain), static_cast<size_t>(kLayers));
  // The last layer's backward follows its forward at once: its gather is kept.
  EXPECT_EQ(gathers(remat), static_cast<size_t>(2 * kLayers - 1));
  const size_t peak_plain = plain.lowered(args).executable().stats().peak_bytes;
  const size_t peak_remat = remat.lowered(args).executable().stats().peak_bytes;
  EXPECT_LT(peak_remat, peak_plain);
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// Independent small all-reduces (the loss and the gradients of small parameters under
// data parallelism) become one call; the values are those of one device.
TEST(SpmdJit, SmallIndependentAllReducesAreCombined) {
  testing::VirtualDevices devices(4);
  spmd::Mesh mesh = spmd::Mesh::parse("data=4");
  std::vector<Array> args = {testing::random_array({8, 16}, 1)};
  for (int i = 0; i < 5; ++i) args.push_back(testing::random_array({16}, 10 + static_cast<uint64_t>(i)));
  auto step = [](const std::vector<Array>& a) {
    auto loss = [](const std::vector<Array>& p) {
      Array total = Array::scalar(0.0);
      for (size_t i = 1; i < p.size(); ++i) total = total + mean(square(tanh(p[0] * p[i])));
      return total;
    };
    auto [value, grads] = value_and_grad(loss, {1, 2, 3, 4, 5})(a);
    std::vector<Array> out = {value};
    out.insert(out.end(), grads.begin(), grads.end());
    return out;
  };
  std::vector<Array> want = jit(step)(args);
  std::vector<Array> sharded = args;
  sharded[0] = spmd::device_put(args[0], spmd::NamedSharding(mesh, spmd::P("data")));
  auto f = jit(step);
  std::vector<Array> got = f(sharded);
  for (size_t i = 0; i < got.size(); ++i) testing::expect_close(got[i], want[i], 1e-6, "output " + std::to_string(i));
  const spmd::CommStats& s =
      f.lowered(Tree::list({sharded.begin(), sharded.end()})).spmd()->program().summary.per_device;
  EXPECT_EQ(s.all_reduce_calls, 1) << "6 independent all-reduces should be one call";
  EXPECT_EQ(s.total_calls(), 1);
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// Replicated host arguments are shared by the devices (read-only); an output that is
// such an argument still gets one buffer per device, so donating it later is safe.
TEST(SpmdJit, OutputsThatAreSharedInputsGetABufferPerDevice) {
  testing::VirtualDevices devices(2);
  spmd::Mesh mesh = spmd::Mesh::parse("data=2");
  Array w = testing::random_array({4, 4}, 3);
  Array x = spmd::device_put(testing::random_array({4, 4}, 4), spmd::NamedSharding(mesh, spmd::P("data")));
  auto f = jit([](const std::vector<Array>& a) { return std::vector<Array>{a[0], matmul(a[1], a[0])}; });
  std::vector<Array> out = f({w, x});
  const std::vector<Array>& shards = spmd::addressable_shards(out[0]);
  ASSERT_EQ(shards.size(), 2u);
  EXPECT_NE(shards[0].storage(), shards[1].storage());
  testing::expect_close(out[0], w, 0, "w passed through");
  testing::expect_close(out[1], matmul(spmd::gather(x), w), 1e-6, "x @ w");
}

}  // namespace
}  // namespace tessera
