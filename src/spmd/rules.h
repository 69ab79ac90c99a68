// Internal: the built-in sharding rules, one file per primitive family
// (rules_<family>.cpp), registered on first lookup (a static library would drop
// self-registering objects).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tessera/spmd/sharding_rule.h"

namespace tessera::spmd::rules {

using RuleFn = std::function<ShardingRule::Decision(const ShardingRule::Context&)>;
// Registers a built-in rule; only inside a family's register_<family>() below, which
// sharding_rule.cpp calls with the family set, so `add` checks the name against the
// primitive table (ir/primitive_table.h).
void add(const std::string& primitive_name, RuleFn fn);

void register_elementwise();
void register_layout();
void register_linalg();
void register_reduce();
void register_indexing();
void register_nn();
void register_attention();
void register_optim();

// The rule of every custom op (core/custom_op.h), from its definition; null for a
// primitive that is not one. find_sharding_rule falls back to it.
const ShardingRule* custom_op_rule(const Primitive& primitive);

// Shorthands.
using Decision = ShardingRule::Decision;
using Context = ShardingRule::Context;
[[noreturn]] void fail_rule(const Context& c, const std::string& message);
// A decision that keeps every input as it arrives and gives each output `out`.
Decision same_everywhere(const Context& c, const Sharding& out);

}  // namespace tessera::spmd::rules

namespace tessera::spmd::rules {
// target (a sharding of the output shape `out`) as input of shape `in` needs it:
// numpy broadcasting aligns dims right; dims the input broadcasts (missing or size 1)
// are not split. Partial axes are copied from target.
Sharding project(const Sharding& target, const Shape& in, const Shape& out);
}  // namespace tessera::spmd::rules
