// jit: trace a function once per input signature, optimize and plan it, then run
// the compiled Executable on every call (jax.jit).
//
//   auto step = tessera::jit([](const Tree& args) { ... return Tree{...}; });
//   Tree out = step(args);                       // first call traces and compiles
//   std::cout << step.lowered(args).text();      // the traced IR
//
// The function receives placeholder arrays: it may build any graph (grad, vmap and
// checkpoint inside work), but reading a value (item, to_vector, data) while
// tracing is an error naming the op. Arrays it captures from outside are constants.
// The cache key is the signature: every leaf's shape and dtype plus the static
// arguments (ints and bools selecting a code path). A call with another signature
// re-traces; a call whose tree structure (keys, list lengths) differs from the
// first call's is an error.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "tessera/compiler/device_program.h"
#include "tessera/compiler/executable.h"
#include "tessera/compiler/graph.h"
#include "tessera/compiler/pass.h"
#include "tessera/core/tree.h"
#include "tessera/spmd/sharding.h"

namespace tessera::spmd {
class SpmdExecutable;
}

namespace tessera {

using StaticArgs = std::vector<int64_t>;
using JitFn = std::function<Tree(const Tree& args, const StaticArgs& statics)>;

struct JitOptions {
  // Leaves of the argument tree (in Tree::leaves() order) whose buffers the program
  // may reuse for outputs (parameters and optimizer state updated in place). The
  // caller must not read donated arrays after the call.
  std::vector<int> donate_leaves;
  compiler::CompileOptions compile;
  std::string name = "main";
  // SPMD (spmd/): layouts of the argument and output leaves (Tree::leaves() order).
  // Missing or empty entries: a sharded argument keeps its own layout, a host
  // argument is replicated, an output follows propagation (partial sums reduced).
  // A call runs as an SPMD program when any argument is sharded or any entry is set.
  std::vector<std::optional<spmd::Sharding>> in_shardings = {};
  std::vector<std::optional<spmd::Sharding>> out_shardings = {};
  // Where the program runs: "cpu", "cuda" or "cuda:N" (compiler/device_program.h). On a
  // GPU, outputs stay in device memory until read on the host.
  std::string device = "cpu";
  // The persistent compilation cache's index (compiler/compilation_cache.h): what the
  // traced function computes beyond its arguments' types (model and optimizer configs,
  // captured constants' provenance...), as text. Set, a call whose identity and
  // signature were compiled before (in any process) loads the executable without
  // tracing. The caller promises that equal identities trace equal programs; a stale
  // identity runs a stale program. Empty: every first call traces (the cache's key is
  // then the traced program itself).
  std::string cache_identity = {};
};

// The traced program for one signature, before and after optimization.
class Lowered {
 public:
  Lowered(compiler::Graph traced, std::shared_ptr<compiler::Executable> executable,
          std::shared_ptr<spmd::SpmdExecutable> spmd = nullptr)
      : traced_(std::move(traced)), executable_(std::move(executable)), spmd_(std::move(spmd)) {}
  // The traced IR (what the function computes, before any pass); for an SPMD program
  // the per-device program with its collectives and their bytes.
  std::string text() const;
  // The global traced program (also for SPMD programs). Empty (no nodes) when the
  // executable came from the compilation cache's index without tracing.
  std::string global_text() const { return traced_.text(); }
  // The SPMD program, or nullptr when the call was not sharded.
  spmd::SpmdExecutable* spmd() const { return spmd_.get(); }
  const std::shared_ptr<spmd::SpmdExecutable>& spmd_ptr() const { return spmd_; }
  // The optimized program with its buffer assignment.
  std::string optimized_text() const { return executable_->text(); }
  const compiler::Graph& graph() const { return traced_; }
  compiler::Executable& executable() const { return *executable_; }
  const std::shared_ptr<compiler::Executable>& executable_ptr() const { return executable_; }

 private:
  compiler::Graph traced_;
  std::shared_ptr<compiler::Executable> executable_;
  std::shared_ptr<spmd::SpmdExecutable> spmd_;
};

class Jitted {
 public:
  Jitted(JitFn fn, JitOptions options);

  Tree operator()(const Tree& args, const StaticArgs& statics = {});
  std::vector<Array> operator()(const std::vector<Array>& args, const StaticArgs& statics = {});
  Array operator()(const Array& x);

  Lowered lowered(const Tree& args, const StaticArgs& statics = {});
  Lowered lowered(const std::vector<Array>& args, const StaticArgs& statics = {});

  // How many times the function was traced (one per distinct signature; none for a
  // signature found in the compilation cache's index).
  int trace_count() const { return state_->traces; }
  // The kernel profile (TESSERA_PROFILE) of every compiled specialization: the device
  // program's where the call runs on a GPU, else the executable's.
  std::string profile_text() const;
  size_t cache_size() const { return state_->cache.size(); }

 private:
  struct Entry {
    compiler::Graph traced;
    std::shared_ptr<compiler::Executable> executable;         // device 0's for SPMD programs
    std::shared_ptr<spmd::SpmdExecutable> spmd;               // set for SPMD programs
    std::shared_ptr<compiler::DeviceProgram> device_program;  // set when the program runs on a GPU
    Tree output_structure;                                    // leaves are placeholders; rebuilt with the outputs
  };
  struct State {
    JitFn fn;
    JitOptions options;
    bool has_structure = false;
    Tree structure;  // the first call's argument tree as placeholders (structure only is compared)
    std::map<std::string, Entry> cache;
    int traces = 0;
    std::mutex mutex;  // calls from several threads share the cache
  };
  Entry& entry_for(const Tree& args, const StaticArgs& statics);
  std::shared_ptr<State> state_;  // copies of a Jitted share the cache
};

namespace detail {
template <typename F>
JitFn to_jit_fn(F fn) {
  if constexpr (std::is_invocable_r_v<Tree, F, const Tree&, const StaticArgs&>) {
    return [fn](const Tree& a, const StaticArgs& s) -> Tree { return fn(a, s); };
  } else if constexpr (std::is_invocable_r_v<std::vector<Array>, F, const std::vector<Array>&>) {
    return [fn](const Tree& a, const StaticArgs&) -> Tree {
      std::vector<Tree> outs;
      for (const Array& o : fn(a.leaves())) outs.emplace_back(o);
      return Tree::list(std::move(outs));
    };
  } else if constexpr (std::is_invocable_r_v<Tree, F, const Tree&>) {
    return [fn](const Tree& a, const StaticArgs&) -> Tree { return Tree(fn(a)); };
  } else {
    static_assert(std::is_invocable_r_v<Array, F, const Array&>,
                  "jit: the function must take (const Tree&[, const StaticArgs&]), "
                  "(const std::vector<Array>&) or (const Array&)");
    return [fn](const Tree& a, const StaticArgs&) -> Tree { return Tree(fn(a.leaves().at(0))); };
  }
}
}  // namespace detail

template <typename F>
Jitted jit(F fn, JitOptions options = {}) {
  return Jitted(detail::to_jit_fn(std::move(fn)), std::move(options));
}

// Traces fn on placeholders of the argument tree's types into a Graph (no passes).
compiler::Graph trace(const JitFn& fn, const Tree& args, const StaticArgs& statics = {},
                      Tree* output_structure = nullptr);

}  // namespace tessera
