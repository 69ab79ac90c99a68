// Sharded arrays, the user's side of SPMD (jax.device_put and friends).
//
//   Mesh mesh = Mesh::parse("data=2,model=4");
//   Array xs = device_put(x, NamedSharding(mesh, P("data", "model")));
//   Array y = jit(f)(xs);          // one program per device, collectives inserted
//   sharding_of(y)->to_string();   // the output's layout
//
// A sharded Array has its global shape and dtype; its data lives in one shard per
// device (addressable_shards). Reading its values (data, to_vector, eager ops)
// assembles the global array on the host (every shard must be in this process).
// Inside jit, with_sharding_constraint pins an intermediate's layout.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tessera/core/array.h"
#include "tessera/core/tree.h"
#include "tessera/spmd/sharding.h"

namespace tessera::spmd {

// What a sharded array holds (ArrayImpl::shards).
struct ShardedData {
  Sharding sharding;
  std::vector<Array> shards;  // indexed by mesh device; invalid where not addressable
};

// Splits x over the mesh (replicated dims copied). x may already be sharded: then
// it is resharded. Throws ShapeError when a dimension does not divide evenly.
Array device_put(const Array& x, const NamedSharding& sharding, const std::string& what = "array");
Array device_put(const Array& x, const Sharding& sharding, const std::string& what = "array");
// Wraps existing per-device shards (local shapes) as one global array.
Array make_sharded(const Shape& global, DType dtype, const Sharding& sharding, std::vector<Array> shards);

// The layout of a sharded array; nullptr for an ordinary (host) array.
const Sharding* sharding_of(const Array& x);
// Shards this process holds, by mesh device (invalid entries for other processes').
const std::vector<Array>& addressable_shards(const Array& x);
// The shard of mesh device `device` of x: its own shard when x is sharded, else the
// matching slice of the host array under `sharding`.
Array shard_for_device(const Array& x, const Sharding& sharding, int device);

// Inside jit: the value must have this layout here (its gradient too). Outside jit:
// device_put.
Array with_sharding_constraint(const Array& x, const NamedSharding& sharding);
// Same as with_sharding_constraint (the JAX spelling for an explicit reshard).
Array reshard(const Array& x, const NamedSharding& sharding);

// The host value of a sharded array (an unsharded array is returned as is).
// Under MPI every process must call it (shards are gathered collectively).
Array gather(const Array& x);

// device_put of every leaf with sharding_for(path, leaf).
Tree device_put(const Tree& tree,
                const std::function<NamedSharding(const std::string& path, const Array&)>& sharding_for);

// The identity primitive with_sharding_constraint records inside jit.
class ShardingConstraint : public Primitive {
 public:
  explicit ShardingConstraint(Sharding sharding) : sharding_(std::move(sharding)) {}
  const Sharding& sharding() const { return sharding_; }
  std::string name() const override { return "sharding_constraint"; }
  std::string attributes() const override;
  int aliases_input(int) const override { return 0; }
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_VJP
  Cost cost(const std::vector<Array>&, const std::vector<Array>&) const override { return {}; }

 private:
  Sharding sharding_;
};

}  // namespace tessera::spmd
