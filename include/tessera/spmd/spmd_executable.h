// SpmdExecutable: a partitioned program compiled once per device of the mesh that
// this process drives, and run on all of them at once (a thread per device
// in-process; one device per rank under MPI). jit builds one for a call whose
// arguments are sharded (or that names in/out shardings).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

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

  // Global arguments (sharded arrays, or host arrays that are split on the fly) ->
  // global sharded outputs laid out as program().output_shardings.
  std::vector<Array> run(const std::vector<Array>& args);

  const PartitionedProgram& program() const { return program_; }
  // The mesh devices this process runs, and the executable of each.
  const std::vector<int>& devices() const { return devices_; }
  compiler::Executable& executable(size_t slot = 0) const { return *per_device_.at(slot); }
  // Communication of the last run, per device slot (measured by the communicator).
  const std::vector<CommStats>& last_comm_stats() const { return last_stats_; }
  // Peak bytes one device holds while running (arena + live parameters + outputs).
  size_t peak_bytes_per_device() const { return executable(0).stats().peak_bytes; }

 private:
  PartitionedProgram program_;
  std::vector<bool> donated_;  // per parameter
  std::vector<int> devices_;
  std::vector<std::unique_ptr<compiler::Executable>> per_device_;
  std::vector<CommStats> last_stats_;
};

}  // namespace tessera::spmd
