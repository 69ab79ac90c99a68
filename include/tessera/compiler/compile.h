// Graph -> Executable: run the pass pipeline, plan memory, build the kernel list.
#pragma once

#include <memory>
#include <vector>

#include "tessera/compiler/executable.h"
#include "tessera/compiler/graph.h"
#include "tessera/compiler/pass.h"

namespace tessera::compiler {

// `graph` is optimized in place (the caller keeps the traced copy if it wants it).
// donated[p]: parameter p's buffer may be reused for an output.
std::unique_ptr<Executable> compile(Graph graph, const CompileOptions& options = {},
                                    const std::vector<bool>& donated = {});

// The pass pipeline and the memory plan of compile(), without building the executable
// (no arena is allocated): what the planner (tessera plan) costs.
struct OptimizedProgram {
  Graph graph;
  MemoryPlan plan;
};
OptimizedProgram optimize(Graph graph, const CompileOptions& options = {}, const std::vector<bool>& donated = {});

// The executables eval() compiled, keyed by graph text (least recently used dropped
// beyond 2048 entries or TESSERA_EVAL_CACHE_MB of arenas, default 256).
struct EvalCacheStats {
  size_t hits = 0;
  size_t misses = 0;
  size_t entries = 0;
  size_t arena_bytes = 0;  // held by the cached executables
};
EvalCacheStats eval_cache_stats();
// Overrides TESSERA_EVAL_CACHE_MB (bytes of cached arenas); evicts down to it now.
void set_eval_cache_budget(size_t bytes);

}  // namespace tessera::compiler
