// Mesh, PartitionSpec, Sharding and the host side of sharded arrays (device_put,
// gather, make_sharded), each checked against an independent computation of the
// row-major device grid and of the shard blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "spmd_test_util.h"

namespace tessera {
namespace {

using spmd::Axes;
using spmd::Mesh;
using spmd::NamedSharding;
using spmd::None;
using spmd::P;
using spmd::PartitionSpec;
using spmd::Placement;
using spmd::PlacementKind;
using spmd::Sharding;
using testing::error_of;
using testing::expect_contains;
using testing::VirtualDevices;

// ---- Mesh ------------------------------------------------------------------------

TEST(Mesh, ParseAndAccessors) {
  Mesh m = Mesh::parse("data=2,model=4");
  EXPECT_EQ(m.ndim(), 2);
  EXPECT_EQ(m.size(), 8);
  EXPECT_EQ(m.axis_names(), (std::vector<std::string>{"data", "model"}));
  EXPECT_EQ(m.axis_sizes(), (std::vector<int>{2, 4}));
  EXPECT_EQ(m.axis_index("model"), 1);
  EXPECT_EQ(m.axis_size("model"), 4);
  EXPECT_EQ(m.axis_name(0), "data");
  EXPECT_TRUE(m.has_axis("data"));
  EXPECT_FALSE(m.has_axis("fsdp"));
  EXPECT_EQ(m.to_string(), "(data=2, model=4)");
  EXPECT_EQ(Mesh::parse("  data = 2 ,model=4 "), m);
  EXPECT_EQ(Mesh::parse("data=2,model=4,"), m);  // a trailing comma is harmless
  EXPECT_EQ(Mesh({"data", "model"}, {2, 4}), m);
  EXPECT_NE(Mesh::parse("model=4,data=2"), m);
  EXPECT_EQ(Mesh::parse("x=1").size(), 1);
  Mesh none;
  EXPECT_EQ(none.size(), 1);
  EXPECT_EQ(none.ndim(), 0);
  EXPECT_EQ(none.to_string(), "()");
}

TEST(Mesh, ParseErrorsNameTheBadEntry) {
  expect_contains(error_of<ValueError>([] { Mesh::parse(""); }), {"empty entry"});
  expect_contains(error_of<ValueError>([] { Mesh::parse("data=2,,model=4"); }), {"empty entry"});
  expect_contains(error_of<ValueError>([] { Mesh::parse("data=2,model"); }), {"'model'", "no size"});
  expect_contains(error_of<ValueError>([] { Mesh::parse("data=0"); }), {"'0'", "'data'", "positive integer"});
  expect_contains(error_of<ValueError>([] { Mesh::parse("data=-2"); }), {"'-2'", "positive integer"});
  expect_contains(error_of<ValueError>([] { Mesh::parse("data=two"); }), {"'two'", "positive integer"});
  expect_contains(error_of<ValueError>([] { Mesh::parse("2d=2"); }), {"'2d'", "identifier"});
  expect_contains(error_of<ValueError>([] { Mesh::parse("data=2,data=4"); }), {"'data'", "twice"});
  expect_contains(error_of<ValueError>([] { Mesh({"a", "b"}, {2}); }), {"2 axis names but 1 sizes"});
  expect_contains(error_of<ValueError>([] { Mesh({"a"}, {0}); }), {"'a'", "size 0"});
  Mesh m = Mesh::parse("data=2,model=4");
  expect_contains(error_of<ValueError>([&] { m.axis_index("x"); }), {"(data=2, model=4)", "no axis 'x'"});
  expect_contains(error_of<ValueError>([&] { m.coords(8); }), {"device 8", "out of range"});
  expect_contains(error_of<ValueError>([&] { m.coords(-1); }), {"device -1"});
  expect_contains(error_of<ValueError>([&] { m.device({1}); }), {"1 coordinates", "expected 2"});
  expect_contains(error_of<ValueError>([&] { m.device({0, 4}); }), {"coordinate 4", "'model'"});
}

TEST(Mesh, CoordsAreRowMajorAndRoundTrip) {
  Mesh m = Mesh::parse("data=2,model=4");
  EXPECT_EQ(m.coords(5), (std::vector<int>{1, 1}));
  EXPECT_EQ(m.coords(3), (std::vector<int>{0, 3}));
  EXPECT_EQ(m.device({1, 2}), 6);
  for (const char* text : {"x=8", "a=2,b=4", "a=4,b=2", "a=2,b=2,c=2", "p=3,q=1,r=5"}) {
    Mesh mesh = Mesh::parse(text);
    for (int d = 0; d < mesh.size(); ++d) {
      std::vector<int> c = mesh.coords(d);
      // Independent row-major decode: the last axis varies fastest.
      int rest = d;
      for (int a = mesh.ndim() - 1; a >= 0; --a) {
        EXPECT_EQ(c[static_cast<size_t>(a)], rest % mesh.axis_size(a)) << text << " device " << d;
        rest /= mesh.axis_size(a);
      }
      EXPECT_EQ(mesh.device(c), d) << text;
    }
  }
}

TEST(Mesh, GroupsListDevicesAlongTheAxesInOrder) {
  Mesh m = Mesh::parse("data=2,model=4");
  int data = m.axis_index("data"), model = m.axis_index("model");
  EXPECT_EQ(m.group(5, {model}), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(m.group(5, {data}), (std::vector<int>{1, 5}));
  EXPECT_EQ(m.group(5, {}), (std::vector<int>{5}));
  EXPECT_EQ(m.group(5, {data, model}), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  // model major: (model 0, data 0), (model 0, data 1), (model 1, data 0), ...
  EXPECT_EQ(m.group(5, {model, data}), (std::vector<int>{0, 4, 1, 5, 2, 6, 3, 7}));
  EXPECT_EQ(m.index_in_group(5, {model}), 1);
  EXPECT_EQ(m.index_in_group(6, {model, data}), 5);
  EXPECT_EQ(m.group_size({model}), 4);
  EXPECT_EQ(m.group_size({}), 1);
  EXPECT_EQ(m.group_size({data, model}), 8);
}

TEST(Mesh, GroupsPartitionTheDevicesForEveryAxisList) {
  Mesh m = Mesh::parse("a=2,b=2,c=2");
  std::vector<std::vector<int>> axis_lists = {{}, {0}, {1}, {2}, {0, 1}, {1, 0}, {0, 2}, {2, 1}, {0, 1, 2}, {2, 0, 1}};
  for (const auto& axes : axis_lists) {
    std::set<std::vector<int>> groups;
    for (int d = 0; d < m.size(); ++d) {
      std::vector<int> g = m.group(d, axes);
      ASSERT_EQ(static_cast<int>(g.size()), m.group_size(axes));
      int i = m.index_in_group(d, axes);
      ASSERT_EQ(g.at(static_cast<size_t>(i)), d);
      std::vector<int> cd = m.coords(d);
      for (size_t k = 0; k < g.size(); ++k) {
        std::vector<int> ck = m.coords(g[k]);
        // Members share every coordinate outside `axes`, and are ordered by their
        // coordinates along `axes` (first listed axis major).
        int expected_index = 0;
        for (int a = 0; a < m.ndim(); ++a) {
          if (std::find(axes.begin(), axes.end(), a) == axes.end()) {
            EXPECT_EQ(ck[static_cast<size_t>(a)], cd[static_cast<size_t>(a)]);
          }
        }
        for (int a : axes) expected_index = expected_index * m.axis_size(a) + ck[static_cast<size_t>(a)];
        EXPECT_EQ(expected_index, static_cast<int>(k));
      }
      groups.insert(g);
    }
    EXPECT_EQ(static_cast<int>(groups.size()), m.size() / m.group_size(axes));
  }
}

// ---- PartitionSpec and Sharding ---------------------------------------------------

TEST(PartitionSpec, Printing) {
  EXPECT_EQ(P().to_string(), "P()");
  EXPECT_EQ(P("data").to_string(), "P('data')");
  EXPECT_EQ(P("data", None).to_string(), "P('data')");
  EXPECT_EQ(P(None, "model").to_string(), "P(None, 'model')");
  EXPECT_EQ(P(None, None).to_string(), "P()");
  EXPECT_EQ(P(Axes{"a", "b"}, None, "c").to_string(), "P(('a', 'b'), None, 'c')");
  EXPECT_EQ(P(std::string("x")).to_string(), "P('x')");
  EXPECT_EQ(P("a"), P("a", None, None));
  EXPECT_NE(P("a"), P(None, "a"));
  EXPECT_NE(P(Axes{"a", "b"}), P(Axes{"b", "a"}));
  NamedSharding ns(Mesh::parse("data=2"), P("data"));
  EXPECT_EQ(ns.to_string(), "NamedSharding(mesh=(data=2), P('data'))");
}

TEST(Sharding, FromSpecPlacementsAndStrings) {
  Mesh m = Mesh::parse("data=2,model=4");
  Sharding s = Sharding::from_spec(m, P("data", "model"), 2);
  EXPECT_EQ(s.rank(), 2);
  EXPECT_EQ(s.dim_axes(0), std::vector<int>{0});
  EXPECT_EQ(s.dim_axes(1), std::vector<int>{1});
  EXPECT_EQ(s.placement(0), (Placement{PlacementKind::Shard, 0}));
  EXPECT_EQ(s.placement(1), (Placement{PlacementKind::Shard, 1}));
  EXPECT_EQ(spmd::to_string(s.placement(1)), "S(1)");
  EXPECT_EQ(s.sharded_dim(1), 1);
  EXPECT_EQ(s.num_shards(1), 4);
  EXPECT_FALSE(s.is_replicated());
  EXPECT_FALSE(s.is_partial());
  EXPECT_EQ(s.to_string(), "P('data', 'model')");
  EXPECT_EQ(s.spec(), P("data", "model"));

  Sharding t = Sharding::from_spec(m, P(None, "model"), 3);
  EXPECT_EQ(t.rank(), 3);
  EXPECT_EQ(t.placement(0), (Placement{PlacementKind::Replicate, -1}));
  EXPECT_EQ(spmd::to_string(t.placement(0)), "R");
  EXPECT_EQ(t.sharded_dim(0), -1);
  EXPECT_EQ(t.to_string(), "P(None, 'model')");
  Sharding tp = t.with_partial({0});
  EXPECT_TRUE(tp.is_partial());
  EXPECT_EQ(tp.placement(0), (Placement{PlacementKind::Partial, -1}));
  EXPECT_EQ(spmd::to_string(tp.placement(0)), "P");
  EXPECT_EQ(tp.to_string(), "P(None, 'model') partial(data)");
  EXPECT_EQ(tp.without_partial(), t);
  EXPECT_NE(tp, t);

  Sharding r = Sharding::replicated(m, 2);
  EXPECT_TRUE(r.is_replicated());
  EXPECT_EQ(r.to_string(), "replicated");
  EXPECT_EQ(Sharding::from_spec(m, P(), 2), r);
  EXPECT_EQ(r.with_partial({1, 0, 1}).partial_axes(), (std::vector<int>{0, 1}));  // sorted, unique
  EXPECT_EQ(r.with_partial({0, 1}).to_string(), "replicated partial(data,model)");
  EXPECT_EQ(r.with_dim_axes(1, {1, 0}).to_string(), "P(None, ('model', 'data'))");

  // Several axes on one dimension: split over their product, first axis major.
  Sharding multi = Sharding::from_spec(m, P(Axes{"model", "data"}), 1);
  EXPECT_EQ(multi.num_shards(0), 8);
  EXPECT_EQ(multi.to_string(), "P(('model', 'data'))");
  for (int d = 0; d < m.size(); ++d) {
    std::vector<int> c = m.coords(d);
    EXPECT_EQ(multi.shard_index(0, d), c[1] * 2 + c[0]) << "device " << d;
  }
  // A resolved NamedSharding is the same as from_spec; trailing Nones past the rank are allowed.
  EXPECT_EQ(NamedSharding(m, P("data")).resolve(2), Sharding::from_spec(m, P("data", None), 2));
  EXPECT_EQ(Sharding::from_spec(m, P("data", None, None), 1), Sharding::from_spec(m, P("data"), 1));
}

TEST(Sharding, LocalShapeAndOffsets) {
  Mesh m = Mesh::parse("data=2,model=4");
  Shape global{8, 12, 5};
  Sharding s = Sharding::from_spec(m, P("model", "data"), 3);
  EXPECT_EQ(s.local_shape(global), (Shape{2, 6, 5}));
  for (int d = 0; d < m.size(); ++d) {
    std::vector<int> c = m.coords(d);
    EXPECT_EQ(s.shard_offsets(global, d), (std::vector<int64_t>{2 * c[1], 6 * c[0], 0})) << "device " << d;
    EXPECT_EQ(s.shard_index(0, d), c[1]);
  }
  Sharding both = Sharding::from_spec(m, P(None, Axes{"data", "model"}), 3);
  Shape g2{3, 16, 2};
  EXPECT_EQ(both.local_shape(g2), (Shape{3, 2, 2}));
  for (int d = 0; d < m.size(); ++d) {
    std::vector<int> c = m.coords(d);
    EXPECT_EQ(both.shard_offsets(g2, d), (std::vector<int64_t>{0, 2 * (c[0] * 4 + c[1]), 0}));
  }
  // Partial and replicated axes do not change the block.
  EXPECT_EQ(Sharding::replicated(m, 3).with_partial({1}).local_shape(global), global);
}

TEST(Sharding, LocalShapeErrorsNameArrayDimSizeAndAxes) {
  Mesh m = Mesh::parse("data=2,model=4");
  Sharding s = Sharding::from_spec(m, P(None, "model"), 2);
  std::string msg = error_of<ShapeError>([&] { s.local_shape({8, 6}, "layers.0.w"); });
  expect_contains(msg, {"layers.0.w", "dimension 1", "size 6", "'model'", "4 shards"});
  std::string rank = error_of<ShapeError>([&] { s.check_divisible({8, 8, 8}, "x"); });
  expect_contains(rank, {"rank 2", "[8, 8, 8]"});
}

// ---- device_put / gather -------------------------------------------------------

// Every PartitionSpec of a rank-3 array over the axes {a, b, c}: each axis splits one
// dimension or none; the axes on one dimension in every order.
std::vector<PartitionSpec> all_specs_rank3() {
  std::vector<PartitionSpec> out;
  const std::vector<std::string> names = {"a", "b", "c"};
  for (int code = 0; code < 64; ++code) {
    std::vector<int> dim_of = {code % 4 - 1, code / 4 % 4 - 1, code / 16 - 1};  // -1: not used
    std::vector<std::vector<std::string>> dims(3);
    for (int a = 0; a < 3; ++a)
      if (dim_of[static_cast<size_t>(a)] >= 0)
        dims[static_cast<size_t>(dim_of[static_cast<size_t>(a)])].push_back(names[static_cast<size_t>(a)]);
    // Every combination of orders within each dimension.
    std::function<void(size_t, PartitionSpec)> rec = [&](size_t d, PartitionSpec spec) {
      if (d == 3) {
        out.push_back(spec);
        return;
      }
      std::vector<std::string> axes = dims[d];
      std::sort(axes.begin(), axes.end());
      do {
        PartitionSpec next = spec;
        next.dims.push_back(axes);
        rec(d + 1, next);
      } while (std::next_permutation(axes.begin(), axes.end()));
    };
    rec(0, PartitionSpec{});
  }
  return out;
}

TEST(DevicePut, EveryLayoutOfARank3ArrayRoundTrips) {
  VirtualDevices devices(8);
  Mesh m = Mesh::parse("a=2,b=2,c=2");
  const Shape shape{8, 8, 8};
  std::vector<float> values(512);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  Array x = Array::from_vector(values, shape);
  std::vector<PartitionSpec> specs = all_specs_rank3();
  // 4^3 choices of a dimension (or none) per axis, times the orders of axes sharing a dimension.
  EXPECT_EQ(specs.size(), 106u);
  std::set<std::string> printed;
  for (const PartitionSpec& spec : specs) {
    std::string what = spec.to_string();
    printed.insert(what);
    Array xs = spmd::device_put(x, NamedSharding(m, spec));
    const Sharding* s = spmd::sharding_of(xs);
    ASSERT_NE(s, nullptr) << what;
    EXPECT_EQ(s->spec(), spec) << what;
    EXPECT_EQ(xs.shape(), shape);
    const std::vector<Array>& shards = spmd::addressable_shards(xs);
    ASSERT_EQ(shards.size(), 8u);
    for (int d = 0; d < 8; ++d) {
      // Independent block: per dim, the shard index is the row-major number of the
      // device's coordinates along that dim's axes.
      std::vector<int> c = m.coords(d);
      int64_t n[3], idx[3];
      for (int k = 0; k < 3; ++k) {
        n[k] = 1, idx[k] = 0;
        for (const std::string& a : spec.dims[static_cast<size_t>(k)]) {
          n[k] *= 2;
          idx[k] = idx[k] * 2 + c[static_cast<size_t>(m.axis_index(a))];
        }
      }
      Shape local{8 / n[0], 8 / n[1], 8 / n[2]};
      ASSERT_EQ(shards[static_cast<size_t>(d)].shape(), local) << what;
      std::vector<float> got = shards[static_cast<size_t>(d)].to_vector<float>();
      size_t q = 0;
      bool same = true;
      for (int64_t i = 0; i < local[0]; ++i)
        for (int64_t j = 0; j < local[1]; ++j)
          for (int64_t k = 0; k < local[2]; ++k) {
            int64_t gi = idx[0] * local[0] + i, gj = idx[1] * local[1] + j, gk = idx[2] * local[2] + k;
            same = same && got[q++] == values[static_cast<size_t>((gi * 8 + gj) * 8 + gk)];
          }
      EXPECT_TRUE(same) << what << " device " << d;
    }
    EXPECT_EQ(spmd::gather(xs).to_vector<float>(), values) << what;
  }
  EXPECT_EQ(printed.size(), specs.size()) << "distinct layouts print distinctly";
}

TEST(DevicePut, ReshardingAShardedArrayKeepsItsValues) {
  VirtualDevices devices(8);
  Mesh m = Mesh::parse("a=2,b=2,c=2");
  Array x = testing::random_array({8, 4, 8}, 7);
  std::vector<float> values = x.to_vector<float>();
  Array xs = spmd::device_put(x, NamedSharding(m, P("a", "b", "c")));
  Array moved = spmd::device_put(xs, NamedSharding(m, P(Axes{"c", "a"}, None, "b")));
  EXPECT_EQ(spmd::sharding_of(moved)->to_string(), "P(('c', 'a'), None, 'b')");
  EXPECT_EQ(spmd::gather(moved).to_vector<float>(), values);
  // Putting an array with its own layout returns it as is.
  EXPECT_TRUE(spmd::device_put(moved, *spmd::sharding_of(moved)).is_same(moved));
  // Reading a sharded array's values assembles it.
  EXPECT_EQ(moved.to_vector<float>(), values);
}

TEST(DevicePut, HostArraysAndShardForDevice) {
  VirtualDevices devices(4);
  Mesh m = Mesh::parse("data=4");
  std::vector<float> v(8);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  Array x = Array::from_vector(v, {8});
  EXPECT_EQ(spmd::sharding_of(x), nullptr);
  EXPECT_TRUE(spmd::gather(x).is_same(x));
  expect_contains(error_of<ValueError>([&] { spmd::addressable_shards(x); }), {"not a sharded array"});
  Sharding s = Sharding::from_spec(m, P("data"), 1);
  EXPECT_EQ(spmd::shard_for_device(x, s, 2).to_vector<float>(), (std::vector<float>{4, 5}));
  Array xs = spmd::device_put(x, s);
  EXPECT_EQ(spmd::shard_for_device(xs, s, 3).to_vector<float>(), (std::vector<float>{6, 7}));
  // Another layout than the array's own: the matching block of its value.
  Sharding rep = Sharding::replicated(m, 1);
  EXPECT_EQ(spmd::shard_for_device(xs, rep, 1).to_vector<float>(), v);
}

TEST(DevicePut, TreeFormUsesThePathForEachLeaf) {
  VirtualDevices devices(2);
  Mesh m = Mesh::parse("data=2");
  Tree t = {{"w", Tree(testing::random_array({4, 2}, 1))}, {"b", Tree(testing::random_array({3}, 2))}};
  Tree put = spmd::device_put(
      t, [&](const std::string& path, const Array&) { return NamedSharding(m, path == "w" ? P("data") : P()); });
  std::vector<std::string> paths = put.paths();
  std::vector<Array> leaves = put.leaves();
  for (size_t i = 0; i < leaves.size(); ++i)
    EXPECT_EQ(spmd::sharding_of(leaves[i])->to_string(), paths[i] == "w" ? "P('data')" : "replicated") << paths[i];
}

// ---- make_sharded ------------------------------------------------------------------

TEST(MakeSharded, WrapsShardsAndChecksThem) {
  VirtualDevices devices(2);
  Mesh m = Mesh::parse("data=2");
  Sharding s = Sharding::from_spec(m, P(None, "data"), 2);
  std::vector<Array> shards = {Array::from_vector(std::vector<float>{0, 1, 4, 5}, {2, 2}),
                               Array::from_vector(std::vector<float>{2, 3, 6, 7}, {2, 2})};
  Array x = spmd::make_sharded({2, 4}, DType::Float32, s, shards);
  EXPECT_EQ(spmd::gather(x).to_vector<float>(), (std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7}));

  expect_contains(error_of<spmd::ShardingError>([&] {
                    spmd::make_sharded({2, 4}, DType::Float32, s.with_partial({0}), shards);
                  }),
                  {"partial(data)", "partial sum"});
  expect_contains(error_of<ValueError>([&] {
                    spmd::make_sharded({2, 4}, DType::Float32, s, {shards[0]});
                  }),
                  {"1 shards", "(data=2)", "2 devices"});
  std::vector<Array> wrong_shape = {shards[0], Array::from_vector(std::vector<float>{0, 1}, {2})};
  expect_contains(error_of<ShapeError>([&] {
                    spmd::make_sharded({2, 4}, DType::Float32, s, wrong_shape);
                  }),
                  {"shard 1", "f32[2]", "[2, 4]", "P(None, 'data')", "[2, 2]"});
  std::vector<Array> wrong_dtype = {shards[0], astype(shards[1], DType::Float64).eval()};
  expect_contains(error_of<ShapeError>([&] {
                    spmd::make_sharded({2, 4}, DType::Float32, s, wrong_dtype);
                  }),
                  {"shard 1", "f64[2, 2]"});
  expect_contains(error_of<ShapeError>([&] {
                    spmd::make_sharded({3, 4}, DType::Float32, s.with_dim_axes(0, {0}).with_dim_axes(1, {}), shards);
                  }),
                  {"dimension 0", "size 3", "'data'"});
}

TEST(MakeSharded, ShapeMismatchMessageSpellsTheNeededType) {
  VirtualDevices devices(2);
  Sharding s = Sharding::from_spec(Mesh::parse("data=2"), P(None, "data"), 2);
  std::vector<Array> shards = {Array::from_vector(std::vector<float>{0, 1, 4, 5}, {2, 2}),
                               Array::from_vector(std::vector<float>{0, 1}, {2})};
  expect_contains(error_of<ShapeError>([&] {
                    spmd::make_sharded({2, 4}, DType::Float32, s, shards);
                  }),
                  {"needs f32[2, 2]"});
}

}  // namespace
}  // namespace tessera
