// GpuExecutable: runs a compiled program (the CPU Executable's optimized graph and
// memory plan) on one CUDA device.
//
// Built once: every node is looked up in the kernel table (a missing op is an error
// naming it), the arena is allocated from the device's caching allocator at the
// planned size, constants are uploaded. A run binds argument and output buffers,
// walks the schedule queueing each kernel on the device's stream (views share their
// source's pointer; a view returned as an output is a device copy), and returns the
// outputs as device-resident arrays without waiting for the GPU.
//
// Runs of consecutive equivalent ops with a group kernel (AdamW over every parameter)
// become one step: one multi-tensor launch instead of one per parameter.
//
// CUDA graphs: from the second run on, when the bound buffers (arguments, outputs)
// are the ones of an earlier run — the steady state of a training step, whose donated
// parameters come back in the same blocks — the launches are captured once as a CUDA
// graph and replayed, removing per-kernel launch overhead. Up to kMaxGraphs pointer
// sets are kept; TESSERA_CUDA_GRAPHS=0 turns capture off. Kernels must be
// capture-safe (kernel_registry.h); the first run, never captured, is where they
// compile (NVRTC), autotune (GEMM algorithms) and size their scratch. A program with a
// kernel registered as not capturable (an SPMD program's collectives) is never captured.
//
// Host offload (the offload remat policy): offload_to_host / load_from_host steps are
// copies to and from the plan's host arena, held in pinned memory, on a side stream
// with events (host_offload.h); the main stream waits for a copy only at the first
// step that overwrites the offloaded buffer or reads the loaded value.
#pragma once

#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cuda/host_offload.h"
#include "backend/cuda/kernel_registry.h"
#include "tessera/compiler/device_program.h"

namespace tessera::cuda {

class GpuExecutable : public compiler::DeviceProgram {
 public:
  GpuExecutable(std::shared_ptr<compiler::Executable> executable, int device);
  ~GpuExecutable() override;

  std::vector<Array> run(const std::vector<Array>& args) override;
  std::string device_name() const override;
  std::string profile_text() const override;

  int graph_launches() const { return graph_launches_; }
  // Launch steps per run (kernels, copies, groups).
  int steps() const { return static_cast<int>(steps_.size()); }
  int graphs_captured() const { return static_cast<int>(graphs_.size()); }
  void set_graphs_enabled(bool on) { graphs_enabled_ = on; }

  static constexpr int kMaxGraphs = 8;

 private:
  struct Step {
    enum class Kind { Kernel, Copy, Group, ToHost, ToDevice } kind = Kind::Kernel;
    const Primitive* primitive = nullptr;
    const KernelFn* kernel = nullptr;
    std::vector<int> inputs;   // value ids
    std::vector<int> outputs;  // value ids
    // Group: a run of consecutive equivalent applications launched together.
    const GroupKernelFn* group = nullptr;
    std::vector<std::vector<int>> group_inputs, group_outputs;
    int copy = -1;  // ToHost / ToDevice: the copy's index in offload_
  };
  // Merges runs of consecutive steps that have a group kernel (kernel_registry.h).
  void group_steps();
  // Host offload: the pinned block, and where the main stream waits for each copy.
  void plan_offload_waits();
  void bind(const std::vector<Array>& args, std::vector<std::shared_ptr<void>>& owners);
  void launch_all(KernelContext& ctx);
  void* scratch(size_t bytes);

  std::shared_ptr<compiler::Executable> executable_;  // owns the graph and plan
  int device_;
  std::vector<Step> steps_;
  std::shared_ptr<void> arena_;
  std::unique_ptr<HostOffloadStreams> offload_;   // null without offload steps
  std::vector<std::vector<int>> waits_before_;    // per step: copies the main stream waits for first
  std::vector<std::shared_ptr<void>> constants_;  // per value (constants only)
  std::vector<void*> ptr_;                        // per value: its device pointer for the current run
  std::vector<int> view_source_;                  // per value: the value whose buffer it views, or -1
  std::shared_ptr<void> scratch_;
  size_t scratch_bytes_ = 0;
  bool capturing_ = false;
  bool graphs_enabled_ = true;
  int runs_ = 0;
  int graph_launches_ = 0;
  int capture_failures_ = 0;
  std::map<std::vector<void*>, cudaGraphExec_t> graphs_;
  bool profiling_ = false;
  bool profile_steps_ = false;     // TESSERA_PROFILE=2: profile_text() lists the costliest launches
  std::vector<double> kernel_ms_;  // per step, summed over profiled runs
  int profiled_runs_ = 0;
  std::mutex mutex_;
};

}  // namespace tessera::cuda
