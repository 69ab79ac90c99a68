// SpmdExecutable: a partitioned program compiled once per device of the mesh that
// this process drives, and run on all of them at once (a thread per device
// in-process; one device per rank under MPI). jit builds one for a call whose
// arguments are sharded (or that names in/out shardings).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tessera/compiler/device_program.h"
#include "tessera/compiler/executable.h"
#include "tessera/compiler/pass.h"
#include "tessera/spmd/partitioner.h"

namespace tessera::spmd {

class SpmdExecutable {
 public:
  // Builds each device's executable of program.local (each device needs its own arena
  // and bindings): jit passes one that loads it from the persistent compilation cache
  // or compiles and stores it.
  using ExecutableFactory = std::function<std::unique_ptr<compiler::Executable>(const compiler::Graph& local,
                                                                                const std::vector<bool>& donated)>;
  SpmdExecutable(PartitionedProgram program, std::vector<bool> donated, const ExecutableFactory& make_executable);
  // Compiles program.local once per device.
  SpmdExecutable(PartitionedProgram program, const compiler::CompileOptions& options, std::vector<bool> donated);

  // Runs every device's program on an accelerator from now on: make(executable, device)
  // gives mesh device `device`'s program (jit passes the GPU program of the logical CUDA
  // device the mesh device maps to). Arguments are uploaded or read in place, outputs
  // stay device-resident shards, and the collectives run on the devices (their CUDA
  // kernels run CollectivePlans), each device driven by its own thread as on the CPU.
  using DeviceProgramFactory = std::function<std::shared_ptr<compiler::DeviceProgram>(
      std::shared_ptr<compiler::Executable> executable, int device)>;
  void run_on_accelerator(const DeviceProgramFactory& make);
  // Slot `slot`'s device program (nullptr before run_on_accelerator).
  compiler::DeviceProgram* device_program(size_t slot = 0) const {
    return device_programs_.empty() ? nullptr : device_programs_.at(slot).get();
  }

  // Global arguments (sharded arrays, or host arrays that are split on the fly) ->
  // global sharded outputs laid out as program().output_shardings.
  std::vector<Array> run(const std::vector<Array>& args);

  const PartitionedProgram& program() const { return program_; }
  // The mesh devices this process runs, and the executable of each.
  const std::vector<int>& devices() const { return devices_; }
  compiler::Executable& executable(size_t slot = 0) const { return *per_device_.at(slot); }
  // Communication of the last run, per device slot (measured by the communicator, and
  // for programs on an accelerator by its collectives: device_collective_stats).
  const std::vector<CommStats>& last_comm_stats() const { return last_stats_; }
  // Peak bytes one device holds while running (arena + live parameters + outputs).
  size_t peak_bytes_per_device() const { return executable(0).stats().peak_bytes; }

 private:
  PartitionedProgram program_;
  std::vector<bool> donated_;  // per parameter
  std::vector<int> devices_;
  std::vector<std::shared_ptr<compiler::Executable>> per_device_;
  std::vector<std::shared_ptr<compiler::DeviceProgram>> device_programs_;  // empty: on the CPU
  std::vector<CommStats> last_stats_;
};

}  // namespace tessera::spmd
