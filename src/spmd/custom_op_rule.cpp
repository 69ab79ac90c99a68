// The sharding rule of every custom op (core/custom_op.h), read from its definition:
//   unsharded_only: every input gathered (replicated, partial sums reduced), every
//     output replicated; each device computes the whole op.
//   factors "b h q d, b h k d -> b h q d" with shardable {b, h}: a shardable factor
//     keeps the mesh axes the first input that splits it arrives with (unless another
//     factor took them); every dim of that factor, in inputs and outputs, is split the
//     same way; every other dim is gathered.
#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "spmd/rules.h"
#include "tessera/core/custom_op.h"

namespace tessera::spmd {
namespace {

class CustomOpRule : public ShardingRule {
 public:
  Decision decide(const Context& c) const override {
    const CustomOpDefinition* def = custom_op_definition(c.primitive);
    if (def == nullptr) rules::fail_rule(c, "the custom-op rule was asked about a built-in op");
    Decision d;
    if (def->sharding.is_unsharded_only()) {
      for (const auto& t : c.in_types)
        d.inputs.push_back(Sharding::replicated(c.mesh, static_cast<int>(t.shape.size())));
      for (const auto& t : c.out_types)
        d.outputs.push_back(Sharding::replicated(c.mesh, static_cast<int>(t.shape.size())));
      return d;
    }
    const std::string& spec = def->sharding.spec;
    const size_t arrow = spec.find("->");
    const auto ins = custom_op_factor_groups(def->name, spec.substr(0, arrow));
    const auto outs = custom_op_factor_groups(def->name, spec.substr(arrow + 2));
    check_ranks(c, *def, ins, c.in_types, "input");
    check_ranks(c, *def, outs, c.out_types, "output");
    const auto& shardable = def->sharding.shardable;
    auto is_shardable = [&](const std::string& f) {
      return std::find(shardable.begin(), shardable.end(), f) != shardable.end();
    };
    // Each shardable factor's size (all its dims must agree) and mesh axes.
    std::map<std::string, int64_t> size;
    std::map<std::string, std::vector<int>> axes;
    std::vector<bool> axis_taken(static_cast<size_t>(c.mesh.ndim()), false);
    auto note_sizes = [&](const auto& groups, const auto& types, const char* what) {
      for (size_t i = 0; i < groups.size(); ++i)
        for (size_t k = 0; k < groups[i].size(); ++k) {
          const std::string& f = groups[i][k];
          if (!is_shardable(f)) continue;
          int64_t n = types[i].shape[k];
          auto [it, fresh] = size.emplace(f, n);
          if (!fresh && it->second != n)
            rules::fail_rule(c, fmt::format("custom op '{}': factor '{}' is {} at {} {} dim {} but {} elsewhere",
                                            def->name, f, n, what, i, k, it->second));
        }
    };
    note_sizes(ins, c.in_types, "input");
    note_sizes(outs, c.out_types, "output");
    for (size_t i = 0; i < ins.size(); ++i)
      for (size_t k = 0; k < ins[i].size(); ++k) {
        const std::string& f = ins[i][k];
        const std::vector<int>& have = c.in[i].dim_axes(static_cast<int>(k));
        if (!is_shardable(f) || have.empty() || axes.count(f) > 0) continue;
        bool free = true;
        for (int a : have) free = free && !axis_taken[static_cast<size_t>(a)];
        if (!free) continue;  // another factor holds the axis: this dim is gathered
        axes[f] = have;
        for (int a : have) axis_taken[static_cast<size_t>(a)] = true;
      }
    auto layout = [&](const std::vector<std::string>& factors) {
      Sharding s = Sharding::replicated(c.mesh, static_cast<int>(factors.size()));
      for (size_t k = 0; k < factors.size(); ++k) {
        auto it = axes.find(factors[k]);
        if (it != axes.end()) s = s.with_dim_axes(static_cast<int>(k), it->second);
      }
      return s;
    };
    for (const auto& g : ins) d.inputs.push_back(layout(g));
    for (const auto& g : outs) d.outputs.push_back(layout(g));
    return d;
  }

 private:
  static void check_ranks(const Context& c, const CustomOpDefinition& def,
                          const std::vector<std::vector<std::string>>& groups,
                          const std::vector<compiler::TensorType>& types, const char* what) {
    if (groups.size() != types.size())
      rules::fail_rule(c, fmt::format("custom op '{}': sharding spec '{}' names {} {}s but the op has {}", def.name,
                                      def.sharding.spec, groups.size(), what, types.size()));
    for (size_t i = 0; i < groups.size(); ++i)
      if (groups[i].size() != types[i].shape.size())
        rules::fail_rule(c, fmt::format("custom op '{}': sharding spec '{}' gives {} {} {} factors but it has rank {} "
                                        "({})",
                                        def.name, def.sharding.spec, what, i, groups[i].size(), types[i].shape.size(),
                                        tessera::to_string(types[i].shape)));
  }
};

}  // namespace

const ShardingRule* rules::custom_op_rule(const Primitive& primitive) {
  static const CustomOpRule rule;
  return custom_op_definition(primitive) != nullptr ? &rule : nullptr;
}

}  // namespace tessera::spmd
