#include "tessera/dist/spmd_executable.h"

#include <fmt/format.h>

#include "tessera/compiler/compile.h"
#include "tessera/dist/api.h"
#include "tessera/dist/runtime.h"

namespace tessera::dist {

SpmdExecutable::SpmdExecutable(PartitionedProgram program, const compiler::CompileOptions& options,
                               std::vector<bool> donated)
    : program_(std::move(program)) {
  check_mesh(program_.mesh);
  for (int d : local_devices())
    if (d < program_.mesh.size()) devices_.push_back(d);
  // Every device runs the same program; each needs its own arena and bindings.
  for (size_t i = 0; i < devices_.size(); ++i)
    per_device_.push_back(compiler::compile(program_.local, options, donated));
  last_stats_.resize(devices_.size());
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
    for (size_t s = 0; s < n; ++s) local_args[s].push_back(shard_for_device(args[i], in[i], devices_[s]));
  }
  std::vector<std::vector<Array>> results(n);
  Communicator& comm = communicator();
  run_on_devices(devices_, [&](int device) {
    size_t slot = static_cast<size_t>(std::find(devices_.begin(), devices_.end(), device) - devices_.begin());
    CommStats before = comm.stats(device);
    results[slot] = per_device_[slot]->run(local_args[slot]);
    CommStats after = comm.stats(device);
    CommStats& s = last_stats_[slot];
    s.all_gather_calls = after.all_gather_calls - before.all_gather_calls;
    s.all_reduce_calls = after.all_reduce_calls - before.all_reduce_calls;
    s.reduce_scatter_calls = after.reduce_scatter_calls - before.reduce_scatter_calls;
    s.all_to_all_calls = after.all_to_all_calls - before.all_to_all_calls;
    s.all_gather_bytes = after.all_gather_bytes - before.all_gather_bytes;
    s.all_reduce_bytes = after.all_reduce_bytes - before.all_reduce_bytes;
    s.reduce_scatter_bytes = after.reduce_scatter_bytes - before.reduce_scatter_bytes;
    s.all_to_all_bytes = after.all_to_all_bytes - before.all_to_all_bytes;
    s.seconds = after.seconds - before.seconds;
  });
  std::vector<Array> outputs;
  int mesh_size = program_.mesh.size();
  for (size_t o = 0; o < program_.output_shardings.size(); ++o) {
    std::vector<Array> shards(static_cast<size_t>(mesh_size));
    for (size_t s = 0; s < n; ++s) shards[static_cast<size_t>(devices_[s])] = results[s].at(o);
    const compiler::TensorType& t = program_.global_output_types[o];
    outputs.push_back(make_sharded(t.shape, t.dtype, program_.output_shardings[o], std::move(shards)));
  }
  return outputs;
}

}  // namespace tessera::dist
