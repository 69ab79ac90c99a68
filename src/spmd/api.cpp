#include "tessera/spmd/api.h"

#include <fmt/format.h>

#include <cstring>

#include "core/trace_state.h"
#include "spmd/assemble.h"
#include "tessera/spmd/runtime.h"

namespace tessera::spmd {

namespace {

// Copies the block of `global` (row-major, `item` bytes per element) starting at
// `offsets` with shape `local` into `dst`, or the other way when `to_global`.
void copy_block(char* global, const Shape& global_shape, char* block, const Shape& local,
                const std::vector<int64_t>& offsets, size_t item, bool to_global) {
  int rank = static_cast<int>(global_shape.size());
  if (rank == 0) {
    to_global ? std::memcpy(global, block, item) : std::memcpy(block, global, item);
    return;
  }
  // Innermost contiguous run: the last dim's local extent.
  size_t run = static_cast<size_t>(local[static_cast<size_t>(rank - 1)]) * item;
  std::vector<int64_t> global_strides(static_cast<size_t>(rank), 1);
  for (int d = rank - 2; d >= 0; --d)
    global_strides[static_cast<size_t>(d)] =
        global_strides[static_cast<size_t>(d + 1)] * global_shape[static_cast<size_t>(d + 1)];
  int64_t rows = 1;
  for (int d = 0; d + 1 < rank; ++d) rows *= local[static_cast<size_t>(d)];
  std::vector<int64_t> index(static_cast<size_t>(rank), 0);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t g = offsets[static_cast<size_t>(rank - 1)];
    for (int d = 0; d + 1 < rank; ++d)
      g += (index[static_cast<size_t>(d)] + offsets[static_cast<size_t>(d)]) * global_strides[static_cast<size_t>(d)];
    char* gp = global + static_cast<size_t>(g) * item;
    char* bp = block + static_cast<size_t>(r) * run;
    to_global ? std::memcpy(gp, bp, run) : std::memcpy(bp, gp, run);
    for (int d = rank - 2; d >= 0; --d) {
      if (++index[static_cast<size_t>(d)] < local[static_cast<size_t>(d)]) break;
      index[static_cast<size_t>(d)] = 0;
    }
  }
}

Array extract_shard(const Array& host, const Sharding& s, int device) {
  Shape local = s.local_shape(host.shape());
  Array shard = Array::empty(local, host.dtype());
  if (shard.nbytes() == 0) return shard;
  copy_block(static_cast<char*>(const_cast<void*>(host.raw_data())), host.shape(),
             static_cast<char*>(shard.mutable_raw_data()), local, s.shard_offsets(host.shape(), device),
             host.itemsize(), false);
  return shard;
}

}  // namespace

Array make_sharded(const Shape& global, DType dtype, const Sharding& sharding, std::vector<Array> shards) {
  if (sharding.is_partial())
    fail<ShardingError>("make_sharded: {} is a partial sum; reduce it before it leaves a program",
                        sharding.to_string());
  Shape local = sharding.local_shape(global);
  if (static_cast<int>(shards.size()) != sharding.mesh().size())
    fail<ValueError>("make_sharded: {} shards for mesh {} ({} devices)", shards.size(), sharding.mesh().to_string(),
                     sharding.mesh().size());
  for (size_t d = 0; d < shards.size(); ++d)
    if (shards[d].valid() && (shards[d].shape() != local || shards[d].dtype() != dtype))
      fail<ShapeError>("make_sharded: shard {} is {} but {} under {} needs {}{}", d, type_string(shards[d]),
                       tessera::to_string(global), sharding.to_string(), short_name(dtype), tessera::to_string(local));
  Array x = Array::placeholder(global, dtype);
  auto data = std::make_shared<ShardedData>();
  data->sharding = sharding;
  data->shards = std::move(shards);
  x.impl()->shards = std::move(data);
  return x;
}

const Sharding* sharding_of(const Array& x) {
  const auto& shards = x.impl()->shards;
  return shards ? &shards->sharding : nullptr;
}

const std::vector<Array>& addressable_shards(const Array& x) {
  const auto& shards = x.impl()->shards;
  if (!shards) fail<ValueError>("addressable_shards: {} is not a sharded array (use device_put)", type_string(x));
  return shards->shards;
}

Array shard_for_device(const Array& x, const Sharding& sharding, int device) {
  if (const Sharding* s = sharding_of(x)) {
    if (*s == sharding) {
      const Array& shard = addressable_shards(x).at(static_cast<size_t>(device));
      if (!shard.valid())
        fail<ValueError>("shard_for_device: device {}'s shard of {} lives in another process", device, type_string(x));
      return shard;
    }
  }
  return extract_shard(x.is_evaluated() || !sharding_of(x) ? x.eval() : gather(x), sharding, device);
}

Array device_put(const Array& x, const Sharding& sharding, const std::string& what) {
  sharding.check_divisible(x.shape(), what);
  if (const Sharding* s = sharding_of(x))
    if (*s == sharding) return x;
  check_mesh(sharding.mesh());
  if (sharding.is_partial()) fail<ShardingError>("device_put: {} cannot be placed as a partial sum", what);
  Array host = sharding_of(x) ? gather(x) : x;
  host.eval();
  std::vector<Array> shards(static_cast<size_t>(sharding.mesh().size()));
  for (int d : local_devices())
    if (d < sharding.mesh().size()) shards[static_cast<size_t>(d)] = extract_shard(host, sharding, d);
  return make_sharded(x.shape(), x.dtype(), sharding, std::move(shards));
}

Array device_put(const Array& x, const NamedSharding& sharding, const std::string& what) {
  return device_put(x, sharding.resolve(x.ndim(), what), what);
}

void assemble_on_host(const Array& x) {
  const auto& data = x.impl()->shards;
  const Sharding& s = data->sharding;
  if (s.is_replicated()) {
    // Every shard is the whole value: any one this process holds will do (under MPI
    // a rank holds only its own).
    for (const Array& shard : data->shards)
      if (shard.valid()) {
        auto storage = std::make_shared<Storage>(x.nbytes());
        if (x.nbytes() > 0) std::memcpy(storage->data, shard.raw_data(), x.nbytes());
        x.bind_storage(std::move(storage));
        return;
      }
  }
  Shape local = s.local_shape(x.shape());
  auto storage = std::make_shared<Storage>(x.nbytes());
  for (int d = 0; d < s.mesh().size(); ++d) {
    const Array& shard = data->shards[static_cast<size_t>(d)];
    if (!shard.valid())
      fail<ValueError>(
          "reading {}: device {}'s shard lives in another process; call spmd::gather on every process first",
          type_string(x), d);
    if (shard.nbytes() == 0) continue;
    copy_block(static_cast<char*>(storage->data), x.shape(), static_cast<char*>(const_cast<void*>(shard.raw_data())),
               local, s.shard_offsets(x.shape(), d), x.itemsize(), true);
  }
  x.bind_storage(std::move(storage));
}

Array gather(const Array& x) {
  const auto& data = x.impl()->shards;
  if (!data) return x;
  if (x.is_evaluated()) return x;
  bool all_local = data->sharding.is_replicated();
  if (!all_local) {
    all_local = true;
    for (const Array& shard : data->shards) all_local = all_local && shard.valid();
  }
  if (!all_local) {
    // Multi-process: every device's shard goes to everyone (shards have equal sizes).
    const Sharding& s = data->sharding;
    Shape local = s.local_shape(x.shape());
    size_t bytes = static_cast<size_t>(numel(local)) * x.itemsize();
    int n = s.mesh().size();
    std::vector<int> group(static_cast<size_t>(n));
    for (int d = 0; d < n; ++d) group[static_cast<size_t>(d)] = d;
    int me = local_devices().at(0);
    std::vector<char> all(bytes * static_cast<size_t>(n));
    communicator().all_gather(me, group, data->shards.at(static_cast<size_t>(me)).raw_data(), all.data(), bytes);
    std::vector<Array> shards(static_cast<size_t>(n));
    for (int d = 0; d < n; ++d)
      shards[static_cast<size_t>(d)] = Array::from_data(all.data() + bytes * static_cast<size_t>(d), local, x.dtype());
    Array full = make_sharded(x.shape(), x.dtype(), s, std::move(shards));
    assemble_on_host(full);
    return Array::from_data(full.raw_data(), x.shape(), x.dtype());
  }
  assemble_on_host(x);
  return x;
}

Array with_sharding_constraint(const Array& x, const NamedSharding& sharding) {
  Sharding s = sharding.resolve(x.ndim(), "with_sharding_constraint");
  s.check_divisible(x.shape(), "with_sharding_constraint");
  if (tessera::detail::tracing() || (!x.is_evaluated() && !sharding_of(x) && !x.is_leaf()))
    return Array::make(x.shape(), x.dtype(), std::make_shared<ShardingConstraint>(s), {x});
  return device_put(x, s, "with_sharding_constraint");
}

Array reshard(const Array& x, const NamedSharding& sharding) { return with_sharding_constraint(x, sharding); }

Tree device_put(const Tree& tree,
                const std::function<NamedSharding(const std::string& path, const Array&)>& sharding_for) {
  std::vector<Array> leaves = tree.leaves();
  std::vector<std::string> paths = tree.paths();
  for (size_t i = 0; i < leaves.size(); ++i)
    leaves[i] = device_put(leaves[i], sharding_for(paths[i], leaves[i]), paths[i].empty() ? "array" : paths[i]);
  return tree.with_leaves(leaves);
}

std::string ShardingConstraint::attributes() const { return "sharding=" + sharding_.to_string(); }

void ShardingConstraint::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  outputs[0].share_storage(inputs[0]);
}

std::vector<Array> ShardingConstraint::vjp(const std::vector<Array>&, const std::vector<Array>& cotangents,
                                           const std::vector<int>&, const std::vector<Array>&) {
  // The gradient of a pinned value is pinned to the same layout.
  return {Array::make(cotangents[0].shape(), cotangents[0].dtype(), std::make_shared<ShardingConstraint>(sharding_),
                      {cotangents[0]})};
}

}  // namespace tessera::spmd
