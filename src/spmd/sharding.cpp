#include "tessera/spmd/sharding.h"

#include <fmt/format.h>

#include <algorithm>

#include "tessera/base/error.h"

namespace tessera::spmd {

namespace {

std::string axes_text(const Mesh& mesh, const std::vector<int>& axes) {
  std::string s;
  for (size_t i = 0; i < axes.size(); ++i) s += (i ? "," : "") + mesh.axis_name(axes[i]);
  return s;
}

std::string entry_text(const Axes& axes) {
  if (axes.empty()) return "None";
  if (axes.size() == 1) return "'" + axes[0] + "'";
  std::string s = "(";
  for (size_t i = 0; i < axes.size(); ++i) s += (i ? ", '" : "'") + axes[i] + "'";
  return s + ")";
}

}  // namespace

std::string PartitionSpec::to_string() const {
  size_t n = dims.size();
  while (n > 0 && dims[n - 1].empty()) --n;
  std::string s = "P(";
  for (size_t i = 0; i < n; ++i) s += (i ? ", " : "") + entry_text(dims[i]);
  return s + ")";
}

bool PartitionSpec::operator==(const PartitionSpec& o) const {
  size_t n = std::max(dims.size(), o.dims.size());
  for (size_t i = 0; i < n; ++i) {
    Axes a = i < dims.size() ? dims[i] : Axes{};
    Axes b = i < o.dims.size() ? o.dims[i] : Axes{};
    if (a != b) return false;
  }
  return true;
}

std::string to_string(const Placement& p) {
  switch (p.kind) {
    case PlacementKind::Replicate:
      return "R";
    case PlacementKind::Shard:
      return fmt::format("S({})", p.dim);
    case PlacementKind::Partial:
      return "P";
  }
  return "?";
}

Sharding Sharding::replicated(const Mesh& mesh, int rank) {
  Sharding s;
  s.mesh_ = mesh;
  s.dims_.assign(static_cast<size_t>(rank), {});
  return s;
}

Sharding Sharding::from_spec(const Mesh& mesh, const PartitionSpec& spec, int rank, const std::string& what) {
  if (static_cast<int>(spec.dims.size()) > rank) {
    // Trailing Nones beyond the rank are harmless; a split dimension that does not exist is not.
    for (size_t d = static_cast<size_t>(rank); d < spec.dims.size(); ++d)
      if (!spec.dims[d].empty())
        fail<ValueError>("{}: sharding {} has {} entries but the array has rank {}", what, spec.to_string(),
                         spec.dims.size(), rank);
  }
  Sharding s = replicated(mesh, rank);
  std::vector<int> used(static_cast<size_t>(mesh.ndim()), -1);
  for (size_t d = 0; d < spec.dims.size() && static_cast<int>(d) < rank; ++d) {
    for (const std::string& name : spec.dims[d]) {
      if (!mesh.has_axis(name))
        fail<ValueError>("{}: sharding {} names mesh axis '{}' but mesh {} has no such axis", what, spec.to_string(),
                         name, mesh.to_string());
      int a = mesh.axis_index(name);
      if (used[static_cast<size_t>(a)] >= 0)
        fail<ValueError>(
            "{}: sharding {} uses mesh axis '{}' twice (dimensions {} and {}); an axis splits at most one "
            "dimension",
            what, spec.to_string(), name, used[static_cast<size_t>(a)], d);
      used[static_cast<size_t>(a)] = static_cast<int>(d);
      s.dims_[d].push_back(a);
    }
  }
  return s;
}

bool Sharding::is_replicated() const {
  if (!partial_.empty()) return false;
  for (const auto& d : dims_)
    if (!d.empty()) return false;
  return true;
}

int Sharding::sharded_dim(int axis) const {
  for (size_t d = 0; d < dims_.size(); ++d)
    for (int a : dims_[d])
      if (a == axis) return static_cast<int>(d);
  return -1;
}

Placement Sharding::placement(int axis) const {
  if (std::find(partial_.begin(), partial_.end(), axis) != partial_.end()) return {PlacementKind::Partial, -1};
  int d = sharded_dim(axis);
  if (d >= 0) return {PlacementKind::Shard, d};
  return {PlacementKind::Replicate, -1};
}

int64_t Sharding::num_shards(int dim) const {
  int64_t n = 1;
  for (int a : dim_axes(dim)) n *= mesh_.axis_size(a);
  return n;
}

Sharding Sharding::with_dim_axes(int dim, std::vector<int> axes) const {
  Sharding s = *this;
  s.dims_.at(static_cast<size_t>(dim)) = std::move(axes);
  return s;
}

Sharding Sharding::with_partial(std::vector<int> axes) const {
  Sharding s = *this;
  std::sort(axes.begin(), axes.end());
  axes.erase(std::unique(axes.begin(), axes.end()), axes.end());
  s.partial_ = std::move(axes);
  return s;
}

void Sharding::check_divisible(const Shape& global, const std::string& what) const {
  if (static_cast<int>(global.size()) != rank())
    fail<ShapeError>("{}: sharding {} is for rank {} but the array has shape {}", what, to_string(), rank(),
                     tessera::to_string(global));
  for (int d = 0; d < rank(); ++d) {
    int64_t n = num_shards(d);
    if (n > 1 && global[static_cast<size_t>(d)] % n != 0)
      fail<ShapeError>(
          "{}: dimension {} of shape {} has size {}, not divisible by mesh axes '{}' ({} shards); shapes must divide "
          "evenly across their axes",
          what, d, tessera::to_string(global), global[static_cast<size_t>(d)], axes_text(mesh_, dim_axes(d)), n);
  }
}

Shape Sharding::local_shape(const Shape& global, const std::string& what) const {
  check_divisible(global, what);
  Shape local = global;
  for (int d = 0; d < rank(); ++d) local[static_cast<size_t>(d)] /= num_shards(d);
  return local;
}

int64_t Sharding::shard_index(int dim, int device) const {
  std::vector<int> c = mesh_.coords(device);
  int64_t index = 0;
  for (int a : dim_axes(dim)) index = index * mesh_.axis_size(a) + c[static_cast<size_t>(a)];
  return index;
}

std::vector<int64_t> Sharding::shard_offsets(const Shape& global, int device) const {
  Shape local = local_shape(global);
  std::vector<int64_t> offsets(global.size());
  for (int d = 0; d < rank(); ++d)
    offsets[static_cast<size_t>(d)] = shard_index(d, device) * local[static_cast<size_t>(d)];
  return offsets;
}

PartitionSpec Sharding::spec() const {
  PartitionSpec p;
  for (const auto& d : dims_) {
    Axes axes;
    for (int a : d) axes.push_back(mesh_.axis_name(a));
    p.dims.push_back(std::move(axes));
  }
  return p;
}

std::string Sharding::to_string() const {
  bool split = false;
  for (const auto& d : dims_) split = split || !d.empty();
  std::string s = split ? spec().to_string() : "replicated";
  if (!partial_.empty()) s += " partial(" + axes_text(mesh_, partial_) + ")";
  return s;
}

}  // namespace tessera::spmd
