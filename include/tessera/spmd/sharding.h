// How an array is laid out over a mesh.
//
// PartitionSpec (P) is the user's spelling: one entry per array dimension, each
// None (not split), a mesh axis name, or several axis names (split over their
// product, first axis major). Dimensions past the spec's length are not split.
//
//   P("data", "model")         // dim 0 over data, dim 1 over model
//   P(None, "model")
//   P(Axes{"data", "fsdp"}, None)
//
// NamedSharding = Mesh + PartitionSpec. Sharding is the resolved form the compiler
// works with: per array dimension the mesh axes that split it, plus the mesh axes on
// which the value is an unreduced partial sum. Per mesh axis that is one placement:
// Shard(dim), Replicate or Partial(sum) (see placement()).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "tessera/base/error.h"
#include "tessera/base/shape.h"
#include "tessera/spmd/mesh.h"

namespace tessera::spmd {

// Thrown where a layout cannot be derived or is invalid (names the op, the array,
// the dimension and the mesh axis).
class ShardingError : public Error {
 public:
  using Error::Error;
};

// Several mesh axes splitting one dimension.
using Axes = std::vector<std::string>;
struct NoneType {};
inline constexpr NoneType None{};

struct PartitionSpec {
  std::vector<Axes> dims;  // empty Axes: not split
  // "P('data', None, ('a', 'b'))" (trailing Nones dropped).
  std::string to_string() const;
  bool operator==(const PartitionSpec& o) const;
};

namespace detail {
inline Axes spec_entry(NoneType) { return {}; }
inline Axes spec_entry(const char* axis) { return {axis}; }
inline Axes spec_entry(const std::string& axis) { return {axis}; }
inline Axes spec_entry(const Axes& axes) { return axes; }
}  // namespace detail

template <typename... Entries>
PartitionSpec P(const Entries&... entries) {
  return PartitionSpec{{detail::spec_entry(entries)...}};
}

enum class PlacementKind { Replicate, Shard, Partial };
struct Placement {
  PlacementKind kind = PlacementKind::Replicate;
  int dim = -1;  // Shard only
  bool operator==(const Placement& o) const { return kind == o.kind && dim == o.dim; }
};
// "R", "S(1)", "P".
std::string to_string(const Placement& p);

class Sharding {
 public:
  Sharding() = default;
  // Replicated on every axis of `mesh`, for an array of `rank` dims.
  static Sharding replicated(const Mesh& mesh, int rank);
  // Resolves a spec against a mesh for an array of `rank` dims. Throws ValueError
  // for an unknown axis, an axis used twice, or a spec longer than the rank;
  // `what` names the array in the message ("argument 2 (layers.0.attn.wqkv)").
  static Sharding from_spec(const Mesh& mesh, const PartitionSpec& spec, int rank, const std::string& what = "array");

  const Mesh& mesh() const { return mesh_; }
  int rank() const { return static_cast<int>(dims_.size()); }
  // Mesh axes splitting dimension `dim`, major first.
  const std::vector<int>& dim_axes(int dim) const { return dims_.at(static_cast<size_t>(dim)); }
  // Sorted mesh axes holding partial sums.
  const std::vector<int>& partial_axes() const { return partial_; }
  bool is_partial() const { return !partial_.empty(); }
  // Replicated on every mesh axis (not split, not partial).
  bool is_replicated() const;
  // The placement on mesh axis `axis`.
  Placement placement(int axis) const;
  // Dimension split by mesh axis `axis`, or -1.
  int sharded_dim(int axis) const;
  // How many shards dimension `dim` has (product of its axes' sizes).
  int64_t num_shards(int dim) const;

  // Builders (return modified copies).
  Sharding with_dim_axes(int dim, std::vector<int> axes) const;
  Sharding with_partial(std::vector<int> axes) const;
  Sharding without_partial() const { return with_partial({}); }

  // The shard's shape. Throws ShapeError naming `what`, the dimension and the axes
  // when a dimension does not divide evenly.
  Shape local_shape(const Shape& global, const std::string& what = "array") const;
  // Checks divisibility only (same errors as local_shape).
  void check_divisible(const Shape& global, const std::string& what = "array") const;
  // Start index of `device`'s shard along every dimension.
  std::vector<int64_t> shard_offsets(const Shape& global, int device) const;
  // The shard index of `device` along dimension `dim` (0 .. num_shards(dim)-1).
  int64_t shard_index(int dim, int device) const;

  PartitionSpec spec() const;
  // "P('data', None)" plus " partial(model)" when partial; "replicated" when nothing is split.
  std::string to_string() const;
  bool operator==(const Sharding& o) const { return mesh_ == o.mesh_ && dims_ == o.dims_ && partial_ == o.partial_; }
  bool operator!=(const Sharding& o) const { return !(*this == o); }

 private:
  Mesh mesh_;
  std::vector<std::vector<int>> dims_;
  std::vector<int> partial_;
};

// The user-facing pair (jax.sharding.NamedSharding).
class NamedSharding {
 public:
  NamedSharding() = default;
  NamedSharding(Mesh mesh, PartitionSpec spec) : mesh_(std::move(mesh)), spec_(std::move(spec)) {}
  const Mesh& mesh() const { return mesh_; }
  const PartitionSpec& spec() const { return spec_; }
  Sharding resolve(int rank, const std::string& what = "array") const {
    return Sharding::from_spec(mesh_, spec_, rank, what);
  }
  std::string to_string() const { return "NamedSharding(mesh=" + mesh_.to_string() + ", " + spec_.to_string() + ")"; }

 private:
  Mesh mesh_;
  PartitionSpec spec_;
};

}  // namespace tessera::spmd
