// IR-in / IR-out tests of the graph passes: each test builds a Graph by hand, runs
// one pass, compares the text form with the expected IR, and checks with a small
// node-by-node interpreter (every primitive's eval_cpu) that the graph computes
// bitwise the same values before and after.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "compiler/graph_test_util.h"
#include "core/test_util.h"
#include "tessera/compiler/graph.h"
#include "tessera/compiler/passes/constant_folding.h"
#include "tessera/compiler/passes/cse.h"
#include "tessera/compiler/passes/dce.h"
#include "tessera/compiler/passes/remat.h"
#include "tessera/compiler/passes/simplify.h"
#include "tessera/ir/primitives/elementwise.h"
#include "tessera/ir/primitives/layout.h"
#include "tessera/ir/primitives/optim.h"

namespace tessera::compiler {
namespace {

using test_util::interpret;
using test_util::random_params;

using test::make_array;
using test::random_values;

const DType f32 = DType::Float32;

PrimitivePtr unary(UnaryKind k) { return std::make_shared<Unary>(k); }
PrimitivePtr binary(BinaryKind k) { return std::make_shared<Binary>(k); }
PrimitivePtr add() { return binary(BinaryKind::Add); }
PrimitivePtr mul() { return binary(BinaryKind::Mul); }
TensorType t32(Shape s) { return {std::move(s), f32}; }

// Copies of its input, one per output, that the compiler must treat as opaque: not equivalent even to itself (as a
// primitive with hidden state would declare).
class Opaque : public Primitive {
 public:
  std::string name() const override { return "opaque"; }
  void eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) override {
    for (Array& out : outputs) {
      out.allocate();
      std::memcpy(out.mutable_raw_data(), inputs[0].raw_data(), inputs[0].nbytes());
    }
  }
  bool is_equivalent(const Primitive&) const override { return false; }
};

// Runs `pass` on g, verifies the result, checks the values are bitwise unchanged on
// random inputs, and returns the text of the rewritten graph.
std::string run_pass(Pass&& pass, Graph& g) {
  g.verify();
  std::vector<Array> params = random_params(g, 7);
  std::vector<Array> before = interpret(g, params);
  pass.run(g);
  g.verify();
  std::vector<Array> after = interpret(g, params);
  EXPECT_EQ(before.size(), after.size());
  for (size_t i = 0; i < before.size() && i < after.size(); ++i) {
    EXPECT_EQ(type_string(before[i]), type_string(after[i])) << "output " << i;
    EXPECT_EQ(test::values(before[i]), test::values(after[i])) << "output " << i << " of " << pass.name();
  }
  return g.text();
}

// ---------------------------------------------------------------- dce

TEST(DeadCodeElimination, RemovesNodesThatReachNoOutputAndUnusedConstants) {
  Graph g;
  ValueId x = g.add_parameter(t32({4}));
  ValueId unused_constant = g.add_constant(Array::scalar(3));
  ValueId e = g.add_node1(unary(UnaryKind::Exp), {x}, t32({4}));
  g.add_node1(mul(), {e, unused_constant}, t32({4}));  // dead chain: exp -> multiply
  ValueId n = g.add_node1(unary(UnaryKind::Neg), {x}, t32({4}));
  ValueId s = g.add_node1(unary(UnaryKind::Sin), {n}, t32({4}));
  g.outputs = {s, n};
  EXPECT_EQ(run_pass(DeadCodeElimination(), g),
            "func @main(%0: f32[4]) -> (f32[4], f32[4]) {\n"
            "  %1 = negative(%0) : f32[4]\n"
            "  %2 = sin(%1) : f32[4]\n"
            "  return %2, %1\n"
            "}\n");
  EXPECT_EQ(g.num_nodes(), 2u);
  EXPECT_EQ(g.values.size(), 3u);
}

TEST(DeadCodeElimination, KeepsMultiOutputNodeWhenOneOutputIsUsed) {
  Graph g;
  ValueId x = g.add_parameter(t32({4}));
  std::vector<ValueId> outs = g.add_node(std::make_shared<Opaque>(), {x}, {t32({4}), t32({4})});
  g.outputs = {outs[1]};
  EXPECT_EQ(run_pass(DeadCodeElimination(), g),
            "func @main(%0: f32[4]) -> (f32[4]) {\n"
            "  %1, %2 = opaque(%0) : f32[4], f32[4]\n"
            "  return %2\n"
            "}\n");
}

// ---------------------------------------------------------------- cse

TEST(CommonSubexpressionElimination, MergesEquivalentNodesAndEqualConstants) {
  Graph g;
  ValueId x = g.add_parameter(t32({4}));
  ValueId y = g.add_parameter(t32({4}));
  ValueId two_a = g.add_constant(Array::scalar(2));
  ValueId two_b = g.add_constant(Array::scalar(2));
  ValueId two_f64 = g.add_constant(Array::scalar(2, DType::Float64));  // other type: kept apart
  ValueId a = g.add_node1(add(), {x, y}, t32({4}));
  ValueId b = g.add_node1(add(), {x, y}, t32({4}));
  ValueId swapped = g.add_node1(add(), {y, x}, t32({4}));  // operand order differs: not merged
  ValueId c = g.add_node1(mul(), {a, b}, t32({4}));
  ValueId e = g.add_node1(mul(), {c, two_a}, t32({4}));
  ValueId f = g.add_node1(mul(), {c, two_b}, t32({4}));  // same as e once the constants merge
  ValueId s = g.add_node1(add(), {e, f}, t32({4}));
  ValueId d = g.add_node1(std::make_shared<Cast>(DType::Float64), {swapped}, {{4}, DType::Float64});
  ValueId m = g.add_node1(binary(BinaryKind::Mul), {d, two_f64}, {{4}, DType::Float64});
  g.outputs = {s, m};
  EXPECT_EQ(run_pass(CommonSubexpressionElimination(), g),
            "func @main(%0: f32[4], %1: f32[4]) -> (f32[4], f64[4]) {\n"
            "  %2 = constant {value=2} : f32[]\n"
            "  %3 = constant {value=2} : f64[]\n"
            "  %4 = add(%0, %1) : f32[4]\n"
            "  %5 = add(%1, %0) : f32[4]\n"
            "  %6 = multiply(%4, %4) : f32[4]\n"
            "  %7 = multiply(%6, %2) : f32[4]\n"
            "  %8 = add(%7, %7) : f32[4]\n"
            "  %9 = convert(%5) {dtype=float64} : f64[4]\n"
            "  %10 = multiply(%9, %3) : f64[4]\n"
            "  return %8, %10\n"
            "}\n");
}

TEST(CommonSubexpressionElimination, AttributesMustMatch) {
  Graph g;
  ValueId x = g.add_parameter(t32({2, 3}));
  ValueId r1 = g.add_node1(std::make_shared<Reshape>(Shape{3, 2}), {x}, t32({3, 2}));
  ValueId r2 = g.add_node1(std::make_shared<Reshape>(Shape{6}), {x}, t32({6}));
  ValueId r3 = g.add_node1(std::make_shared<Reshape>(Shape{3, 2}), {x}, t32({3, 2}));
  g.outputs = {r1, r2, r3};
  EXPECT_EQ(run_pass(CommonSubexpressionElimination(), g),
            "func @main(%0: f32[2, 3]) -> (f32[3, 2], f32[6], f32[3, 2]) {\n"
            "  %1 = reshape(%0) {shape=[3, 2]} : f32[3, 2]\n"
            "  %2 = reshape(%0) {shape=[6]} : f32[6]\n"
            "  return %1, %2, %1\n"
            "}\n");
}

TEST(CommonSubexpressionElimination, NeverMergesOpaqueTaggedOrCrossRegionNodes) {
  Graph g;
  g.remat_regions = {CheckpointPolicy::full()};
  ValueId x = g.add_parameter(t32({4}));
  ValueId o1 = g.add_node1(std::make_shared<Opaque>(), {x}, t32({4}));
  ValueId o2 = g.add_node1(std::make_shared<Opaque>(), {x}, t32({4}));
  ValueId e1 = g.add_node1(unary(UnaryKind::Exp), {x}, t32({4}));
  ValueId e2 = g.add_node1(unary(UnaryKind::Exp), {x}, t32({4}));
  g.nodes.back().remat_region = 0;
  ValueId e3 = g.add_node1(unary(UnaryKind::Exp), {x}, t32({4}));
  g.nodes.back().remat_name = Rematerialization::kRecomputed;
  ValueId e4 = g.add_node1(unary(UnaryKind::Exp), {x}, t32({4}));  // merges into e1
  ValueId e5 = g.add_node1(unary(UnaryKind::Exp), {x}, t32({4}));
  g.nodes.back().remat_region = 0;  // merges into e2: same region, no tag
  g.outputs = {o1, o2, e1, e2, e3, e4, e5};
  EXPECT_EQ(run_pass(CommonSubexpressionElimination(), g),
            "func @main(%0: f32[4]) -> (f32[4], f32[4], f32[4], f32[4], f32[4], f32[4], f32[4]) {\n"
            "  %1 = opaque(%0) : f32[4]\n"
            "  %2 = opaque(%0) : f32[4]\n"
            "  %3 = exp(%0) : f32[4]\n"
            "  %4 = exp(%0) : f32[4]  #remat region=0\n"
            "  %5 = exp(%0) : f32[4]  #remat name=__recomputed__\n"
            "  return %1, %2, %3, %4, %5, %3, %4\n"
            "}\n");
}

TEST(CommonSubexpressionElimination, IsDeterministicAndIdempotent) {
  auto build = [] {
    Graph g;
    ValueId x = g.add_parameter(t32({3}));
    ValueId a = g.add_node1(unary(UnaryKind::Tanh), {x}, t32({3}));
    ValueId b = g.add_node1(unary(UnaryKind::Tanh), {x}, t32({3}));
    ValueId c = g.add_node1(unary(UnaryKind::Exp), {a}, t32({3}));
    ValueId d = g.add_node1(unary(UnaryKind::Exp), {b}, t32({3}));  // merges only after a == b
    g.outputs = {g.add_node1(add(), {c, d}, t32({3}))};
    return g;
  };
  Graph g1 = build(), g2 = build();
  std::string t1 = run_pass(CommonSubexpressionElimination(), g1);
  EXPECT_EQ(t1, run_pass(CommonSubexpressionElimination(), g2));
  EXPECT_EQ(t1,
            "func @main(%0: f32[3]) -> (f32[3]) {\n"
            "  %1 = tanh(%0) : f32[3]\n"
            "  %2 = exp(%1) : f32[3]\n"
            "  %3 = add(%2, %2) : f32[3]\n"
            "  return %3\n"
            "}\n");
  EXPECT_EQ(run_pass(CommonSubexpressionElimination(), g1), t1);
}

// ---------------------------------------------------------------- constant folding

TEST(ConstantFolding, FoldsConstantChainsAndKeepsTheRest) {
  Graph g;
  ValueId x = g.add_parameter(t32({4}));
  ValueId v = g.add_constant(Array::from_vector<float>({1, 2, 3, 4}));
  ValueId two = g.add_constant(Array::scalar(2));
  ValueId doubled = g.add_node1(mul(), {v, two}, t32({4}));        // [2, 4, 6, 8]
  ValueId shifted = g.add_node1(add(), {doubled, two}, t32({4}));  // [4, 6, 8, 10]
  ValueId r = g.add_node1(std::make_shared<Reshape>(Shape{2, 2}), {shifted}, t32({2, 2}));
  ValueId y = g.add_node1(add(), {x, shifted}, t32({4}));
  g.outputs = {y, r};
  EXPECT_EQ(run_pass(ConstantFolding(), g),
            "func @main(%0: f32[4]) -> (f32[4], f32[2, 2]) {\n"
            "  %1 = constant {value=[4, 6, 8, 10]} : f32[4]\n"
            "  %2 = constant {value=[4, 6, 8, 10]} : f32[2, 2]\n"
            "  %3 = add(%0, %1) : f32[4]\n"
            "  return %3, %2\n"
            "}\n");
}

TEST(ConstantFolding, RespectsTheSizeLimit) {
  Graph g;
  ValueId one = g.add_constant(Array::scalar(1));
  ValueId small = g.add_node1(std::make_shared<BroadcastTo>(Shape{256, 256}), {one}, t32({256, 256}));
  ValueId big = g.add_node1(std::make_shared<BroadcastTo>(Shape{257, 256}), {one}, t32({257, 256}));
  g.outputs = {small, big};
  std::string text = run_pass(ConstantFolding(), g);
  EXPECT_EQ(g.num_nodes(), 1u) << text;  // 65536 elements fold, 65792 do not
  EXPECT_NE(text.find("broadcast_to(%0) {shape=[257, 256]}"), std::string::npos) << text;
  EXPECT_EQ(text.find("shape=[256, 256]"), std::string::npos) << text;
  EXPECT_NE(text.find("constant {bytes=262144"), std::string::npos) << text;
}

TEST(ConstantFolding, LeavesNodesWithParameterInputs) {
  Graph g;
  ValueId x = g.add_parameter(t32({4}));
  ValueId two = g.add_constant(Array::scalar(2));
  g.outputs = {g.add_node1(mul(), {x, two}, t32({4}))};
  std::string before = g.text();
  EXPECT_EQ(run_pass(ConstantFolding(), g), before);
}

// ---------------------------------------------------------------- simplify

TEST(AlgebraicSimplification, RemovesIdentityArithmetic) {
  Graph g;
  ValueId x = g.add_parameter(t32({2, 3}));
  ValueId one = g.add_constant(Array::scalar(1));
  ValueId zeros = g.add_constant(Array::from_vector<float>({0, 0, 0}));
  ValueId ones = g.add_node1(std::make_shared<BroadcastTo>(Shape{2, 3}), {one}, t32({2, 3}));
  ValueId a = g.add_node1(mul(), {x, one}, t32({2, 3}));                      // x*1
  ValueId b = g.add_node1(mul(), {ones, a}, t32({2, 3}));                     // 1*x through broadcast_to
  ValueId c = g.add_node1(add(), {b, zeros}, t32({2, 3}));                    // x+0 (zeros broadcast)
  ValueId d = g.add_node1(add(), {zeros, c}, t32({2, 3}));                    // 0+x
  ValueId e = g.add_node1(binary(BinaryKind::Sub), {d, zeros}, t32({2, 3}));  // x-0
  ValueId f = g.add_node1(binary(BinaryKind::Div), {e, ones}, t32({2, 3}));   // x/1
  ValueId h = g.add_node1(binary(BinaryKind::Sub), {zeros, f}, t32({2, 3}));  // 0-x: kept
  g.outputs = {f, h};
  EXPECT_EQ(run_pass(AlgebraicSimplification(), g),
            "func @main(%0: f32[2, 3]) -> (f32[2, 3], f32[2, 3]) {\n"
            "  %1 = constant {value=[0, 0, 0]} : f32[3]\n"
            "  %2 = subtract(%1, %0) : f32[2, 3]\n"
            "  return %0, %2\n"
            "}\n");
}

TEST(AlgebraicSimplification, KeepsIdentitiesThatBroadcastOrAreNotSplats) {
  Graph g;
  ValueId x = g.add_parameter(t32({3}));
  ValueId zeros = g.add_constant(Array::from_vector<float>({0, 0, 0, 0, 0, 0}, {2, 3}));
  ValueId mixed = g.add_constant(Array::from_vector<float>({1, 1, 2}));
  ValueId a = g.add_node1(add(), {x, zeros}, t32({2, 3}));  // x+0 broadcasts x: kept
  ValueId b = g.add_node1(mul(), {x, mixed}, t32({3}));     // not all ones: kept
  g.outputs = {a, b};
  std::string before = g.text();
  EXPECT_EQ(run_pass(AlgebraicSimplification(), g), before);
}

TEST(AlgebraicSimplification, FoldsAGradientsWideningConvertIntoAdamW) {
  // Float32 parameters: the update reads the bfloat16 gradient itself; the convert goes
  // when nothing else reads it and stays for the other reader (a norm's square).
  // A float64 parameter's float32 gradient keeps its convert (not an accepted mix).
  Graph g;
  auto f32 = [](Shape s) { return TensorType{std::move(s), DType::Float32}; };
  // v (the second moment) as a square, so the update of random inputs is finite and the
  // values compare bitwise before and after.
  auto second_moment = [&](TensorType t) { return g.add_node1(unary(UnaryKind::Square), {g.add_parameter(t)}, t); };
  const ValueId p1 = g.add_parameter(f32({4})), m1 = g.add_parameter(f32({4})), v1 = second_moment(f32({4}));
  const ValueId p2 = g.add_parameter(f32({4})), m2 = g.add_parameter(f32({4})), v2 = second_moment(f32({4}));
  const ValueId g1 = g.add_parameter({{4}, DType::BFloat16}), g2 = g.add_parameter({{4}, DType::Float16});
  const ValueId p3 = g.add_parameter({{4}, DType::Float64}), m3 = g.add_parameter({{4}, DType::Float64});
  const ValueId v3 = second_moment({{4}, DType::Float64}), g3 = g.add_parameter(f32({4}));
  const ValueId w1 = g.add_node1(std::make_shared<Cast>(DType::Float32), {g1}, f32({4}));
  const ValueId w2 = g.add_node1(std::make_shared<Cast>(DType::Float32), {g2}, f32({4}));
  const ValueId w3 = g.add_node1(std::make_shared<Cast>(DType::Float64), {g3}, {{4}, DType::Float64});
  const ValueId sq = g.add_node1(unary(UnaryKind::Square), {w2}, f32({4}));
  AdamWConfig config;
  std::vector<ValueId> outs =
      g.add_node(std::make_shared<AdamW>(config), {p1, w1, m1, v1}, {f32({4}), f32({4}), f32({4})});
  std::vector<ValueId> r2 =
      g.add_node(std::make_shared<AdamW>(config), {p2, w2, m2, v2}, {f32({4}), f32({4}), f32({4})});
  std::vector<ValueId> r3 = g.add_node(std::make_shared<AdamW>(config), {p3, w3, m3, v3},
                                       {{{4}, DType::Float64}, {{4}, DType::Float64}, {{4}, DType::Float64}});
  outs.insert(outs.end(), r2.begin(), r2.end());
  outs.insert(outs.end(), r3.begin(), r3.end());
  outs.push_back(sq);
  g.outputs = outs;
  run_pass(AlgebraicSimplification(), g);
  std::vector<std::pair<ValueId, DType>> update_grads;  // each update's gradient: its producer's dtype
  int converts = 0;
  for (const Node& n : g.nodes) {
    if (n.dead) continue;
    if (n.primitive->name() == "convert") ++converts;
    if (n.primitive->name() == "adamw_update") update_grads.emplace_back(n.inputs[1], g.type(n.inputs[1]).dtype);
  }
  ASSERT_EQ(update_grads.size(), 3u);
  // (DCE renumbers the values: the first two gradients are parameters again.)
  EXPECT_EQ(g.value(update_grads[0].first).kind, ValueKind::Parameter);
  EXPECT_EQ(update_grads[0].second, DType::BFloat16);
  EXPECT_EQ(g.value(update_grads[1].first).kind, ValueKind::Parameter);
  EXPECT_EQ(update_grads[1].second, DType::Float16);
  EXPECT_EQ(update_grads[2].second, DType::Float64) << "float64 params keep their widened gradient";
  EXPECT_EQ(converts, 2) << "the float16 one stays for the square, the float64 one for its update";
}

TEST(AlgebraicSimplification, CancelsNegationsAndComposesTransposes) {
  Graph g;
  ValueId x = g.add_parameter(t32({2, 3, 4}));
  ValueId n1 = g.add_node1(unary(UnaryKind::Neg), {x}, t32({2, 3, 4}));
  ValueId n2 = g.add_node1(unary(UnaryKind::Neg), {n1}, t32({2, 3, 4}));
  // [1, 2, 0] then [2, 0, 1] is the identity.
  ValueId t1 = g.add_node1(std::make_shared<Transpose>(std::vector<int>{1, 2, 0}), {n2}, t32({3, 4, 2}));
  ValueId t2 = g.add_node1(std::make_shared<Transpose>(std::vector<int>{2, 0, 1}), {t1}, t32({2, 3, 4}));
  // [1, 0, 2] then [0, 2, 1] reads x's axes [1, 2, 0].
  ValueId t3 = g.add_node1(std::make_shared<Transpose>(std::vector<int>{1, 0, 2}), {t2}, t32({3, 2, 4}));
  ValueId t4 = g.add_node1(std::make_shared<Transpose>(std::vector<int>{0, 2, 1}), {t3}, t32({3, 4, 2}));
  g.outputs = {t4, t2};
  EXPECT_EQ(run_pass(AlgebraicSimplification(), g),
            "func @main(%0: f32[2, 3, 4]) -> (f32[3, 4, 2], f32[2, 3, 4]) {\n"
            "  %1 = transpose(%0) {perm=[1, 2, 0]} : f32[3, 4, 2]\n"
            "  return %1, %0\n"
            "}\n");
}

TEST(AlgebraicSimplification, CollapsesReshapesAndNoOpLayoutChanges) {
  Graph g;
  ValueId x = g.add_parameter(t32({2, 6}));
  ValueId r1 = g.add_node1(std::make_shared<Reshape>(Shape{3, 4}), {x}, t32({3, 4}));
  ValueId r2 = g.add_node1(std::make_shared<Reshape>(Shape{12}), {r1}, t32({12}));
  ValueId r3 = g.add_node1(std::make_shared<Reshape>(Shape{4, 3}), {x}, t32({4, 3}));
  ValueId r4 = g.add_node1(std::make_shared<Reshape>(Shape{2, 6}), {r3}, t32({2, 6}));  // back to x
  ValueId c = g.add_node1(std::make_shared<Cast>(f32), {r4}, t32({2, 6}));
  ValueId b = g.add_node1(std::make_shared<BroadcastTo>(Shape{2, 6}), {c}, t32({2, 6}));
  ValueId t = g.add_node1(std::make_shared<Transpose>(std::vector<int>{0, 1}), {b}, t32({2, 6}));
  ValueId s = g.add_node1(unary(UnaryKind::Sin), {t}, t32({2, 6}));
  g.outputs = {r2, s};
  EXPECT_EQ(run_pass(AlgebraicSimplification(), g),
            "func @main(%0: f32[2, 6]) -> (f32[12], f32[2, 6]) {\n"
            "  %1 = reshape(%0) {shape=[12]} : f32[12]\n"
            "  %2 = sin(%0) : f32[2, 6]\n"
            "  return %1, %2\n"
            "}\n");
}

TEST(AlgebraicSimplification, FoldsBroadcastsIntoBinaryAndWhere) {
  Graph g;
  ValueId x = g.add_parameter(t32({4, 8}));
  ValueId bias = g.add_parameter(t32({8}));
  ValueId col = g.add_parameter(t32({4, 1}));
  ValueId cond = g.add_parameter({{4, 8}, DType::Bool});
  ValueId s = g.add_parameter(t32({}));
  ValueId bb = g.add_node1(std::make_shared<BroadcastTo>(Shape{4, 8}), {bias}, t32({4, 8}));
  ValueId sum = g.add_node1(add(), {x, bb}, t32({4, 8}));
  ValueId bc = g.add_node1(std::make_shared<BroadcastTo>(Shape{4, 8}), {col}, t32({4, 8}));
  ValueId bs = g.add_node1(std::make_shared<BroadcastTo>(Shape{4, 8}), {s}, t32({4, 8}));
  ValueId w = g.add_node1(std::make_shared<Where>(), {cond, bc, bs}, t32({4, 8}));
  ValueId both = g.add_node1(mul(), {bc, bb}, t32({4, 8}));  // [4, 1] * [8] still gives [4, 8]
  // bias broadcast against a [8] operand: folding would shrink the result to [8].
  ValueId lone = g.add_node1(binary(BinaryKind::Sub), {bb, bias}, t32({4, 8}));
  g.outputs = {sum, w, both, lone};
  EXPECT_EQ(run_pass(AlgebraicSimplification(), g),
            "func @main(%0: f32[4, 8], %1: f32[8], %2: f32[4, 1], %3: bool[4, 8], %4: f32[]) -> "
            "(f32[4, 8], f32[4, 8], f32[4, 8], f32[4, 8]) {\n"
            "  %5 = broadcast_to(%1) {shape=[4, 8]} : f32[4, 8]\n"
            "  %6 = add(%0, %1) : f32[4, 8]\n"
            "  %7 = where(%3, %2, %4) : f32[4, 8]\n"
            "  %8 = multiply(%2, %1) : f32[4, 8]\n"
            "  %9 = subtract(%5, %1) : f32[4, 8]\n"
            "  return %6, %7, %8, %9\n"
            "}\n");
}

TEST(AlgebraicSimplification, KeepsNodesWithRematTags) {
  Graph g;
  ValueId x = g.add_parameter(t32({4}));
  ValueId r = g.add_node1(std::make_shared<Reshape>(Shape{4}), {x}, t32({4}));
  g.nodes.back().remat_name = "h";
  g.outputs = {g.add_node1(unary(UnaryKind::Exp), {r}, t32({4}))};
  std::string before = g.text();
  EXPECT_EQ(run_pass(AlgebraicSimplification(), g), before);
}

// ---------------------------------------------------------------- remat

// Region 0 computes y = exp(sin(x) * w) (y is the region's output); a forward op
// outside reads y, and a "backward" reads the intermediates a = sin(x), b = a * w.
struct RematGraph {
  Graph g;
  ValueId x, w, a, b, y, o;
};

RematGraph remat_graph(CheckpointPolicy policy, std::string a_name = {}) {
  RematGraph r;
  Graph& g = r.g;
  g.remat_regions = {std::move(policy)};
  r.x = g.add_parameter(t32({4}));
  r.w = g.add_parameter(t32({4}));
  r.a = g.add_node1(unary(UnaryKind::Sin), {r.x}, t32({4}));
  g.nodes.back().remat_region = 0;
  g.nodes.back().remat_name = std::move(a_name);
  r.b = g.add_node1(mul(), {r.a, r.w}, t32({4}));
  g.nodes.back().remat_region = 0;
  r.y = g.add_node1(unary(UnaryKind::Exp), {r.b}, t32({4}));
  g.nodes.back().remat_region = 0;
  g.nodes.back().remat_name = Rematerialization::kRegionOutput;
  r.o = g.add_node1(mul(), {r.y, r.w}, t32({4}));
  return r;
}

TEST(Rematerialization, FullPolicyRecomputesIntermediatesBeforeTheirBackwardReaders) {
  RematGraph r = remat_graph(CheckpointPolicy::full());
  Graph& g = r.g;
  ValueId c = g.add_node1(unary(UnaryKind::Cos), {r.x}, t32({4}));  // backward work not reading the region
  ValueId t1 = g.add_node1(mul(), {c, r.b}, t32({4}));
  ValueId t2 = g.add_node1(add(), {t1, r.a}, t32({4}));
  ValueId t3 = g.add_node1(mul(), {t2, r.b}, t32({4}));  // second reader shares the clone
  g.outputs = {r.o, t3};
  const std::string expected =
      "func @main(%0: f32[4], %1: f32[4]) -> (f32[4], f32[4]) {\n"
      "  %2 = sin(%0) : f32[4]  #remat region=0\n"
      "  %3 = multiply(%2, %1) : f32[4]  #remat region=0\n"
      "  %4 = exp(%3) : f32[4]  #remat region=0 name=__output__\n"
      "  %5 = multiply(%4, %1) : f32[4]\n"
      "  %6 = cos(%0) : f32[4]\n"
      "  %7 = sin(%0) : f32[4]  #remat name=__recomputed__\n"
      "  %8 = multiply(%7, %1) : f32[4]  #remat name=__recomputed__\n"
      "  %9 = multiply(%6, %8) : f32[4]\n"
      "  %10 = add(%9, %7) : f32[4]\n"
      "  %11 = multiply(%10, %8) : f32[4]\n"
      "  return %5, %11\n"
      "}\n";
  EXPECT_EQ(run_pass(Rematerialization(), g), expected);
  // The clones are tagged, so CSE keeps them apart from the forward originals.
  EXPECT_EQ(run_pass(CommonSubexpressionElimination(), g), expected);
}

TEST(Rematerialization, ClonesMadeForAnEarlierReaderAreReused) {
  RematGraph r = remat_graph(CheckpointPolicy::full());
  Graph& g = r.g;
  ValueId t1 = g.add_node1(mul(), {r.o, r.a}, t32({4}));  // reads a first
  ValueId t2 = g.add_node1(add(), {t1, r.b}, t32({4}));   // then b = a' * w
  g.outputs = {t2};
  EXPECT_EQ(run_pass(Rematerialization(), g),
            "func @main(%0: f32[4], %1: f32[4]) -> (f32[4]) {\n"
            "  %2 = sin(%0) : f32[4]  #remat region=0\n"
            "  %3 = multiply(%2, %1) : f32[4]  #remat region=0\n"
            "  %4 = exp(%3) : f32[4]  #remat region=0 name=__output__\n"
            "  %5 = multiply(%4, %1) : f32[4]\n"
            "  %6 = sin(%0) : f32[4]  #remat name=__recomputed__\n"
            "  %7 = multiply(%5, %6) : f32[4]\n"
            "  %8 = multiply(%6, %1) : f32[4]  #remat name=__recomputed__\n"
            "  %9 = add(%7, %8) : f32[4]\n"
            "  return %9\n"
            "}\n");
}

TEST(Rematerialization, SaveNamedKeepsTheNamedValues) {
  RematGraph r = remat_graph(CheckpointPolicy::save_named({"a"}), "a");
  Graph& g = r.g;
  ValueId t1 = g.add_node1(mul(), {r.o, r.b}, t32({4}));
  ValueId t2 = g.add_node1(add(), {t1, r.a}, t32({4}));
  g.outputs = {t2};
  EXPECT_EQ(run_pass(Rematerialization(), g),
            "func @main(%0: f32[4], %1: f32[4]) -> (f32[4]) {\n"
            "  %2 = sin(%0) : f32[4]  #remat region=0 name=a\n"
            "  %3 = multiply(%2, %1) : f32[4]  #remat region=0\n"
            "  %4 = exp(%3) : f32[4]  #remat region=0 name=__output__\n"
            "  %5 = multiply(%4, %1) : f32[4]\n"
            "  %6 = multiply(%2, %1) : f32[4]  #remat name=__recomputed__\n"
            "  %7 = multiply(%5, %6) : f32[4]\n"
            "  %8 = add(%7, %2) : f32[4]\n"
            "  return %8\n"
            "}\n");
}

TEST(Rematerialization, FullPolicyRecomputesNamedValuesAndNonePolicyChangesNothing) {
  for (CheckpointPolicy policy : {CheckpointPolicy::full(), CheckpointPolicy::none()}) {
    RematGraph r = remat_graph(policy, "a");
    Graph& g = r.g;
    g.outputs = {g.add_node1(add(), {r.o, r.a}, t32({4}))};
    std::string before = g.text();
    std::string after = run_pass(Rematerialization(), g);
    if (policy.kind == CheckpointPolicy::Kind::None) {
      EXPECT_EQ(after, before);
    } else {
      EXPECT_EQ(g.num_nodes(), 6u) << after;
      EXPECT_NE(after.find("  %6 = sin(%0) : f32[4]  #remat name=__recomputed__\n  %7 = add(%5, %6)"),
                std::string::npos)
          << after;
    }
  }
}

}  // namespace
}  // namespace tessera::compiler
