// Bad SPMD input gives errors that say what was wrong, where, and what was expected:
// each test checks the exception type and the substrings a user needs to fix it.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "spmd_test_util.h"
#include "tessera/core/random.h"

namespace tessera {
namespace {

using spmd::Mesh;
using spmd::NamedSharding;
using spmd::None;
using spmd::P;
using spmd::Sharding;
using spmd::ShardingError;
using testing::random_array;
using testing::VirtualDevices;

using testing::error_of;
using testing::expect_contains;

Array matmul_t(const Array& x) { return matmul(x, x.T()); }

// ---- the mesh does not fit the devices -------------------------------------------

TEST(SpmdErrors, MeshLargerThanTheDevicesNamesBothCounts) {
  VirtualDevices devices(8);
  Mesh big = Mesh::parse("data=16");
  Array x = random_array({16, 4}, 1);
  std::string put = error_of<ValueError>([&] { spmd::device_put(x, NamedSharding(big, P("data"))); });
  expect_contains(put, {"(data=16)", "needs 16 devices", "8 are present", "TESSERA_CPU_DEVICES=8"});

  JitOptions options;
  options.in_shardings = {Sharding::from_spec(big, P("data"), 2)};
  auto f = jit(matmul_t, options);
  std::string in_jit = error_of<ValueError>([&] { f(x); });
  expect_contains(in_jit, {"(data=16)", "needs 16 devices", "8 are present"});
  // Lowering alone compiles per device, so it reports the same.
  std::string lowered = error_of<ValueError>([&] { f.lowered(Tree(x)); });
  expect_contains(lowered, {"needs 16 devices", "8 are present"});
}

// ---- PartitionSpec against the mesh and the array -------------------------------

TEST(SpmdErrors, AxisUsedTwiceNamesTheAxis) {
  VirtualDevices devices(8);
  Mesh mesh = Mesh::parse("data=2,model=4");
  Array x = random_array({8, 8}, 2);
  std::string put =
      error_of<ValueError>([&] { spmd::device_put(x, NamedSharding(mesh, P("data", "data")), "weights"); });
  expect_contains(put, {"weights", "'data'", "twice", "dimensions 0 and 1"});
  std::string multi = error_of<ValueError>([&] {
    Sharding::from_spec(mesh, P(spmd::Axes{"model", "data"}, "model"), 2, "argument 3");
  });
  expect_contains(multi, {"argument 3", "'model'", "twice"});
  // Inside jit, through with_sharding_constraint.
  auto f = jit([&](const Array& a) {
    return spmd::with_sharding_constraint(add(a, a), NamedSharding(mesh, P("model", "model")));
  });
  std::string constraint = error_of<ValueError>([&] { f(spmd::device_put(x, NamedSharding(mesh, P("data")))); });
  expect_contains(constraint, {"with_sharding_constraint", "'model'", "twice"});
}

TEST(SpmdErrors, IndivisibleDimensionNamesArrayDimSizeAndAxis) {
  VirtualDevices devices(8);
  Mesh mesh = Mesh::parse("data=2,model=4");
  Array x = random_array({8, 6}, 3);
  std::string put = error_of<ShapeError>([&] { spmd::device_put(x, NamedSharding(mesh, P(None, "model")), "w1"); });
  expect_contains(put, {"w1", "dimension 1", "size 6", "'model'", "4 shards"});
  std::string two_axes = error_of<ShapeError>([&] {
    spmd::device_put(x, NamedSharding(mesh, P(None, spmd::Axes{"data", "model"})));
  });
  expect_contains(two_axes, {"dimension 1", "size 6", "'data,model'", "8 shards"});

  // jit of a host argument with an in_sharding: the argument's tree path is named.
  JitOptions options;
  options.in_shardings = {std::nullopt, Sharding::from_spec(mesh, P(None, "model"), 2)};
  auto f = jit([](const Tree& t) { return Tree(matmul(t.at("a").leaf(), t.at("w").leaf())); }, options);
  Tree args = {{"a", Tree(random_array({4, 8}, 4))}, {"w", Tree(x)}};
  std::string in_jit = error_of<ShapeError>([&] { f(args); });
  expect_contains(in_jit, {"argument 1 (w)", "dimension 1", "size 6", "'model'"});

  // An intermediate pinned to an indivisible layout.
  auto g =
      jit([&](const Array& a) { return spmd::with_sharding_constraint(sum(a, {0}), NamedSharding(mesh, P("model"))); });
  std::string constraint = error_of<ShapeError>([&] { g(spmd::device_put(x, NamedSharding(mesh, P("data")))); });
  expect_contains(constraint, {"with_sharding_constraint", "dimension 0", "size 6", "'model'"});

  // An output sharding that does not divide.
  JitOptions out_options;
  out_options.out_shardings = {Sharding::from_spec(mesh, P("model"), 1)};
  auto h = jit([](const Array& a) { return sum(a, {0}); }, out_options);
  std::string out = error_of<ShapeError>([&] { h(spmd::device_put(x, NamedSharding(mesh, P("data")))); });
  expect_contains(out, {"output 0", "dimension 0", "size 6", "'model'"});
}

TEST(SpmdErrors, UnknownAxisNamesTheAxisAndTheMesh) {
  VirtualDevices devices(8);
  Mesh mesh = Mesh::parse("data=2,model=4");
  Array x = random_array({8, 8}, 5);
  std::string put = error_of<ValueError>([&] { spmd::device_put(x, NamedSharding(mesh, P("modle")), "x"); });
  expect_contains(put, {"'modle'", "(data=2, model=4)", "P('modle')"});
  std::string size = error_of<ValueError>([&] { mesh.axis_size("fsdp"); });
  expect_contains(size, {"(data=2, model=4)", "no axis 'fsdp'"});
}

TEST(SpmdErrors, SpecLongerThanRank) {
  VirtualDevices devices(8);
  Mesh mesh = Mesh::parse("data=2,model=4");
  Array b = random_array({8}, 6);
  std::string put = error_of<ValueError>([&] { spmd::device_put(b, NamedSharding(mesh, P(None, "model")), "b1"); });
  expect_contains(put, {"b1", "P(None, 'model')", "2 entries", "rank 1"});
  // Trailing Nones past the rank are harmless.
  EXPECT_NO_THROW(spmd::device_put(b, NamedSharding(mesh, P("model", None, None))));
  // An in_sharding of another rank than the argument.
  JitOptions options;
  options.in_shardings = {Sharding::from_spec(mesh, P("data", "model"), 2)};
  auto f = jit([](const Array& a) { return a * 2.0; }, options);
  std::string rank = error_of<ShardingError>([&] { f(b); });
  expect_contains(rank, {"argument 0", "[8]", "rank 2"});
}

// ---- layouts on different meshes ---------------------------------------------------

TEST(SpmdErrors, ConstraintOnAnotherMeshNamesBothMeshes) {
  VirtualDevices devices(8);
  Mesh mesh = Mesh::parse("data=2,model=4");
  Mesh other = Mesh::parse("data=8");
  Array x = random_array({8, 8}, 7);
  auto f =
      jit([&](const Array& a) { return spmd::with_sharding_constraint(a * 2.0, NamedSharding(other, P("data"))); });
  std::string msg = error_of<ShardingError>([&] { f(spmd::device_put(x, NamedSharding(mesh, P("data")))); });
  expect_contains(msg, {"with_sharding_constraint", "(data=8)", "(data=2, model=4)"});
}

TEST(SpmdErrors, JitWithLayoutsOnTwoMeshesNamesBoth) {
  VirtualDevices devices(8);
  Mesh a = Mesh::parse("data=2,model=4");
  Mesh b = Mesh::parse("data=8");
  Array x = random_array({8, 8}, 8), y = random_array({8, 8}, 9);
  auto f = jit([](const std::vector<Array>& v) { return std::vector<Array>{add(v[0], v[1])}; });
  std::string args = error_of<ShardingError>([&] {
    f(std::vector<Array>{spmd::device_put(x, NamedSharding(a, P("data"))),
                         spmd::device_put(y, NamedSharding(b, P("data")))});
  });
  expect_contains(args, {"argument 1", "(data=8)", "(data=2, model=4)"});

  // An output layout on another mesh than the arguments'.
  JitOptions options;
  options.out_shardings = {Sharding::from_spec(b, P("data"), 2)};
  auto g = jit([](const Array& v) { return v * 3.0; }, options);
  std::string out = error_of<ShardingError>([&] { g(spmd::device_put(x, NamedSharding(a, P("data")))); });
  expect_contains(out, {"output 0", "(data=8)", "(data=2, model=4)"});
}

// ---- layouts the partitioner cannot derive ----------------------------------------

TEST(SpmdErrors, ConflictingOperandLayoutsAskForAConstraint) {
  VirtualDevices devices(4);
  Mesh mesh = Mesh::parse("x=4");
  Array a = random_array({8, 8}, 10), b = random_array({8, 8}, 11);
  auto f = jit([](const std::vector<Array>& v) { return std::vector<Array>{add(v[0], v[1])}; });
  std::string msg = error_of<ShardingError>([&] {
    f(std::vector<Array>{spmd::device_put(a, NamedSharding(mesh, P("x"))),
                         spmd::device_put(b, NamedSharding(mesh, P(None, "x")))});
  });
  expect_contains(msg, {"add(f32[8, 8], f32[8, 8])", "P(None, 'x')", "P('x')", "with_sharding_constraint"});
  // Pinning one operand resolves it, and the result is right.
  auto g = jit([&](const std::vector<Array>& v) {
    return std::vector<Array>{add(v[0], spmd::with_sharding_constraint(v[1], NamedSharding(mesh, P("x"))))};
  });
  std::vector<Array> out = g(std::vector<Array>{spmd::device_put(a, NamedSharding(mesh, P("x"))),
                                                spmd::device_put(b, NamedSharding(mesh, P(None, "x")))});
  testing::expect_close(out[0], add(a, b), 1e-6, "pinned add");
}

TEST(SpmdErrors, OpWithoutARuleOnSplitOperandsNamesTheOp) {
  VirtualDevices devices(2);
  Mesh mesh = Mesh::parse("x=2");
  Array p = full({8}, 0.5);
  auto f = jit([](const Array& prob) { return astype(random::bernoulli(key(1), prob, {8}), DType::Float32); });
  std::string msg = error_of<ShardingError>([&] { f(spmd::device_put(p, NamedSharding(mesh, P("x")))); });
  expect_contains(msg, {"random_bernoulli", "no sharding rule", "P('x')", "with_sharding_constraint"});
}

TEST(SpmdErrors, PartialLayoutsCannotBePlaced) {
  VirtualDevices devices(2);
  Mesh mesh = Mesh::parse("x=2");
  Sharding partial = Sharding::replicated(mesh, 1).with_partial({0});
  std::string msg = error_of<ShardingError>([&] { spmd::device_put(random_array({4}, 12), partial, "grad"); });
  expect_contains(msg, {"grad", "partial sum"});
}

}  // namespace
}  // namespace tessera
