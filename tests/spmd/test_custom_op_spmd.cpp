// Custom ops under SPMD: each sharded run equals the single-device run. A factor spec
// keeps shardable dims split and gathers the rest; unsharded_only gathers everything;
// a custom vjp (itself a custom op) partitions the same way.
#include <gtest/gtest.h>

#include "core/custom_op_test_ops.h"
#include "spmd_test_util.h"
#include "tessera/core/transforms.h"

namespace tessera {
namespace {

using spmd::Mesh;
using spmd::NamedSharding;
using spmd::P;
using testing::expect_close;
using testing::random_array;
using testing::VirtualDevices;

Array row_cumsum(const Array& x) { return custom_op("test_row_cumsum", {x})[0]; }

TEST(CustomOpSpmd, ShardableRowsStaySplitAndColumnsAreGathered) {
  test::register_test_custom_ops();
  VirtualDevices devices(4);
  Mesh mesh = Mesh::parse("data=2,model=2");
  Array x = random_array({8, 6}, 1);
  Array xs = spmd::device_put(x, NamedSharding(mesh, P("data", "model")));
  auto f = jit([](const Array& a) { return row_cumsum(a); });
  Array y = f(xs);
  ASSERT_NE(spmd::sharding_of(y), nullptr);
  EXPECT_EQ(spmd::sharding_of(y)->to_string(), "P('data')") << "rows keep their split; the scanned dim is whole";
  expect_close(y, row_cumsum(x), 0, "row_cumsum sharded vs one device");
  const std::string text = f.lowered(Tree(xs)).text();
  EXPECT_NE(text.find("= all_gather("), std::string::npos) << "the columns are gathered: " << text;
  EXPECT_NE(text.find("test_row_cumsum(%"), std::string::npos) << text;
}

TEST(CustomOpSpmd, FullyShardableOpRunsLocallyWithoutCollectives) {
  test::register_test_custom_ops();
  VirtualDevices devices(4);
  Mesh mesh = Mesh::parse("data=2,model=2");
  Array x = random_array({8, 6}, 2);
  Array xs = spmd::device_put(x, NamedSharding(mesh, P("data", "model")));
  auto f = jit([](const Array& a) { return test::test_poly(a, 0.5, -1.0); });
  Array y = f(xs);
  EXPECT_EQ(spmd::sharding_of(y)->to_string(), "P('data', 'model')");
  expect_close(y, test::test_poly(x, 0.5, -1.0), 0, "test_poly sharded vs one device");
  const std::string text = f.lowered(Tree(xs)).text();
  EXPECT_EQ(text.find("= all_gather("), std::string::npos) << text;
  EXPECT_NE(text.find("all_gather 0 (0 B)"), std::string::npos) << text;
}

TEST(CustomOpSpmd, UnshardedOnlyGathersItsInputsAndReplicatesItsOutput) {
  test::register_test_custom_ops();
  VirtualDevices devices(4);
  Mesh mesh = Mesh::parse("data=4");
  Array x = random_array({8, 6}, 3);
  Array xs = spmd::device_put(x, NamedSharding(mesh, P("data")));
  auto f = jit([](const Array& a) { return custom_op("test_row_cumsum_gathered", {a})[0]; });
  Array y = f(xs);
  ASSERT_NE(spmd::sharding_of(y), nullptr);
  EXPECT_EQ(spmd::sharding_of(y)->to_string(), "replicated");
  expect_close(y, row_cumsum(x), 0, "unsharded_only vs one device");
  EXPECT_NE(f.lowered(Tree(xs)).text().find("= all_gather("), std::string::npos);
}

TEST(CustomOpSpmd, GradThroughACustomVjpMatchesOneDevice) {
  test::register_test_custom_ops();
  VirtualDevices devices(4);
  Mesh mesh = Mesh::parse("data=2,model=2");
  Array x = random_array({8, 6}, 4);
  auto loss = [](const std::vector<Array>& a) { return sum(multiply(row_cumsum(a[0]), sin(a[0]))); };
  auto step = jit([loss](const std::vector<Array>& a) { return grad(loss)(a); });
  Array g = step(std::vector<Array>{spmd::device_put(x, NamedSharding(mesh, P("data", "model")))})[0];
  expect_close(g, grad(loss)({x})[0], 1e-6, "grad sharded vs one device");
}

TEST(CustomOpSpmd, ASpecThatDoesNotFitTheRankIsAShardingError) {
  test::register_test_custom_ops();
  VirtualDevices devices(2);
  Mesh mesh = Mesh::parse("data=2");
  Array x = random_array({4, 6, 2}, 5);
  // test_poly's spec is "i j -> i j": a rank-3 input does not fit it.
  auto f = jit([](const Array& a) { return test::test_poly(a, 1.0, 0.0); });
  std::string message =
      testing::error_of<spmd::ShardingError>([&] { f(spmd::device_put(x, NamedSharding(mesh, P("data")))); });
  EXPECT_NE(message.find("custom op 'test_poly'"), std::string::npos) << message;
  EXPECT_NE(message.find("rank 3"), std::string::npos) << message;
}

}  // namespace
}  // namespace tessera
