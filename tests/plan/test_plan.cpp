// The planner (tessera plan): the systolic-array model against hand-worked values, the
// alpha-beta collectives, the run and goodput arithmetic, and the step model read from
// the real traced programs (memory by sharding, FLOPs, monotone scaling).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "tessera/base/allocator.h"
#include "tessera/base/error.h"
#include "tessera/models/model.h"
#include "tessera/plan/planner.h"
#include "tessera/plan/run_model.h"
#include "tessera/plan/step_model.h"
#include "tessera/plan/systolic.h"
#include "tessera/train/config.h"
#include "tessera/train/pipeline.h"
#include "train/pipeline_config.h"

namespace tessera::plan {
namespace {

// An H100-like entry written out here, so the arithmetic below does not move when the
// catalog's figures are revised.
goodput::AcceleratorSpec test_gpu() {
  goodput::AcceleratorSpec a;
  a.key = "testgpu";
  a.name = "test GPU";
  a.kind = "gpu";
  a.peak_flops = 1000e12;
  a.peak_int8 = 2000e12;
  a.memory = 80e9;
  a.memory_bandwidth = 3e12;
  a.matrix_tile = {128, 128, 64};
  a.matrix_units = 132;
  a.gemm_efficiency = 0.8;
  a.attention_efficiency = {0.56, 0.56};  // 0.7 of the GEMM's, forward and backward
  a.memory_efficiency = 0.9;
  a.kernel_overhead = 4e-6;
  a.collective_overlap = 1;
  a.failure_rate = 2e-5;
  a.price = 3;
  a.links = {{"nvlink", 8, 400e9, 2e-6, "switch"}, {"infiniband", 0, 50e9, 10e-6, "network"}};
  return a;
}

train::TrainConfig tiny_config(const std::string& extra = "") {
  return train::parse_config("[model]\npreset = \"tiny\"\n[train]\nbatch = 8\nseq = 64\n" + extra, "test");
}

TEST(Systolic, AlignedGemmFillsEveryTileAndUnit) {
  const MatrixUnitUse use = matrix_unit_use(1, 1024, 1024, 1024, {128, 128, 64}, 64);
  EXPECT_EQ(use.tiles, 64);
  EXPECT_EQ(use.waves, 1);
  EXPECT_DOUBLE_EQ(use.utilization(), 1.0);
}

TEST(Systolic, MisalignedDimensionsPayForTheirPadding) {
  // 130 rows on 128-row tiles: 256 rows computed, 130 useful.
  const MatrixUnitUse a = matrix_unit_use(1, 130, 128, 128, {128, 128, 128}, 1);
  EXPECT_DOUBLE_EQ(a.tile_utilization, 130.0 / 256.0);
  EXPECT_EQ(a.tiles, 2);
  EXPECT_DOUBLE_EQ(a.wave_utilization, 1.0);
  // A 256x256 MXU (v6e) on a reduction of 64: a quarter of the array works.
  const MatrixUnitUse b = matrix_unit_use(1, 4096, 4096, 64, {8, 256, 256}, 2);
  EXPECT_DOUBLE_EQ(b.tile_utilization, 0.25);
  // The same GEMM on 128x128 MXUs wastes half.
  EXPECT_DOUBLE_EQ(matrix_unit_use(1, 4096, 4096, 64, {8, 128, 128}, 4).tile_utilization, 0.5);
}

TEST(Systolic, TheLastWaveLeavesUnitsIdle) {
  // GPT-2's [16384 x 768] x [768 x 768] on 132 SMs with 128x128 tiles: 768 tiles in 6
  // waves of 132 (792 slots).
  const MatrixUnitUse use = matrix_unit_use(1, 16384, 768, 768, {128, 128, 64}, 132);
  EXPECT_EQ(use.tiles, 768);
  EXPECT_EQ(use.waves, 6);
  EXPECT_DOUBLE_EQ(use.wave_utilization, 768.0 / 792.0);
  EXPECT_DOUBLE_EQ(use.tile_utilization, 1.0);
}

TEST(Systolic, FewOutputTilesSplitTheReduction) {
  // One 128x128 output tile with K = 4096 (64 K-tiles): split 16 ways (4 K-tiles each).
  const MatrixUnitUse use = matrix_unit_use(1, 128, 128, 4096, {128, 128, 64}, 132);
  EXPECT_EQ(use.split_k, 16);
  EXPECT_EQ(use.tiles, 16);
  EXPECT_EQ(use.waves, 1);
  EXPECT_DOUBLE_EQ(use.wave_utilization, 16.0 / 132.0);
}

TEST(Systolic, RefusesNonPositiveShapes) {
  EXPECT_THROW(matrix_unit_use(1, 0, 8, 8, {8, 8, 8}, 1), ValueError);
  EXPECT_THROW(matrix_unit_use(1, 8, 8, 8, {8, 0, 8}, 1), ValueError);
  EXPECT_THROW(matrix_unit_use(1, 8, 8, 8, {8, 8, 8}, 0), ValueError);
}

TEST(Collectives, RingAndHierarchicalTimesMatchTheAlphaBetaModel) {
  const goodput::AcceleratorSpec gpu = test_gpu();
  // 8 GPUs in one NVLink domain: a ring all-reduce moves 2 (n-1)/n of the buffer; the
  // switch's tree latency is 2 log2(8) steps.
  const double inner = 2 * 7.0 / 8 * 1e9 / 400e9 + 2 * 3 * 2e-6;
  EXPECT_NEAR(collective_seconds("all_reduce", 1e9, 8, 1, gpu), inner, 1e-12);
  // 16 GPUs: the NVLink part, then 2 domains over InfiniBand on an eighth of the buffer.
  const double outer = 2 * 1.0 / 2 * (1e9 / 8) / 50e9 + 2 * 1 * 10e-6;
  EXPECT_NEAR(collective_seconds("all_reduce", 1e9, 16, 1, gpu), inner + outer, 1e-12);
  // A data axis outside tensor=8: its 4 members are in 4 different NVLink domains.
  EXPECT_NEAR(collective_seconds("all_reduce", 1e9, 4, 8, gpu), 2 * 3.0 / 4 * 1e9 / 50e9 + 2 * 2 * 10e-6, 1e-12);
  // All-gathers move (n-1)/n of the gathered buffer once.
  EXPECT_NEAR(collective_seconds("all_gather", 1e9, 8, 1, gpu), 7.0 / 8 * 1e9 / 400e9 + 3 * 2e-6, 1e-12);
  EXPECT_EQ(collective_seconds("all_reduce", 1e9, 1, 1, gpu), 0.0);
  EXPECT_THROW(collective_seconds("broadcast", 1e9, 8, 1, gpu), ValueError);
}

TEST(RunModel, WithoutFailuresTimeIsStepsTimesStepAndCostIsChipHours) {
  goodput::AcceleratorSpec gpu = test_gpu();
  gpu.failure_rate = 0;
  StepEstimate step;
  step.layout = {.data = 8};
  step.global_batch = 64;
  step.seq = 1000;
  step.step_seconds = 0.5;
  const RunEstimate run = estimate_run(step, gpu, 64e6);  // 1000 steps
  EXPECT_DOUBLE_EQ(run.steps, 1000);
  EXPECT_DOUBLE_EQ(run.raw_seconds, 500);
  EXPECT_DOUBLE_EQ(run.goodput, 1);
  EXPECT_DOUBLE_EQ(run.dollars, 500.0 / 3600 * 8 * 3);
  EXPECT_THROW(estimate_run(step, gpu, 0), ConfigError);
}

TEST(RunModel, FailuresCostRestartsAndHalfAnIntervalEach) {
  const goodput::AcceleratorSpec gpu = test_gpu();  // 2e-5 failures per chip-hour
  StepEstimate step;
  step.layout = {.data = 1000};
  step.global_batch = 1000;
  step.seq = 1000;
  step.step_seconds = 1;
  RunCosts costs;
  costs.restart_seconds = 600;
  costs.save_seconds = 10;
  const RunEstimate run = estimate_run(step, gpu, 1e12);
  const double m = 3600 / (1000 * 2e-5);  // 180000 s between failures
  const double t = std::sqrt(2 * 10 * m);
  EXPECT_NEAR(run.mtbf_seconds, m, 1e-6);
  EXPECT_NEAR(run.checkpoint_interval_seconds, t, 1e-9);
  EXPECT_NEAR(run.goodput, 1 / (1 + 10 / t + (600 + t / 2) / m), 1e-12);
  EXPECT_NEAR(run.seconds, run.raw_seconds / run.goodput, 1e-6);
  EXPECT_GT(run.dollars, run.dollars_raw);
  // More chips fail more often: goodput falls.
  step.layout = {.data = 4000};
  EXPECT_LT(estimate_run(step, gpu, 1e12).goodput, run.goodput);
}

TEST(PlanLayoutTest, ParsesTheThreeAxesAndRefusesOthers) {
  const PlanLayout l = PlanLayout::parse("data=2,fsdp=4,tensor=8");
  EXPECT_EQ(l.data, 2);
  EXPECT_EQ(l.fsdp, 4);
  EXPECT_EQ(l.tensor, 8);
  EXPECT_EQ(l.chips(), 64);
  EXPECT_EQ(l.mesh(), "data=2,fsdp=4,tensor=8");
  EXPECT_EQ(PlanLayout{}.mesh(), "data=1");
  const PlanLayout piped = PlanLayout::parse("data=2,pipeline=4");
  EXPECT_EQ(piped.pipeline, 4);
  EXPECT_EQ(piped.chips(), 8);
  EXPECT_EQ(piped.mesh(), "pipeline=4,data=2");
  EXPECT_THROW(PlanLayout::parse("model=2"), ConfigError);
  EXPECT_THROW(PlanLayout::parse("data=two"), ConfigError);
  // A pipeline's micro-batch count follows the mesh as name() writes it.
  const PlanLayout counted = PlanLayout::parse("pipeline=2,data=2 m=8");
  EXPECT_EQ(counted.pipeline_micro_batches, 8);
  EXPECT_EQ(counted.mesh(), "pipeline=2,data=2");
  EXPECT_EQ(counted.name(), "pipeline=2,data=2 m=8");
  EXPECT_EQ(piped.name(), "pipeline=4,data=2");
  for (const char* bad : {"data=2 m=8", "pipeline=2 m=x", "pipeline=2 m=0", "pipeline=2 m=4x", "pipeline=2 n=4"}) {
    try {
      PlanLayout::parse(bad);
      ADD_FAILURE() << bad << " parsed";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
}

// A GPU's programs are compiled as jit compiles them for a CUDA device: attention reads
// q, k, v in place from the fused projection (no slices, transposes or concatenation
// around it); a TPU's keep the plain attention. Forward and backward attention take
// the catalog's two efficiencies.
TEST(StepModel, GpuProgramsUsePackedAttentionAndEachDirectionItsEfficiency) {
  const auto op = [](const StepEstimate& est, const std::string& name) -> const OpClassCost* {
    for (const OpClassCost& o : est.ops)
      if (o.op == name) return &o;
    return nullptr;
  };
  goodput::AcceleratorSpec gpu = test_gpu();
  goodput::AcceleratorSpec tpu = test_gpu();
  tpu.kind = "tpu";
  train::TrainConfig config = tiny_config();
  config.model.compute_dtype = "bfloat16";
  const StepEstimate on_gpu = estimate_step(config, PlanLayout{}, gpu);
  const StepEstimate on_tpu = estimate_step(config, PlanLayout{}, tpu);
  ASSERT_NE(op(on_gpu, "attention_packed"), nullptr);
  ASSERT_NE(op(on_gpu, "attention_packed_grad"), nullptr);
  EXPECT_EQ(op(on_gpu, "attention"), nullptr);
  EXPECT_EQ(op(on_gpu, "concatenate"), nullptr);
  ASSERT_NE(op(on_tpu, "attention"), nullptr);
  ASSERT_NE(op(on_tpu, "attention_grad"), nullptr);
  EXPECT_EQ(op(on_tpu, "attention_packed"), nullptr);
  EXPECT_LT(on_gpu.step_seconds, on_tpu.step_seconds);  // the layout copies are gone

  // Halving the backward efficiency slows only the backward kernels' compute time.
  goodput::AcceleratorSpec slow_backward = gpu;
  slow_backward.attention_efficiency[1] /= 2;
  const StepEstimate slower = estimate_step(config, PlanLayout{}, slow_backward);
  EXPECT_DOUBLE_EQ(op(slower, "attention_packed")->seconds, op(on_gpu, "attention_packed")->seconds);
  EXPECT_GT(op(slower, "attention_packed_grad")->seconds, op(on_gpu, "attention_packed_grad")->seconds);
}

TEST(StepModel, OneChipCountsTheModelsFlopsAndHoldsEveryParameter) {
  const train::TrainConfig config = tiny_config();
  const StepEstimate est = estimate_step(config, PlanLayout{}, test_gpu());
  const models::Model model(config.model);
  EXPECT_DOUBLE_EQ(est.model_flops, model.flops_per_token(64) * 8 * 64);
  // float32 master weights: 4 bytes per (padded) parameter; AdamW keeps two moments.
  const double params = 4.0 * static_cast<double>(nn::parameter_count(model.specs()));
  EXPECT_DOUBLE_EQ(est.memory.parameters, params);
  EXPECT_DOUBLE_EQ(est.memory.optimizer, 2 * params + 8);  // m, v and the int64 step
  EXPECT_GE(est.memory.peak, est.memory.parameters + est.memory.optimizer);
  EXPECT_GT(est.compute_seconds, 0);
  EXPECT_EQ(est.collective_seconds, 0);
  EXPECT_TRUE(est.fits);
  EXPECT_GT(est.mfu, 0);
  EXPECT_LT(est.mfu, 1);
  // The costed FLOPs are the program's: at least the model's 6N per token.
  double flops = 0;
  for (const OpClassCost& op : est.ops) flops += op.flops;
  EXPECT_GE(flops, est.model_flops * 0.95);
}

// A pipeline layout: its stage programs costed and the schedule replayed with them.
// The tiny model's 4 layers balance into 2 equal stages (the head's cost goes to the last
// layer, so not exactly); the idle share is near 1F1B's (p-1)/(m+p-1) and GPipe's is
// the same; more micro-batches idle less. A chip holds its stages' parameters and their
// optimizer state (stage-local; the tied embedding on both ends; its shards of them when
// the stages are partitioned), reported for the pipeline device that holds the most, plus
// its stages' arenas and the inputs it keeps in flight.
TEST(StepModel, APipelineReplaysItsScheduleWithTheCostedStages) {
  const goodput::AcceleratorSpec gpu = test_gpu();
  const StepEstimate one = estimate_step(tiny_config(), PlanLayout{}, gpu);
  auto piped = [&](const std::string& extra) {
    return estimate_step(tiny_config("[parallel]\n" + extra), PlanLayout{.pipeline = 2}, gpu);
  };
  const StepEstimate m4 = piped("pipeline_micro_batches = 4\n");
  const StepEstimate m8 = piped("pipeline_micro_batches = 8\n");
  const StepEstimate gpipe = piped("pipeline_micro_batches = 4\npipeline_schedule = \"gpipe\"\n");
  EXPECT_NEAR(m4.pipeline_bubble, 1.0 / 5.0, 0.08);
  EXPECT_NEAR(m8.pipeline_bubble, 1.0 / 9.0, 0.06);
  EXPECT_LT(m8.pipeline_bubble, m4.pipeline_bubble);
  EXPECT_NEAR(gpipe.pipeline_bubble, m4.pipeline_bubble, 1e-9);
  EXPECT_EQ(one.pipeline_bubble, -1);
  // Idle time is in the step: it exceeds the average device's busy time.
  EXPECT_GT(m4.step_seconds, m4.compute_seconds);
  train::TrainConfig piped_config = tiny_config("[parallel]\npipeline_micro_batches = 4\n");
  piped_config.parallel.mesh = "pipeline=2";
  const models::Model model(piped_config.model);
  const train::PipelineExecutor executor(model, train::pipeline_plan(piped_config)->options, piped_config.loop.seq);
  const Tree shapes = model.placeholders();
  double held_most = 0;
  for (int d = 0; d < 2; ++d) {
    const std::vector<bool> reads = train::device_reads(shapes, executor.stage_layers(), 2, d, true);
    const std::vector<Array> leaves = shapes.leaves();
    double held = 0;
    for (size_t i = 0; i < leaves.size(); ++i) held += reads[i] ? static_cast<double>(leaves[i].nbytes()) : 0;
    held_most = std::max(held_most, held);
  }
  EXPECT_DOUBLE_EQ(m4.memory.parameters, held_most);
  EXPECT_LT(m4.memory.parameters, 0.75 * one.memory.parameters) << "a chip holds about half the model";
  EXPECT_GT(m4.memory.parameters, 0.5 * one.memory.parameters) << "and the tied embedding twice";
  EXPECT_NEAR(m4.memory.optimizer / m4.memory.parameters, one.memory.optimizer / one.memory.parameters, 0.01)
      << "AdamW's two moments of the parameters it holds";
  // GPipe keeps all 4 micro-batches' stage inputs where 1F1B keeps at most 2.
  EXPECT_GT(gpipe.memory.activations, m4.memory.activations);
  EXPECT_NE(std::find(m4.programs.begin(), m4.programs.end(), "stage0_backward x4"), m4.programs.end());
  // Stages partitioned over a tensor axis: 4 chips, collectives inside the stages.
  const StepEstimate tp = estimate_step(tiny_config("[parallel]\npipeline_micro_batches = 4\n"),
                                        PlanLayout{.tensor = 2, .pipeline = 2}, gpu);
  EXPECT_GT(tp.collective_seconds, 0);
  EXPECT_EQ(tp.layout.chips(), 4);
  // Stages partitioned over FSDP: a chip keeps its shards of the state, about half of
  // what a chip of the unpartitioned pipeline holds; with Adafactor too (its update, which
  // reads whole matrices, runs as an SPMD program on the shards).
  const PlanLayout fsdp_stages{.fsdp = 2, .pipeline = 2};
  const StepEstimate fsdp = estimate_step(tiny_config("[parallel]\npipeline_micro_batches = 4\n"), fsdp_stages, gpu);
  EXPECT_LT(fsdp.memory.parameters, 0.6 * m4.memory.parameters);
  EXPECT_GT(fsdp.memory.parameters, 0.4 * m4.memory.parameters);
  EXPECT_LT(fsdp.memory.optimizer, 0.6 * m4.memory.optimizer);
  train::TrainConfig adafactor = tiny_config("[parallel]\npipeline_micro_batches = 4\n");
  adafactor.optimizer.name = "adafactor";
  EXPECT_DOUBLE_EQ(estimate_step(adafactor, fsdp_stages, gpu).memory.parameters, fsdp.memory.parameters);
  // A layout the pipeline cannot take is a ConfigError naming it.
  EXPECT_THROW(estimate_step(tiny_config("[parallel]\npipeline_micro_batches = 3\n"), PlanLayout{.pipeline = 2}, gpu),
               ConfigError);
}

TEST(StepModel, FsdpSplitsParametersAndOptimizerStateDataParallelDoesNot) {
  const train::TrainConfig config = tiny_config();
  const goodput::AcceleratorSpec gpu = test_gpu();
  const StepEstimate one = estimate_step(config, PlanLayout{}, gpu);
  const StepEstimate dp = estimate_step(config, PlanLayout{.data = 2}, gpu);
  const StepEstimate fsdp = estimate_step(config, PlanLayout{.fsdp = 2}, gpu);
  EXPECT_DOUBLE_EQ(dp.memory.parameters, one.memory.parameters);
  EXPECT_LT(fsdp.memory.parameters, 0.6 * one.memory.parameters);
  EXPECT_LT(fsdp.memory.optimizer, 0.6 * one.memory.optimizer);
  // Data parallel halves each device's batch: half the GEMM and attention FLOPs, plus
  // the gradient all-reduce (and its combined buffer's copies).
  auto matrix_flops = [](const StepEstimate& e) {
    double f = 0;
    for (const OpClassCost& op : e.ops)
      if (op.kind == "gemm" || op.kind == "attention") f += op.flops;
    return f;
  };
  EXPECT_NEAR(matrix_flops(dp) / matrix_flops(one), 0.5, 0.01);
  EXPECT_GT(dp.collective_seconds, 0);
  EXPECT_GT(fsdp.collective_seconds, 0);
  bool all_reduce = false;
  for (const OpClassCost& op : dp.ops) all_reduce = all_reduce || (op.op == "all_reduce" && op.kind == "collective");
  EXPECT_TRUE(all_reduce);
}

// collective_overlap: the share of the batch-axis collectives hidden under compute.
// All hidden (1) exposes none of a data-parallel step's all-reduce here (it is shorter
// than the compute); none hidden (0) exposes all of it; a half exposes half.
TEST(StepModel, CollectiveOverlapHidesThatShareOfTheBatchAxisCollectives) {
  const train::TrainConfig config = tiny_config();
  goodput::AcceleratorSpec gpu = test_gpu();
  const PreparedStep prepared = prepare_step(config, PlanLayout{.data = 2});
  gpu.collective_overlap = 1;
  const StepEstimate hidden = cost_step(prepared, gpu);
  gpu.collective_overlap = 0;
  const StepEstimate exposed = cost_step(prepared, gpu);
  gpu.collective_overlap = 0.5;
  const StepEstimate half = cost_step(prepared, gpu);
  ASSERT_GT(hidden.collective_seconds, 0);
  ASSERT_LT(hidden.collective_seconds, hidden.compute_seconds);
  EXPECT_DOUBLE_EQ(hidden.exposed_collective_seconds, 0);
  EXPECT_DOUBLE_EQ(exposed.exposed_collective_seconds, exposed.collective_seconds);
  EXPECT_NEAR(half.exposed_collective_seconds, 0.5 * half.collective_seconds, 1e-12);
  EXPECT_DOUBLE_EQ(exposed.step_seconds, exposed.compute_seconds + exposed.collective_seconds);
  EXPECT_DOUBLE_EQ(hidden.compute_seconds, exposed.compute_seconds);
}

// A CPU device holds each tensor and arena as a block of the host allocator, rounded
// up to its size class (base/allocator.h); a GPU's blocks are counted as they are.
TEST(StepModel, ACpuDeviceCountsEachBlockAtTheHostAllocatorsCapacity) {
  const PreparedStep prepared = prepare_step(tiny_config(), PlanLayout{});
  goodput::AcceleratorSpec device = test_gpu();
  const StepEstimate gpu = cost_step(prepared, device);
  device.kind = "cpu";
  const StepEstimate cpu = cost_step(prepared, device);
  EXPECT_DOUBLE_EQ(gpu.memory.peak, prepared.memory.peak);
  EXPECT_DOUBLE_EQ(cpu.memory.peak, prepared.host_memory.peak);
  // The step's one program: its arena is one block.
  ASSERT_EQ(prepared.programs.size(), 1u);
  EXPECT_DOUBLE_EQ(cpu.memory.activations,
                   static_cast<double>(buffer_capacity(static_cast<size_t>(gpu.memory.activations))));
  EXPECT_DOUBLE_EQ(cpu.memory.eval, static_cast<double>(buffer_capacity(static_cast<size_t>(gpu.memory.eval))));
  // Each parameter is its own block: at least the exact bytes, at most 12.5% more.
  EXPECT_GE(cpu.memory.parameters, gpu.memory.parameters);
  EXPECT_LE(cpu.memory.parameters, 1.125 * gpu.memory.parameters);
  EXPECT_GT(cpu.memory.peak, gpu.memory.peak);
  EXPECT_DOUBLE_EQ(cpu.memory.peak, cpu.memory.parameters + cpu.memory.optimizer + cpu.memory.gradients +
                                        cpu.memory.activations + cpu.memory.eval);
}

TEST(StepModel, RematTradesActivationsForFlops) {
  const goodput::AcceleratorSpec gpu = test_gpu();
  const StepEstimate keep = estimate_step(tiny_config(), PlanLayout{}, gpu);
  train::TrainConfig remat = tiny_config();
  remat.model.remat = "full";
  const StepEstimate recompute = estimate_step(remat, PlanLayout{}, gpu);
  EXPECT_LT(recompute.memory.activations, keep.memory.activations);
  double keep_flops = 0, recompute_flops = 0;
  for (const OpClassCost& op : keep.ops) keep_flops += op.flops;
  for (const OpClassCost& op : recompute.ops) recompute_flops += op.flops;
  EXPECT_GT(recompute_flops, keep_flops);
}

TEST(StepModel, AModelFarLargerThanThisMachinePlansWithoutAllocatingIt) {
  // Llama 2 7B with AdamW: 27 GB of parameters and 54 GB of moments if they were real.
  train::TrainConfig config =
      train::parse_config("[model]\npreset = \"llama2-7b\"\n[train]\nbatch = 8\nseq = 256\n", "test");
  config.model.compute_dtype = "bfloat16";
  reset_peak_bytes_in_use();
  const int64_t before = allocator_stats().bytes_in_use;
  const StepEstimate est = estimate_step(config, PlanLayout{.fsdp = 8}, test_gpu());
  EXPECT_LT(allocator_stats().peak_bytes_in_use - before, int64_t{1} << 30);
  EXPECT_NEAR(est.memory.parameters, 4.0 * 6738415616 / 8, 4.0 * 6738415616 / 8 * 0.01);
  EXPECT_TRUE(est.fits);
}

TEST(StepModel, ALayoutThatDoesNotSplitTheBatchIsAClearError) {
  try {
    estimate_step(tiny_config(), PlanLayout{.data = 3}, test_gpu());
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("does not split over 3"), std::string::npos) << e.what();
  }
}

TEST(Planner, MoreChipsNeverGrowTheSmallestFootprintAndEveryCountHasALayout) {
  Planner planner(tiny_config());
  const goodput::AcceleratorSpec gpu = test_gpu();
  double previous_memory = 1e30;
  for (int64_t chips : {1, 2, 4, 8}) {
    const PlanRow row = planner.best(gpu, chips, 1e9, {});
    ASSERT_TRUE(row.found) << row.reason;
    EXPECT_TRUE(row.step.fits);
    // FSDP over all the chips is always a candidate, so the smallest footprint shrinks.
    double smallest = 1e30;
    for (const PlanLayout& l : planner.candidate_layouts(chips, 8))
      smallest = std::min(smallest, planner.prepared(l, gpu).memory.peak);
    EXPECT_LE(smallest, previous_memory * 1.0001);
    previous_memory = smallest;
  }
}

// A mixture of experts' layouts include expert axes that divide its experts (a batch
// axis too, so data x fsdp x expert divides the micro-batch); a dense model's none.
TEST(Planner, TheSearchTriesExpertAxesForAMixtureOfExperts) {
  train::TrainConfig moe =
      train::parse_config("[model]\npreset = \"mixtral-tiny\"\ncontext = 64\n[train]\nbatch = 8\nseq = 64\n", "test");
  const std::vector<PlanLayout> layouts = Planner(moe).candidate_layouts(8, 8);
  bool expert_2 = false, expert_4 = false;
  for (const PlanLayout& l : layouts) {
    EXPECT_EQ(l.chips(), 8) << l.mesh();
    EXPECT_EQ(moe.model.moe_experts % l.expert, 0) << l.mesh();
    EXPECT_EQ(8 % (l.data * l.fsdp * l.expert), 0) << l.mesh();
    expert_2 = expert_2 || l.expert == 2;
    expert_4 = expert_4 || l.expert == 4;
  }
  EXPECT_TRUE(expert_2 && expert_4);
  for (const PlanLayout& l : Planner(tiny_config()).candidate_layouts(8, 8)) EXPECT_EQ(l.expert, 1) << l.mesh();
}

// The search tries pipeline layouts: pipeline=P outermost, each stage with the widest
// tensor axis and FSDP or replicas. Over a slow link between NVLink domains the layouts
// without a pipeline all-reduce or all-gather across it every step, and a pipeline whose
// stages each fill a domain hands only its stage inputs over it: the search picks it.
// Over a fast link the bubble costs more than the link saves.
TEST(Planner, TheSearchTriesPipelinesAndPicksOneOverASlowLink) {
  const train::TrainConfig config = tiny_config();
  Planner planner(config);
  const std::vector<PlanLayout> pipelines = planner.pipeline_layouts(16, 8);
  ASSERT_FALSE(pipelines.empty());
  for (const PlanLayout& l : pipelines) {
    EXPECT_EQ(l.chips(), 16) << l.mesh();
    EXPECT_TRUE(l.pipeline == 2 || l.pipeline == 4) << l.mesh();  // tiny has 4 layers
    EXPECT_FALSE(l.data > 1 && l.fsdp > 1) << l.mesh();
  }
  // tiny's 4 heads allow tensor=4: each stage's other 2 chips are FSDP or replicas.
  std::string meshes;
  for (const PlanLayout& l : pipelines) meshes += l.mesh() + " ";
  EXPECT_NE(meshes.find("pipeline=2,fsdp=2,tensor=4"), std::string::npos) << meshes;
  EXPECT_NE(meshes.find("pipeline=2,data=2,tensor=4"), std::string::npos) << meshes;
  goodput::AcceleratorSpec slow = test_gpu();
  slow.links[1].bandwidth = 0.05e9;  // 50 MB/s between domains
  const PlanRow row = planner.best(slow, 16, 1e9, {});
  ASSERT_TRUE(row.found) << row.reason;
  std::string ranked;
  for (const auto& [mesh, seconds] : row.ranked) ranked += fmt::format("{} {:.2f} ms; ", mesh, seconds * 1e3);
  std::printf("50 MB/s between domains: %s\n", ranked.c_str());
  EXPECT_EQ(row.step.layout.pipeline > 1 ? "pipeline" : row.step.layout.mesh(), "pipeline") << ranked;
  EXPECT_GT(row.step.pipeline_bubble, 0) << ranked;
  Planner fast_planner(config);
  const PlanRow fast = fast_planner.best(test_gpu(), 16, 1e9, {});
  ASSERT_TRUE(fast.found) << fast.reason;
  std::string fast_ranked;
  for (const auto& [mesh, seconds] : fast.ranked) fast_ranked += fmt::format("{} {:.2f} ms; ", mesh, seconds * 1e3);
  std::printf("50 GB/s between domains: %s\n", fast_ranked.c_str());
  EXPECT_EQ(fast.step.layout.pipeline, 1) << fast_ranked;
}

// The search tries several micro-batch counts per pipeline: the one `tessera train`
// takes, then 1, 2 and 4 times the stages. Where each micro-batch's GEMMs stay large
// (tiny widened to 4096, 8 to 32 sequences of 1024 tokens per micro-batch), more
// micro-batches shrink the bubble ((p-1)/(m+p-1)) and the step; the prediction must
// follow. (On tiny itself the kernels' fixed costs dominate and fewer micro-batches win.)
TEST(Planner, TheSearchTriesMicroBatchCountsPerPipeline) {
  // tiny 4096 wide, `rows` sequences of 1024 tokens a step, and `extra` TOML.
  const auto large = [](int rows, const std::string& extra = "") {
    return train::parse_config(
        fmt::format("[model]\npreset = \"tiny\"\ndim = 4096\nheads = 32\ncontext = 1024\n[train]\nbatch = {}\n"
                    "seq = 1024\n{}",
                    rows, extra),
        "test");
  };
  const train::TrainConfig config = large(64);
  Planner planner(config);
  PlanLayout two;
  two.pipeline = 2;
  EXPECT_EQ(planner.pipeline_micro_batch_counts(two), (std::vector<int64_t>{4, 2, 8}));  // auto: 2 x stages
  // Interleaved, 2 virtual stages each: multiples of 4 stages; auto takes 8.
  EXPECT_EQ(Planner(large(64, "[parallel]\npipeline_schedule = \"interleaved\"\n")).pipeline_micro_batch_counts(two),
            (std::vector<int64_t>{8, 4, 16}));
  // A count the config sets is the only one; one that does not split the batch, none.
  EXPECT_EQ(Planner(large(64, "[parallel]\npipeline_micro_batches = 16\n")).pipeline_micro_batch_counts(two),
            (std::vector<int64_t>{16}));
  EXPECT_TRUE(Planner(large(64, "[parallel]\npipeline_micro_batches = 3\n")).pipeline_micro_batch_counts(two).empty());
  // A batch of 6 rows: auto takes 3 (the most up to 4 that divides 6); of 2, 4 and 8
  // only 2 divides it.
  EXPECT_EQ(Planner(large(6)).pipeline_micro_batch_counts(two), (std::vector<int64_t>{3, 2}));

  const PlanRow row = planner.best(test_gpu(), 2, 1e9, {});
  ASSERT_TRUE(row.found) << row.reason;
  std::map<int64_t, double> by_count;
  std::string ranked;
  for (const auto& [name, seconds] : row.ranked) {
    ranked += fmt::format("{} {:.2f} ms; ", name, seconds * 1e3);
    const PlanLayout l = PlanLayout::parse(name);
    if (l.pipeline == 2) by_count[l.pipeline_micro_batches] = seconds;
  }
  std::printf("2 chips, batch 64 x 1024: %s\n", ranked.c_str());
  ASSERT_EQ(by_count.size(), 3u) << ranked;
  EXPECT_LT(by_count.at(8), by_count.at(4)) << ranked;
  EXPECT_LT(by_count.at(4), by_count.at(2)) << ranked;
  // Each count as the mesh path costs it alone, with the schedule's analytic bubble.
  for (const int64_t m : {2, 4, 8}) {
    Planner alone(config);
    const PlanRow one =
        alone.best(test_gpu(), 2, 1e9, {}, nullptr, PlanLayout::parse(fmt::format("pipeline=2 m={}", m)));
    ASSERT_TRUE(one.found) << one.reason;
    EXPECT_EQ(one.step.layout.pipeline_micro_batches, m);
    EXPECT_DOUBLE_EQ(one.step.step_seconds, by_count.at(m));
    EXPECT_NEAR(one.step.pipeline_bubble, 1.0 / static_cast<double>(m + 1), 0.05) << m;
  }
  // Without a count the mesh path takes the config's (auto: 4) and says so.
  Planner auto_count(config);
  const PlanRow resolved = auto_count.best(test_gpu(), 2, 1e9, {}, nullptr, PlanLayout::parse("pipeline=2"));
  ASSERT_TRUE(resolved.found) << resolved.reason;
  EXPECT_EQ(resolved.step.layout.name(), "pipeline=2 m=4");
}

TEST(Planner, MemoryAdviceNamesTheOverflowingClass) {
  StepEstimate step;
  step.memory = {.parameters = 10e9, .optimizer = 60e9, .gradients = 10e9, .activations = 20e9, .peak = 100e9};
  step.memory_capacity = 80e9;
  const std::string advice = fit_advice(step);
  EXPECT_NE(advice.find("optimizer state (60.0 GB)"), std::string::npos) << advice;
  EXPECT_NE(advice.find("20.0 GB over"), std::string::npos) << advice;
  step.memory_capacity = 200e9;
  EXPECT_EQ(fit_advice(step), "");
  // Activations: the advice offers only the remat policies that keep less than the one
  // in use; the validation program's arena is a class of its own.
  step.memory = {.parameters = 1e9, .optimizer = 2e9, .activations = 90e9, .eval = 7e9, .peak = 100e9};
  step.memory_capacity = 80e9;
  EXPECT_NE(fit_advice(step).find("remat = \"full\" or \"offload\""), std::string::npos) << fit_advice(step);
  step.remat = "full";
  EXPECT_EQ(fit_advice(step).find("remat = \"full\""), std::string::npos) << fit_advice(step);
  EXPECT_NE(fit_advice(step).find("remat = \"offload\""), std::string::npos) << fit_advice(step);
  EXPECT_NE(fit_advice(step).find("next the validation program's arena (7.0 GB)"), std::string::npos)
      << fit_advice(step);
  step.remat = "offload";
  EXPECT_EQ(fit_advice(step).find("remat ="), std::string::npos) << fit_advice(step);
}

}  // namespace
}  // namespace tessera::plan
