#include "tessera/nn/logical_sharding.h"

#include <algorithm>
#include <memory>

#include "core/trace_state.h"
#include "tessera/base/error.h"
#include "tessera/core/ops.h"
#include "tessera/spmd/api.h"

namespace tessera::nn {

namespace {
thread_local const LogicalShardingScope* t_active = nullptr;
}  // namespace

spmd::PartitionSpec logical_spec(const spmd::Mesh& mesh, const LogicalRules& rules, const AxisNames& axes) {
  spmd::PartitionSpec spec;
  std::vector<std::string> used;
  for (const std::string& name : axes) {
    spmd::Axes dim;
    auto it = rules.find(name);
    if (it != rules.end())
      for (const std::string& a : it->second) {
        if (!mesh.has_axis(a) || mesh.axis_size(a) == 1) continue;
        if (std::find(used.begin(), used.end(), a) != used.end()) continue;
        dim.push_back(a);
        used.push_back(a);
      }
    spec.dims.push_back(dim);
  }
  return spec;
}

LogicalShardingScope::LogicalShardingScope(const spmd::Mesh& mesh, const LogicalRules& rules)
    : previous_(t_active), mesh_(mesh), rules_(rules) {
  t_active = this;
}

LogicalShardingScope::~LogicalShardingScope() { t_active = static_cast<const LogicalShardingScope*>(previous_); }

Array with_logical_constraint(const Array& x, const AxisNames& axes) {
  if (t_active == nullptr || t_active->mesh_.size() == 1 || !tessera::detail::tracing()) return x;
  if (static_cast<int>(axes.size()) != x.ndim())
    fail<ShapeError>("with_logical_constraint: {} axis names for a {}-d value {}", axes.size(), x.ndim(),
                     tessera::to_string(x.shape()));
  const spmd::Sharding s =
      spmd::Sharding::from_spec(t_active->mesh_, logical_spec(t_active->mesh_, t_active->rules_, axes), x.ndim());
  for (int d = 0; d < x.ndim(); ++d)
    if (x.shape(d) % s.num_shards(d) != 0) return x;
  return Array::make(x.shape(), x.dtype(), std::make_shared<spmd::ShardingConstraint>(s), {x});
}

int64_t logical_axis_size(const std::string& name) {
  int64_t n = 1;
  for (const std::string& a : logical_axis_names(name)) n *= t_active->mesh_.axis_size(a);
  return n;
}

std::vector<std::string> logical_axis_names(const std::string& name) {
  if (t_active == nullptr) return {};
  return logical_spec(t_active->mesh_, t_active->rules_, {name}).dims.front();
}

}  // namespace tessera::nn
