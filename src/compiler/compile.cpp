#include "tessera/compiler/compile.h"

#include <chrono>
#include <cstdlib>
#include <string>

#include "tessera/base/flags.h"
#include "tessera/compiler/memory_plan.h"
#include "tessera/compiler/passes/attention_layout.h"
#include "tessera/compiler/passes/classifier_fusion.h"
#include "tessera/compiler/passes/constant_folding.h"
#include "tessera/compiler/passes/cse.h"
#include "tessera/compiler/passes/dce.h"
#include "tessera/compiler/passes/fusion.h"
#include "tessera/compiler/passes/gemm_epilogue.h"
#include "tessera/compiler/passes/layout.h"
#include "tessera/compiler/passes/offload.h"
#include "tessera/compiler/passes/remat.h"
#include "tessera/compiler/passes/schedule.h"
#include "tessera/compiler/passes/simplify.h"

namespace tessera::compiler {

Pipeline default_pipeline(const CompileOptions& options) {
  // Simplify first so folding and CSE see canonical forms; CSE before remat (its
  // clones must stay distinct); remat before fusion (clones fuse like any op);
  // scheduling on the kernels that will run; host offload after it (the scheduler
  // would move each offload next to its load).
  Pipeline p;
  p.add(std::make_shared<DeadCodeElimination>());
  if (options.simplify) p.add(std::make_shared<AlgebraicSimplification>());
  if (options.simplify) p.add(std::make_shared<LayoutSimplification>());
  if (options.fold_constants) p.add(std::make_shared<ConstantFolding>());
  if (options.simplify) p.add(std::make_shared<CommonSubexpressionElimination>());
  if (options.remat) p.add(std::make_shared<Rematerialization>());
  if (options.fuse && options.packed_attention) p.add(std::make_shared<AttentionLayoutPass>());  // clones fold too
  if (options.fuse) p.add(std::make_shared<ClassifierFusionPass>());
  if (options.fuse) p.add(std::make_shared<GemmEpiloguePass>());  // before fusion takes the epilogue ops
  if (options.fuse) p.add(std::make_shared<FusionPass>());
  if (options.schedule) p.add(std::make_shared<SchedulePass>());
  if (options.remat) p.add(std::make_shared<HostOffload>());
  // TESSERA_DISABLE_PASSES=fusion,cse drops passes by name (bisecting a miscompile,
  // like XLA's --xla_disable_hlo_passes).
  const char* disabled = flags::env("TESSERA_DISABLE_PASSES");
  if (disabled == nullptr || *disabled == 0) return p;
  std::string list = std::string(",") + disabled + ",";
  Pipeline kept;
  for (const PassPtr& pass : p.passes()) {
    if (list.find("," + pass->name() + ",") == std::string::npos) kept.add(pass);
  }
  return kept;
}

OptimizedProgram optimize(Graph graph, const CompileOptions& options, const std::vector<bool>& donated) {
  default_pipeline(options).run(graph);
  MemoryPlanOptions plan_options;
  plan_options.donated = donated;
  plan_options.donated.resize(graph.parameters.size(), false);
  MemoryPlan plan = plan_memory(graph, plan_options);
  return {std::move(graph), std::move(plan)};
}

std::unique_ptr<Executable> compile(Graph graph, const CompileOptions& options, const std::vector<bool>& donated) {
  auto start = std::chrono::steady_clock::now();
  std::vector<bool> all_donated = donated;
  all_donated.resize(graph.parameters.size(), false);
  OptimizedProgram program = optimize(std::move(graph), options, all_donated);
  auto exe = std::make_unique<Executable>(std::move(program.graph), std::move(program.plan), std::move(all_donated));
  exe->mutable_stats().compile_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return exe;
}

}  // namespace tessera::compiler
