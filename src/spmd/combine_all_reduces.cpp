#include "spmd/combine_all_reduces.h"

#include <algorithm>
#include <map>
#include <queue>

#include "tessera/ir/primitives/layout.h"
#include "tessera/spmd/collectives.h"

namespace tessera::spmd {

namespace {

using compiler::Graph;
using compiler::Node;
using compiler::TensorType;
using compiler::ValueId;

// Kahn's algorithm, ties broken by current position: the nodes' order changes only
// where a combined collective must come after its last operand and before its first
// reader.
// Returns false when the graph has a cycle (some nodes never become ready).
bool restore_topological_order(Graph& g) {
  const int n = static_cast<int>(g.nodes.size());
  std::vector<int> producer(g.values.size(), -1);
  for (int i = 0; i < n; ++i)
    if (!g.nodes[i].dead)
      for (ValueId out : g.nodes[i].outputs) producer[static_cast<size_t>(out)] = i;
  std::vector<int> pending(n, 0);
  std::vector<std::vector<int>> readers(n);
  for (int i = 0; i < n; ++i) {
    if (g.nodes[i].dead) continue;
    for (ValueId in : g.nodes[i].inputs)
      if (int p = producer[static_cast<size_t>(in)]; p >= 0) {
        ++pending[i];
        readers[p].push_back(i);
      }
  }
  std::priority_queue<int, std::vector<int>, std::greater<>> ready;
  for (int i = 0; i < n; ++i)
    if (!g.nodes[i].dead && pending[i] == 0) ready.push(i);
  std::vector<Node> order;
  while (!ready.empty()) {
    const int i = ready.top();
    ready.pop();
    order.push_back(std::move(g.nodes[i]));
    for (int r : readers[i])
      if (--pending[r] == 0) ready.push(r);
  }
  size_t live = 0;
  for (const Node& node : g.nodes) live += node.dead ? 0 : 1;
  if (order.size() != live) return false;
  g.nodes = std::move(order);
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (ValueId out : g.nodes[i].outputs) g.values[static_cast<size_t>(out)].node = static_cast<int>(i);
  return true;
}

// Replaces the all-reduces producing `outputs` by one over their concatenation, placed
// after the last of them. The new nodes are built apart and spliced in with one move, and
// the uses are redirected in one pass: Graph::insert_node and Graph::replace_uses each
// walk the whole graph, which per node of a bucket made this quadratic (the planner
// prepares many large steps).
void rewrite_bucket(Graph& g, const std::vector<ValueId>& outputs) {
  std::vector<int> members;
  for (ValueId v : outputs) members.push_back(g.values[static_cast<size_t>(v)].node);
  const DType dtype = g.type(g.nodes[members[0]].inputs[0]).dtype;
  PrimitivePtr reduce = g.nodes[members[0]].primitive;
  const int at = *std::max_element(members.begin(), members.end()) + 1;
  const auto first_new_value = static_cast<ValueId>(g.values.size());
  std::vector<Node> added;
  auto add = [&](PrimitivePtr primitive, std::vector<ValueId> inputs, TensorType type) {
    compiler::Value v;
    v.type = std::move(type);
    v.kind = compiler::ValueKind::NodeOutput;
    v.node = at + static_cast<int>(added.size());
    v.output_index = 0;
    g.values.push_back(std::move(v));
    Node node;
    node.primitive = std::move(primitive);
    node.inputs = std::move(inputs);
    node.outputs = {static_cast<ValueId>(g.values.size() - 1)};
    added.push_back(std::move(node));
    return added.back().outputs[0];
  };
  std::vector<ValueId> flat;
  std::vector<int64_t> sizes;
  for (int m : members) {
    const ValueId in = g.nodes[m].inputs[0];
    const int64_t size = numel(g.type(in).shape);
    flat.push_back(add(std::make_shared<Reshape>(Shape{size}), {in}, TensorType{Shape{size}, dtype}));
    sizes.push_back(size);
  }
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  const TensorType packed{Shape{total}, dtype};
  const ValueId cat = add(std::make_shared<Concatenate>(0), flat, packed);
  const ValueId sum = add(reduce, {cat}, packed);
  std::vector<ValueId> redirect(g.values.size(), compiler::kNoValue);
  int64_t offset = 0;
  for (size_t k = 0; k < outputs.size(); ++k) {
    const TensorType out = g.type(outputs[k]);
    const ValueId piece = add(std::make_shared<Slice>(std::vector<int64_t>{offset},
                                                      std::vector<int64_t>{offset + sizes[k]}, std::vector<int64_t>{1}),
                              {sum}, TensorType{Shape{sizes[k]}, dtype});
    redirect[static_cast<size_t>(outputs[k])] = add(std::make_shared<Reshape>(out.shape), {piece}, out);
    offset += sizes[k];
  }
  // The nodes from `at` on move down past the new ones.
  const auto count = static_cast<int>(added.size());
  for (ValueId v = 0; v < first_new_value; ++v) {
    compiler::Value& value = g.values[static_cast<size_t>(v)];
    if (value.kind == compiler::ValueKind::NodeOutput && value.node >= at) value.node += count;
  }
  g.nodes.insert(g.nodes.begin() + at, std::make_move_iterator(added.begin()), std::make_move_iterator(added.end()));
  auto redirected = [&](ValueId v) {
    const auto i = static_cast<size_t>(v);
    return i < redirect.size() && redirect[i] != compiler::kNoValue ? redirect[i] : v;
  };
  for (Node& node : g.nodes) {
    if (node.dead) continue;
    for (ValueId& in : node.inputs) in = redirected(in);
  }
  for (ValueId& out : g.outputs) out = redirected(out);
  for (int m : members) g.erase_node(m);  // before `at`: not renumbered
}

}  // namespace

int combine_all_reduces(Graph& g, size_t max_operand_bytes, size_t max_bucket_bytes) {
  const int n = static_cast<int>(g.nodes.size());
  // Candidates: all-reduces of small operands, grouped by (mesh, axes, dtype).
  std::vector<int> candidate_index(n, -1);
  std::vector<int> candidates;
  for (int i = 0; i < n; ++i) {
    const Node& node = g.nodes[i];
    const auto* c = dynamic_cast<const Collective*>(node.primitive.get());
    if (node.dead || c == nullptr || c->kind() != CollectiveKind::AllReduce) continue;
    if (g.type(node.inputs[0]).nbytes() > max_operand_bytes) continue;
    candidate_index[i] = static_cast<int>(candidates.size());
    candidates.push_back(i);
  }
  if (candidates.size() < 2) return 0;
  // For every node, the candidates upstream of it (bitsets): two all-reduces can run as
  // one only when neither reads the other's result.
  const size_t words = (candidates.size() + 63) / 64;
  std::vector<int> producer(g.values.size(), -1);
  for (int i = 0; i < n; ++i)
    if (!g.nodes[i].dead)
      for (ValueId out : g.nodes[i].outputs) producer[static_cast<size_t>(out)] = i;
  // One flat array (node i's words at i * words): a vector per node was one allocation
  // per node of the step.
  std::vector<uint64_t> upstream_bits(static_cast<size_t>(n) * words, 0);
  auto upstream = [&](int node) { return upstream_bits.data() + static_cast<size_t>(node) * words; };
  for (int i = 0; i < n; ++i) {
    if (g.nodes[i].dead) continue;
    uint64_t* mine = upstream(i);
    for (ValueId in : g.nodes[i].inputs) {
      const int p = producer[static_cast<size_t>(in)];
      if (p < 0) continue;
      const uint64_t* theirs = upstream(p);
      for (size_t w = 0; w < words; ++w) mine[w] |= theirs[w];
      if (candidate_index[p] >= 0)
        mine[static_cast<size_t>(candidate_index[p]) / 64] |= 1ull << (candidate_index[p] % 64);
    }
  }
  // Greedy buckets in schedule order, per key.
  std::map<std::string, std::vector<std::vector<int>>> buckets;
  std::map<std::string, size_t> bucket_bytes;
  for (int i : candidates) {
    const Node& node = g.nodes[i];
    const std::string key = node.primitive->attributes() + "|" + std::string(name(g.type(node.inputs[0]).dtype));
    auto& list = buckets[key];
    const size_t bytes = g.type(node.inputs[0]).nbytes();
    bool fits = !list.empty() && bucket_bytes[key] + bytes <= max_bucket_bytes;
    if (fits)
      for (int member : list.back())
        if (upstream(i)[static_cast<size_t>(candidate_index[member]) / 64] >> (candidate_index[member] % 64) & 1ull)
          fits = false;
    if (!fits) {
      list.push_back({});
      bucket_bytes[key] = 0;
    }
    list.back().push_back(i);
    bucket_bytes[key] += bytes;
  }
  // One bucket at a time, on a copy: two buckets can each be acyclic and still need
  // each other (a member of one reads a result of the other); such a bucket is left as
  // it was.
  std::vector<std::vector<ValueId>> by_value;  // node indices change as buckets are rewritten
  for (auto& [key, list] : buckets)
    for (const std::vector<int>& bucket : list) {
      if (bucket.size() < 2) continue;
      by_value.emplace_back();
      for (int m : bucket) by_value.back().push_back(g.nodes[m].outputs[0]);
    }
  int combined = 0;
  // Usually no two buckets need each other: then all are rewritten on one copy. (Merging
  // only adds dependencies, so when all together are acyclic every bucket is, and the
  // one-at-a-time loop below would take each.)
  if (by_value.size() > 1) {
    Graph trial = g;
    for (const std::vector<ValueId>& outputs : by_value) rewrite_bucket(trial, outputs);
    if (restore_topological_order(trial)) {
      g = std::move(trial);
      combined = static_cast<int>(by_value.size());
      by_value.clear();
    }
  }
  for (const std::vector<ValueId>& outputs : by_value) {
    Graph trial = g;
    rewrite_bucket(trial, outputs);
    if (!restore_topological_order(trial)) continue;
    g = std::move(trial);
    ++combined;
  }
  if (combined > 0) {
    g.compact();
    g.verify();
  }
  return combined;
}

}  // namespace tessera::spmd
