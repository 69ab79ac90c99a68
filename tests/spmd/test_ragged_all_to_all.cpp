// Dropless expert parallelism's dispatch and combine (ir/primitives/expert_dispatch.h)
// and their lowering, the ragged all-to-all (spmd/ragged_all_to_all.h): the global ops
// against a float64 reference and each other's transpose; Communicator::all_to_all_v
// in-process (and the padded default) with exact contents and statistics; sharded
// dispatch -> expert GEMMs -> combine, value and gradients, equal to one device on three
// meshes, sending exactly the routed rows; their programs parse back from their text.
#include <gtest/gtest.h>

#include <random>

#include "spmd_test_util.h"
#include "tessera/api/jit.h"
#include "tessera/compiler/parser.h"
#include "tessera/compiler/primitive_registry.h"
#include "tessera/core/ops.h"
#include "tessera/core/transforms.h"
#include "tessera/ir/primitives/expert_dispatch.h"
#include "tessera/spmd/api.h"
#include "tessera/spmd/ragged_all_to_all.h"
#include "tessera/spmd/runtime.h"
#include "tessera/spmd/spmd_executable.h"

namespace tessera {
namespace {

using spmd::Mesh;
using spmd::P;
using spmd::Sharding;
using testing::expect_close;
using testing::random_array;
using testing::VirtualDevices;

// [groups, experts] counts, each group's summing to at most `rows` (some zeros, some
// groups full, one empty).
std::vector<int64_t> random_counts(int64_t groups, int64_t experts, int64_t rows, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> c(static_cast<size_t>(groups * experts), 0);
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t total = g == 1 ? 0 : (g % 3 == 0 ? rows : static_cast<int64_t>(rng() % static_cast<uint64_t>(rows)));
    for (int64_t r = 0; r < total; ++r) {
      // Skewed: expert 0 gets about half.
      const int64_t e = rng() % 2 == 0 ? 0 : static_cast<int64_t>(rng() % static_cast<uint64_t>(experts));
      ++c[static_cast<size_t>(g * experts + e)];
    }
  }
  return c;
}

Array sizes_array(const std::vector<int64_t>& c, int64_t groups, int64_t experts, DType dtype) {
  return astype(Array::from_vector(c, {groups, experts}), dtype);
}

TEST(ExpertDispatch, MatchesTheReferenceAndCombineIsItsTranspose) {
  const int64_t groups = 4, rows = 9, width = 3, experts = 6;
  const std::vector<int64_t> c = random_counts(groups, experts, rows, 7);
  for (int64_t shards : {1, 2, 3}) {
    for (DType dtype : {DType::Int32, DType::Int64}) {
      const Array sizes = sizes_array(c, groups, experts, dtype);
      const Array x = astype(random_array({groups, rows, width}, 11), DType::Float64);
      const std::vector<double> xv = x.to_vector<double>();
      const std::vector<double> got = expert_dispatch(x, sizes, shards, {"expert"}).to_vector<double>();
      ASSERT_EQ(got.size(), static_cast<size_t>(shards * groups * rows * width));
      std::vector<double> want(got.size(), 0.0);
      const int64_t per = experts / shards;
      for (int64_t g = 0; g < groups; ++g) {
        int64_t start = 0;
        for (int64_t s = 0; s < shards; ++s) {
          int64_t n = 0;
          for (int64_t e = s * per; e < (s + 1) * per; ++e) n += c[static_cast<size_t>(g * experts + e)];
          for (int64_t r = 0; r < n; ++r)
            for (int64_t d = 0; d < width; ++d)
              want[static_cast<size_t>(((s * groups + g) * rows + r) * width + d)] =
                  xv[static_cast<size_t>((g * rows + start + r) * width + d)];
          start += n;
        }
      }
      EXPECT_EQ(got, want) << shards << " shards, " << name(dtype) << " sizes";

      // <dispatch(x), y> = <x, combine(y)>: the two are each other's transposes, and the
      // combine zeroes the rows past each group's assignments.
      const Array y = astype(random_array({shards, groups, rows, width}, 12), DType::Float64);
      const double lhs = sum(expert_dispatch(x, sizes, shards, {"expert"}) * y).item<double>();
      const Array back = expert_combine(y, sizes, {"expert"});
      const double rhs = sum(x * back).item<double>();
      EXPECT_NEAR(lhs, rhs, 1e-12 * (std::abs(lhs) + 1)) << shards << " shards";
      const std::vector<double> bv = back.to_vector<double>();
      for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(bv[static_cast<size_t>((1 * rows + r) * width)], 0.0) << r;
    }
  }
}

TEST(ExpertDispatch, BadInputIsAClearError) {
  const Array x = random_array({2, 4, 3}, 1);
  const Array sizes = sizes_array({1, 1, 0, 2, 2, 1, 0, 1}, 2, 4, DType::Int64);
  testing::expect_contains(testing::error_of<ShapeError>([&] { expert_dispatch(x, sizes, 3, {"expert"}); }),
                           {"expert_dispatch", "4 experts", "3 equal expert shards"});
  testing::expect_contains(
      testing::error_of<DTypeError>([&] { expert_dispatch(x, astype(sizes, DType::Float32), 2, {"expert"}); }),
      {"expert_dispatch", "float32", "int32 or int64"});
  testing::expect_contains(testing::error_of<ShapeError>([&] {
                             expert_dispatch(x, sizes_array({1, 1, 1, 1}, 1, 4, DType::Int64), 2, {});
                           }),
                           {"expert sizes [1, 4]", "one row per routing group"});
  testing::expect_contains(testing::error_of<ShapeError>([&] { expert_combine(x, sizes, {"expert"}); }),
                           {"expert_combine", "[shards, groups, rows, width]"});
  // Checked when the values exist: a negative count, and more rows than a group holds.
  testing::expect_contains(
      testing::error_of<ValueError>([&] {
        expert_dispatch(x, sizes_array({1, -1, 0, 0, 0, 0, 0, 0}, 2, 4, DType::Int64), 2, {}).eval();
      }),
      {"expert_dispatch", "expert 1 of group 0 has -1 rows"});
  testing::expect_contains(
      testing::error_of<ValueError>([&] {
        expert_dispatch(x, sizes_array({1, 1, 0, 0, 2, 2, 1, 0}, 2, 4, DType::Int64), 2, {}).eval();
      }),
      {"expert_dispatch", "group 1", "holds 4"});
  // Read back from IR text: a bad attribute is named.
  testing::expect_contains(
      testing::error_of<ValueError>([] { compiler::make_primitive("expert_dispatch", "shards=0, axes=[expert]"); }),
      {"expert_dispatch", "shards=0"});
  testing::expect_contains(
      testing::error_of<ValueError>([] { compiler::make_primitive("expert_combine", "shards=2, axes=expert"); }),
      {"expert_combine", "axes = 'expert'", "list of mesh axes"});
  testing::expect_contains(
      testing::error_of<ValueError>(
          [] { compiler::make_primitive("ragged_all_to_all", "axes=[model], combine=false, mesh=(expert=2)"); }),
      {"ragged_all_to_all", "model"});
}

// Runs fn on every device of an n-device in-process runtime, from fresh statistics.
void on_devices(int n, const std::function<void(int, spmd::Communicator&)>& fn) {
  spmd::set_cpu_devices(n);
  spmd::Communicator& comm = spmd::communicator();
  comm.reset_stats();
  std::vector<int> devices(static_cast<size_t>(n));
  for (int d = 0; d < n; ++d) devices[static_cast<size_t>(d)] = d;
  spmd::run_on_devices(devices, [&](int d) { fn(d, comm); });
}

// Bytes device `from` sends device `to`: (from * 3 + to) % 4 * 5, 0 on some pairs.
size_t block_bytes(int from, int to) { return static_cast<size_t>((from * 3 + to) % 4 * 5); }
char block_byte(int from, int to, size_t k) { return static_cast<char>(from * 16 + to * 4 + static_cast<int>(k % 3)); }

TEST(RaggedAllToAll, TheCommunicatorMovesOnlyTheBlocks) {
  const int n = 3;
  const std::vector<int> group{0, 1, 2};
  for (const bool padded_default : {false, true}) {
    VirtualDevices devices(n);
    on_devices(n, [&](int d, spmd::Communicator& comm) {
      std::vector<size_t> send_bytes, recv_bytes;
      std::vector<char> send, want;
      for (int j = 0; j < n; ++j) {
        send_bytes.push_back(block_bytes(d, j));
        recv_bytes.push_back(block_bytes(j, d));
        for (size_t k = 0; k < block_bytes(d, j); ++k) send.push_back(block_byte(d, j, k));
        for (size_t k = 0; k < block_bytes(j, d); ++k) want.push_back(block_byte(j, d, k));
      }
      std::vector<char> recv(want.size(), 'x');
      if (padded_default)
        comm.spmd::Communicator::all_to_all_v(d, group, send.data(), send_bytes, recv.data(), recv_bytes);
      else
        comm.all_to_all_v(d, group, send.data(), send_bytes, recv.data(), recv_bytes);
      EXPECT_EQ(recv, want) << "device " << d << (padded_default ? " (padded default)" : "");
      const spmd::CommStats s = comm.stats(d);
      EXPECT_EQ(s.all_to_all_calls, 1) << d;
      double sent = 0, largest = 0;
      for (int j = 0; j < n; ++j) {
        if (j != d) sent += static_cast<double>(block_bytes(d, j));
        for (int k = 0; k < n; ++k) largest = std::max(largest, static_cast<double>(block_bytes(j, k)));
      }
      if (padded_default)  // every block padded to the largest, as all_to_all counts it
        EXPECT_DOUBLE_EQ(s.all_to_all_bytes, (n - 1) * largest) << d;
      else
        EXPECT_DOUBLE_EQ(s.all_to_all_bytes, sent) << d;
    });
  }
  // A member expecting another size than its peer sends is named.
  VirtualDevices devices(2);
  EXPECT_THROW(on_devices(2,
                          [&](int d, spmd::Communicator& comm) {
                            std::vector<char> send(8), recv(8);
                            comm.all_to_all_v(d, {0, 1}, send.data(), {4, 4}, recv.data(), {4, d == 0 ? 2u : 4u});
                          }),
               Error);
}

// dispatch -> each shard's grouped GEMM -> combine, with the loss and its gradients.
std::vector<Array> experts_step(const std::vector<Array>& a, int64_t shards) {
  const Array& sizes = a[2];
  const Array& shard_sizes = a[3];
  auto loss = [&](const std::vector<Array>& p) {
    const Array routed = expert_dispatch(p[0], sizes, shards, {"expert"});
    const Array out = expert_combine(grouped_matmul(routed, p[1], shard_sizes), sizes, {"expert"});
    return sum(square(out) * 0.5);
  };
  auto [value, grads] = value_and_grad(loss)({a[0], a[1]});
  return {value, grads[0], grads[1]};
}

TEST(RaggedAllToAll, ShardedExpertsEqualOneDeviceAndSendTheRoutedRows) {
  struct Case {
    const char* mesh;
    int64_t shards;
    const char* groups_axes;  // the groups' split
  };
  const int64_t rows = 12, width = 8;
  for (const Case& k :
       {Case{"expert=2", 2, "expert"}, Case{"data=2,expert=2", 2, "data+expert"}, Case{"expert=4", 4, "expert"}}) {
    const Mesh mesh = Mesh::parse(k.mesh);
    const int64_t groups = mesh.size(), experts = 2 * k.shards, per = experts / k.shards;
    const std::vector<int64_t> c = random_counts(groups, experts, rows, 21 + static_cast<uint64_t>(k.shards));
    const Array sizes = sizes_array(c, groups, experts, DType::Int64);
    // [S, G, E/S]: shard s's experts' counts per group.
    std::vector<int64_t> sc;
    for (int64_t s = 0; s < k.shards; ++s)
      for (int64_t g = 0; g < groups; ++g)
        for (int64_t e = 0; e < per; ++e) sc.push_back(c[static_cast<size_t>(g * experts + s * per + e)]);
    const Array shard_sizes = Array::from_vector(sc, {k.shards, groups, per});
    const Array x = random_array({groups, rows, width}, 31);
    const Array w = random_array({k.shards, per, width, width}, 32, 0.3);
    const std::vector<Array> want = jit([&](const std::vector<Array>& a) { return experts_step(a, k.shards); })(
        std::vector<Array>{x, w, sizes, shard_sizes});

    VirtualDevices devices(mesh.size());
    const spmd::Axes group_axes =
        std::string(k.groups_axes) == "expert" ? spmd::Axes{"expert"} : spmd::Axes{"data", "expert"};
    const spmd::Axes rest = std::string(k.groups_axes) == "expert" ? spmd::Axes{} : spmd::Axes{"data"};
    JitOptions options;
    options.in_shardings = {Sharding::from_spec(mesh, spmd::PartitionSpec{{group_axes, {}, {}}}, 3),
                            Sharding::from_spec(mesh, P("expert"), 4),
                            Sharding::from_spec(mesh, spmd::PartitionSpec{{group_axes, {}}}, 2),
                            Sharding::from_spec(mesh, spmd::PartitionSpec{{{"expert"}, rest, {}}}, 3)};
    auto f = jit([&](const std::vector<Array>& a) { return experts_step(a, k.shards); }, options);
    const std::vector<Array> args{x, w, sizes, shard_sizes};
    const std::vector<Array> got = f(args);
    const char* names[] = {"loss", "grad x", "grad w"};
    for (size_t i = 0; i < got.size(); ++i) expect_close(got[i], want[i], 1e-6, std::string(k.mesh) + " " + names[i]);

    // Forward dispatch and combine, backward their transposes: 4 ragged all-to-alls, and
    // no other all-to-all. Each sends exactly the rows crossing between shards (group g
    // lives on the device at block g of its split; its shard is that device's expert index).
    Lowered lowered = f.lowered(args);
    const std::string text = lowered.text();
    EXPECT_NE(text.find("ragged_all_to_all"), std::string::npos) << text;
    // The per-device program (ragged all-to-alls, grouped GEMMs with row_shards) and the
    // global one (expert_dispatch / expert_combine) parse back to the same text: the
    // persistent compilation cache can store them.
    const std::string local = lowered.spmd()->program().local.text();
    EXPECT_NE(local.find("row_shards="), std::string::npos) << local;
    EXPECT_EQ(compiler::parse_graph(local).text(), local);
    auto step_tree = [&](const Tree& t, const StaticArgs&) {
      std::vector<Tree> outs;
      for (const Array& out : experts_step(t.leaves(), k.shards)) outs.emplace_back(out);
      return Tree::list(std::move(outs));
    };
    const std::string global = trace(step_tree, Tree::list({Tree(x), Tree(w), Tree(sizes), Tree(shard_sizes)})).text();
    EXPECT_NE(global.find("expert_dispatch"), std::string::npos) << global;
    EXPECT_EQ(compiler::parse_graph(global).text(), global);
    EXPECT_EQ(lowered.spmd()->program().summary.per_device.all_to_all_calls, 4) << text;
    const std::vector<spmd::CommStats>& stats = lowered.spmd()->last_comm_stats();
    ASSERT_EQ(stats.size(), static_cast<size_t>(mesh.size()));
    for (int device = 0; device < mesh.size(); ++device) {
      const int64_t me = mesh.index_in_group(device, {mesh.axis_index("expert")});
      const int64_t first = device * groups / mesh.size();  // its group (one per device)
      double out_rows = 0, in_rows = 0;
      for (int64_t e = 0; e < experts; ++e)
        if (e / per != me) out_rows += static_cast<double>(c[static_cast<size_t>(first * experts + e)]);
      for (int peer = 0; peer < mesh.size(); ++peer) {
        const bool same_group =
            mesh.index_in_group(peer, {mesh.axis_index("expert")}) != me &&
            mesh.group(peer, {mesh.axis_index("expert")}) == mesh.group(device, {mesh.axis_index("expert")});
        if (!same_group) continue;
        for (int64_t e = me * per; e < (me + 1) * per; ++e)
          in_rows += static_cast<double>(c[static_cast<size_t>(peer * experts + e)]);
      }
      const double row_bytes = static_cast<double>(width) * 4;
      EXPECT_EQ(stats[static_cast<size_t>(device)].all_to_all_calls, 4) << k.mesh << " device " << device;
      EXPECT_DOUBLE_EQ(stats[static_cast<size_t>(device)].all_to_all_bytes, 2 * (out_rows + in_rows) * row_bytes)
          << k.mesh << " device " << device;
    }
  }
}

}  // namespace
}  // namespace tessera
