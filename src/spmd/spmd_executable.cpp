#include "tessera/spmd/spmd_executable.h"

#include <fmt/format.h>

#include "tessera/compiler/compile.h"
#include "tessera/spmd/api.h"
#include "tessera/spmd/collective_plan.h"
#include "tessera/spmd/runtime.h"

namespace tessera::spmd {

SpmdExecutable::SpmdExecutable(PartitionedProgram program, std::vector<bool> donated,
                               const ExecutableFactory& make_executable)
    : program_(std::move(program)), donated_(std::move(donated)) {
  donated_.resize(program_.parameter_shardings.size(), false);
  check_mesh(program_.mesh);
  for (int d : local_devices())
    if (d < program_.mesh.size()) devices_.push_back(d);
  // Every device runs the same program; each needs its own arena and bindings.
  for (size_t i = 0; i < devices_.size(); ++i) per_device_.push_back(make_executable(program_.local, donated_));
  last_stats_.resize(devices_.size());
}

SpmdExecutable::SpmdExecutable(PartitionedProgram program, const compiler::CompileOptions& options,
                               std::vector<bool> donated)
    : SpmdExecutable(std::move(program), std::move(donated),
                     [&](const compiler::Graph& local, const std::vector<bool>& d) {
                       return compiler::compile(local, options, d);
                     }) {}

void SpmdExecutable::run_on_accelerator(const DeviceProgramFactory& make) {
  std::vector<std::shared_ptr<compiler::DeviceProgram>> programs;
  for (size_t slot = 0; slot < devices_.size(); ++slot) programs.push_back(make(per_device_[slot], devices_[slot]));
  device_programs_ = std::move(programs);
}

std::vector<Array> SpmdExecutable::run(const std::vector<Array>& args) {
  const auto& in = program_.parameter_shardings;
  if (args.size() != in.size())
    fail<ValueError>("SPMD program @{}: {} arguments given, {} expected", program_.local.name, args.size(), in.size());
  size_t n = devices_.size();
  std::vector<std::vector<Array>> local_args(n);
  for (size_t i = 0; i < args.size(); ++i) {
    const compiler::TensorType& t = program_.global_parameter_types[i];
    if (args[i].shape() != t.shape || args[i].dtype() != t.dtype)
      fail<ValueError>("SPMD program @{}: argument {} is {} but the program was compiled for {}", program_.local.name,
                       i, type_string(args[i]), compiler::to_string(t));
    // A replicated host array that the program only reads is shared by every device
    // (no copy per device and call); a donated one is copied, since each device may
    // write its buffer.
    if (in[i].is_replicated() && sharding_of(args[i]) == nullptr && !donated_[i]) {
      const Array& whole = args[i].eval();
      for (size_t s = 0; s < n; ++s) local_args[s].push_back(whole);
      continue;
    }
    for (size_t s = 0; s < n; ++s) local_args[s].push_back(shard_for_device(args[i], in[i], devices_[s]));
  }
  std::vector<std::vector<Array>> results(n);
  Communicator& comm = communicator();
  run_on_devices(devices_, [&](int device) {
    size_t slot = static_cast<size_t>(std::find(devices_.begin(), devices_.end(), device) - devices_.begin());
    const CommStats before = comm.stats(device);
    if (device_programs_.empty()) {
      results[slot] = per_device_[slot]->run(local_args[slot]);
      last_stats_[slot] = comm.stats(device) - before;
      return;
    }
    // On an accelerator the collectives count themselves (device_collective_stats).
    const CommStats device_before = device_collective_stats(device);
    results[slot] = device_programs_[slot]->run(local_args[slot]);
    last_stats_[slot] = (comm.stats(device) - before) + (device_collective_stats(device) - device_before);
  });
  std::vector<Array> outputs;
  int mesh_size = program_.mesh.size();
  for (size_t o = 0; o < program_.output_shardings.size(); ++o) {
    std::vector<Array> shards(static_cast<size_t>(mesh_size));
    for (size_t s = 0; s < n; ++s) {
      Array shard = results[s].at(o);
      // An output that is an input shared by the devices (or a constant) would give
      // them one buffer; a later call that donates it would then write it from every
      // device at once, so each device gets its own copy.
      // (Device-resident outputs have no host storage, and each device's own buffers.)
      for (size_t t = 0; t < s && shard.storage() != nullptr; ++t)
        if (results[t].at(o).storage() == shard.storage()) {
          shard = Array::from_data(shard.raw_data(), shard.shape(), shard.dtype());
          break;
        }
      shards[static_cast<size_t>(devices_[s])] = shard;
    }
    const compiler::TensorType& t = program_.global_output_types[o];
    outputs.push_back(make_sharded(t.shape, t.dtype, program_.output_shardings[o], std::move(shards)));
  }
  return outputs;
}

}  // namespace tessera::spmd
