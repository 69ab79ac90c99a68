#include "tessera/compiler/passes/remat.h"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "tessera/base/error.h"

namespace tessera::compiler {

namespace {

class RegionRematerializer {
 public:
  RegionRematerializer(Graph& graph, int region) : g_(graph), region_(region), policy_(graph.remat_regions[region]) {}

  void run() {
    // The values to recompute, ordered by their first outside reader (ties by id),
    // so a clone made for an earlier reader is defined before every later one and
    // can be shared.
    std::vector<std::vector<int>> users = g_.users();
    std::vector<std::pair<int, ValueId>> targets;
    for (size_t n = 0; n < g_.nodes.size(); ++n) {
      const Node& node = g_.nodes[n];
      if (node.dead || node.remat_region != region_) continue;
      for (ValueId out : node.outputs) {
        if (is_kept(out)) continue;
        for (int reader : users[static_cast<size_t>(out)]) {
          if (g_.nodes[static_cast<size_t>(reader)].remat_region != region_) {
            targets.emplace_back(reader, out);
            break;
          }
        }
      }
    }
    std::sort(targets.begin(), targets.end());
    for (const auto& [first_reader, value] : targets) recompute_for_outside_readers(value);
  }

 private:
  bool in_region(const Node* node) const { return node != nullptr && node->remat_region == region_; }

  // Values the policy keeps alive from the forward pass (or that are not the
  // region's at all).
  bool is_kept(ValueId v) const {
    const Node* node = g_.producer(v);
    if (!in_region(node)) return true;
    if (node->remat_name == Rematerialization::kRegionOutput) return true;
    return policy_.saves_named() && std::find(policy_.saved_names.begin(), policy_.saved_names.end(),
                                              node->remat_name) != policy_.saved_names.end();
  }

  void recompute_for_outside_readers(ValueId value) {
    // Readers are looked up afresh: earlier insertions moved node indices. Clones are
    // outside the region but never read an original that is recomputed.
    std::vector<int> readers;
    std::vector<std::vector<int>> users = g_.users();
    for (int reader : users[static_cast<size_t>(value)]) {
      if (g_.nodes[static_cast<size_t>(reader)].remat_region != region_) readers.push_back(reader);
    }
    if (readers.empty()) return;
    // Clones go right before the first reader; each insertion moves the readers down.
    int position = readers.front();
    const int before = static_cast<int>(g_.nodes.size());
    const ValueId clone = clone_chain(value, position);
    const int inserted = static_cast<int>(g_.nodes.size()) - before;
    for (int reader : readers) {
      for (ValueId& in : g_.nodes[static_cast<size_t>(reader + inserted)].inputs) {
        if (in == value) in = clone;
      }
    }
  }

  // The recomputed counterpart of v, inserting clones at `position` (advanced past
  // each insertion).
  ValueId clone_chain(ValueId v, int& position) {
    if (is_kept(v)) return v;
    auto found = clones_.find(v);
    if (found != clones_.end()) return found->second;
    const Node& original = *g_.producer(v);
    PrimitivePtr primitive = original.primitive;
    std::vector<ValueId> original_inputs = original.inputs;
    std::vector<ValueId> original_outputs = original.outputs;
    std::vector<ValueId> inputs;
    for (ValueId in : original_inputs) inputs.push_back(clone_chain(in, position));
    std::vector<TensorType> types;
    for (ValueId out : original_outputs) types.push_back(g_.type(out));
    std::vector<ValueId> outs = g_.insert_node(position, std::move(primitive), std::move(inputs), std::move(types));
    Node& inserted = g_.nodes[static_cast<size_t>(position)];
    inserted.remat_region = -1;
    inserted.remat_name = Rematerialization::kRecomputed;
    ++position;
    for (size_t i = 0; i < outs.size(); ++i) clones_[original_outputs[i]] = outs[i];
    return clones_.at(v);
  }

  Graph& g_;
  int region_;
  CheckpointPolicy policy_;
  std::map<ValueId, ValueId> clones_;
};

}  // namespace

void Rematerialization::run(Graph& graph) {
  for (size_t r = 0; r < graph.remat_regions.size(); ++r) {
    if (graph.remat_regions[r].kind == CheckpointPolicy::Kind::None) continue;
    RegionRematerializer(graph, static_cast<int>(r)).run();
  }
}

}  // namespace tessera::compiler
