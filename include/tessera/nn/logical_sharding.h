// Activations annotated with logical axis names (MaxText's nn.with_logical_constraint):
// the model says what a dimension is ("experts", "moe_groups", ...), the training layout
// says which mesh axes that splits over. While a LogicalShardingScope is active on this
// thread (TrainStep and the Evaluator trace their programs inside one when the layout has
// several devices), with_logical_constraint pins a traced value to that layout, so the
// partitioner reshards into it (an all-to-all when a split moves from one dimension to
// another); without a scope it is the identity.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "tessera/core/array.h"
#include "tessera/nn/param.h"
#include "tessera/spmd/mesh.h"
#include "tessera/spmd/sharding.h"

namespace tessera::nn {

// Logical axis -> mesh axes (major first): train::AxisRules.
using LogicalRules = std::map<std::string, std::vector<std::string>>;

// The split of each dimension: the rules' mesh axes for its logical name, skipping axes
// absent from the mesh, of size 1, or used by an earlier dimension ("" or an unknown
// name: not split).
spmd::PartitionSpec logical_spec(const spmd::Mesh& mesh, const LogicalRules& rules, const AxisNames& axes);

class LogicalShardingScope {
 public:
  // Holds references: `mesh` and `rules` must outlive the scope (a TrainStep's layout
  // does; the scope is made per step, so it copies nothing).
  LogicalShardingScope(const spmd::Mesh& mesh, const LogicalRules& rules);
  ~LogicalShardingScope();
  LogicalShardingScope(const LogicalShardingScope&) = delete;
  LogicalShardingScope& operator=(const LogicalShardingScope&) = delete;

 private:
  const void* previous_;
  const spmd::Mesh& mesh_;
  const LogicalRules& rules_;
  friend Array with_logical_constraint(const Array& x, const AxisNames& axes);
  friend int64_t logical_axis_size(const std::string& name);
  friend std::vector<std::string> logical_axis_names(const std::string& name);
};

// x pinned to its logical axes' layout while tracing inside a scope; the identity
// otherwise, and where the split does not divide x's shape (left to propagation).
Array with_logical_constraint(const Array& x, const AxisNames& axes);

// The number of devices the logical axis `name` splits over in the active scope (1
// without a scope).
int64_t logical_axis_size(const std::string& name);
// The mesh axes it splits over there, major first (empty without a scope).
std::vector<std::string> logical_axis_names(const std::string& name);

}  // namespace tessera::nn
