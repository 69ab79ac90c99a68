// Sharding rules: how one primitive runs on sharded operands.
//
// Given the shardings its inputs arrive with, a rule decides
//   * the sharding each input must have (the partitioner reshards to it, inserting
//     collectives from the resharding table, see reshard.h),
//   * the sharding of each output,
//   * the primitive to run on the local shards (null: the same primitive; ops whose
//     attributes hold shapes, e.g. reshape, get local attributes),
//   * or, for ops that need communication inside (vocab-parallel cross-entropy,
//     vocab-parallel embedding), an `expand` function that writes the local
//     computation with ops and collective builders.
// Rules are deterministic functions of the primitive and the input shardings.
// Where the right layout cannot be derived (two operands split the same mesh axis
// over different dimensions), a rule throws ShardingError asking for an explicit
// with_sharding_constraint, never guesses.
//
// Every primitive gets its rule from the registry (register_sharding_rule; the
// built-in rules are in rules_*.cpp), keyed by Primitive::sharding_rule_key(), which
// is the primitive's name unless it names its own rule.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tessera/base/error.h"
#include "tessera/compiler/graph.h"
#include "tessera/spmd/sharding.h"

namespace tessera {

class ShardingRule {
 public:
  virtual ~ShardingRule() = default;
  struct Context {
    const Primitive& primitive;
    const spmd::Mesh& mesh;
    std::vector<compiler::TensorType> in_types;   // global
    std::vector<compiler::TensorType> out_types;  // global
    std::vector<spmd::Sharding> in;               // as the inputs arrive
    std::string where;                            // "%12 = matmul(%3, %7)" for messages
  };
  struct Decision {
    std::vector<spmd::Sharding> inputs;
    std::vector<spmd::Sharding> outputs;
    PrimitivePtr local;  // null: the same primitive on local shapes
    // Optional: the local computation (local input arrays -> local outputs).
    std::function<std::vector<Array>(const std::vector<Array>& local_inputs)> expand;
  };
  virtual Decision decide(const Context& context) const = 0;
};

}  // namespace tessera

namespace tessera::spmd {

void register_sharding_rule(const std::string& primitive_name, std::shared_ptr<const ShardingRule> rule);
// The rule registered under primitive.sharding_rule_key(), else nullptr.
const ShardingRule* find_sharding_rule(const Primitive& primitive);
// Every key with a registered rule, sorted (the op-coverage test walks it).
std::vector<std::string> sharding_rule_keys();
// (The primitives that deliberately have none, each with the reason, are the rows of
// ir/primitive_table.h with no_sharding_rule: the partitioner asks for a sharding
// constraint around them.)

// Helpers for rules.
namespace rules {
// The output layout of an elementwise op over `inputs` (numpy broadcasting): their
// splits merged from the largest operand down; a smaller operand whose split conflicts
// is left to be gathered, equal-sized operands that conflict throw ShardingError naming
// `where`. Partial axes survive only when `keep_partial` and every input is partial
// on the same axes.
Sharding elementwise_target(const ShardingRule::Context& c, const std::vector<int>& inputs, bool keep_partial);
// `s` with the listed dims whole (their axes freed) and no partial sums: what an op
// that reduces or normalizes over those dims needs.
Sharding gathered(const Sharding& s, const std::vector<int>& dims);
}  // namespace rules

}  // namespace tessera::spmd
