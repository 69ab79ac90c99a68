#include "tessera/spmd/sharding_rule.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <optional>

#include "spmd/rules.h"
#include "tessera/ir/primitive_table.h"

namespace tessera::spmd {

namespace {

class FunctionRule : public ShardingRule {
 public:
  explicit FunctionRule(rules::RuleFn fn) : fn_(std::move(fn)) {}
  Decision decide(const Context& context) const override { return fn_(context); }

 private:
  rules::RuleFn fn_;
};

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, std::shared_ptr<const ShardingRule>>& registry() {
  static std::map<std::string, std::shared_ptr<const ShardingRule>> r;
  return r;
}

// The family whose rules are being registered (set only inside register_builtins).
std::optional<OpFamily> g_registering;

void register_builtins() {
  static std::once_flag once;
  std::call_once(once, [] {
    const std::pair<OpFamily, void (*)()> families[] = {
        {OpFamily::Elementwise, rules::register_elementwise}, {OpFamily::Layout, rules::register_layout},
        {OpFamily::Linalg, rules::register_linalg},           {OpFamily::Reduce, rules::register_reduce},
        {OpFamily::Indexing, rules::register_indexing},       {OpFamily::Nn, rules::register_nn},
        {OpFamily::Attention, rules::register_attention},     {OpFamily::Optim, rules::register_optim}};
    for (const auto& [family, register_family] : families) {
      g_registering = family;
      register_family();
    }
    g_registering.reset();
  });
}

}  // namespace

void register_sharding_rule(const std::string& primitive_name, std::shared_ptr<const ShardingRule> rule) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry()[primitive_name] = std::move(rule);
}

const ShardingRule* find_sharding_rule(const Primitive& primitive) {
  register_builtins();
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto it = registry().find(primitive.sharding_rule_key());
  return it == registry().end() ? rules::custom_op_rule(primitive) : it->second.get();
}

std::vector<std::string> sharding_rule_keys() {
  register_builtins();
  std::lock_guard<std::mutex> lock(registry_mutex());
  std::vector<std::string> keys;
  for (const auto& [key, rule] : registry()) keys.push_back(key);
  return keys;
}

namespace rules {

void add(const std::string& primitive_name, RuleFn fn) {
  if (!g_registering) fail<Error>("rules::add('{}') outside a family's registration", primitive_name);
  check_registration(primitive_name, *g_registering, OpProvider::ShardingRule);
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry()[primitive_name] = std::make_shared<FunctionRule>(std::move(fn));
}

void fail_rule(const Context& c, const std::string& message) {
  fail<ShardingError>("sharding {}: {}; pin the layout with with_sharding_constraint", c.where, message);
}

Sharding gathered(const Sharding& s, const std::vector<int>& dims) {
  Sharding out = s.without_partial();
  for (int d : dims) out = out.with_dim_axes(d, {});
  return out;
}

Decision same_everywhere(const Context& c, const Sharding& out) {
  Decision d;
  d.inputs = c.in;
  d.outputs.assign(c.out_types.size(), out);
  return d;
}

}  // namespace rules

Sharding rules::elementwise_target(const ShardingRule::Context& c, const std::vector<int>& inputs, bool keep_partial) {
  const Shape& out = c.out_types.at(0).shape;
  int rank = static_cast<int>(out.size());
  Sharding target = Sharding::replicated(c.mesh, rank);
  // The largest operand's layout wins: operands are merged from the largest down, and
  // a smaller operand (a broadcast bias, a parameter) whose split conflicts with the
  // layout so far is gathered on that axis. Equal-sized operands that conflict are an
  // error: no layout is better than the other.
  std::vector<int> order = inputs;
  auto size_of = [&](int i) { return numel(c.in_types.at(static_cast<size_t>(i)).shape); };
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return size_of(a) > size_of(b); });
  std::vector<int> axis_dim(static_cast<size_t>(c.mesh.ndim()), -1);
  std::vector<int64_t> dim_owner_size(static_cast<size_t>(rank), 0);
  for (int i : order) {
    const Shape& in = c.in_types.at(static_cast<size_t>(i)).shape;
    const Sharding& s = c.in.at(static_cast<size_t>(i));
    int offset = rank - static_cast<int>(in.size());
    for (int di = 0; di < static_cast<int>(in.size()); ++di) {
      const std::vector<int>& axes = s.dim_axes(di);
      if (axes.empty() || in[static_cast<size_t>(di)] != out[static_cast<size_t>(di + offset)]) continue;
      int d = di + offset;
      const std::vector<int>& have = target.dim_axes(d);
      bool conflict = false;
      if (have.empty()) {
        for (int a : axes) conflict = conflict || (axis_dim[static_cast<size_t>(a)] >= 0);
      } else if (have != axes) {
        bool prefix = axes.size() <= have.size() && std::equal(axes.begin(), axes.end(), have.begin());
        conflict = !prefix;
      } else {
        continue;
      }
      if (!conflict) {
        if (have.empty()) {
          target = target.with_dim_axes(d, axes);
          for (int a : axes) axis_dim[static_cast<size_t>(a)] = d;
          dim_owner_size[static_cast<size_t>(d)] = size_of(i);
        }
        continue;
      }
      int64_t owner = 0;
      for (int a : axes)
        if (axis_dim[static_cast<size_t>(a)] >= 0)
          owner = std::max(owner, dim_owner_size[static_cast<size_t>(axis_dim[static_cast<size_t>(a)])]);
      owner = std::max(owner, dim_owner_size[static_cast<size_t>(d)]);
      if (size_of(i) >= owner)
        fail_rule(c, fmt::format("operands of equal size split the output differently (operand {} is {}, the others "
                                 "give {})",
                                 i, s.to_string(), target.to_string()));
      // This smaller operand is gathered on the conflicting axes (project() leaves them out).
    }
  }
  if (keep_partial && !inputs.empty()) {
    std::vector<int> partial = c.in.at(static_cast<size_t>(inputs[0])).partial_axes();
    for (int i : inputs)
      if (c.in.at(static_cast<size_t>(i)).partial_axes() != partial) partial.clear();
    target = target.with_partial(partial);
  }
  return target;
}

}  // namespace tessera::spmd
