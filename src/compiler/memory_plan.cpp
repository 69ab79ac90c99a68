// Static memory planning. The plan is built in four steps:
//   1. views: a value produced by an aliasing primitive (reshape, identity) shares
//      the buffer of its root, the first value up the alias chain that owns one;
//   2. liveness over the schedule, with each root's interval covering its views';
//   3. in-place groups: a value written over a dying input joins that input's group,
//      and a group is one arena buffer whose interval is the union of its members';
//   4. offsets: greedy by size (the TFLite / XLA heap-simulator strategy): the largest
//      buffers are placed first, each at the lowest aligned offset where it overlaps
//      no placed buffer that is live at the same time.
// Host values (Primitive::output_in_host_memory) go through steps 2 and 4 in an arena
// of their own; the device peak leaves them out, which is what offloading saves.
#include "tessera/compiler/memory_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "tessera/base/error.h"

namespace tessera::compiler {
namespace {

using Kind = BufferAssignment::Kind;

size_t align_up(size_t n, size_t alignment) { return alignment <= 1 ? n : (n + alignment - 1) / alignment * alignment; }

bool intersects(const LiveRange& a, const LiveRange& b) { return a.begin <= b.end && b.begin <= a.end; }

// Values returned by the graph (a set, by id).
std::vector<bool> graph_outputs(const Graph& graph) {
  std::vector<bool> is_output(graph.values.size(), false);
  for (ValueId v : graph.outputs) is_output.at(static_cast<size_t>(v)) = true;
  return is_output;
}

// For each value: the value whose buffer it uses. Itself unless it is a view; a
// view that is a graph output owns a buffer (the executable copies into it), so a
// returned array never points into the arena.
std::vector<ValueId> view_roots(const Graph& graph) {
  std::vector<ValueId> root(graph.values.size());
  std::iota(root.begin(), root.end(), 0);
  const std::vector<bool> is_output = graph_outputs(graph);
  for (const Node& node : graph.nodes) {
    if (node.dead) continue;
    for (size_t o = 0; o < node.outputs.size(); ++o) {
      const ValueId out = node.outputs[o];
      const int aliased = node.primitive->aliases_input(static_cast<int>(o));
      if (aliased < 0 || is_output[static_cast<size_t>(out)]) continue;
      if (static_cast<size_t>(aliased) >= node.inputs.size()) {
        fail<Error>("plan_memory: {} output {} aliases input {} (got {} inputs)", node.primitive->name(), o, aliased,
                    node.inputs.size());
      }
      root[static_cast<size_t>(out)] = root[static_cast<size_t>(node.inputs[static_cast<size_t>(aliased)])];
    }
  }
  return root;
}

// Liveness of each value on its own (views not yet folded into their roots).
std::vector<LiveRange> own_ranges(const Graph& graph) {
  std::vector<LiveRange> range(graph.values.size());
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    const Node& node = graph.nodes[n];
    if (node.dead) continue;
    for (ValueId out : node.outputs) range[static_cast<size_t>(out)] = {static_cast<int>(n), static_cast<int>(n)};
  }
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    const Node& node = graph.nodes[n];
    if (node.dead) continue;
    for (ValueId in : node.inputs) {
      LiveRange& r = range[static_cast<size_t>(in)];
      r.end = std::max(r.end, static_cast<int>(n));
    }
  }
  const int end_of_program = static_cast<int>(graph.nodes.size());
  for (ValueId v : graph.outputs) range[static_cast<size_t>(v)].end = end_of_program;
  return range;
}

std::vector<LiveRange> live_ranges_with_roots(const Graph& graph, const std::vector<ValueId>& root) {
  std::vector<LiveRange> range = own_ranges(graph);
  for (size_t v = 0; v < graph.values.size(); ++v) {
    if (graph.values[v].dead || root[v] == static_cast<ValueId>(v)) continue;
    LiveRange& r = range[static_cast<size_t>(root[v])];
    r.end = std::max(r.end, range[v].end);
  }
  return range;
}

// Union-find over values sharing one arena buffer (in-place pairs).
struct Groups {
  std::vector<ValueId> parent;
  explicit Groups(size_t n) : parent(n) { std::iota(parent.begin(), parent.end(), 0); }
  ValueId find(ValueId v) {
    while (parent[static_cast<size_t>(v)] != v) {
      parent[static_cast<size_t>(v)] = parent[static_cast<size_t>(parent[static_cast<size_t>(v)])];
      v = parent[static_cast<size_t>(v)];
    }
    return v;
  }
};

struct Buffer {
  ValueId leader;  // the group's representative (smallest id: the first value of the chain)
  LiveRange range;
  size_t size = 0;  // aligned
  size_t offset = 0;
};

// Greedy by size: largest first (ties: earlier start, then value id), each at the
// lowest aligned offset not overlapping a placed buffer live at the same time.
size_t place_buffers(std::vector<Buffer>& buffers, size_t alignment) {
  std::vector<size_t> order(buffers.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (buffers[a].size != buffers[b].size) return buffers[a].size > buffers[b].size;
    if (buffers[a].range.begin != buffers[b].range.begin) return buffers[a].range.begin < buffers[b].range.begin;
    return buffers[a].leader < buffers[b].leader;
  });
  std::vector<size_t> placed;
  size_t arena = 0;
  for (size_t i : order) {
    Buffer& buf = buffers[i];
    if (buf.size == 0) continue;
    std::vector<std::pair<size_t, size_t>> taken;  // [begin, end) of conflicting buffers
    for (size_t j : placed) {
      if (intersects(buf.range, buffers[j].range))
        taken.emplace_back(buffers[j].offset, buffers[j].offset + buffers[j].size);
    }
    std::sort(taken.begin(), taken.end());
    size_t offset = 0;
    for (const auto& [begin, end] : taken) {
      if (offset + buf.size <= begin) break;
      offset = std::max(offset, align_up(end, alignment));
    }
    buf.offset = offset;
    arena = std::max(arena, offset + buf.size);
    placed.push_back(i);
  }
  return arena;
}

}  // namespace

std::vector<LiveRange> live_ranges(const Graph& graph) { return live_ranges_with_roots(graph, view_roots(graph)); }

MemoryPlan plan_memory(const Graph& graph, const MemoryPlanOptions& options) {
  const size_t num_values = graph.values.size();
  const std::vector<ValueId> root = view_roots(graph);
  const std::vector<LiveRange> range = live_ranges_with_roots(graph, root);
  const std::vector<bool> is_output = graph_outputs(graph);

  MemoryPlan plan;
  plan.values.resize(num_values);
  for (size_t v = 0; v < num_values; ++v)
    plan.values[v].bytes = graph.values[v].dead ? 0 : graph.values[v].type.nbytes();

  // Kinds of the values that do not live in the arena.
  for (size_t p = 0; p < graph.parameters.size(); ++p) {
    BufferAssignment& a = plan.values[static_cast<size_t>(graph.parameters[p])];
    a.kind = Kind::Parameter;
    a.index = static_cast<int>(p);
  }
  for (size_t v = 0; v < num_values; ++v) {
    if (graph.values[v].kind == ValueKind::Constant) plan.values[v].kind = Kind::Constant;
  }
  for (size_t i = 0; i < graph.outputs.size(); ++i) {
    const auto v = static_cast<size_t>(graph.outputs[i]);
    if (graph.values[v].kind != ValueKind::NodeOutput || plan.values[v].kind == Kind::Output) continue;
    plan.values[v].kind = Kind::Output;
    plan.values[v].index = static_cast<int>(i);
  }
  for (const Node& node : graph.nodes) {
    if (node.dead) continue;
    for (size_t o = 0; o < node.outputs.size(); ++o) {
      BufferAssignment& a = plan.values[static_cast<size_t>(node.outputs[o])];
      if (a.kind == Kind::Arena && node.primitive->output_in_host_memory(static_cast<int>(o))) a.kind = Kind::Host;
    }
  }
  for (size_t v = 0; v < num_values; ++v) {
    if (root[v] == static_cast<ValueId>(v)) continue;
    plan.values[v].kind = Kind::View;
    plan.values[v].source = root[v];
  }
  auto in_arena = [&](ValueId v) {
    return !graph.values[static_cast<size_t>(v)].dead && plan.values[static_cast<size_t>(v)].kind == Kind::Arena;
  };

  // In place: an output joins the group of an input (through views) that dies at
  // this node. Group intervals are tracked per leader.
  Groups groups(num_values);
  std::vector<LiveRange> group_range = range;
  for (size_t n = 0; options.in_place && n < graph.nodes.size(); ++n) {
    const Node& node = graph.nodes[n];
    if (node.dead) continue;
    std::vector<ValueId> claimed;  // groups an output of this node already writes into
    for (size_t o = 0; o < node.outputs.size(); ++o) {
      const ValueId out = node.outputs[o];
      if (!in_arena(out)) continue;
      for (size_t i = 0; i < node.inputs.size(); ++i) {
        const ValueId in = node.inputs[i];
        const ValueId owner = root[static_cast<size_t>(in)];
        if (!in_arena(owner) || graph.type(in) != graph.type(out) ||
            graph.type(owner).nbytes() != graph.type(out).nbytes() ||
            !node.primitive->can_write_in_place(static_cast<int>(i), static_cast<int>(o))) {
          continue;
        }
        const ValueId leader = groups.find(owner);
        if (range[static_cast<size_t>(owner)].end != static_cast<int>(n) ||
            group_range[static_cast<size_t>(leader)].end != static_cast<int>(n) ||
            std::find(claimed.begin(), claimed.end(), leader) != claimed.end()) {
          continue;
        }
        claimed.push_back(leader);
        groups.parent[static_cast<size_t>(out)] = leader;
        LiveRange& g = group_range[static_cast<size_t>(leader)];
        g.end = std::max(g.end, range[static_cast<size_t>(out)].end);
        ++plan.in_place_reuses;
        break;
      }
    }
  }

  // Donation: an output reuses a donated parameter's buffer when the parameter (and
  // its views) is dead by then, or dies at the producer which may write over it.
  std::vector<bool> donor_used(graph.parameters.size(), false);
  for (size_t i = 0; i < graph.outputs.size(); ++i) {
    const ValueId out = graph.outputs[i];
    BufferAssignment& a = plan.values[static_cast<size_t>(out)];
    if (a.kind != Kind::Output || a.index != static_cast<int>(i)) continue;
    const int producer = graph.value(out).node;
    const Node& node = graph.nodes.at(static_cast<size_t>(producer));
    const int output_index = graph.value(out).output_index;
    for (size_t p = 0; p < graph.parameters.size() && p < options.donated.size(); ++p) {
      const ValueId param = graph.parameters[p];
      if (!options.donated[p] || donor_used[p] || graph.type(param).nbytes() != graph.type(out).nbytes()) continue;
      const int last_use = range[static_cast<size_t>(param)].end;
      bool ok = last_use < producer;
      if (!ok && last_use == producer) {
        for (size_t k = 0; k < node.inputs.size() && !ok; ++k) {
          const ValueId in = node.inputs[k];
          ok = root[static_cast<size_t>(in)] == param && graph.type(in) == graph.type(out) &&
               graph.type(param) == graph.type(out) &&
               node.primitive->can_write_in_place(static_cast<int>(k), output_index);
        }
      }
      if (!ok) continue;
      a.donor = static_cast<int>(p);
      donor_used[p] = true;
      ++plan.donations;
      break;
    }
  }

  // One arena buffer per group.
  std::vector<int> buffer_of(num_values, -1);
  std::vector<Buffer> buffers;
  for (size_t v = 0; v < num_values; ++v) {
    if (!in_arena(static_cast<ValueId>(v))) continue;
    const auto leader = static_cast<size_t>(groups.find(static_cast<ValueId>(v)));
    if (buffer_of[leader] < 0) {
      buffer_of[leader] = static_cast<int>(buffers.size());
      buffers.push_back({static_cast<ValueId>(leader), group_range[leader], 0, 0});
    }
    Buffer& buf = buffers[static_cast<size_t>(buffer_of[leader])];
    buf.size = std::max(buf.size, align_up(plan.values[v].bytes, options.alignment));
    buffer_of[v] = buffer_of[leader];
  }
  plan.arena_bytes = place_buffers(buffers, options.alignment);
  std::vector<Buffer> host_buffers;
  std::vector<size_t> host_values;
  for (size_t v = 0; v < num_values; ++v) {
    if (graph.values[v].dead || plan.values[v].kind != Kind::Host) continue;
    host_buffers.push_back({static_cast<ValueId>(v), range[v], align_up(plan.values[v].bytes, options.alignment), 0});
    host_values.push_back(v);
    plan.offloaded_bytes += plan.values[v].bytes;
    ++plan.offloaded_values;
  }
  plan.host_arena_bytes = place_buffers(host_buffers, options.alignment);
  for (size_t i = 0; i < host_values.size(); ++i) plan.values[host_values[i]].offset = host_buffers[i].offset;
  for (size_t v = 0; v < num_values; ++v) {
    const auto owner = static_cast<size_t>(root[v]);
    if (buffer_of[owner] >= 0 && (in_arena(static_cast<ValueId>(v)) || plan.values[v].kind == Kind::View)) {
      plan.values[v].offset = buffers[static_cast<size_t>(buffer_of[owner])].offset;
    }
  }

  // Peak: live arena buffers + outputs written so far (their own buffers) + parameters.
  size_t parameter_bytes = 0;
  for (ValueId p : graph.parameters) parameter_bytes += graph.type(p).nbytes();
  plan.peak_bytes = parameter_bytes;
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    if (graph.nodes[n].dead) continue;
    const int t = static_cast<int>(n);
    size_t live = parameter_bytes;
    for (const Buffer& buf : buffers) {
      if (buf.range.begin <= t && t <= buf.range.end) live += buf.size;
    }
    for (size_t v = 0; v < num_values; ++v) {
      const BufferAssignment& a = plan.values[v];
      if (a.kind == Kind::Output && a.donor < 0 && range[v].begin <= t) live += a.bytes;
    }
    plan.peak_bytes = std::max(plan.peak_bytes, live);
  }
  return plan;
}

std::string MemoryPlan::text(const Graph& graph) const {
  std::string out;
  for (size_t v = 0; v < values.size() && v < graph.values.size(); ++v) {
    if (graph.values[v].dead) continue;
    const BufferAssignment& a = values[v];
    out += fmt::format("%{} ", v);
    switch (a.kind) {
      case Kind::Arena:
        out += fmt::format("arena [{}, {})", a.offset, a.offset + a.bytes);
        break;
      case Kind::Parameter:
        out += fmt::format("param {}", a.index);
        break;
      case Kind::Constant:
        out += "constant";
        break;
      case Kind::Output:
        out += fmt::format("output {}", a.index);
        if (a.donor >= 0) out += fmt::format(" (donated param {})", a.donor);
        break;
      case Kind::View:
        out += fmt::format("view of %{}", a.source);
        break;
      case Kind::Host:
        out += fmt::format("host [{}, {})", a.offset, a.offset + a.bytes);
        break;
    }
    out += fmt::format(" : {}\n", to_string(graph.values[v].type));
  }
  return out;
}

}  // namespace tessera::compiler
