// CollectivePlan (the lowering the GPU backend runs) through its host emulation: every
// collective kind over every axis set, every dtype and odd sizes (all-reduce padding)
// bitwise equal to Collective::eval_cpu on the same inputs, on 2, 4 and 8 virtual devices.
#include <gtest/gtest.h>

#include <cstring>

#include "spmd/collective_reference.h"
#include "spmd/spmd_test_util.h"
#include "tessera/spmd/collective_plan.h"
#include "tessera/spmd/runtime.h"

namespace tessera::spmd {
namespace {

using tessera::testing::all_devices;
using tessera::testing::bytes_of;

// Runs collective `y` (built on device d's input) both ways on every device of the mesh
// and compares their bytes. make_input(d) gives device d's local input.
void expect_plan_equals_eval(const Mesh& mesh, const std::function<Array(const Array&)>& build,
                             const std::function<Array(int)>& make_input, const std::string& what) {
  set_cpu_devices(mesh.size());
  const size_t n = static_cast<size_t>(mesh.size());
  std::vector<std::vector<char>> by_eval(n), by_plan(n);
  std::vector<std::string> plans(n);
  run_on_devices(all_devices(mesh.size()), [&](int d) {
    const Array x = make_input(d);
    const Array y = build(x);
    if (y.is_leaf()) return;  // a group of one: no collective
    by_eval[static_cast<size_t>(d)] = bytes_of(testing::run_collective(y));
    const auto& collective = dynamic_cast<const Collective&>(*y.primitive());
    const CollectivePlan plan =
        plan_collective(collective, x.shape(), x.dtype(), collective.mesh().index_in_group(d, collective.axes()));
    EXPECT_EQ(plan.output_bytes, y.nbytes()) << what;
    std::vector<char> out(y.nbytes(), 0x55), staging(plan.staging_bytes, 0x55);
    run_collective_plan(plan, x.raw_data(), out.data(), staging.data(), *current_device()->communicator, d,
                        collective.mesh().group(d, collective.axes()));
    by_plan[static_cast<size_t>(d)] = std::move(out);
    plans[static_cast<size_t>(d)] = plan.to_string();
  });
  for (size_t d = 0; d < n; ++d)
    EXPECT_EQ(by_plan[d], by_eval[d]) << what << " on device " << d << " (plan: " << plans[d] << ")";
}

TEST(CollectivePlan, EveryKindOverEveryAxisSetEqualsEvalCpu) {
  const Shape shape{8, 4, 3};
  for (const char* spec : {"data=2", "model=4", "data=2,model=4", "data=4,model=2"}) {
    const Mesh mesh = Mesh::parse(spec);
    testing::for_each_case(mesh, shape, [&](const testing::Case& c, const Shape& s, DType dt, int salt) {
      expect_plan_equals_eval(
          mesh, [&](const Array& x) { return testing::build(c, x, mesh); },
          [&](int d) { return testing::input_array(d, s, dt, salt); },
          fmt::format("{} {} dim={} concat={}", spec, to_string(c.kind), c.dim, c.concat));
    });
  }
}

TEST(CollectivePlan, SumsAreBitwiseTheOrderedSumInEveryDtype) {
  const Mesh mesh = Mesh::parse("data=2,model=4");
  // Fractional values, so the order of the additions shows in the bits; 333 and 7
  // elements do not divide into 4 or 8 chunks (the all-reduce pads).
  for (DType dt : {DType::Float32, DType::Float64, DType::BFloat16, DType::Float16, DType::Int32, DType::Int64}) {
    for (int64_t count : {333, 7, 8}) {
      auto input = [&](int d) {
        const std::vector<char> f32 = testing::fractional_f32(d, static_cast<size_t>(count) * 2);
        Array x = Array::from_data(f32.data(), {count * 2}, DType::Float32);
        return x.astype(dt).eval();
      };
      for (const std::vector<int>& axes : std::vector<std::vector<int>>{{1}, {1, 0}, {0}}) {
        expect_plan_equals_eval(
            mesh, [&](const Array& x) { return all_reduce(x, mesh, axes); }, input,
            fmt::format("all_reduce {} of {}", name(dt), count * 2));
        if ((count * 2) % mesh.group_size(axes) == 0)
          expect_plan_equals_eval(
              mesh, [&](const Array& x) { return reduce_scatter(x, mesh, axes, 0); }, input,
              fmt::format("reduce_scatter {} of {}", name(dt), count * 2));
      }
    }
  }
}

TEST(CollectivePlan, StepsAndStaging) {
  const Mesh mesh = Mesh::parse("data=2,model=4");
  // An all-reduce that divides evenly exchanges straight from the input into the output.
  const Collective even(CollectiveKind::AllReduce, mesh, {1});
  const CollectivePlan a = plan_collective(even, Shape{8, 4}, DType::Float32, 1);
  EXPECT_EQ(a.to_string(), "all_reduce over 4: all_to_all 32 B, ordered_sum 8 x4, all_gather 32 B");
  // One that does not pads to 4 chunks of 2 (7 elements + 1 zero).
  const CollectivePlan b = plan_collective(even, Shape{7}, DType::Float32, 0);
  EXPECT_EQ(b.to_string(),
            "all_reduce over 4: copy 28 B, zero 4 B, all_to_all 8 B, ordered_sum 2 x4, all_gather 8 B, copy 28 B");
  EXPECT_GT(b.staging_bytes, 0u);
  // Gathering an inner dim moves the member axis inward: one strided copy per member.
  const Collective gather(CollectiveKind::AllGather, mesh, {0}, 1);
  EXPECT_EQ(plan_collective(gather, Shape{3, 5}, DType::Float16, 1).to_string(),
            "all_gather over 2: all_gather 30 B, copy 10 B x3, copy 10 B x3");
  // Slices and pads are local copies at the member's block.
  const Collective slice(CollectiveKind::ShardSlice, mesh, {1}, 1);
  const CollectivePlan s = plan_collective(slice, Shape{2, 8}, DType::Float32, 3);
  ASSERT_EQ(s.steps.size(), 1u);
  EXPECT_EQ(s.steps[0].src.offset, 3u * 2 * 4);
  EXPECT_EQ(s.steps[0].src_pitch, 32u);
  EXPECT_EQ(s.staging_bytes, 0u);
  // Nothing to move: no steps.
  EXPECT_TRUE(plan_collective(even, Shape{0, 4}, DType::Float32, 0).steps.empty());
}

TEST(CollectivePlan, BadArgumentsAreClearErrors) {
  const Mesh mesh = Mesh::parse("data=2,model=4");
  const Collective scatter(CollectiveKind::ReduceScatter, mesh, {1}, 0);
  try {
    plan_collective(scatter, Shape{6, 2}, DType::Float32, 0);
    FAIL() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("dim 0 of shape [6, 2] is not divisible by the group's 4 members"),
              std::string::npos)
        << e.what();
  }
  try {
    plan_collective(scatter, Shape{8, 2}, DType::Float32, 4);
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("member index 4 is outside the group of 4"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera::spmd
