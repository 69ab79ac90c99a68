// Demand-driven order: the anchored nodes (graph-output producers and nodes without
// users) are emitted in their original order, each right after a depth-first,
// post-order emission of the not-yet-emitted nodes it depends on. A non-anchored
// node is thus emitted when its first user (in the new order) needs it, i.e. as
// late as possible. Among the producers one node needs, the one heading the longest
// chain of non-anchored producers goes first (its chain then is not held across a
// short one's value, and a node made early but read late lands next to its user);
// ties keep the original order. The order depends only on the graph's structure and
// the current order of ties, so running the pass twice changes nothing.
//
// Then shrinking nodes move up (hoist_shrinking): a node whose outputs are smaller
// than the inputs it reads last (a weight gradient x^T dy of two activations, a
// reduction) would otherwise wait, as late as possible, for its first user (the
// gradient clip's norm or the optimizer, after the whole backward pass) and hold
// both activations alive until then. Moving such a node n from position p to the
// earliest q after which nothing else reads those inputs changes the live bytes only
// on [q, p): + bytes(outputs of n) - bytes(inputs n now frees at q). The move is
// made only when that is negative, so no point of the schedule holds more than
// before. Views (reshape, identity) first move to just after their source: a view
// costs no bytes but its position counts as a use of its source's buffer.
//
// Then casts of the program's inputs (the bf16 copies of float32 weights) move to the
// front where that keeps every position at or under the peak (hoist_input_casts).
//
// Last, runs of consecutive independent in-place updates (the optimizer's) are sorted
// so that equivalent ones are neighbours (cluster_equivalent_updates).
#include "tessera/compiler/passes/schedule.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

namespace tessera::compiler {

namespace {

bool is_view(const Node& node) {
  if (node.outputs.empty()) return false;
  for (size_t o = 0; o < node.outputs.size(); ++o)
    if (node.primitive->aliases_input(static_cast<int>(o)) < 0) return false;
  return true;
}

// The schedule as a list of node indices with each node's position, moved one node at
// a time.
class Order {
 public:
  explicit Order(size_t n) : order_(n), position_(n) {
    std::iota(order_.begin(), order_.end(), 0);
    std::iota(position_.begin(), position_.end(), 0);
  }
  int position(int node) const { return position_[static_cast<size_t>(node)]; }
  const std::vector<int>& nodes() const { return order_; }
  // Moves `node` up to position `to` (< its position), shifting the nodes between down.
  void move_up(int node, int to) {
    const int from = position(node);
    std::rotate(order_.begin() + to, order_.begin() + from, order_.begin() + from + 1);
    for (int i = to; i <= from; ++i) position_[static_cast<size_t>(order_[static_cast<size_t>(i)])] = i;
  }

 private:
  std::vector<int> order_, position_;
};

class ShrinkingHoister {
 public:
  explicit ShrinkingHoister(Graph& graph) : g_(graph), order_(graph.nodes.size()) {
    const size_t num_values = g_.values.size();
    root_.resize(num_values);
    std::iota(root_.begin(), root_.end(), 0);
    is_output_.assign(num_values, false);
    for (ValueId v : g_.outputs) is_output_[static_cast<size_t>(v)] = true;
    kept_.assign(num_values, false);
    for (size_t n = 0; n < g_.nodes.size(); ++n) {
      const Node& node = g_.nodes[n];
      if (node.dead) continue;
      for (size_t o = 0; o < node.outputs.size(); ++o) {
        const int aliased = node.primitive->aliases_input(static_cast<int>(o));
        const auto out = static_cast<size_t>(node.outputs[o]);
        if (aliased >= 0 && static_cast<size_t>(aliased) < node.inputs.size())
          root_[out] = root_[static_cast<size_t>(node.inputs[static_cast<size_t>(aliased)])];
      }
    }
    // Buffers the program never frees: the caller's (parameters, constants), and those
    // a graph output lives in.
    for (size_t v = 0; v < num_values; ++v) {
      const Value& value = g_.values[v];
      if (value.kind != ValueKind::NodeOutput || is_output_[v]) kept_[static_cast<size_t>(root_[v])] = true;
    }
    readers_.resize(num_values);
    direct_readers_.resize(num_values);
    read_.assign(num_values, false);
    for (size_t n = 0; n < g_.nodes.size(); ++n) {
      const Node& node = g_.nodes[n];
      if (node.dead) continue;
      for (ValueId in : node.inputs) {
        readers_[static_cast<size_t>(root_[static_cast<size_t>(in)])].push_back(static_cast<int>(n));
        direct_readers_[static_cast<size_t>(in)].push_back(static_cast<int>(n));
        read_[static_cast<size_t>(in)] = true;
      }
    }
    for (auto* lists : {&readers_, &direct_readers_})
      for (auto& r : *lists) {
        std::sort(r.begin(), r.end());
        r.erase(std::unique(r.begin(), r.end()), r.end());
      }
  }

  // Returns the number of sweeps made.
  int run() {
    // A move can make another node the last reader of a buffer: sweep until none moves
    // (try_hoist says why this ends; the cap bounds the time). Views follow their
    // sources up before every sweep.
    int sweeps = 0;
    while (sweeps < SchedulePass::kMaxHoistSweeps) {
      ++sweeps;
      for (int n : std::vector<int>(order_.nodes()))
        if (!g_.nodes[static_cast<size_t>(n)].dead && is_view(g_.nodes[static_cast<size_t>(n)])) hoist_view(n);
      bool moved = false;
      for (int n : std::vector<int>(order_.nodes())) moved = try_hoist(n) || moved;
      if (!moved) break;
    }
    return sweeps;
  }

  const std::vector<int>& order() const { return order_.nodes(); }

  // Casts of the program's inputs (a convert reading a parameter or constant, or a view
  // of one: the bf16 copy of a float32 weight) move to the front, after the inputs'
  // views and keeping their order, each where the
  // bytes it adds to the positions it passes keep all of them at or under the
  // schedule's peak. A backend can then launch them together (the CUDA multi-tensor
  // convert), and in a training step the copies stay live until the backward pass, so
  // across the peak (the end of the forward pass), anyway. Returns the number moved.
  int hoist_input_casts() {
    int front = 0, moved = 0;
    auto of_input = [&](ValueId v) { return g_.value(root_[static_cast<size_t>(v)]).kind != ValueKind::NodeOutput; };
    // First the views of the inputs (a training step's parameters come through
    // identities), which cost nothing and which the casts read: then every cast can
    // follow them, one after the other.
    for (int n : std::vector<int>(order_.nodes())) {
      const Node& node = g_.nodes[static_cast<size_t>(n)];
      if (node.dead || !is_view(node) || node.inputs.empty()) continue;
      bool views_input = true;
      for (ValueId in : node.inputs) views_input = views_input && of_input(in);
      for (ValueId out : node.outputs)  // graph outputs and unread views keep their place
        views_input = views_input && !is_output_[static_cast<size_t>(out)] && read_[static_cast<size_t>(out)];
      // A view of a view that stays behind stays too.
      if (!views_input || earliest(n) > front) continue;
      if (order_.position(n) > front) {
        order_.move_up(n, front);
        profile_current_ = false;
      }
      ++front;
    }
    for (int n : std::vector<int>(order_.nodes())) {
      const Node& node = g_.nodes[static_cast<size_t>(n)];
      if (node.dead || node.primitive->name() != "convert" || node.inputs.size() != 1 || node.outputs.size() != 1)
        continue;
      if (!of_input(node.inputs[0]) || earliest(n) > front) continue;
      const ValueId out = node.outputs[0];
      if (kept_[static_cast<size_t>(out)] || !read_[static_cast<size_t>(out)]) continue;
      const int p = order_.position(n);
      if (p > front) {
        update_profile();
        size_t highest = 0;
        for (int t = front; t < p; ++t) highest = std::max(highest, live_[static_cast<size_t>(t)]);
        if (highest + g_.type(out).nbytes() > peak_) continue;
        order_.move_up(n, front);
        hoisted_[static_cast<size_t>(n)] = true;
        profile_current_ = false;
        ++moved;
      }
      ++front;
    }
    return moved;
  }

 private:
  // One past the latest producer of n's inputs.
  int earliest(int n) const {
    int q = 0;
    for (ValueId in : g_.nodes[static_cast<size_t>(n)].inputs) {
      const Value& v = g_.value(in);
      if (v.kind == ValueKind::NodeOutput && v.node >= 0) q = std::max(q, order_.position(v.node) + 1);
    }
    return q;
  }

  void hoist_view(int n) {
    // Anchors (no readers, or a graph output) keep their place.
    for (ValueId out : g_.nodes[static_cast<size_t>(n)].outputs)
      if (is_output_[static_cast<size_t>(out)] || !read_[static_cast<size_t>(out)]) return;
    const int q = earliest(n);
    if (q < order_.position(n)) {
      order_.move_up(n, q);
      profile_current_ = false;
    }
  }

  // The unit a move takes: n alone, or n and up to kMaxChain - 1 nodes after it (views
  // included), each the only reader of the one before (try_hoist).
  static constexpr int kMaxChain = 6;
  struct Unit {
    std::vector<int> nodes;  // in schedule order
    size_t cost = 0, freed = 0;
    int earliest = 0;  // the first position the unit may start at
  };

  // Whether node n may move (it has readers and no graph output), and its new bytes.
  bool movable(int n, size_t* cost) const {
    const Node& node = g_.nodes[static_cast<size_t>(n)];
    if (node.dead || is_view(node) || node.outputs.empty()) return false;
    for (ValueId out : node.outputs) {
      // Graph outputs keep their order, and a node without users may be there for its effect.
      if (kept_[static_cast<size_t>(out)] || !read_[static_cast<size_t>(out)]) return false;
      if (root_[static_cast<size_t>(out)] == out) *cost += g_.type(out).nbytes();
    }
    return true;
  }

  // Fills the unit's freed bytes and earliest start from the inputs its nodes read last.
  void account(Unit& u) const {
    std::vector<ValueId> roots;
    for (int n : u.nodes) {
      for (ValueId in : g_.nodes[static_cast<size_t>(n)].inputs) {
        const Value& v = g_.value(in);
        const bool inside =
            v.kind == ValueKind::NodeOutput && std::find(u.nodes.begin(), u.nodes.end(), v.node) != u.nodes.end();
        if (inside) continue;
        if (v.kind == ValueKind::NodeOutput && v.node >= 0)
          u.earliest = std::max(u.earliest, order_.position(v.node) + 1);
        roots.push_back(root_[static_cast<size_t>(in)]);
      }
    }
    std::sort(roots.begin(), roots.end());
    roots.erase(std::unique(roots.begin(), roots.end()), roots.end());
    const int last = order_.position(u.nodes.back());
    for (ValueId r : roots) {
      if (kept_[static_cast<size_t>(r)]) continue;
      int other_last = order_.position(g_.value(r).node);
      bool last_reader = true;
      for (int reader : readers_[static_cast<size_t>(r)]) {
        if (std::find(u.nodes.begin(), u.nodes.end(), reader) != u.nodes.end()) continue;
        const int at = order_.position(reader);
        if (at > last) last_reader = false;
        other_last = std::max(other_last, at);
      }
      if (!last_reader) continue;
      u.freed += g_.type(r).nbytes();
      u.earliest = std::max(u.earliest, other_last + 1);
    }
  }

  bool try_hoist(int n) {
    Unit unit;
    if (!movable(n, &unit.cost)) return false;
    unit.nodes = {n};
    account(unit);
    // Else n and the chain of nodes after it, each the only reader of the one before
    // (views included, at no cost), when the chain as a whole shrinks what it reads: a
    // weight gradient, converted to float32, then reduce-scattered (the first two grow);
    // a recomputed activation, reshaped, then multiplied into a weight gradient.
    std::vector<int> chain = {n};
    while (unit.freed <= unit.cost) {
      if (static_cast<int>(chain.size()) >= kMaxChain) return false;
      const Node& tail = g_.nodes[static_cast<size_t>(chain.back())];
      if (tail.outputs.size() != 1) return false;
      const std::vector<int>& next = direct_readers_[static_cast<size_t>(tail.outputs[0])];
      if (next.size() != 1) return false;
      chain.push_back(next[0]);
      const Node& added = g_.nodes[static_cast<size_t>(next[0])];
      if (added.dead || added.outputs.size() != 1) return false;
      if (is_view(added)) {
        // A view is free, but what it shows stays alive until its readers: go on.
        const ValueId out = added.outputs[0];
        if (is_output_[static_cast<size_t>(out)] || !read_[static_cast<size_t>(out)]) return false;
        continue;
      }
      Unit longer;
      if (!movable(next[0], &longer.cost)) return false;
      longer.nodes = chain;
      // Every value made inside the chain but its last must die inside it.
      for (size_t i = 0; i + 1 < chain.size(); ++i)
        for (int reader : readers_[static_cast<size_t>(
                 root_[static_cast<size_t>(g_.nodes[static_cast<size_t>(chain[i])].outputs[0])])])
          if (std::find(chain.begin(), chain.end(), reader) == chain.end()) return false;
      account(longer);
      unit = longer;
    }
    const int p = order_.position(n);
    const int q = unit.earliest;
    if (q >= p) return false;
    // A chain holds its intermediates for a moment where it lands: allowed only below the
    // schedule's peak (a single node never raises the live bytes anywhere).
    if (unit.nodes.size() > 1) {
      // Each chain value lives from its node to the next real (non-view) node: at most
      // two of them at once.
      size_t made = 0, previous = 0;
      for (int m : unit.nodes) {
        size_t bytes = 0;
        for (ValueId out : g_.nodes[static_cast<size_t>(m)].outputs)
          if (root_[static_cast<size_t>(out)] == out) bytes += g_.type(out).nbytes();
        if (is_view(g_.nodes[static_cast<size_t>(m)])) continue;
        made = std::max(made, previous + bytes);
        previous = bytes;
      }
      update_profile();
      if (across_[static_cast<size_t>(q)] + made > peak_) return false;
    }
    // A move must pass a node that was never hoisted and is not a view: two nodes with
    // the same frontier would otherwise swap places forever, and so would a node and a
    // view that follows its source back up before the next sweep. (Each move then
    // lowers the count of never-hoisted non-view nodes before hoisted ones, and view
    // moves do not change it, so the sweeps end.)
    bool passes_other = false;
    for (int at = q; at < p && !passes_other; ++at) {
      const int other = order_.nodes()[static_cast<size_t>(at)];
      passes_other = !hoisted_[static_cast<size_t>(other)] && !is_view(g_.nodes[static_cast<size_t>(other)]);
    }
    if (!passes_other) return false;
    for (size_t i = 0; i < unit.nodes.size(); ++i) {
      order_.move_up(unit.nodes[i], q + static_cast<int>(i));
      hoisted_[static_cast<size_t>(unit.nodes[i])] = true;
    }
    profile_current_ = false;
    return true;
  }

  // across_[t]: the bytes live across the gap before position t (made before t, read at
  // or after t); live_[t]: the bytes live at position t (made at or before t, read at or
  // after it); peak_: the most of live_. Recomputed after moves.
  void update_profile() {
    if (profile_current_) return;
    const size_t n = order_.nodes().size();
    std::vector<int64_t> begin_delta(n + 2, 0), at_delta(n + 2, 0);
    for (size_t v = 0; v < root_.size(); ++v) {
      if (root_[v] != static_cast<ValueId>(v) || kept_[v]) continue;
      const Value& value = g_.values[v];
      if (value.dead || value.kind != ValueKind::NodeOutput || value.node < 0 ||
          g_.nodes[static_cast<size_t>(value.node)].dead)
        continue;
      const int begin = order_.position(value.node);
      int end = begin;
      for (int reader : readers_[v]) end = std::max(end, order_.position(reader));
      const auto bytes = static_cast<int64_t>(g_.type(static_cast<ValueId>(v)).nbytes());
      at_delta[static_cast<size_t>(begin)] += bytes;  // live at positions begin..end
      at_delta[static_cast<size_t>(end) + 1] -= bytes;
      if (end > begin) {  // across the gaps before begin+1..end
        begin_delta[static_cast<size_t>(begin) + 1] += bytes;
        begin_delta[static_cast<size_t>(end) + 1] -= bytes;
      }
    }
    across_.assign(n + 1, 0);
    live_.assign(n + 1, 0);
    peak_ = 0;
    int64_t live = 0, crossing = 0;
    for (size_t t = 0; t <= n; ++t) {
      live += at_delta[t];
      crossing += begin_delta[t];
      across_[t] = static_cast<size_t>(crossing);
      live_[t] = static_cast<size_t>(live);
      if (t < n) peak_ = std::max(peak_, static_cast<size_t>(live));
    }
    profile_current_ = true;
  }

  Graph& g_;
  Order order_;
  std::vector<ValueId> root_;                     // the value whose buffer each value uses
  std::vector<bool> kept_;                        // per root: never freed by the program
  std::vector<bool> is_output_;                   // per value: a graph output
  std::vector<bool> read_;                        // per value: some node reads it
  std::vector<std::vector<int>> readers_;         // per root: the nodes reading it or a view of it
  std::vector<std::vector<int>> direct_readers_;  // per value: the nodes reading it
  std::vector<bool> hoisted_ = std::vector<bool>(g_.nodes.size(), false);
  std::vector<size_t> across_, live_;
  size_t peak_ = 0;
  bool profile_current_ = false;
};

void apply_order(Graph& graph, const std::vector<int>& order) {
  std::vector<Node> reordered;
  reordered.reserve(order.size());
  for (int n : order) reordered.push_back(std::move(graph.nodes[static_cast<size_t>(n)]));
  graph.nodes = std::move(reordered);
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    for (ValueId out : graph.nodes[n].outputs) graph.values[static_cast<size_t>(out)].node = static_cast<int>(n);
  }
}

// Within each run of consecutive live nodes of one primitive that read none of each
// other's outputs and update in place (every output may be written over an input: the
// optimizer's per-parameter updates), nodes with equal attributes become neighbours
// (stable, by attribute text): a backend that launches a run of equivalent nodes as one
// kernel (the CUDA multi-tensor AdamW) then gets two runs, say decayed and undecayed
// parameters, instead of one per switch. The live bytes do not change: each node's
// outputs take its inputs' buffers.
std::vector<int> cluster_equivalent_updates(const Graph& graph) {
  std::vector<int> order;
  order.reserve(graph.nodes.size());
  auto in_place = [](const Node& node) {
    for (size_t o = 0; o < node.outputs.size(); ++o) {
      bool any = false;
      for (size_t i = 0; i < node.inputs.size() && !any; ++i)
        any = node.primitive->can_write_in_place(static_cast<int>(i), static_cast<int>(o));
      if (!any) return false;
    }
    return !node.outputs.empty();
  };
  const size_t n = graph.nodes.size();
  size_t begin = 0;
  while (begin < n) {
    const Node& head = graph.nodes[begin];
    size_t end = begin + 1;
    if (!head.dead && in_place(head)) {
      const std::string name = head.primitive->name();
      for (; end < n; ++end) {
        const Node& node = graph.nodes[end];
        if (node.dead || node.primitive->name() != name || !in_place(node)) break;
        bool reads_run = false;
        for (ValueId in : node.inputs) {
          const Value& v = graph.value(in);
          reads_run = reads_run || (v.kind == ValueKind::NodeOutput && v.node >= static_cast<int>(begin) &&
                                    v.node < static_cast<int>(end));
        }
        if (reads_run) break;
      }
    }
    std::vector<std::pair<std::string, int>> run;
    for (size_t i = begin; i < end; ++i)
      run.emplace_back(end - begin > 1 ? graph.nodes[i].primitive->attributes() : std::string(), static_cast<int>(i));
    std::stable_sort(run.begin(), run.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (const auto& r : run) order.push_back(r.second);
    begin = end;
  }
  return order;
}

}  // namespace

void SchedulePass::run(Graph& graph) {
  hoist_sweeps_ = 0;
  const size_t num_nodes = graph.nodes.size();
  std::vector<bool> has_user(num_nodes, false), anchored(num_nodes, false);
  std::vector<std::vector<int>> producers(num_nodes);  // live producers of each node's inputs
  for (size_t n = 0; n < num_nodes; ++n) {
    const Node& node = graph.nodes[n];
    if (node.dead) continue;
    for (ValueId in : node.inputs) {
      const Value& v = graph.value(in);
      if (v.kind != ValueKind::NodeOutput || v.node < 0 || graph.nodes[static_cast<size_t>(v.node)].dead) continue;
      producers[n].push_back(v.node);
      has_user[static_cast<size_t>(v.node)] = true;
    }
  }
  for (size_t n = 0; n < num_nodes; ++n) anchored[n] = !has_user[n];
  for (ValueId v : graph.outputs) {
    if (graph.value(v).kind == ValueKind::NodeOutput && graph.value(v).node >= 0) {
      anchored[static_cast<size_t>(graph.value(v).node)] = true;
    }
  }
  // Length of the longest chain of non-anchored nodes ending at each node (the
  // current order is topological, so producers are done first).
  std::vector<int> chain(num_nodes, 0);
  for (size_t n = 0; n < num_nodes; ++n) {
    for (int p : producers[n]) {
      if (!anchored[static_cast<size_t>(p)]) chain[n] = std::max(chain[n], chain[static_cast<size_t>(p)]);
    }
    chain[n] += 1;
  }
  for (auto& deps : producers) {
    std::sort(deps.begin(), deps.end());
    deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
    std::stable_sort(deps.begin(), deps.end(),
                     [&](int a, int b) { return chain[static_cast<size_t>(a)] > chain[static_cast<size_t>(b)]; });
  }

  std::vector<int> order;
  order.reserve(num_nodes);
  std::vector<bool> emitted(num_nodes, false);
  std::vector<std::pair<int, size_t>> stack;  // (node, next producer to visit); iterative: chains can be long
  for (size_t n = 0; n < num_nodes; ++n) {
    if (graph.nodes[n].dead || !anchored[n]) continue;
    stack.emplace_back(static_cast<int>(n), 0);
    while (!stack.empty()) {
      const int node = stack.back().first;
      const std::vector<int>& deps = producers[static_cast<size_t>(node)];
      if (stack.back().second < deps.size()) {
        const int p = deps[stack.back().second++];
        if (!emitted[static_cast<size_t>(p)]) stack.emplace_back(p, 0);
        continue;
      }
      if (!emitted[static_cast<size_t>(node)]) {
        emitted[static_cast<size_t>(node)] = true;
        order.push_back(node);
      }
      stack.pop_back();
    }
  }
  // Every live node feeds some anchored node, so only removed nodes are left; they
  // go last and keep their outputs' links.
  for (size_t n = 0; n < num_nodes; ++n) {
    if (!emitted[n]) order.push_back(static_cast<int>(n));
  }

  apply_order(graph, order);
  if (hoist_shrinking_) {
    ShrinkingHoister hoister(graph);
    hoist_sweeps_ = hoister.run();
    hoister.hoist_input_casts();
    apply_order(graph, hoister.order());
  }
  apply_order(graph, cluster_equivalent_updates(graph));
}

}  // namespace tessera::compiler
