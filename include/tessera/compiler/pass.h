// Passes and the pipeline that runs them. A pass is a class with one `run` that
// rewrites a Graph in place; the pipeline runs passes in order, verifies the graph
// after each, and with TESSERA_DUMP=dir writes every pass's output
// (dir/<graph>.<compilation>.<NN>.<pass>.txt) so a miscompile can be bisected by
// reading text.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tessera/compiler/graph.h"

namespace tessera::compiler {

class Pass {
 public:
  virtual ~Pass() = default;
  virtual std::string name() const = 0;
  virtual void run(Graph& graph) = 0;
};

using PassPtr = std::shared_ptr<Pass>;

class Pipeline {
 public:
  Pipeline() = default;
  explicit Pipeline(std::vector<PassPtr> passes) : passes_(std::move(passes)) {}
  Pipeline& add(PassPtr pass) {
    passes_.push_back(std::move(pass));
    return *this;
  }
  // Runs every pass. `dump_dir` empty: read TESSERA_DUMP from the environment.
  void run(Graph& graph, const std::string& dump_dir = {}) const;
  // "dce -> cse -> constant-folding -> ...".
  std::string text() const;
  const std::vector<PassPtr>& passes() const { return passes_; }

 private:
  std::vector<PassPtr> passes_;
};

struct CompileOptions {
  bool fuse = true;  // elementwise / reduction / GEMM-epilogue fusion
  bool fold_constants = true;
  bool simplify = true;  // algebraic simplification, CSE
  bool remat = true;     // apply checkpoint policies
  bool schedule = true;  // memory-aware reordering
  // The attention-layout pass (passes/attention_layout.h). jit turns it on for GPU
  // programs, whose kernels read the packed layout in place; the CPU kernels would copy
  // to their own layout instead of the transposes, a few % slower (bench_train small).
  bool packed_attention = false;
};

// `base` as compiled for a GPU (gpu) or a CPU: what jit uses for a device, and the
// planner for an accelerator of that kind.
inline CompileOptions for_device(bool gpu, CompileOptions base = {}) {
  if (gpu) base.packed_attention = true;
  return base;
}

// The default pipeline jit and eval use.
Pipeline default_pipeline(const CompileOptions& options = {});

}  // namespace tessera::compiler
