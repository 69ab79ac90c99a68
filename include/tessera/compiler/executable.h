// Executable: the compiled program. A linear list of kernel calls (the scheduled,
// optimized graph) over one arena whose offsets the memory planner fixed, run by
// the CPU backend. Running it allocates nothing but the output buffers (and not
// even those with run_into or donation). Serializable to bytes and back in a
// versioned format; the persistent compilation cache stores those bytes.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/compiler/graph.h"
#include "tessera/compiler/memory_plan.h"

namespace tessera::compiler {

// 2: binary graph records (1 stored the IR text and re-parsed it).
// 3: host buffers in the memory plan (host offload).
inline constexpr uint32_t kExecutableFormatVersion = 3;

struct ExecutableStats {
  size_t arena_bytes = 0;  // the static arena
  size_t peak_bytes = 0;   // arena + outputs + parameters live at the peak
  // Host offload (MemoryPlan): the host arena, and the device bytes it relieves.
  size_t host_bytes = 0;
  size_t offloaded_bytes = 0;
  double flops = 0;  // sum of Primitive::cost over the program
  // The same per primitive name (int8 GEMMs fused with their epilogue as
  // "matmul_epilogue[int8]"): how much of a program runs in int8, for instance.
  std::map<std::string, double> flops_by_op;
  double bytes_moved = 0;
  size_t kernels = 0;  // kernel calls per run
  double compile_seconds = 0;
};

class Executable {
 public:
  // Takes a scheduled, optimized graph and its memory plan.
  Executable(Graph graph, MemoryPlan plan, std::vector<bool> donated = {});
  Executable(const Executable&) = delete;
  Executable& operator=(const Executable&) = delete;

  // Runs the program. `args` must match the parameter types. Donated arguments'
  // buffers may be reused for outputs; those arrays are invalid afterwards.
  std::vector<Array> run(const std::vector<Array>& args);
  // Same, writing into caller-allocated outputs of the output types: allocates
  // nothing at all.
  void run_into(const std::vector<Array>& args, const std::vector<Array>& outputs);

  const Graph& graph() const { return graph_; }
  const MemoryPlan& plan() const { return plan_; }
  const ExecutableStats& stats() const { return stats_; }
  ExecutableStats& mutable_stats() { return stats_; }
  const std::vector<bool>& donated() const { return donated_; }
  // Per output: whether run() returns it in a buffer of its own, one no other output,
  // argument or constant shares (so a later program may take it as a donated argument).
  // Not so: a parameter or constant returned as is, a planned view, and an output that
  // views an input outside the arena (Primitive::aliases_input: it keeps sharing).
  std::vector<bool> owned_outputs() const;
  // The program as text: the graph plus the buffer of every value.
  std::string text() const;

  // Versioned, checksummed bytes: the graph (values keep their ids), the memory plan,
  // constants and donation (layout in executable_serialization.cpp). Loading them back
  // runs no pass and no planner.
  std::string serialize() const;
  // Throws ValueError for a wrong magic, another version or damaged contents.
  static std::unique_ptr<Executable> deserialize(std::string_view bytes);

  // Fill freed arena regions with a poison value before each kernel (tests: a
  // planner that let two live buffers overlap then gives wrong results).
  void set_poison_freed(bool poison) { poison_freed_ = poison; }

  // Per-kernel timing (off by default; TESSERA_PROFILE=1 turns it on for every
  // executable). profile_text() sums seconds and calls by op name, largest first.
  void set_profiling(bool on) { profiling_ = on; }
  std::string profile_text() const;
  void reset_profile() {
    kernel_seconds_.assign(kernel_seconds_.size(), 0.0);
    runs_ = 0;
  }

 private:
  void bind(const std::vector<Array>& args, const std::vector<Array>* outputs);
  void execute();
  void unbind();

  Graph graph_;
  MemoryPlan plan_;
  std::vector<bool> donated_;
  ExecutableStats stats_;
  std::shared_ptr<void> arena_;       // 64-byte aligned
  std::shared_ptr<void> host_arena_;  // offloaded values (on the CPU just a second block)
  // One Array handle per value, bound to its buffer; the kernels' input/output lists.
  std::vector<Array> handles_;
  struct Instruction {
    Primitive* primitive;
    std::vector<Array> inputs;
    std::vector<Array> outputs;
    int node = 0;          // index in graph_.nodes (schedule position)
    int view_output = -1;  // an output that views an input but is returned (copied out of the arena)
  };
  std::vector<Instruction> instructions_;
  std::vector<int> parameter_index_;  // per value: its position among the parameters, or -1
  std::vector<int> donors_;           // parameters whose buffers hold outputs after a run
  bool poison_freed_ = false;
  bool profiling_ = false;
  std::vector<double> kernel_seconds_;  // per instruction, summed over runs
  int64_t runs_ = 0;
  std::mutex mutex_;  // one run at a time (the handles are shared state)
};

}  // namespace tessera::compiler
