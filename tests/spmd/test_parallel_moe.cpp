// A mixture-of-experts model (nn/moe.h, the llama family with moe_experts) trained on a
// mesh: data, FSDP, tensor and expert axes, and expert with tensor or FSDP (the experts' weights split over `expert`,
// the batch too) give the one-device losses and parameters after 3 AdamW steps
// (relative < 1e-5), dropless (routing groups left automatic: one per batch device) and
// with a capacity factor (2 groups everywhere, so each group's slots are the same). With
// an expert axis the dispatch and combine are all-to-alls (the dispatched buffer is
// constrained to the experts' devices, nn/logical_sharding.h): of the capacity buffers
// with a capacity factor, of the routed rows only (ragged) when dropless.
#include <gtest/gtest.h>

#include <cstdio>
#include <optional>
#include <string>

#include "spmd/parallel_train_util.h"
#include "spmd/spmd_test_util.h"
#include "tessera/models/model.h"
#include "tessera/optim/optimizer.h"
#include "tessera/spmd/api.h"
#include "tessera/spmd/ragged_all_to_all.h"
#include "tessera/train/parallel.h"
#include "tessera/train/train_step.h"

namespace tessera::train {
namespace {

using testing::expect_close;
using testing::VirtualDevices;

constexpr int64_t kBatch = 8, kSeq = 16, kSteps = 3;

models::ModelConfig mixtral(double capacity_factor) {
  models::ModelConfig c = models::preset("mixtral-tiny");
  c.vocab = 64;
  c.dim = 32;
  c.heads = 4;
  c.kv_heads = 2;
  c.mlp_dim = 48;
  c.context = kSeq;
  c.moe_capacity_factor = capacity_factor;
  c.moe_groups = capacity_factor > 0 ? 2 : 0;
  return c;
}

struct MoeRun {
  std::vector<double> losses;
  Tree params;
  int64_t all_to_all_calls = 0;
  double all_to_all_bytes = 0;
  // Ragged all-to-alls (dropless expert parallelism) in the programs, their planned
  // bytes per device, and the all-to-all bytes device 0 really sent in the last step.
  int64_t ragged_calls = 0;
  double ragged_planned_bytes = 0, last_step_all_to_all_bytes = 0;
  std::vector<std::string> summary_lines;  // the partitioners' inserted collectives
};

MoeRun train(const models::ModelConfig& c, const std::string& mesh_text) {
  const models::Model model(c);
  const optim::Optimizer optimizer(testing::test_adamw(), model.specs());
  Tree params = model.init(3), opt = optimizer.init(params);
  const std::optional<Layout> layout = testing::place_on_mesh(mesh_text, model, params, opt);
  TrainStep step(model, optimizer, 1, layout ? &*layout : nullptr);
  MoeRun run;
  for (int64_t s = 0; s < kSteps; ++s) {
    data::Batch b = testing::random_batch(kBatch, kSeq, c.vocab, static_cast<uint64_t>(10 + s));
    run.losses.push_back(step.run(params, opt, {layout ? layout->shard_batch(b) : b}, 1e-2, std::nullopt).loss);
  }
  run.params = layout ? Layout::gather(params) : params;
  for (const auto& program : step.spmd_programs()) {
    run.all_to_all_calls += program->program().summary.per_device.all_to_all_calls;
    run.all_to_all_bytes += program->program().summary.per_device.all_to_all_bytes;
    const std::vector<std::string>& lines = program->program().summary.lines;
    run.summary_lines.insert(run.summary_lines.end(), lines.begin(), lines.end());
    const compiler::Graph& local = program->program().local;
    for (const compiler::Node& n : local.nodes)
      if (const auto* r = dynamic_cast<const spmd::RaggedAllToAll*>(n.primitive.get()); r && !n.dead) {
        ++run.ragged_calls;
        run.ragged_planned_bytes +=
            r->planned_bytes(static_cast<double>(local.type(r->combine() ? n.outputs[0] : n.inputs[0]).nbytes()));
      }
    if (!program->last_comm_stats().empty())
      run.last_step_all_to_all_bytes += program->last_comm_stats().front().all_to_all_bytes;
  }
  return run;
}

TEST(ParallelMoE, EveryLayoutTrainsAsOneDevice) {
  for (double factor : {0.0, 1.0}) {
    const models::ModelConfig c = mixtral(factor);
    const MoeRun want = train(c, "");
    for (const char* mesh : {"data=2", "fsdp=2", "tensor=2", "expert=2", "expert=2,tensor=2", "expert=2,fsdp=2"}) {
      const std::string what = std::string(mesh) + " capacity factor " + std::to_string(factor);
      VirtualDevices devices(spmd::Mesh::parse(mesh).size());
      const MoeRun got = train(c, mesh);
      for (int64_t s = 0; s < kSteps; ++s)
        EXPECT_NEAR(got.losses[s], want.losses[s], 1e-5 * want.losses[s]) << what << " step " << s;
      const std::vector<Array> g = got.params.leaves(), w = want.params.leaves();
      const std::vector<std::string> paths = want.params.paths();
      for (size_t i = 0; i < g.size(); ++i) expect_close(g[i], w[i], 1e-5, what + " " + paths[i]);
      // Expert parallelism: 2 layers x (dispatch + combine) forward and their transposes
      // backward are all-to-alls. (Other layouts may use some too where the partitioner
      // finds them cheaper, e.g. FSDP-split expert weights meeting group-split tokens.)
      std::printf("%-36s all_to_all calls per step %lld\n", what.c_str(), static_cast<long long>(got.all_to_all_calls));
      // One routing group per batch device (the capacity runs: 2 groups everywhere).
      const spmd::Mesh m = spmd::Mesh::parse(mesh);
      const int64_t batch_devices = m.size() / (m.has_axis("tensor") ? m.axis_size("tensor") : 1);
      const int64_t group_tokens = kBatch * kSeq / (factor > 0 ? 2 : batch_devices);
      if (std::string(mesh).starts_with("expert") && factor > 0 && !m.has_axis("fsdp")) {
        // Each all-to-all moves a device's group buffer [experts, capacity, dim] float32,
        // (n-1)/n of it to the other device: 8 of them per step. (With fsdp=2 too, the 2
        // groups split over fsdp alone: the expert devices each slice their experts' slots.)
        const int64_t capacity =
            (group_tokens * c.moe_top_k * static_cast<int64_t>(factor) + c.moe_experts - 1) / c.moe_experts;
        const double buffer = static_cast<double>(c.moe_experts * capacity * c.dim) * 4;
        EXPECT_EQ(got.all_to_all_calls, 4 * c.layers) << what;
        EXPECT_DOUBLE_EQ(got.all_to_all_bytes, 4.0 * static_cast<double>(c.layers) * buffer / 2) << what;
        EXPECT_EQ(got.ragged_calls, 0) << what;
      } else if (std::string(mesh).starts_with("expert") && factor == 0) {
        // Dropless: the dispatch and combine forward and their transposes backward are
        // ragged all-to-alls of the routed rows, planned at half of a group's
        // group_tokens * top_k rows (the rows for the other device's experts when the
        // router is balanced); the padded buffers would be experts / top_k times that.
        const double rows = static_cast<double>(group_tokens * c.moe_top_k);
        EXPECT_EQ(got.ragged_calls, 4 * c.layers) << what;
        EXPECT_DOUBLE_EQ(got.ragged_planned_bytes, 4.0 * static_cast<double>(c.layers) * rows * c.dim * 4 / 2) << what;
        // What moved: some rows, never more than all of them (the exact counts are checked
        // in test_ragged_all_to_all.cpp).
        std::printf("%-36s all_to_all bytes sent by device 0 in the last step %.0f (planned %.0f)\n", what.c_str(),
                    got.last_step_all_to_all_bytes, got.ragged_planned_bytes);
        EXPECT_GT(got.last_step_all_to_all_bytes, 0) << what;
        // A tensor-parallel partial sum of the experts' output passes through the combine
        // (linear): reduced after it, never on the padded [1, S x groups, rows, dim] buffers.
        for (const std::string& line : got.summary_lines)
          EXPECT_EQ(line.find("of expert_combine"), std::string::npos) << what << ": " << line;
        EXPECT_LE(got.last_step_all_to_all_bytes, 4.0 * static_cast<double>(c.layers) * rows * c.dim * 4 + 1024)
            << what;
      } else {
        EXPECT_EQ(got.ragged_calls, 0) << what;
      }
    }
  }
  // The experts' weights are split over the expert axis.
  const models::Model model(mixtral(0));
  const Layout layout(spmd::Mesh::parse("expert=2"), default_axis_rules(), model.specs());
  EXPECT_EQ(layout.param("layers.0.moe.gate.w").to_string(), "P('expert')");
}

}  // namespace
}  // namespace tessera::train
