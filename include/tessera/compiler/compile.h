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

// The executables eval() compiled, keyed by graph text (least recently used dropped).
struct EvalCacheStats {
  size_t hits = 0;
  size_t misses = 0;
  size_t entries = 0;
};
EvalCacheStats eval_cache_stats();

}  // namespace tessera::compiler
