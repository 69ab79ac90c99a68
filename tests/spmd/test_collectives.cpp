// Collective primitives on 2, 4 and 8 virtual devices: every kind over every axis
// set of several meshes against the element-by-element reference of
// collective_reference.h, every dtype, the vjps (dot-product test of the exact
// transposes), attributes, cost and the errors.
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <mutex>

#include "spmd/collective_reference.h"
#include "tessera/spmd/runtime.h"

namespace tessera::spmd {
namespace {

using testing::Case;

std::vector<int> all_devices(int n) {
  std::vector<int> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
  return v;
}

// Runs case `c` on every device of `mesh` with local inputs of `shape`/`dtype` and
// checks each device's output against the reference.
void check_case(const Mesh& mesh, const Case& c, const Shape& shape, DType dtype, int salt) {
  set_cpu_devices(mesh.size());
  std::vector<std::vector<double>> got(static_cast<size_t>(mesh.size()));
  std::vector<Shape> shapes(got.size());
  run_on_devices(all_devices(mesh.size()), [&](int d) {
    Array x = testing::input_array(d, shape, dtype, salt);
    Array y = testing::build(c, x, mesh);
    ASSERT_EQ(y.dtype(), dtype);
    Array out = testing::run_collective(y);
    shapes[static_cast<size_t>(d)] = out.shape();
    got[static_cast<size_t>(d)] = testing::as_doubles(out);
  });
  const int n = mesh.group_size(c.axes);
  for (int d = 0; d < mesh.size(); ++d) {
    const std::string where = fmt::format("{} {} axes={} dim={} concat={} {} device {}", mesh.to_string(),
                                          to_string(c.kind), c.axes, c.dim, c.concat, name(dtype), d);
    EXPECT_EQ(shapes[static_cast<size_t>(d)], testing::output_shape(c, shape, n)) << where;
    const std::vector<double> expect = testing::reference(
        c, mesh, shape, d, [&](int dev) { return testing::input_values(dev, numel(shape), salt, dtype); });
    EXPECT_EQ(got[static_cast<size_t>(d)], expect) << where;
  }
}

TEST(Collectives, EveryKindOverEveryAxisSetMatchesReference) {
  const Shape shape{8, 4, 3};  // every dim divisible by 8 after... dim 0 by 8, dim 1 by 4
  for (const char* spec : {"data=2", "model=4", "data=2,model=4", "data=4,model=2"}) {
    const Mesh mesh = Mesh::parse(spec);
    testing::for_each_case(mesh, shape, [&](const testing::Case& c, const Shape& s, DType dt, int salt) {
      check_case(mesh, c, s, dt, salt);
    });
  }
}

TEST(Collectives, EveryDtype) {
  const Mesh mesh = Mesh::parse("data=2,model=4");
  const Shape shape{4, 6};
  for (DType dt : {DType::Float32, DType::Float64, DType::BFloat16, DType::Float16, DType::Int32, DType::Int64}) {
    check_case(mesh, {CollectiveKind::AllReduce, {1}}, shape, dt, 1);
    check_case(mesh, {CollectiveKind::ReduceScatter, {0, 1}, 0}, Shape{8, 3}, dt, 2);
  }
  for (DType dt : {DType::Bool, DType::UInt8, DType::Int8, DType::UInt32, DType::Float16, DType::Int64}) {
    check_case(mesh, {CollectiveKind::AllGather, {1}, 1}, shape, dt, 3);
    check_case(mesh, {CollectiveKind::AllToAll, {1}, 0, 1}, shape, dt, 4);
    check_case(mesh, {CollectiveKind::ShardSlice, {0}, 1}, shape, dt, 5);
  }
}

TEST(Collectives, AllReduceIsBitwiseTheSerialOrderedSum) {
  const Mesh mesh = Mesh::parse("data=2,model=4");
  const std::vector<int> axes{1, 0};  // group order differs from device order
  const size_t count = 333;
  set_cpu_devices(8);
  std::vector<std::vector<char>> got(8);
  for (int run = 0; run < 2; ++run) {
    run_on_devices(all_devices(8), [&](int d) {
      std::vector<char> bytes = testing::fractional_f32(d, count);
      Array x = Array::from_data(bytes.data(), {static_cast<int64_t>(count)}, DType::Float32);
      Array out = testing::run_collective(all_reduce(x, mesh, axes));
      std::vector<char> result(count * 4);
      std::memcpy(result.data(), out.raw_data(), result.size());
      if (run == 1) {
        EXPECT_EQ(result, got[static_cast<size_t>(d)]) << "run 2 differs on device " << d;
      }
      got[static_cast<size_t>(d)] = result;
    });
  }
  std::vector<std::vector<char>> members;
  for (int dev : mesh.group(0, axes)) members.push_back(testing::fractional_f32(dev, count));
  const std::vector<char> expect = testing::serial_sum(members, count, DType::Float32);
  for (int d = 0; d < 8; ++d) EXPECT_EQ(got[static_cast<size_t>(d)], expect) << "device " << d;
}

// Dot-product test of the vjps: for the per-device linear map y_d = f(x_d) and any
// cotangents g_d, sum_d <f(x)_d, g_d> must equal sum_d <x_d, vjp(g)_d>.
TEST(Collectives, VjpsAreExactTransposes) {
  const Mesh mesh = Mesh::parse("data=2,model=4");
  const Shape shape{4, 8};
  const std::vector<Case> cases{
      {CollectiveKind::AllGather, {1}, 1},      {CollectiveKind::AllGather, {0, 1}, 0},
      {CollectiveKind::ReduceScatter, {1}, 1},  {CollectiveKind::ReduceScatter, {1, 0}, 1},
      {CollectiveKind::AllReduce, {0}},         {CollectiveKind::AllToAll, {1}, 0, 1},
      {CollectiveKind::AllToAll, {0, 1}, 1, 1}, {CollectiveKind::ShardSlice, {1}, 0},
      {CollectiveKind::ShardSlice, {0, 1}, 1},  {CollectiveKind::ShardPad, {0}, 1},
  };
  set_cpu_devices(8);
  for (const Case& c : cases) {
    std::mutex mutex;
    double forward = 0, backward = 0;
    std::string vjp_name;
    run_on_devices(all_devices(8), [&](int d) {
      Array x = testing::input_array(d, shape, DType::Float64, 1);
      Array y = testing::build(c, x, mesh);
      Array g = testing::input_array(d + 8, y.shape(), DType::Float64, 2);
      Array fy = testing::run_collective(y);
      std::vector<Array> dx = y.primitive()->vjp({x}, {g}, {0}, {y});
      ASSERT_EQ(dx.size(), 1u);
      ASSERT_EQ(dx[0].shape(), x.shape());
      Array vg = testing::run_collective(dx[0]);
      double f = 0, b = 0;
      std::vector<double> fv = testing::as_doubles(fy), gv = testing::as_doubles(g), xv = testing::as_doubles(x),
                          bv = testing::as_doubles(vg);
      for (size_t k = 0; k < fv.size(); ++k) f += fv[k] * gv[k];
      for (size_t k = 0; k < xv.size(); ++k) b += xv[k] * bv[k];
      std::lock_guard<std::mutex> lock(mutex);
      forward += f;
      backward += b;
      vjp_name = dx[0].primitive()->name();
    });
    EXPECT_EQ(forward, backward) << to_string(c.kind) << " axes=" << fmt::format("{}", c.axes) << " (vjp " << vjp_name
                                 << ")";
    EXPECT_NE(forward, 0.0);
  }
}

TEST(Collectives, VjpKinds) {
  const Mesh mesh = Mesh::parse("data=2,model=4");
  Array x = Array::placeholder({4, 8}, DType::Float32);
  auto vjp_of = [&](const Array& y) {
    Array g = Array::placeholder(y.shape(), y.dtype());
    return static_cast<const Collective&>(*y.primitive()->vjp({x}, {g}, {0}, {y})[0].primitive());
  };
  EXPECT_EQ(vjp_of(all_gather(x, mesh, {1}, 1)).kind(), CollectiveKind::ReduceScatter);
  EXPECT_EQ(vjp_of(reduce_scatter(x, mesh, {1}, 1)).kind(), CollectiveKind::AllGather);
  EXPECT_EQ(vjp_of(all_reduce(x, mesh, {1})).kind(), CollectiveKind::AllReduce);
  EXPECT_EQ(vjp_of(shard_slice(x, mesh, {1}, 1)).kind(), CollectiveKind::ShardPad);
  const Collective a2a = vjp_of(all_to_all(x, mesh, {1}, 0, 1));
  EXPECT_EQ(a2a.kind(), CollectiveKind::AllToAll);
  EXPECT_EQ(a2a.dim(), 1);
  EXPECT_EQ(a2a.concat_dim(), 0);
}

TEST(Collectives, AttributesCostAndBytes) {
  const Mesh mesh = Mesh::parse("data=2,model=4");
  Array x = Array::placeholder({4, 8}, DType::Float32);  // 128 bytes
  Array g = all_gather(x, mesh, {1}, 1);
  EXPECT_EQ(g.primitive()->name(), "all_gather");
  EXPECT_EQ(g.primitive()->attributes(), "axes=[model], dim=1, mesh=(data=2, model=4)");
  EXPECT_EQ(g.shape(), (Shape{4, 32}));
  EXPECT_EQ(all_reduce(x, mesh, {0, 1}).primitive()->attributes(), "axes=[data, model], mesh=(data=2, model=4)");
  EXPECT_EQ(all_to_all(x, mesh, {1}, 1, 0).primitive()->attributes(),
            "axes=[model], split=1, concat=0, mesh=(data=2, model=4)");
  EXPECT_EQ(shard_slice(x, mesh, {0}, -1).primitive()->attributes(), "axes=[data], dim=1, mesh=(data=2, model=4)");
  // The same axes of another mesh are another function.
  EXPECT_FALSE(g.primitive()->is_equivalent(*all_gather(x, Mesh::parse("model=4"), {0}, 1).primitive()));

  auto cost = [&](const Array& y) { return y.primitive()->cost(y.inputs(), {y}); };
  EXPECT_EQ(cost(g).flops, 0.0);
  EXPECT_EQ(cost(g).bytes, 3 * 128.0);
  EXPECT_EQ(cost(all_reduce(x, mesh, {1})).bytes, 2 * 0.75 * 128);
  EXPECT_EQ(cost(reduce_scatter(x, mesh, {1}, 1)).bytes, 0.75 * 128);
  EXPECT_EQ(cost(all_to_all(x, mesh, {1}, 1, 0)).bytes, 0.75 * 128);
  EXPECT_EQ(cost(shard_slice(x, mesh, {1}, 1)).bytes, 128 + 32.0);  // a local copy
  const auto& c = static_cast<const Collective&>(*g.primitive());
  EXPECT_EQ(c.bytes_sent(100), 300.0);
  EXPECT_EQ(c.group_size(), 4);
}

TEST(Collectives, PrimitiveCallsShowInCommStats) {
  const Mesh mesh = Mesh::parse("data=2,model=4");
  set_cpu_devices(8);
  communicator().reset_stats();
  run_on_devices(all_devices(8), [&](int d) {
    Array x = testing::input_array(d, {2, 3}, DType::Float32, 0);  // 24 bytes
    testing::run_collective(all_gather(x, mesh, {1}, 0));
    testing::run_collective(all_reduce(x, mesh, {0}));
    testing::run_collective(shard_slice(x, mesh, {0}, 0));  // no communication
  });
  for (int d = 0; d < 8; ++d) {
    const CommStats s = communicator().stats(d);
    EXPECT_EQ(s.all_gather_calls, 1);
    EXPECT_EQ(s.all_gather_bytes, 3 * 24.0);
    EXPECT_EQ(s.all_reduce_calls, 1);
    EXPECT_EQ(s.all_reduce_bytes, 2 * 0.5 * 24);
    EXPECT_EQ(s.total_calls(), 2);
  }
}

TEST(Collectives, ErrorsAndGroupsOfOne) {
  const Mesh mesh = Mesh::parse("data=2,model=4");
  Array x = Array::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_THROW(reduce_scatter(x, mesh, {1}, 1), ShapeError);  // 3 rows over 4 devices
  EXPECT_THROW(shard_slice(x, mesh, {1}, 0), ShapeError);
  EXPECT_THROW(all_to_all(x, mesh, {0}, 1, 0), ShapeError);
  EXPECT_THROW(all_gather(x, mesh, {2}, 0), AxisError);  // no mesh axis 2
  EXPECT_THROW(all_gather(x, mesh, {1, 1}, 0), AxisError);
  EXPECT_THROW(all_gather(x, mesh, {1}, 2), AxisError);  // no dim 2
  EXPECT_THROW(all_reduce(Array::from_vector<bool>({true, false}), mesh, {1}), DTypeError);
  try {
    all_gather(x, mesh, {0}, 0).eval();  // 2 devices, but nothing runs them
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("no device is current"), std::string::npos) << e.what();
  }
  // A group of one device is the identity: the builders return x, and the primitive
  // itself copies when it runs outside run_on_devices.
  const Mesh single = Mesh::parse("data=1,model=4");
  EXPECT_TRUE(all_reduce(x, single, {0}).is_same(x));
  EXPECT_TRUE(all_gather(x, mesh, {}, 0).is_same(x));
  Array y = Array::make(x.shape(), x.dtype(),
                        std::make_shared<Collective>(CollectiveKind::AllReduce, single, std::vector<int>{0}), {x});
  EXPECT_EQ(y.to_vector<float>(), x.to_vector<float>());
}

}  // namespace
}  // namespace tessera::spmd
