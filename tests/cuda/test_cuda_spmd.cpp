// SPMD programs on GPUs: the collectives' CUDA kernels (CollectivePlans on device
// copies, in-process transport between the virtual devices of one GPU) bitwise equal to
// the CPU's eval_cpu on the same inputs — every kind over every axis set, every dtype,
// sums of fractional values — and a GPT training step under data, FSDP and tensor
// parallel layouts on virtual GPU devices against the CPU's sharded run, bitwise from run
// to run, its measured bytes the partitioner's count; and a dropless MoE over expert=2.
//
// They need 8 CUDA devices: ctest runs them as cuda.spmd_virtual_devices with
// TESSERA_GPU_VIRTUAL_DEVICES=8 (cmake/gpu_tests.cmake); elsewhere (no GPU, or fewer
// devices) each skips and says why.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "backend/cuda/run_on_gpu.h"
#include "cuda/cuda_test_util.h"
#include "spmd/collective_reference.h"
#include "spmd/parallel_train_util.h"
#include "spmd/spmd_test_util.h"
#include "tessera/api/jit.h"
#include "tessera/backend/device_data.h"
#include "tessera/spmd/api.h"
#include "tessera/spmd/runtime.h"
#include "tessera/train/parallel.h"
#include "tessera/train/train_step.h"

namespace tessera {
namespace {

constexpr int kDevices = 8;

#define TESSERA_REQUIRE_GPU_DEVICES(n)                                                                                 \
  do {                                                                                                                 \
    TESSERA_REQUIRE_GPU();                                                                                             \
    if (cuda::device_count() < (n))                                                                                    \
      GTEST_SKIP() << "needs " << (n) << " CUDA devices, " << cuda::device_count()                                     \
                   << " present (ctest's cuda.spmd_virtual_devices runs this with TESSERA_GPU_VIRTUAL_DEVICES=" << (n) \
                   << ")";                                                                                             \
  } while (0)

using testing::all_devices;
using testing::bytes_of;

// Runs collective `build(x_d)` on every device of the mesh, on the CPU (eval_cpu) and on
// CUDA device d (the kernel, its exchanges between the virtual devices' streams), and
// compares the bytes.
void expect_gpu_equals_cpu(const spmd::Mesh& mesh, const std::function<Array(const Array&)>& build,
                           const std::function<Array(int)>& make_input, const std::string& what) {
  testing::VirtualDevices threads(mesh.size());
  const size_t n = static_cast<size_t>(mesh.size());
  std::vector<std::vector<char>> cpu(n), gpu(n);
  spmd::run_on_devices(all_devices(mesh.size()), [&](int d) {
    const Array x = make_input(d);
    const Array y = build(x);
    if (y.is_leaf()) return;
    cpu[static_cast<size_t>(d)] = bytes_of(spmd::testing::run_collective(y));
    gpu[static_cast<size_t>(d)] = bytes_of(cuda::run_on_gpu(y, d).at(0));
  });
  for (size_t d = 0; d < n; ++d) EXPECT_EQ(gpu[d], cpu[d]) << what << " on device " << d;
}

TEST(GpuSpmd, CollectivesOverEveryAxisSetEqualTheCpuBitwise) {
  TESSERA_REQUIRE_GPU_DEVICES(kDevices);
  const Shape shape{8, 4, 3};
  for (const char* spec : {"data=2", "model=4", "data=2,model=4", "data=4,model=2"}) {
    const spmd::Mesh mesh = spmd::Mesh::parse(spec);
    spmd::testing::for_each_case(mesh, shape, [&](const spmd::testing::Case& c, const Shape& s, DType dt, int salt) {
      expect_gpu_equals_cpu(
          mesh, [&](const Array& x) { return spmd::testing::build(c, x, mesh); },
          [&](int d) { return spmd::testing::input_array(d, s, dt, salt); },
          fmt::format("{} {} dim={} concat={}", spec, spmd::to_string(c.kind), c.dim, c.concat));
    });
  }
}

TEST(GpuSpmd, SumsAreTheCpusOrderedSumInEveryDtype) {
  TESSERA_REQUIRE_GPU_DEVICES(kDevices);
  const spmd::Mesh mesh = spmd::Mesh::parse("data=2,model=4");
  for (DType dt : {DType::Float32, DType::Float64, DType::BFloat16, DType::Float16, DType::Int32, DType::Int64}) {
    for (int64_t count : {333, 7, 4096}) {
      auto input = [&](int d) {
        const std::vector<char> f32 = spmd::testing::fractional_f32(d, static_cast<size_t>(count) * 2);
        return Array::from_data(f32.data(), {count * 2}, DType::Float32).astype(dt).eval();
      };
      for (const std::vector<int>& axes : std::vector<std::vector<int>>{{1}, {1, 0}, {0}}) {
        expect_gpu_equals_cpu(
            mesh, [&](const Array& x) { return spmd::all_reduce(x, mesh, axes); }, input,
            fmt::format("all_reduce {} of {}", name(dt), count * 2));
        if ((count * 2) % mesh.group_size(axes) == 0)
          expect_gpu_equals_cpu(
              mesh, [&](const Array& x) { return spmd::reduce_scatter(x, mesh, axes, 0); }, input,
              fmt::format("reduce_scatter {} of {}", name(dt), count * 2));
      }
    }
  }
}

struct StepRun {
  std::vector<double> losses;
  std::vector<std::vector<char>> params;  // every leaf's bytes, after the steps
  Tree tree;
  double summary_bytes = 0, measured_bytes = 0;
};

// 3 AdamW steps of the tiny GPT on `mesh_text` ("" one device) on `device`.
StepRun train(const std::string& mesh_text, const std::string& device) {
  models::Model model(testing::tiny_gpt());
  optim::Optimizer optimizer(testing::test_adamw(), model.specs());
  Tree params = model.init(7);
  Tree opt = optimizer.init(params);
  std::optional<train::Layout> layout = testing::place_on_mesh(mesh_text, model, params, opt);
  train::TrainStep step(model, optimizer, 1, layout ? &*layout : nullptr, device);
  StepRun run;
  for (int64_t s = 0; s < testing::kTrainSteps; ++s) {
    data::Batch b = testing::random_batch(testing::kTrainBatch, testing::kTrainSeq, 64, static_cast<uint64_t>(100 * s));
    std::vector<data::Batch> micro{layout ? layout->shard_batch(b) : b};
    run.losses.push_back(step.run(params, opt, micro, 1e-2, std::nullopt).loss);
  }
  for (const auto& p : step.spmd_programs()) {
    run.summary_bytes += p->program().summary.per_device.total_bytes();
    run.measured_bytes += p->last_comm_stats().at(0).total_bytes();
  }
  for (const Array& leaf : params.leaves()) run.params.push_back(bytes_of(leaf));
  run.tree = params;
  return run;
}

class GpuSpmdTrain : public ::testing::TestWithParam<const char*> {};

TEST_P(GpuSpmdTrain, StepEqualsTheCpusShardedRunAndRepeatsBitwise) {
  const spmd::Mesh mesh = spmd::Mesh::parse(GetParam());
  TESSERA_REQUIRE_GPU_DEVICES(mesh.size());
  testing::VirtualDevices threads(mesh.size());
  const StepRun cpu = train(GetParam(), "cpu");
  const StepRun gpu = train(GetParam(), "cuda");
  const StepRun again = train(GetParam(), "cuda");
  ASSERT_EQ(gpu.losses.size(), cpu.losses.size());
  for (size_t s = 0; s < cpu.losses.size(); ++s) {
    // float32 on both; cuBLAS and the CPU GEMMs sum in different orders.
    EXPECT_NEAR(gpu.losses[s], cpu.losses[s], 1e-4 * std::abs(cpu.losses[s])) << "step " << s;
    EXPECT_EQ(gpu.losses[s], again.losses[s]) << "step " << s << " differs between two GPU runs";
  }
  const std::vector<Array> g = gpu.tree.leaves(), c = cpu.tree.leaves();
  const std::vector<std::string> paths = cpu.tree.paths();
  for (size_t i = 0; i < g.size(); ++i) testing::expect_close(g[i], c[i], 1e-3, paths[i]);
  EXPECT_EQ(gpu.params, again.params) << "parameters differ between two GPU runs";
  // The collectives ran on the devices and counted what the partitioner planned.
  EXPECT_GT(gpu.measured_bytes, 0);
  EXPECT_DOUBLE_EQ(gpu.measured_bytes, gpu.summary_bytes);
  EXPECT_DOUBLE_EQ(gpu.measured_bytes, cpu.measured_bytes);
}

INSTANTIATE_TEST_SUITE_P(Layouts, GpuSpmdTrain,
                         ::testing::Values("data=2", "fsdp=2", "tensor=2", "data=2,tensor=2", "data=2,fsdp=2,tensor=2"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string name = info.param;
                           for (char& ch : name)
                             if (ch == '=' || ch == ',') ch = '_';
                           return name;
                         });

// Dropless expert parallelism on virtual GPU devices: a 4-expert MoE model (top 2) over
// expert=2, whose dispatch and combine are ragged all-to-alls (their CUDA kernel stages
// the routed rows through host memory), trains like the CPU's sharded run.
TEST(GpuSpmd, DroplessExpertParallelismTrainsAsOnTheCpu) {
  TESSERA_REQUIRE_GPU_DEVICES(2);
  testing::VirtualDevices threads(2);
  models::ModelConfig c = testing::tiny_gpt();
  c.family = "llama";
  c.moe_experts = 4;
  c.moe_top_k = 2;
  auto run = [&](const std::string& device) {
    models::Model model(c);
    optim::Optimizer optimizer(testing::test_adamw(), model.specs());
    Tree params = model.init(7), opt = optimizer.init(params);
    std::optional<train::Layout> layout = testing::place_on_mesh("expert=2", model, params, opt);
    train::TrainStep step(model, optimizer, 1, &*layout, device);
    StepRun r;
    for (int64_t s = 0; s < testing::kTrainSteps; ++s) {
      data::Batch b =
          testing::random_batch(testing::kTrainBatch, testing::kTrainSeq, 64, static_cast<uint64_t>(100 * s));
      r.losses.push_back(step.run(params, opt, {layout->shard_batch(b)}, 1e-2, std::nullopt).loss);
    }
    for (const auto& p : step.spmd_programs()) r.measured_bytes += p->last_comm_stats().at(0).all_to_all_bytes;
    r.tree = params;
    return r;
  };
  const StepRun cpu = run("cpu"), gpu = run("cuda");
  for (size_t s = 0; s < cpu.losses.size(); ++s)
    EXPECT_NEAR(gpu.losses[s], cpu.losses[s], 1e-4 * std::abs(cpu.losses[s])) << "step " << s;
  const std::vector<Array> g = gpu.tree.leaves(), want = cpu.tree.leaves();
  const std::vector<std::string> paths = cpu.tree.paths();
  for (size_t i = 0; i < g.size(); ++i) testing::expect_close(g[i], want[i], 1e-3, paths[i]);
  EXPECT_GT(gpu.measured_bytes, 0) << "no routed rows moved between the GPU devices";
}

// A sharded jit call on the GPU: x @ x.T over data=2, model=4 (an all-gather and a
// reduce-scatter on the devices) equals the CPU's sharded run, keeps the output's
// sharding and leaves its shards on the devices.
TEST(GpuSpmd, ShardedJitCallRunsOnTheDevices) {
  TESSERA_REQUIRE_GPU_DEVICES(kDevices);
  testing::VirtualDevices threads(kDevices);
  const spmd::Mesh mesh = spmd::Mesh::parse("data=2,model=4");
  const Array x = testing::random_array({32, 64}, 2);
  auto options = [&](const std::string& device) {
    JitOptions o;
    o.out_shardings = {spmd::Sharding::from_spec(mesh, spmd::P("data", "model"), 2)};
    o.device = device;
    return o;
  };
  auto on = [&](const std::string& device) {
    return jit([](const Array& m) { return matmul(m, m.T()); },
               options(device))(spmd::device_put(x, spmd::NamedSharding(mesh, spmd::P("data", "model"))));
  };
  const Array gpu = on("cuda"), cpu = on("cpu");
  ASSERT_NE(spmd::sharding_of(gpu), nullptr);
  EXPECT_EQ(spmd::sharding_of(gpu)->to_string(), "P('data', 'model')");
  for (const Array& shard : spmd::addressable_shards(gpu)) EXPECT_TRUE(backend::on_device(shard));
  testing::expect_close(gpu, cpu, 1e-5, "x @ x.T on 8 virtual GPU devices");
}

// A mesh larger than the CUDA devices present is refused with the way out.
TEST(GpuSpmd, AMeshLargerThanTheDevicesIsAClearError) {
  TESSERA_REQUIRE_GPU();
  const int present = cuda::device_count();
  testing::VirtualDevices threads(present + 1);
  const spmd::Mesh mesh = spmd::Mesh::parse(fmt::format("data={}", present + 1));
  JitOptions o;
  o.device = "cuda";
  const Array x = testing::random_array({4 * (present + 1), 4}, 3);
  try {
    jit([](const Array& m) { return m * 2.0; }, o)(spmd::device_put(x, spmd::NamedSharding(mesh, spmd::P("data"))));
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("TESSERA_GPU_VIRTUAL_DEVICES"), std::string::npos) << e.what();
  }
}

// A TESSERA_GPU_VIRTUAL_DEVICES that is not a count makes the GPUs unavailable with the
// reason, GPU or not: ctest runs this as cuda.virtual_devices_bad_value with the variable
// set to "eight" (cmake/gpu_tests.cmake); without it the test skips.
TEST(GpuVirtualDevices, ABadCountIsTheReasonNoGpuIsUsed) {
  const char* value = std::getenv("TESSERA_GPU_VIRTUAL_DEVICES");
  if (value == nullptr || std::string(value) != "eight")
    GTEST_SKIP() << "runs as ctest's cuda.virtual_devices_bad_value (TESSERA_GPU_VIRTUAL_DEVICES=eight)";
  EXPECT_FALSE(cuda::available());
  EXPECT_EQ(cuda::unavailable_reason(),
            "TESSERA_GPU_VIRTUAL_DEVICES=eight is not a device count (expected an integer 1..64)");
}

}  // namespace
}  // namespace tessera
