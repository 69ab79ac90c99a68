// Static memory planning and the schedule pass, on hand-built graphs: buffer reuse,
// in-place writes, views, donation, outputs kept out of the arena, and a randomized
// check that no two simultaneously-live arena values share bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tessera/compiler/executable.h"
#include "tessera/compiler/graph.h"
#include "tessera/compiler/memory_plan.h"
#include "tessera/compiler/passes/schedule.h"
#include "tessera/core/array.h"
#include "tessera/ir/primitives/elementwise.h"
#include "tessera/ir/primitives/layout.h"
#include "tessera/ir/primitives/optim.h"
#include "tessera/ir/primitives/reduce.h"

namespace tessera::compiler {
namespace {

using Kind = BufferAssignment::Kind;

PrimitivePtr exp_op() { return std::make_shared<Unary>(UnaryKind::Exp); }
PrimitivePtr neg_op() { return std::make_shared<Unary>(UnaryKind::Neg); }
PrimitivePtr add_op() { return std::make_shared<Binary>(BinaryKind::Add); }
PrimitivePtr mul_op() { return std::make_shared<Binary>(BinaryKind::Mul); }
PrimitivePtr reshape_op(Shape s) { return std::make_shared<Reshape>(std::move(s)); }

TensorType f32(Shape s) { return {std::move(s), DType::Float32}; }

bool bytes_overlap(const BufferAssignment& a, const BufferAssignment& b) {
  return a.bytes > 0 && b.bytes > 0 && a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
}

// p -> e1 -> e2 -> e3 -> e4 -> e5 (returned): a chain of exps.
struct Chain {
  Graph graph;
  ValueId p;
  std::vector<ValueId> e;
};
Chain make_chain(int length, const TensorType& type) {
  Chain c;
  c.p = c.graph.add_parameter(type);
  ValueId x = c.p;
  for (int i = 0; i < length; ++i) c.e.push_back(x = c.graph.add_node1(exp_op(), {x}, type));
  c.graph.outputs = {x};
  return c;
}

TEST(MemoryPlan, LiveRanges) {
  Chain c = make_chain(3, f32({16}));
  auto r = live_ranges(c.graph);
  EXPECT_EQ(r[c.p].begin, -1);
  EXPECT_EQ(r[c.p].end, 0);
  EXPECT_EQ(r[c.e[0]].begin, 0);
  EXPECT_EQ(r[c.e[0]].end, 1);
  EXPECT_EQ(r[c.e[1]].begin, 1);
  EXPECT_EQ(r[c.e[1]].end, 2);
  EXPECT_EQ(r[c.e[2]].begin, 2);
  EXPECT_EQ(r[c.e[2]].end, 3);  // a graph output lives to nodes.size()
}

TEST(MemoryPlan, ReusesDeadBuffers) {
  // 64 floats = 256 bytes; without in-place, e1 [0,1] and e3 [2,3] can share, as can
  // e2 and e4: two buffers for four intermediates.
  Chain c = make_chain(5, f32({64}));
  MemoryPlanOptions opts;
  opts.in_place = false;
  MemoryPlan plan = plan_memory(c.graph, opts);
  EXPECT_EQ(plan.in_place_reuses, 0);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(plan.values[c.e[i]].kind, Kind::Arena) << i;
  EXPECT_EQ(plan.arena_bytes, 2u * 256);
  EXPECT_NE(plan.values[c.e[0]].offset, plan.values[c.e[1]].offset);
  EXPECT_NE(plan.values[c.e[1]].offset, plan.values[c.e[2]].offset);
  EXPECT_EQ(plan.values[c.e[4]].kind, Kind::Output);
  EXPECT_EQ(plan.values[c.e[4]].index, 0);
  // Peak: the parameter + two live intermediates (node 4 holds e4 and the output).
  EXPECT_EQ(plan.peak_bytes, 256u + 2 * 256);
  EXPECT_NE(plan.text(c.graph).find("arena ["), std::string::npos);
}

TEST(MemoryPlan, AlignmentRoundsBuffersUp) {
  Chain c = make_chain(3, f32({3}));  // 12-byte values
  MemoryPlanOptions opts;
  opts.in_place = false;
  opts.alignment = 64;
  MemoryPlan plan = plan_memory(c.graph, opts);
  EXPECT_EQ(plan.arena_bytes, 128u);
  for (ValueId v : {c.e[0], c.e[1]}) EXPECT_EQ(plan.values[v].offset % 64, 0u);
}

TEST(MemoryPlan, InPlaceChainUsesOneBuffer) {
  Chain c = make_chain(5, f32({64}));
  MemoryPlan plan = plan_memory(c.graph);
  EXPECT_EQ(plan.in_place_reuses, 3);  // e2 over e1, e3 over e2, e4 over e3 (e5 is an output)
  EXPECT_EQ(plan.arena_bytes, 256u);
  for (int i = 1; i < 4; ++i) EXPECT_EQ(plan.values[c.e[i]].offset, plan.values[c.e[0]].offset);
}

TEST(MemoryPlan, InPlaceOnlyOverADyingInput) {
  Graph g;
  const TensorType t = f32({32});
  ValueId p = g.add_parameter(t);
  ValueId x = g.add_node1(exp_op(), {p}, t);     // node 0
  ValueId y = g.add_node1(neg_op(), {x}, t);     // node 1: x is read again at node 2
  ValueId z = g.add_node1(add_op(), {x, y}, t);  // node 2: x and y both die here
  ValueId w = g.add_node1(exp_op(), {z}, t);     // node 3
  g.outputs = {w};
  MemoryPlan plan = plan_memory(g);
  EXPECT_NE(plan.values[y].offset, plan.values[x].offset);
  EXPECT_EQ(plan.values[z].offset, plan.values[x].offset);  // first eligible input
  EXPECT_EQ(plan.in_place_reuses, 1);
  // Never into a parameter: x does not overwrite p.
  EXPECT_EQ(plan.values[p].kind, Kind::Parameter);
}

TEST(MemoryPlan, InPlaceNeedsEqualTypes) {
  Graph g;
  ValueId p = g.add_parameter(f32({8}));
  ValueId q = g.add_parameter(f32({4, 8}));
  ValueId x = g.add_node1(exp_op(), {p}, f32({8}));
  ValueId y = g.add_node1(add_op(), {x, q}, f32({4, 8}));  // broadcast: x is smaller than y
  ValueId z = g.add_node1(exp_op(), {y}, f32({4, 8}));
  g.outputs = {z};
  MemoryPlan plan = plan_memory(g);
  EXPECT_EQ(plan.in_place_reuses, 0);
  EXPECT_FALSE(bytes_overlap(plan.values[x], plan.values[y]));
}

TEST(MemoryPlan, ViewsShareAndExtendTheirSource) {
  Graph g;
  ValueId p = g.add_parameter(f32({4, 4}));
  ValueId q = g.add_parameter(f32({2, 8}));
  ValueId a = g.add_node1(exp_op(), {p}, f32({4, 4}));              // node 0
  ValueId r = g.add_node1(reshape_op({2, 8}), {a}, f32({2, 8}));    // node 1
  ValueId r2 = g.add_node1(reshape_op({16}), {r}, f32({16}));       // node 2: view of a view
  ValueId c = g.add_node1(exp_op(), {q}, f32({2, 8}));              // node 3
  ValueId d = g.add_node1(exp_op(), {c}, f32({2, 8}));              // node 4
  ValueId r3 = g.add_node1(reshape_op({2, 8}), {r2}, f32({2, 8}));  // node 5
  ValueId e = g.add_node1(mul_op(), {r3, d}, f32({2, 8}));          // node 6
  g.outputs = {e};
  auto ranges = live_ranges(g);
  EXPECT_EQ(ranges[a].end, 6);  // a's buffer is read through r3 at node 6
  MemoryPlanOptions opts;
  opts.in_place = false;
  MemoryPlan plan = plan_memory(g, opts);
  EXPECT_EQ(plan.values[r].kind, Kind::View);
  EXPECT_EQ(plan.values[r].source, a);
  EXPECT_EQ(plan.values[r2].source, a);  // resolved to the buffer's owner
  EXPECT_EQ(plan.values[r3].source, a);
  EXPECT_EQ(plan.values[r3].offset, plan.values[a].offset);
  EXPECT_FALSE(bytes_overlap(plan.values[a], plan.values[c]));
  EXPECT_FALSE(bytes_overlap(plan.values[a], plan.values[d]));
  EXPECT_NE(plan.text(g).find("view of %" + std::to_string(a)), std::string::npos);
}

TEST(MemoryPlan, ReturnedViewIsACopyNotAnArenaPointer) {
  Graph g;
  ValueId p = g.add_parameter(f32({4, 4}));
  ValueId a = g.add_node1(exp_op(), {p}, f32({4, 4}));
  ValueId r = g.add_node1(reshape_op({16}), {a}, f32({16}));
  ValueId b = g.add_node1(neg_op(), {p}, f32({4, 4}));
  ValueId s = g.add_node1(add_op(), {b, b}, f32({4, 4}));
  g.outputs = {s, r};
  auto ranges = live_ranges(g);
  EXPECT_EQ(ranges[a].end, 1);  // not extended to the end: the output is a copy
  MemoryPlan plan = plan_memory(g);
  EXPECT_EQ(plan.values[r].kind, Kind::Output);
  EXPECT_EQ(plan.values[r].index, 1);
  EXPECT_EQ(plan.values[a].kind, Kind::Arena);
}

TEST(MemoryPlan, OutputsNeverInTheArena) {
  Graph g;
  ValueId p = g.add_parameter(f32({8}));
  ValueId k = g.add_constant(Array::from_vector<float>({1, 2, 3, 4, 5, 6, 7, 8}));
  ValueId a = g.add_node1(add_op(), {p, k}, f32({8}));
  ValueId b = g.add_node1(exp_op(), {a}, f32({8}));
  g.outputs = {b, p, k, b, a};
  MemoryPlan plan = plan_memory(g);
  EXPECT_EQ(plan.values[b].kind, Kind::Output);
  EXPECT_EQ(plan.values[b].index, 0);  // first occurrence
  EXPECT_EQ(plan.values[p].kind, Kind::Parameter);
  EXPECT_EQ(plan.values[p].index, 0);
  EXPECT_EQ(plan.values[k].kind, Kind::Constant);
  EXPECT_EQ(plan.values[a].kind, Kind::Output);
  EXPECT_EQ(plan.values[a].index, 4);
  EXPECT_EQ(plan.arena_bytes, 0u);
  EXPECT_EQ(plan.in_place_reuses, 0);  // b may not overwrite the output a
}

// Which outputs run() hands back in buffers of their own (Executable::owned_outputs: what
// a later program may take as donated): not a parameter or constant returned as is, nor
// an output and a view of it (they share at run time), but a fresh value and a view of
// an arena value (copied out). The flags match the buffers run() returns.
TEST(MemoryPlan, OwnedOutputsShareNoBuffer) {
  Graph g;
  ValueId p = g.add_parameter(f32({4, 4}));
  ValueId k = g.add_constant(Array::from_vector<float>({1, 2}));
  ValueId a = g.add_node1(exp_op(), {p}, f32({4, 4}));
  ValueId r = g.add_node1(reshape_op({16}), {a}, f32({16}));  // a view of the output a
  ValueId b = g.add_node1(neg_op(), {p}, f32({4, 4}));
  ValueId e = g.add_node1(exp_op(), {b}, f32({4, 4}));         // in the arena
  ValueId r2 = g.add_node1(reshape_op({16}), {e}, f32({16}));  // copied out of it
  ValueId c = g.add_node1(add_op(), {b, b}, f32({4, 4}));
  g.outputs = {p, k, a, r, c, r2};
  Executable exe(g, plan_memory(g));
  EXPECT_EQ(exe.owned_outputs(), (std::vector<bool>{false, false, false, false, true, true})) << exe.text();
  const Array x = Array::from_vector<float>(std::vector<float>(16, 0.5f), {4, 4});
  const std::vector<Array> out = exe.run({x});
  // The owned ones hold storage no other output (or the argument) holds; a and r share.
  const std::vector<bool> owned = exe.owned_outputs();
  for (size_t i = 0; i < out.size(); ++i)
    for (size_t j = 0; j < out.size(); ++j)
      if (i != j && owned[i]) {
        EXPECT_NE(out[i].storage(), out[j].storage()) << i << " and " << j;
      }
  EXPECT_EQ(out[2].storage(), out[3].storage());
  EXPECT_TRUE(out[0].is_same(x) || out[0].storage() == x.storage());
  for (size_t i = 0; i < out.size(); ++i)
    if (owned[i]) {
      EXPECT_NE(out[i].storage(), x.storage()) << i;
    }
}

TEST(MemoryPlan, Donation) {
  const TensorType t = f32({16});
  {
    // p dies at the producer, which may write over it.
    Graph g;
    ValueId p = g.add_parameter(t);
    ValueId a = g.add_node1(exp_op(), {p}, t);
    g.outputs = {a};
    MemoryPlanOptions opts;
    opts.donated = {true};
    MemoryPlan plan = plan_memory(g, opts);
    EXPECT_EQ(plan.donations, 1);
    EXPECT_EQ(plan.values[a].donor, 0);
    EXPECT_EQ(plan_memory(g).donations, 0);  // not donated
  }
  {
    // p is still read after the output is produced; q has the wrong size; r is free
    // before the output's producer, and serves one output only.
    Graph g;
    ValueId p = g.add_parameter(t);
    ValueId q = g.add_parameter(f32({8}));
    ValueId r = g.add_parameter(t);
    ValueId x = g.add_node1(exp_op(), {r}, t);     // node 0: r's last use
    ValueId a = g.add_node1(add_op(), {p, x}, t);  // node 1
    ValueId b = g.add_node1(mul_op(), {p, a}, t);  // node 2
    ValueId c = g.add_node1(exp_op(), {q}, f32({8}));
    g.outputs = {a, b, c};
    MemoryPlanOptions opts;
    opts.donated = {true, true, true};
    MemoryPlan plan = plan_memory(g, opts);
    EXPECT_EQ(plan.values[a].donor, 2);  // p is read again at node 2
    EXPECT_EQ(plan.values[b].donor, 0);  // p dies at b's producer, which writes in place
    EXPECT_EQ(plan.values[c].donor, 1);
    EXPECT_EQ(plan.donations, 3);
    opts.donated = {false, false, true};
    plan = plan_memory(g, opts);
    EXPECT_EQ(plan.donations, 1);
    EXPECT_EQ(plan.values[a].donor, 2);
    EXPECT_EQ(plan.values[b].donor, -1);
  }
  {
    // A parameter that is itself returned is never donated.
    Graph g;
    ValueId p = g.add_parameter(t);
    ValueId a = g.add_node1(exp_op(), {p}, t);
    g.outputs = {a, p};
    MemoryPlanOptions opts;
    opts.donated = {true};
    EXPECT_EQ(plan_memory(g, opts).donations, 0);
  }
}

// ---- randomized property test ----

// Random DAG of elementwise ops and reshapes over 1-D/2-D f32 values of a few sizes.
Graph random_graph(std::mt19937& gen) {
  Graph g;
  std::uniform_int_distribution<int> size_pick(0, 3);
  const int sizes[] = {1, 7, 64, 300};
  std::vector<ValueId> pool;
  const int num_params = 1 + static_cast<int>(gen() % 3);
  for (int i = 0; i < num_params; ++i) pool.push_back(g.add_parameter(f32({sizes[size_pick(gen)]})));
  const int num_nodes = 3 + static_cast<int>(gen() % 25);
  for (int n = 0; n < num_nodes; ++n) {
    ValueId x = pool[gen() % pool.size()];
    const TensorType tx = g.type(x);
    const int op = static_cast<int>(gen() % 10);
    if (op < 4) {
      pool.push_back(g.add_node1(op % 2 ? exp_op() : neg_op(), {x}, tx));
    } else if (op < 8) {
      std::vector<ValueId> same;
      for (ValueId v : pool)
        if (g.type(v) == tx) same.push_back(v);
      ValueId y = same[gen() % same.size()];
      pool.push_back(g.add_node1(op % 2 ? add_op() : mul_op(), {x, y}, tx));
    } else if (op == 8) {
      const int64_t n_el = numel(tx.shape);
      Shape s = tx.shape.size() == 1 ? Shape{1, n_el} : Shape{n_el};
      pool.push_back(g.add_node1(reshape_op(s), {x}, f32(s)));
    } else {
      pool.push_back(g.add_node1(exp_op(), {x}, f32({sizes[size_pick(gen)]})));  // a fresh size
    }
  }
  const int num_outputs = 1 + static_cast<int>(gen() % 3);
  for (int i = 0; i < num_outputs; ++i) g.outputs.push_back(pool[pool.size() - 1 - gen() % pool.size()]);
  return g;
}

// Values whose buffer a node may legitimately take over: `later` is written by the
// node that reads `earlier` (directly or through views) for the last time.
bool may_share(const Graph& g, const MemoryPlan& plan, const std::vector<LiveRange>& r, ValueId earlier,
               ValueId later) {
  if (r[earlier].end != r[later].begin) return false;
  const Node& node = g.nodes[static_cast<size_t>(g.value(later).node)];
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    ValueId in = node.inputs[i];
    ValueId owner = plan.values[in].kind == Kind::View ? plan.values[in].source : in;
    if (owner == earlier && g.type(in) == g.type(later) &&
        node.primitive->can_write_in_place(static_cast<int>(i), g.value(later).output_index) &&
        plan.values[earlier].offset == plan.values[later].offset) {
      return true;
    }
  }
  return false;
}

void check_plan(const Graph& g, const MemoryPlan& plan, size_t alignment, const std::string& where) {
  const auto r = live_ranges(g);
  ASSERT_EQ(plan.values.size(), g.values.size()) << where;
  std::vector<ValueId> arena;
  for (size_t v = 0; v < g.values.size(); ++v) {
    const BufferAssignment& a = plan.values[v];
    if (a.kind == Kind::Arena) {
      arena.push_back(static_cast<ValueId>(v));
      EXPECT_EQ(a.offset % alignment, 0u) << where;
      EXPECT_LE(a.offset + a.bytes, plan.arena_bytes) << where;
      EXPECT_EQ(a.bytes, g.type(static_cast<ValueId>(v)).nbytes()) << where;
    }
    if (a.kind == Kind::View) {
      EXPECT_NE(plan.values[a.source].kind, Kind::View) << where;
      EXPECT_GE(r[a.source].end, r[v].end) << where << " view %" << v;
    }
  }
  for (ValueId out : g.outputs) {
    const Kind k = plan.values[out].kind;
    EXPECT_TRUE(k == Kind::Output || k == Kind::Parameter || k == Kind::Constant) << where << " output %" << out;
  }
  for (size_t i = 0; i < arena.size(); ++i) {
    for (size_t j = i + 1; j < arena.size(); ++j) {
      const ValueId u = arena[i], v = arena[j];
      const bool live_together = r[u].begin <= r[v].end && r[v].begin <= r[u].end;
      if (!live_together || !bytes_overlap(plan.values[u], plan.values[v])) continue;
      EXPECT_TRUE(may_share(g, plan, r, u, v) || may_share(g, plan, r, v, u))
          << where << ": %" << u << " [" << r[u].begin << ", " << r[u].end << "] and %" << v << " [" << r[v].begin
          << ", " << r[v].end << "] overlap\n"
          << plan.text(g) << g.text();
    }
  }
  // Lower bound: values live across the gap after node t are pairwise distinct buffers.
  size_t bound = 0;
  for (int t = -1; t < static_cast<int>(g.nodes.size()); ++t) {
    size_t live = 0;
    for (ValueId v : arena)
      if (r[v].begin <= t && t < r[v].end) live += plan.values[v].bytes;
    bound = std::max(bound, live);
  }
  EXPECT_GE(plan.arena_bytes, bound) << where;
}

TEST(MemoryPlan, RandomGraphsNeverOverlapLiveBuffers) {
  std::mt19937 gen(1234);
  for (int trial = 0; trial < 400; ++trial) {
    Graph g = random_graph(gen);
    g.verify();
    MemoryPlanOptions opts;
    opts.in_place = trial % 2 == 0;
    opts.alignment = (trial % 3 == 0) ? 1 : (trial % 3 == 1 ? 16 : 64);
    opts.donated.assign(g.parameters.size(), trial % 5 == 0);
    const std::string where = "trial " + std::to_string(trial);
    MemoryPlan plan = plan_memory(g, opts);
    check_plan(g, plan, opts.alignment, where);
    // Scheduling keeps the graph valid and the plan sound.
    SchedulePass().run(g);
    g.verify();
    check_plan(g, plan_memory(g, opts), opts.alignment, where + " scheduled");
    if (HasFailure()) break;
  }
}

// ---- schedule pass ----

TEST(Schedule, EquivalentOptimizerUpdatesBecomeNeighbours) {
  // Six AdamW updates, decayed and undecayed in turn (weights and biases), each read by
  // the outputs only: after the pass the three of each kind are consecutive (a backend
  // groups a run of equivalent updates into one launch), in their original order
  // within each kind; an update that reads another's output stays after it.
  Graph g;
  const TensorType t = f32({64});
  AdamWConfig decayed, plain;
  decayed.weight_decay = 0.1;
  std::vector<ValueId> outputs;
  for (int i = 0; i < 6; ++i) {
    const ValueId p = g.add_parameter(t), grad = g.add_parameter(t), m = g.add_parameter(t), v = g.add_parameter(t);
    std::vector<ValueId> r =
        g.add_node(std::make_shared<AdamW>(i % 2 == 0 ? decayed : plain), {p, grad, m, v}, {t, t, t});
    g.nodes.back().remat_name = "update " + std::to_string(i);
    outputs.insert(outputs.end(), r.begin(), r.end());
  }
  // A seventh, undecayed, whose gradient is the first update's new parameter.
  const ValueId m7 = g.add_parameter(t), v7 = g.add_parameter(t);
  std::vector<ValueId> r7 = g.add_node(std::make_shared<AdamW>(plain), {outputs[0], outputs[0], m7, v7}, {t, t, t});
  g.nodes.back().remat_name = "update 6";
  outputs.insert(outputs.end(), r7.begin(), r7.end());
  g.outputs = outputs;
  SchedulePass().run(g);
  g.verify();
  std::vector<std::string> order;
  for (const Node& n : g.nodes) order.push_back(n.remat_name);
  const std::vector<std::string> want = {"update 1", "update 3", "update 5", "update 0",
                                         "update 2", "update 4", "update 6"};
  EXPECT_EQ(order, want);
  const std::string text = g.text();
  SchedulePass().run(g);
  EXPECT_EQ(g.text(), text) << "idempotent";
}

TEST(Schedule, MovesANodeToJustBeforeItsFirstUser) {
  Graph g;
  const TensorType t = f32({128});
  ValueId p = g.add_parameter(t);
  ValueId a = g.add_node1(exp_op(), {p}, t);  // node 0, read only by the last node
  g.nodes[0].remat_name = "early";
  ValueId b = g.add_node1(neg_op(), {p}, t);
  ValueId c = g.add_node1(exp_op(), {b}, t);
  ValueId d = g.add_node1(exp_op(), {c}, t);
  ValueId unused = g.add_node1(neg_op(), {p}, t);  // no users: stays in order
  ValueId e = g.add_node1(add_op(), {a, d}, t);
  g.outputs = {e};
  const int before = live_ranges(g)[a].end - live_ranges(g)[a].begin;
  MemoryPlanOptions opts;
  opts.in_place = false;
  const size_t arena_before = plan_memory(g, opts).arena_bytes;

  SchedulePass pass;
  EXPECT_EQ(pass.name(), "schedule");
  pass.run(g);
  g.verify();
  auto node_of = [&](ValueId v) { return g.value(v).node; };
  EXPECT_EQ(node_of(unused), 0);  // anchored: the nodes after it moved past it
  EXPECT_EQ(node_of(b), 1);
  EXPECT_EQ(node_of(c), 2);
  EXPECT_EQ(node_of(d), 3);
  EXPECT_EQ(node_of(a), 4);
  EXPECT_EQ(node_of(e), 5);
  EXPECT_EQ(g.nodes[4].remat_name, "early");
  const int after = live_ranges(g)[a].end - live_ranges(g)[a].begin;
  EXPECT_LT(after, before);
  EXPECT_LT(plan_memory(g, opts).arena_bytes, arena_before);

  // Deterministic and idempotent.
  const std::string text = g.text();
  pass.run(g);
  EXPECT_EQ(g.text(), text);
}

// The most bytes live at once over the schedule: values that own a buffer (not views,
// parameters or constants), each from its producer to its last reader (through views;
// graph outputs to the end).
size_t peak_live_bytes(const Graph& g) {
  const std::vector<LiveRange> r = live_ranges(g);
  std::vector<bool> owns(g.values.size(), false);
  for (const Node& node : g.nodes) {
    if (node.dead) continue;
    for (size_t o = 0; o < node.outputs.size(); ++o)
      owns[static_cast<size_t>(node.outputs[o])] = node.primitive->aliases_input(static_cast<int>(o)) < 0;
  }
  size_t peak = 0;
  for (int t = 0; t < static_cast<int>(g.nodes.size()); ++t) {
    size_t live = 0;
    for (size_t v = 0; v < g.values.size(); ++v)
      if (owns[v] && r[v].begin <= t && t <= r[v].end) live += g.type(static_cast<ValueId>(v)).nbytes();
    peak = std::max(peak, live);
  }
  return peak;
}

// A reduction of a value made early (read early by the chain, then last by the
// reduction the output waits for) moves up to just after the value's other reader:
// the demand-driven order alone would keep the value alive across the whole chain.
PrimitivePtr sum_over(std::vector<int> axes) { return std::make_shared<Reduce>(ReduceKind::Sum, std::move(axes)); }

// Nodes 0-4 of the hoisting tests: x = exp(p) [1024], read early by y1 = p + x, then a
// chain y2 = exp(y1), y3 = exp(y2), r = sum(y3) that does not read x.
struct EarlyValue {
  ValueId x, y1, r;
};
EarlyValue value_read_early(Graph& g) {
  const TensorType big = f32({1024});
  const ValueId p = g.add_parameter(big);
  const ValueId x = g.add_node1(exp_op(), {p}, big);
  const ValueId y1 = g.add_node1(add_op(), {p, x}, big);
  const ValueId y2 = g.add_node1(exp_op(), {y1}, big);
  const ValueId y3 = g.add_node1(exp_op(), {y2}, big);
  return {x, y1, g.add_node1(sum_over({0}), {y3}, f32({}))};
}

TEST(Schedule, HoistsANodeThatShrinksWhatItReadsLast) {
  Graph g;
  const TensorType scalar = f32({});
  const auto [x, y1, r] = value_read_early(g);
  const ValueId s = g.add_node1(sum_over({0}), {x}, scalar);
  const ValueId out = g.add_node1(add_op(), {r, s}, scalar);
  g.outputs = {out};
  MemoryPlanOptions opts;
  opts.in_place = false;

  Graph demand = g;
  SchedulePass(false).run(demand);
  EXPECT_EQ(demand.value(s).node, 5);  // right before the output: x lives across y2, y3, r
  EXPECT_EQ(live_ranges(demand)[x].end, 5);

  SchedulePass().run(g);
  g.verify();
  EXPECT_EQ(g.value(y1).node, 1);
  EXPECT_EQ(g.value(s).node, 2);  // right after y1, x's other reader
  EXPECT_EQ(live_ranges(g)[x].end, 2);
  EXPECT_EQ(g.value(out).node, 6);
  EXPECT_LT(peak_live_bytes(g), peak_live_bytes(demand));
  EXPECT_LT(plan_memory(g, opts).arena_bytes, plan_memory(demand, opts).arena_bytes);
}

// A conversion that doubles a value, a reshape and the reduction after them move up together: the
// conversion alone grows what it reads, the pair frees it (a weight gradient converted
// to float32, then reduce-scattered). The pair holds the wide value for a moment where
// it lands, so it moves only where that stays under the schedule's peak: here the peak
// is later, where a large temporary (w) is made while x still waits for the pair.
TEST(Schedule, HoistsAChainThatShrinksAsAWhole) {
  Graph g;
  const TensorType scalar = f32({}), huge = f32({8192});
  const auto [x, y1, r] = value_read_early(g);
  const ValueId pw = g.add_parameter(huge);
  const ValueId wide = g.add_node1(std::make_shared<Cast>(DType::Float64), {x}, {{1024}, DType::Float64});
  // A view between them moves with them (it costs nothing, but holds what it shows).
  const ValueId square = g.add_node1(std::make_shared<Reshape>(Shape{32, 32}), {wide}, {{32, 32}, DType::Float64});
  const ValueId s = g.add_node1(sum_over({0, 1}), {square}, {{}, DType::Float64});
  const ValueId narrow = g.add_node1(std::make_shared<Cast>(DType::Float32), {s}, scalar);
  const ValueId w = g.add_node1(exp_op(), {pw}, huge);
  const ValueId rw = g.add_node1(sum_over({0}), {w}, scalar);
  const ValueId sum = g.add_node1(add_op(), {r, rw}, scalar);
  const ValueId out = g.add_node1(add_op(), {sum, narrow}, scalar);
  g.outputs = {out};

  Graph demand = g;
  SchedulePass(false).run(demand);
  EXPECT_EQ(demand.value(wide).node, 8);  // after w: x (and then wide) live across it
  EXPECT_EQ(live_ranges(demand)[x].end, 8);

  SchedulePass().run(g);
  g.verify();
  EXPECT_EQ(g.value(y1).node, 1);
  EXPECT_EQ(g.value(wide).node, 2);  // the chain, right after x's other reader
  EXPECT_EQ(g.value(square).node, 3);
  EXPECT_EQ(g.value(s).node, 4);
  EXPECT_EQ(live_ranges(g)[x].end, 2);
  EXPECT_LT(peak_live_bytes(g), peak_live_bytes(demand));
}

// The bf16 copies of float32 weights (converts of parameters) move to the front of
// the schedule, in order, so that a backend launches them together (the CUDA
// multi-tensor convert), but only where no position then holds more than the peak.
TEST(Schedule, InputCastsMoveToTheFrontBelowThePeak) {
  const TensorType wide = f32({1024}), narrow{{1024}, DType::BFloat16};
  auto cast = [](Graph& g, ValueId w) {
    return g.add_node1(std::make_shared<Cast>(DType::BFloat16), {w}, {{1024}, DType::BFloat16});
  };
  {
    // A training step: h_i = h_{i-1} * c_i forward, then gradients that read each h_i
    // and c_i again: every copy is live at the peak (the end of the forward pass). The
    // weights come through identities (views), as a training step's parameters do: the
    // views go first, then the casts.
    Graph g;
    const ValueId x = g.add_parameter(narrow);
    std::vector<ValueId> w, c, h = {x};
    for (int i = 0; i < 3; ++i) w.push_back(g.add_parameter(wide));
    for (int i = 0; i < 3; ++i)
      w[static_cast<size_t>(i)] = g.add_node1(std::make_shared<Identity>(), {w[static_cast<size_t>(i)]}, wide);
    for (int i = 0; i < 3; ++i) {
      c.push_back(cast(g, w[static_cast<size_t>(i)]));
      h.push_back(g.add_node1(mul_op(), {h.back(), c.back()}, narrow));
    }
    ValueId grad = h.back();
    for (int i = 2; i >= 0; --i) {
      const ValueId sum = g.add_node1(add_op(), {grad, h[static_cast<size_t>(i)]}, narrow);
      grad = g.add_node1(mul_op(), {sum, c[static_cast<size_t>(i)]}, narrow);
    }
    g.outputs = {grad};
    Graph demand = g;
    SchedulePass(false).run(demand);
    SchedulePass().run(g);
    g.verify();
    for (int i = 0; i < 3; ++i) EXPECT_LT(g.value(w[static_cast<size_t>(i)]).node, 3) << "view " << i;
    for (int i = 0; i < 3; ++i) EXPECT_EQ(g.value(c[static_cast<size_t>(i)]).node, 3 + i) << "cast " << i;
    EXPECT_LE(peak_live_bytes(g), peak_live_bytes(demand));
    const std::string text = g.text();
    SchedulePass().run(g);
    EXPECT_EQ(g.text(), text) << "idempotent";
  }
  {
    // Inference: each copy is read once, right after it is made. Hoisting the first two
    // keeps the peak (three buffers); the third would make four live at once: it stays.
    Graph g;
    ValueId h = g.add_parameter(narrow);
    std::vector<ValueId> c;
    for (int i = 0; i < 3; ++i) {
      c.push_back(cast(g, g.add_parameter(wide)));
      h = g.add_node1(mul_op(), {h, c.back()}, narrow);
    }
    g.outputs = {h};
    Graph demand = g;
    SchedulePass(false).run(demand);
    SchedulePass().run(g);
    g.verify();
    EXPECT_EQ(g.value(c[0]).node, 0);
    EXPECT_EQ(g.value(c[1]).node, 1);
    EXPECT_EQ(g.value(c[2]).node, 4);  // after h1, h2, where demand put it
    EXPECT_EQ(peak_live_bytes(g), peak_live_bytes(demand));
  }
}

// q, k and v sliced out of one fused projection, each then reshaped (a view): the
// last slice frees the projection, but moving it up only passes the view of the slice
// before it, which then follows its source back. Such a move must not be made: the
// two would swap places on every sweep until the cap (GPT-2's attention, where the
// planner spent a quarter of its time hoisting).
TEST(Schedule, HoistingSettlesWhenOnlyAViewIsInTheWay) {
  Graph g;
  const TensorType one = f32({1, 256}), row = f32({256});
  const ValueId p = g.add_parameter(f32({3, 256}));
  const ValueId qkv = g.add_node1(exp_op(), {p}, f32({3, 256}));
  auto slice = [&](int64_t i) {
    return g.add_node1(std::make_shared<Slice>(std::vector<int64_t>{i, 0}, std::vector<int64_t>{i + 1, 256},
                                               std::vector<int64_t>{1, 1}),
                       {qkv}, one);
  };
  const ValueId q = g.add_node1(exp_op(), {g.add_node1(reshape_op({256}), {slice(0)}, row)}, row);
  const ValueId k = g.add_node1(reshape_op({256}), {slice(1)}, row);
  const ValueId v = g.add_node1(reshape_op({256}), {slice(2)}, row);
  g.outputs = {g.add_node1(add_op(), {g.add_node1(add_op(), {q, k}, row), v}, row)};

  SchedulePass pass;
  pass.run(g);
  g.verify();
  EXPECT_LE(pass.hoist_sweeps(), 2) << g.text();
  EXPECT_LT(pass.hoist_sweeps(), SchedulePass::kMaxHoistSweeps);
}

TEST(Schedule, KeepsOutputProducersInOrderAndRespectsDependencies) {
  std::mt19937 gen(99);
  for (int trial = 0; trial < 200; ++trial) {
    Graph g = random_graph(gen);
    // Remember each node by its first output and the anchored nodes' order.
    std::vector<ValueId> anchors;
    auto users = g.users();
    for (const Node& node : g.nodes) {
      bool anchored = true;
      for (ValueId out : node.outputs) {
        if (!users[static_cast<size_t>(out)].empty()) anchored = false;
        if (std::find(g.outputs.begin(), g.outputs.end(), out) != g.outputs.end()) {
          anchored = true;
          break;
        }
      }
      if (anchored) anchors.push_back(node.outputs[0]);
    }
    const size_t count = g.nodes.size();
    // With hoisting: valid, deterministic, anchors in order, and never more live bytes
    // at its peak than the demand-driven order alone. (Not idempotent: a second run's
    // demand-driven order breaks ties by the hoisted order.)
    Graph hoisted = g, hoisted_twin = g;
    SchedulePass hoisting;
    hoisting.run(hoisted);
    EXPECT_LT(hoisting.hoist_sweeps(), SchedulePass::kMaxHoistSweeps) << "trial " << trial << ": did not settle";
    SchedulePass().run(hoisted_twin);
    ASSERT_EQ(hoisted.nodes.size(), count);
    ASSERT_NO_THROW(hoisted.verify()) << hoisted.text();
    EXPECT_EQ(hoisted_twin.text(), hoisted.text()) << "trial " << trial << ": hoisting not deterministic";
    for (size_t i = 1; i < anchors.size(); ++i)
      EXPECT_LT(hoisted.value(anchors[i - 1]).node, hoisted.value(anchors[i]).node);
    // The demand-driven order alone (no hoisting): each node as late as it can go.
    SchedulePass(false).run(g);
    ASSERT_EQ(g.nodes.size(), count);
    ASSERT_NO_THROW(g.verify()) << g.text();
    const std::string once = g.text();
    Graph again = g;
    SchedulePass(false).run(again);
    EXPECT_EQ(again.text(), once) << "trial " << trial << ": not idempotent";
    for (size_t i = 1; i < anchors.size(); ++i) EXPECT_LT(g.value(anchors[i - 1]).node, g.value(anchors[i]).node);
    EXPECT_LE(peak_live_bytes(hoisted), peak_live_bytes(g)) << "trial " << trial << "\n" << g.text();
    // Every non-anchored node sits immediately before... its first user, or before
    // another producer its first user also needs (the run of its user's inputs).
    users = g.users();
    for (size_t n = 0; n < g.nodes.size(); ++n) {
      int first_user = static_cast<int>(g.nodes.size());
      for (ValueId out : g.nodes[n].outputs)
        if (!users[static_cast<size_t>(out)].empty())
          first_user = std::min(first_user, users[static_cast<size_t>(out)].front());
      if (first_user == static_cast<int>(g.nodes.size())) continue;
      // Nodes strictly between n and its first user all feed (transitively) that user.
      for (int m = static_cast<int>(n) + 1; m < first_user; ++m) {
        bool feeds = false;
        std::vector<int> frontier = {first_user};
        std::vector<bool> seen(g.nodes.size(), false);
        while (!frontier.empty() && !feeds) {
          int k = frontier.back();
          frontier.pop_back();
          for (ValueId in : g.nodes[static_cast<size_t>(k)].inputs) {
            int pn = g.value(in).node;
            if (g.value(in).kind != ValueKind::NodeOutput || seen[static_cast<size_t>(pn)]) continue;
            seen[static_cast<size_t>(pn)] = true;
            if (pn == m) feeds = true;
            frontier.push_back(pn);
          }
        }
        bool is_output = false;
        for (ValueId out : g.nodes[n].outputs)
          if (std::find(g.outputs.begin(), g.outputs.end(), out) != g.outputs.end()) is_output = true;
        if (!is_output) {
          EXPECT_TRUE(feeds) << "trial " << trial << " node " << n << " m " << m << "\n" << g.text();
        }
      }
    }
  }
}

}  // namespace
}  // namespace tessera::compiler
