// Sharded (SPMD) programs in the persistent compilation cache: the collectives parse
// back from their IR text, a sharded jit stores its per-device program, and a fresh
// jit (a new process, as far as the cache can tell) loads it and computes bitwise the
// same result.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "spmd_test_util.h"
#include "tessera/compiler/compilation_cache.h"
#include "tessera/compiler/parser.h"
#include "tessera/compiler/primitive_registry.h"
#include "tessera/spmd/collectives.h"
#include "tessera/spmd/partitioner.h"

namespace fs = std::filesystem;
using namespace tessera;
using namespace tessera::spmd;
using namespace tessera::testing;

namespace {

class SpmdCompilationCache : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        fs::path(::testing::TempDir()) / fmt::format("tessera_spmd_cc_{}_{}", ::getpid(),
                                                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override {
    compiler::set_compilation_cache("");
    fs::remove_all(dir_);
  }
  fs::path dir_;
};

Array sharded_matmul(const Array& xs, const JitOptions& options) {
  Jitted f([](const Tree& t, const StaticArgs&) { return Tree(matmul(t.leaf(), t.leaf().T())); }, options);
  return f(Tree(xs)).leaf();
}

}  // namespace

TEST_F(SpmdCompilationCache, EveryCollectiveParsesBackFromItsAttributes) {
  const std::vector<std::pair<std::string, std::string>> spellings = {
      {"all_gather", "axes=[model], dim=1, mesh=(data=2, model=4)"},
      {"all_reduce", "axes=[data, model], mesh=(data=2, model=4)"},
      {"reduce_scatter", "axes=[data], dim=0, mesh=(data=2, model=4)"},
      {"all_to_all", "axes=[model], split=1, concat=0, mesh=(data=2, model=4)"},
      {"shard_slice", "axes=[data], dim=0, mesh=(data=2)"},
      {"shard_pad", "axes=[data], dim=2, mesh=(data=2)"},
  };
  for (const auto& [name, attributes] : spellings) {
    const PrimitivePtr p = compiler::make_primitive(name, attributes);
    EXPECT_EQ(p->name(), name);
    EXPECT_EQ(p->attributes(), attributes) << name;
  }
  EXPECT_THROW(compiler::make_primitive("all_gather", "axes=[expert], dim=1, mesh=(data=2, model=4)"), ValueError);
  EXPECT_THROW(compiler::make_primitive("all_gather", "axes=[model], dim=1, mesh=data=2"), ValueError);
  EXPECT_THROW(compiler::make_primitive("all_gather", "axes=[model], mesh=(data=2, model=4)"), ValueError);
}

TEST_F(SpmdCompilationCache, PerDeviceProgramTextParsesBackToTheSameText) {
  Mesh mesh = Mesh::parse("data=2,model=4");
  const Sharding layout = Sharding::from_spec(mesh, P("data", "model"), 2);
  const compiler::Graph global =
      trace([](const Tree& t, const StaticArgs&) { return Tree(matmul(t.leaf(), t.leaf().T())); },
            Tree(random_array({32, 64}, 7)));
  const PartitionedProgram program = partition(global, mesh, {layout}, {layout});
  const std::string text = program.local.text();
  ASSERT_NE(text.find("all_gather"), std::string::npos) << text;
  ASSERT_NE(text.find("reduce_scatter"), std::string::npos) << text;
  EXPECT_EQ(compiler::parse_graph(text).text(), text);
}

TEST_F(SpmdCompilationCache, ShardedJitStoresAndAFreshJitLoadsBitwiseTheSame) {
  VirtualDevices devices(8);
  Mesh mesh = Mesh::parse("data=2,model=4");
  Array xs = device_put(random_array({64, 64}, 3), NamedSharding(mesh, P("data", "model")));
  JitOptions options;
  options.name = "spmd_matmul";
  compiler::set_compilation_cache("");
  const std::vector<float> uncached = gather(sharded_matmul(xs, options)).to_vector<float>();

  compiler::set_compilation_cache(dir_.string());
  const auto before = compiler::compilation_cache_stats();
  const std::vector<float> first = gather(sharded_matmul(xs, options)).to_vector<float>();
  const auto after_first = compiler::compilation_cache_stats();
  EXPECT_EQ(after_first.stores - before.stores, 1u) << "the per-device program is stored once";
  EXPECT_EQ(after_first.misses - before.misses, 1u);
  EXPECT_EQ(after_first.hits - before.hits, 7u) << "the other 7 devices load what the first one stored";

  compiler::set_compilation_cache(dir_.string());
  const std::vector<float> second = gather(sharded_matmul(xs, options)).to_vector<float>();
  const auto after_second = compiler::compilation_cache_stats();
  EXPECT_EQ(after_second.hits - after_first.hits, 8u) << "a fresh jit loads every device's program from disk";
  EXPECT_EQ(after_second.misses, after_first.misses);
  EXPECT_EQ(after_second.stores, after_first.stores);
  EXPECT_EQ(first, uncached) << "compiled with the cache vs without";
  EXPECT_EQ(second, uncached) << "loaded from the cache vs compiled";

  // Another mesh is another program: no hit.
  VirtualDevices four(4);
  Mesh other = Mesh::parse("data=4");
  Array ys = device_put(random_array({64, 64}, 3), NamedSharding(other, P("data")));
  sharded_matmul(ys, options);
  EXPECT_EQ(compiler::compilation_cache_stats().misses - after_second.misses, 1u);
}
