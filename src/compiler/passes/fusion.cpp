// FusionPass (see the header): group formation, the cycle check, and the rewrite
// of each group into one Fusion node.
#include "tessera/compiler/passes/fusion.h"

#include <algorithm>
#include <functional>
#include <map>
#include <queue>
#include <string>
#include <vector>

#include "tessera/compiler/passes/remat.h"
#include "tessera/ir/primitives/elementwise.h"
#include "tessera/ir/primitives/fusion.h"
#include "tessera/ir/primitives/layout.h"
#include "tessera/ir/primitives/reduce.h"

namespace tessera::compiler {
namespace {

bool is_elementwise(const Node& node) {
  if (node.dead || node.outputs.size() != 1 || !fusable_after_remat(node)) return false;
  const Primitive* p = node.primitive.get();
  return dynamic_cast<const Unary*>(p) || dynamic_cast<const Binary*>(p) || dynamic_cast<const Where*>(p) ||
         dynamic_cast<const Cast*>(p);
}

class Fuser {
 public:
  Fuser(Graph& graph, FusionPass::Options options) : g_(graph), options_(options) {}

  void run() {
    const int n = static_cast<int>(g_.nodes.size());
    group_of_.assign(n, -1);
    if (options_.elementwise)
      form_groups();
    else
      for (int i = 0; i < n; ++i)
        if (is_elementwise(g_.nodes[i])) new_group(i);
    users_ = g_.users();
    std::vector<Plan> plans;
    for (size_t gi = 0; gi < groups_.size(); ++gi) {
      if (groups_[gi].empty()) continue;
      Plan plan = plan_group(static_cast<int>(gi));
      if (options_.reductions) try_fold_reduce(plan);
      if (plan.ops < 2 && plan.reduce_node < 0) continue;
      plans.push_back(std::move(plan));
    }
    drop_cyclic_plans(plans);
    if (plans.empty()) return;
    // Insert from the back, so that earlier positions stay valid.
    std::sort(plans.begin(), plans.end(), [](const Plan& a, const Plan& b) { return a.position > b.position; });
    for (Plan& plan : plans) rewrite(plan);
    erase_unused_broadcasts();
    restore_order();
    g_.compact();
  }

 private:
  struct Plan {
    std::vector<int> members;  // schedule order
    Shape shape;
    int ops = 0;
    std::vector<ValueId> outputs;  // member values read outside the group
    int reduce_node = -1;
    int position = 0;  // the node the Fusion replaces in the schedule (last member or the reduce)
  };

  // The value a member reads for input `v`: broadcast_to nodes are read through.
  ValueId effective_input(ValueId v) const {
    for (;;) {
      const Node* p = g_.producer(v);
      if (p == nullptr || p->dead || !dynamic_cast<const BroadcastTo*>(p->primitive.get())) return v;
      v = p->inputs[0];
    }
  }

  int producer_index(ValueId v) const {
    const Value& value = g_.value(v);
    if (value.kind != ValueKind::NodeOutput || g_.nodes[value.node].dead) return -1;
    return value.node;
  }

  int new_group(int node) {
    groups_.push_back({node});
    group_shape_.push_back(g_.type(g_.nodes[node].outputs[0]).shape);
    group_of_[node] = static_cast<int>(groups_.size()) - 1;
    return group_of_[node];
  }

  void form_groups() {
    const int n = static_cast<int>(g_.nodes.size());
    for (int i = 0; i < n; ++i) {
      const Node& node = g_.nodes[i];
      if (!is_elementwise(node)) continue;
      const Shape& shape = g_.type(node.outputs[0]).shape;
      std::vector<int> candidates;
      for (ValueId in : node.inputs) {
        int p = producer_index(effective_input(in));
        if (p < 0 || group_of_[p] < 0) continue;
        int gi = group_of_[p];
        if (group_shape_[gi] != shape || g_.nodes[groups_[gi][0]].remat_region != node.remat_region) continue;
        if (std::find(candidates.begin(), candidates.end(), gi) == candidates.end()) candidates.push_back(gi);
      }
      // All candidate groups at once, else the first one that does not close a cycle.
      std::vector<std::vector<int>> tries;
      if (candidates.size() > 1) tries.push_back(candidates);
      for (int c : candidates) tries.push_back({c});
      bool merged = false;
      for (const auto& t : tries) {
        std::vector<int> set{i};
        for (int gi : t) set.insert(set.end(), groups_[gi].begin(), groups_[gi].end());
        if (creates_cycle(set)) continue;
        const int target = t[0];
        for (size_t k = 1; k < t.size(); ++k) {
          for (int m : groups_[t[k]]) group_of_[m] = target;
          groups_[target].insert(groups_[target].end(), groups_[t[k]].begin(), groups_[t[k]].end());
          groups_[t[k]].clear();
        }
        groups_[target].push_back(i);
        group_of_[i] = target;
        std::sort(groups_[target].begin(), groups_[target].end());
        merged = true;
        break;
      }
      if (!merged) new_group(i);
    }
  }

  // Would fusing `set` into one node create a cycle? True when a member reads an
  // outside node that (transitively) reads a member.
  bool creates_cycle(const std::vector<int>& set) const {
    const int lo = *std::min_element(set.begin(), set.end());
    std::vector<char> in_set(g_.nodes.size(), 0), seen(g_.nodes.size(), 0);
    for (int m : set) in_set[m] = 1;
    std::vector<int> stack;
    for (int m : set)
      for (ValueId in : g_.nodes[m].inputs) {
        int p = producer_index(effective_input(in));
        if (p >= 0 && !in_set[p] && !seen[p]) {
          seen[p] = 1;
          stack.push_back(p);
        }
      }
    while (!stack.empty()) {
      const int x = stack.back();
      stack.pop_back();
      for (ValueId in : g_.nodes[x].inputs) {
        int p = producer_index(in);
        if (p < 0 || p < lo || seen[p]) continue;
        if (in_set[p]) return true;
        seen[p] = 1;
        stack.push_back(p);
      }
    }
    return false;
  }

  Plan plan_group(int gi) const {
    Plan plan;
    plan.members = groups_[gi];
    plan.shape = group_shape_[gi];
    plan.ops = static_cast<int>(plan.members.size());
    plan.position = plan.members.back();
    std::vector<char> in_group(g_.nodes.size(), 0);
    for (int m : plan.members) in_group[m] = 1;
    for (int m : plan.members) {
      const ValueId v = g_.nodes[m].outputs[0];
      bool outside = std::find(g_.outputs.begin(), g_.outputs.end(), v) != g_.outputs.end();
      for (int u : users_[v]) outside = outside || !in_group[u];
      if (outside) plan.outputs.push_back(v);
    }
    return plan;
  }

  // Each group is convex on its own, but two fused groups can still need each other
  // (group A feeds an outside op that feeds group B, and B feeds one that feeds A):
  // contracted, the graph would have a cycle. Kahn's algorithm over the contracted
  // graph finds the groups stuck on a cycle; the last-scheduled of them is left
  // unfused, until none is.
  void drop_cyclic_plans(std::vector<Plan>& plans) const {
    const int n = static_cast<int>(g_.nodes.size());
    for (;;) {
      std::vector<int> vertex(n);
      for (int i = 0; i < n; ++i) vertex[i] = static_cast<int>(plans.size()) + i;
      for (size_t p = 0; p < plans.size(); ++p) {
        for (int m : plans[p].members) vertex[m] = static_cast<int>(p);
        if (plans[p].reduce_node >= 0) vertex[plans[p].reduce_node] = static_cast<int>(p);
      }
      const int vertices = static_cast<int>(plans.size()) + n;
      std::vector<int> producer(g_.values.size(), -1);
      for (int i = 0; i < n; ++i)
        if (!g_.nodes[i].dead)
          for (ValueId out : g_.nodes[i].outputs) producer[out] = i;
      std::vector<std::vector<int>> next(vertices);
      std::vector<int> pending(vertices, 0);
      std::vector<char> present(vertices, 0);
      for (int i = 0; i < n; ++i) {
        if (g_.nodes[i].dead) continue;
        present[vertex[i]] = 1;
        for (ValueId in : g_.nodes[i].inputs) {
          const int p = producer[in];
          if (p < 0 || vertex[p] == vertex[i]) continue;
          next[vertex[p]].push_back(vertex[i]);
          ++pending[vertex[i]];
        }
      }
      std::vector<int> ready;
      for (int v = 0; v < vertices; ++v)
        if (present[v] && pending[v] == 0) ready.push_back(v);
      while (!ready.empty()) {
        const int v = ready.back();
        ready.pop_back();
        for (int w : next[v])
          if (--pending[w] == 0) ready.push_back(w);
      }
      int stuck = -1;
      for (size_t p = 0; p < plans.size(); ++p)
        if (pending[p] > 0 && (stuck < 0 || plans[p].position > plans[static_cast<size_t>(stuck)].position))
          stuck = static_cast<int>(p);
      if (stuck < 0) return;
      plans.erase(plans.begin() + stuck);
    }
  }

  // A group whose only outside value feeds one trailing-axes sum/max becomes a fused
  // reduction (the Reduce node is absorbed).
  void try_fold_reduce(Plan& plan) const {
    if (plan.outputs.size() != 1) return;
    const ValueId v = plan.outputs[0];
    if (std::find(g_.outputs.begin(), g_.outputs.end(), v) != g_.outputs.end() || users_[v].size() != 1) return;
    const int r = users_[v][0];
    const Node& node = g_.nodes[r];
    const auto* reduce = dynamic_cast<const Reduce*>(node.primitive.get());
    if (!reduce || node.inputs.size() != 1 || !fusable_after_remat(node) ||
        node.remat_region != g_.nodes[plan.members.back()].remat_region)
      return;
    if (reduce->kind() != ReduceKind::Sum && reduce->kind() != ReduceKind::Max) return;
    const auto& axes = reduce->axes();
    const int nd = static_cast<int>(plan.shape.size());
    if (axes.empty()) return;
    for (size_t i = 0; i < axes.size(); ++i)
      if (axes[i] != nd - static_cast<int>(axes.size() - i)) return;
    if (g_.type(v).dtype == DType::Bool) return;
    plan.reduce_node = r;
    plan.position = r;
  }

  void rewrite(const Plan& plan) {
    FusionProgram program;
    program.shape = plan.shape;
    std::map<ValueId, int> reg;
    std::vector<ValueId> inputs;
    auto operand = [&](ValueId in) {
      const ValueId v = effective_input(in);
      auto it = reg.find(v);
      if (it != reg.end()) return it->second;
      // Every outside value was made an input above; members precede their readers.
      fail<Error>("fusion pass: value %{} was not collected as an input", v);
    };
    std::vector<char> in_group(g_.nodes.size(), 0);
    for (int m : plan.members) in_group[m] = 1;
    for (int m : plan.members)
      for (ValueId in : g_.nodes[m].inputs) {
        const ValueId v = effective_input(in);
        const int p = producer_index(v);
        if ((p >= 0 && in_group[p]) || reg.count(v)) continue;
        reg[v] = static_cast<int>(inputs.size());
        inputs.push_back(v);
        program.inputs.push_back({g_.type(v).shape, g_.type(v).dtype});
      }
    for (int m : plan.members) {
      const Node& node = g_.nodes[m];
      const Primitive* p = node.primitive.get();
      int r = -1;
      if (auto* u = dynamic_cast<const Unary*>(p)) {
        r = program.add_unary(u->kind(), operand(node.inputs[0]));
      } else if (auto* b = dynamic_cast<const Binary*>(p)) {
        r = program.add_binary(b->kind(), operand(node.inputs[0]), operand(node.inputs[1]));
      } else if (dynamic_cast<const Where*>(p)) {
        r = program.add_where(operand(node.inputs[0]), operand(node.inputs[1]), operand(node.inputs[2]));
      } else {
        r = program.add_convert(operand(node.inputs[0]), g_.type(node.outputs[0]).dtype);
      }
      reg[node.outputs[0]] = r;
    }
    for (ValueId v : plan.outputs) program.outputs.push_back(reg.at(v));
    std::vector<TensorType> types;
    std::vector<ValueId> replaced;
    if (plan.reduce_node >= 0) {
      const Node& rnode = g_.nodes[plan.reduce_node];
      const auto* reduce = dynamic_cast<const Reduce*>(rnode.primitive.get());
      program.reduce = reduce->kind();
      program.reduce_axes = reduce->axes();
      types.push_back(g_.type(rnode.outputs[0]));
      replaced.push_back(rnode.outputs[0]);
    } else {
      for (ValueId v : plan.outputs) types.push_back(g_.type(v));
      replaced = plan.outputs;
    }
    const int region = g_.nodes[plan.position].remat_region;
    const std::string remat_name = g_.nodes[plan.position].remat_name;  // a clone's stays one (remat.h)
    auto outs = g_.insert_node(plan.position + 1, std::make_shared<Fusion>(std::move(program)), inputs, types);
    g_.nodes[plan.position + 1].remat_region = region;
    g_.nodes[plan.position + 1].remat_name = remat_name;
    for (int m : plan.members) g_.erase_node(m);
    if (plan.reduce_node >= 0) g_.erase_node(plan.reduce_node);
    for (size_t j = 0; j < outs.size(); ++j) g_.replace_uses(replaced[j], outs[j]);
  }

  // Broadcasts that were read through and have no readers left.
  void erase_unused_broadcasts() {
    auto users = g_.users();
    for (int n = static_cast<int>(g_.nodes.size()) - 1; n >= 0; --n) {
      Node& node = g_.nodes[n];
      if (node.dead || !dynamic_cast<const BroadcastTo*>(node.primitive.get())) continue;
      const ValueId v = node.outputs[0];
      if (!users[v].empty() || std::find(g_.outputs.begin(), g_.outputs.end(), v) != g_.outputs.end()) continue;
      g_.erase_node(n);
      for (ValueId in : node.inputs) std::erase(users[in], n);
    }
  }

  // A Fusion sits where its last member was; an outside reader of an earlier member may
  // now come before it. Reorders stably (by current position) into a valid order.
  void restore_order() {
    const int n = static_cast<int>(g_.nodes.size());
    std::vector<int> producer_of(g_.values.size(), -1);
    for (int i = 0; i < n; ++i)
      if (!g_.nodes[i].dead)
        for (ValueId out : g_.nodes[i].outputs) producer_of[out] = i;
    bool ordered = true;
    for (int i = 0; i < n && ordered; ++i)
      if (!g_.nodes[i].dead)
        for (ValueId in : g_.nodes[i].inputs) ordered = ordered && producer_of[in] < i;
    if (ordered) return;
    std::vector<int> pending(n, 0);
    std::vector<std::vector<int>> readers(n);
    for (int i = 0; i < n; ++i) {
      if (g_.nodes[i].dead) continue;
      for (ValueId in : g_.nodes[i].inputs)
        if (producer_of[in] >= 0) {
          ++pending[i];
          readers[producer_of[in]].push_back(i);
        }
    }
    std::priority_queue<int, std::vector<int>, std::greater<>> ready;
    for (int i = 0; i < n; ++i)
      if (!g_.nodes[i].dead && pending[i] == 0) ready.push(i);
    std::vector<Node> order;
    while (!ready.empty()) {
      const int i = ready.top();
      ready.pop();
      order.push_back(std::move(g_.nodes[i]));
      for (int r : readers[i])
        if (--pending[r] == 0) ready.push(r);
    }
    g_.nodes = std::move(order);  // compact() renumbers the values' producers
  }

  Graph& g_;
  FusionPass::Options options_;
  std::vector<int> group_of_;
  std::vector<std::vector<int>> groups_;
  std::vector<Shape> group_shape_;
  std::vector<std::vector<int>> users_;
};

}  // namespace

void FusionPass::run(Graph& graph) { Fuser(graph, options_).run(); }

}  // namespace tessera::compiler
