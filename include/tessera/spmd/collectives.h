// Collective primitives: the communication the SPMD partitioner inserts into a
// per-device program. Shapes are local (per device). Each names the mesh axes it
// runs over; at run time the group is mesh.group(current device, axes) and the
// work goes to the current DeviceContext's communicator.
//
//   all_gather(x) {axes=[model], dim=1}      S(1) -> R on those axes: dim grows n-fold
//   all_reduce(x) {axes=[data]}              P -> R
//   reduce_scatter(x) {axes=[fsdp], dim=0}   P -> S(0): dim shrinks n-fold
//   all_to_all(x) {axes=[model], split=1, concat=0}   S(0) -> S(1)
//   shard_slice(x) {axes=[data], dim=0}      R -> S(0): this device's block, no communication
//   shard_pad(x) {axes=[data], dim=0}        the transpose of shard_slice: zeros with x
//                                            at this device's block (dim grows n-fold), no communication
//
// vjps (the exact transposes of the per-device program, so grad of a per-device
// program is itself per-device; a replicated input's cotangent is then each device's
// contribution, and the total is their sum over the group):
// all_gather <-> reduce_scatter, all_reduce -> all_reduce of the cotangent's
// partial sums (identity on a replicated cotangent is handled by the partitioner),
// shard_slice <-> shard_pad, all_to_all -> all_to_all with split and concat swapped.
// (Summed over the group, shard_pad's cotangents add up to the all_gather of the
// blocks; using all_gather itself as shard_slice's vjp would count them n times.)
#pragma once

#include <string>
#include <vector>

#include "tessera/core/array.h"
#include "tessera/spmd/mesh.h"

namespace tessera::spmd {

enum class CollectiveKind { AllGather, AllReduce, ReduceScatter, AllToAll, ShardSlice, ShardPad };
std::string to_string(CollectiveKind kind);

class Collective : public Primitive {
 public:
  Collective(CollectiveKind kind, Mesh mesh, std::vector<int> axes, int dim = -1, int concat_dim = -1);
  CollectiveKind kind() const { return kind_; }
  const Mesh& mesh() const { return mesh_; }
  const std::vector<int>& axes() const { return axes_; }
  int dim() const { return dim_; }                // gather / scatter / slice / pad / all-to-all split dim
  int concat_dim() const { return concat_dim_; }  // all-to-all only
  int group_size() const { return mesh_.group_size(axes_); }

  std::string name() const override { return to_string(kind_); }
  // "axes=[model], dim=1, mesh=(data=2, model=4)" (all_reduce: no dim; all_to_all:
  // split=, concat=). The mesh is printed because it fixes the groups: two programs
  // that differ only in their mesh must not share a compiled executable.
  std::string attributes() const override;
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_VJP
  TESSERA_PRIMITIVE_COST
  // Bytes this device sends for one call with a local input of `input_bytes`
  // (ring algorithm; see CommStats).
  double bytes_sent(double input_bytes) const;

 private:
  CollectiveKind kind_;
  Mesh mesh_;
  std::vector<int> axes_;
  int dim_, concat_dim_;
};

// Builders on local arrays (shape checks included; used by the partitioner and vjps).
// Over a group of one device (axes empty or of size 1) each returns x itself.
Array all_gather(const Array& x, const Mesh& mesh, const std::vector<int>& axes, int dim);
Array all_reduce(const Array& x, const Mesh& mesh, const std::vector<int>& axes);
Array reduce_scatter(const Array& x, const Mesh& mesh, const std::vector<int>& axes, int dim);
Array all_to_all(const Array& x, const Mesh& mesh, const std::vector<int>& axes, int split_dim, int concat_dim);
Array shard_slice(const Array& x, const Mesh& mesh, const std::vector<int>& axes, int dim);
Array shard_pad(const Array& x, const Mesh& mesh, const std::vector<int>& axes, int dim);

// Teaches the IR parser (compiler/primitive_registry.h) the collectives, so per-device
// SPMD programs parse and deserialize (the compilation cache stores them). Idempotent;
// src/api/runtime_hooks.cpp calls it when a program starts.
void register_collective_parsers();

}  // namespace tessera::spmd
