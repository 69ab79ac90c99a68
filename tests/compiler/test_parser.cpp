// The IR text reads back: every primitive rebuilds from name() + attributes(), and
// parse_graph(g.text()) prints g.text() again. Malformed text names its line.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <typeinfo>
#include <vector>

#include "core/test_util.h"
#include "tessera/compiler/graph.h"
#include "tessera/compiler/parser.h"
#include "tessera/compiler/primitive_registry.h"
#include "tessera/ir/primitives/elementwise.h"
#include "tessera/ir/primitives/indexing.h"
#include "tessera/ir/primitives/layout.h"
#include "tessera/ir/primitives/linalg.h"
#include "tessera/ir/primitives/nn.h"
#include "tessera/ir/primitives/optim.h"
#include "tessera/ir/primitives/random.h"
#include "tessera/ir/primitives/reduce.h"

namespace tessera::compiler {
namespace {

using test::make_array;
using test::random_array;

// Several attribute variants of every primitive in include/tessera/ir/primitives.
std::vector<PrimitivePtr> all_primitives() {
  std::vector<PrimitivePtr> p;
  for (int k = 0; k < kNumUnaryKinds; ++k) p.push_back(std::make_shared<Unary>(UnaryKind(k)));
  for (int k = 0; k < kNumBinaryKinds; ++k) {
    p.push_back(std::make_shared<Binary>(BinaryKind(k)));
  }
  p.push_back(std::make_shared<Where>());
  p.push_back(std::make_shared<StopGradient>());
  p.push_back(std::make_shared<Identity>());
  for (int d = 0; d < kNumDTypes; ++d) p.push_back(std::make_shared<Cast>(DType(d)));

  p.push_back(std::make_shared<Reshape>(Shape{}));
  p.push_back(std::make_shared<Reshape>(Shape{4, 0, 8}));
  p.push_back(std::make_shared<Transpose>(std::vector<int>{}));
  p.push_back(std::make_shared<Transpose>(std::vector<int>{2, 0, 1}));
  p.push_back(std::make_shared<BroadcastTo>(Shape{3, 1, 5}));
  p.push_back(
      std::make_shared<Slice>(std::vector<int64_t>{0, 2}, std::vector<int64_t>{4, 9}, std::vector<int64_t>{1, 3}));
  p.push_back(std::make_shared<Slice>(std::vector<int64_t>{}, std::vector<int64_t>{}, std::vector<int64_t>{}));
  p.push_back(std::make_shared<SlicePad>(Shape{6, 10}, std::vector<int64_t>{1, 2}, std::vector<int64_t>{2, 3}));
  p.push_back(std::make_shared<Concatenate>(0));
  p.push_back(std::make_shared<Concatenate>(-1));

  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) p.push_back(std::make_shared<Matmul>(ta, tb));
  }
  for (auto kind : {ReduceKind::Sum, ReduceKind::Prod, ReduceKind::Max, ReduceKind::Min}) {
    p.push_back(std::make_shared<Reduce>(kind, std::vector<int>{0, 2}));
    p.push_back(std::make_shared<Reduce>(kind, std::vector<int>{}));
  }
  for (bool is_max : {false, true}) p.push_back(std::make_shared<ArgReduce>(is_max, 1));

  p.push_back(std::make_shared<Take>(0));
  p.push_back(std::make_shared<Take>(2));
  p.push_back(std::make_shared<TakeAlong>(1));
  p.push_back(std::make_shared<TakeScatterAdd>(Shape{10, 4}, 0));
  p.push_back(std::make_shared<TakeAlongScatterAdd>(Shape{3, 7}, 1));

  for (bool log : {false, true}) {
    p.push_back(std::make_shared<Softmax>(log));
    p.push_back(std::make_shared<SoftmaxGrad>(log));
  }
  for (bool rms : {false, true}) {
    for (bool w : {false, true}) {
      for (bool b : {false, true}) {
        p.push_back(std::make_shared<Norm>(rms, w, b, 1e-5));
        p.push_back(std::make_shared<NormGrad>(rms, w, b));
      }
    }
    p.push_back(std::make_shared<Norm>(rms, true, false, 1.0 / 3.0));
  }
  for (bool causal : {false, true}) {
    for (bool mask : {false, true}) {
      AttentionConfig config{causal, 1.0 / std::sqrt(3.0), mask};
      p.push_back(std::make_shared<Attention>(config));
      p.push_back(std::make_shared<AttentionGrad>(config));
    }
  }
  p.push_back(std::make_shared<Attention>(AttentionConfig{true, 0.125, false}));
  for (bool mask : {false, true}) {  // segment ids (packed documents)
    p.push_back(std::make_shared<Attention>(AttentionConfig{true, 0.125, mask, true}));
    p.push_back(std::make_shared<AttentionGrad>(AttentionConfig{true, 0.125, mask, true}));
  }
  for (int64_t ignore : {int64_t{-100}, int64_t{0}, std::numeric_limits<int64_t>::min()}) {
    p.push_back(std::make_shared<CrossEntropy>(ignore));
    p.push_back(std::make_shared<CrossEntropyGrad>(ignore));
  }

  p.push_back(std::make_shared<AdamW>(AdamWConfig{}));
  p.push_back(std::make_shared<AdamW>(AdamWConfig{3e-4, 0.95, 0.9999, 1e-12, 0.1, 123456789012}));
  p.push_back(std::make_shared<AdamW>(AdamWConfig{0, 0.95, 0.9999, 1e-12, 0.1, 1}, /*dynamic=*/true));
  p.push_back(std::make_shared<Lion>(LionConfig{}));
  p.push_back(std::make_shared<Lion>(LionConfig{3e-4, 0.95, 0.98, 0.1}));
  p.push_back(std::make_shared<Lion>(LionConfig{0, 0.9, 0.99, 1.0 / 3.0}, /*dynamic=*/true));

  p.push_back(std::make_shared<RandomSplit>(2));
  p.push_back(std::make_shared<RandomSplit>(0));
  p.push_back(std::make_shared<RandomSample>(Distribution::Uniform, -0.1, 2.5e-7, Shape{3, 4}, DType::Float32));
  p.push_back(std::make_shared<RandomSample>(Distribution::Uniform, -std::numeric_limits<double>::infinity(), 1.0,
                                             Shape{}, DType::BFloat16));
  p.push_back(std::make_shared<RandomSample>(Distribution::Normal, 0.0, 0.02, Shape{128}, DType::Float64));
  p.push_back(std::make_shared<RandomBernoulli>());
  return p;
}

TEST(PrimitiveRegistry, EveryPrimitiveRebuildsFromItsAttributes) {
  for (const PrimitivePtr& p : all_primitives()) {
    SCOPED_TRACE(p->name() + " {" + p->attributes() + "}");
    PrimitivePtr rebuilt = make_primitive(p->name(), p->attributes());
    ASSERT_NE(rebuilt, nullptr);
    EXPECT_EQ(rebuilt->name(), p->name());
    EXPECT_EQ(rebuilt->attributes(), p->attributes());
    EXPECT_TRUE(rebuilt->is_equivalent(*p));
    const Primitive& rebuilt_primitive = *rebuilt;  // (typeid of a plain reference: no side effects to warn of)
    const Primitive& original = *p;
    EXPECT_EQ(typeid(rebuilt_primitive), typeid(original));
  }
}

// Norm and NormGrad print which optional inputs they take: primitives that differ
// only there must not be merged by CSE (nor lost by the text form).
TEST(PrimitiveRegistry, NormVariantsAreDistinct) {
  EXPECT_FALSE(NormGrad(false, true, true).is_equivalent(NormGrad(false, false, false)));
  EXPECT_FALSE(NormGrad(true, true, false).is_equivalent(NormGrad(true, false, false)));
  EXPECT_FALSE(Norm(false, true, true, 1e-5).is_equivalent(Norm(false, true, false, 1e-5)));
}

TEST(PrimitiveRegistry, AttributeMapSplitsAtTopLevelCommas) {
  AttributeMap map("op", "a=1, b=[1, 2], body={x=[3, 4], y=(5, 6)}, c=-2.5e-3, d=true, e=bfloat16, f=[]");
  EXPECT_EQ(map.get_int("a"), 1);
  EXPECT_EQ(map.get_ints("b"), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(map.raw("body"), "{x=[3, 4], y=(5, 6)}");
  EXPECT_EQ(map.get_double("c"), -2.5e-3);
  EXPECT_TRUE(map.get_bool("d"));
  EXPECT_EQ(map.get_dtype("e"), DType::BFloat16);
  EXPECT_TRUE(map.get_shape("f").empty());
  EXPECT_FALSE(map.has("g"));
  EXPECT_NO_THROW(map.check_all_read());
}

TEST(PrimitiveRegistry, DoublesReadBackExactly) {
  for (double x : {0.1, 1.0 / 3.0, 1e-300, 5e-324, 1.7976931348623157e308, -0.0, 123456.789}) {
    PrimitivePtr p = make_primitive("layer_norm", fmt::format("eps={}, weight=true, bias=false", x));
    AttributeMap map("layer_norm", p->attributes());
    EXPECT_EQ(std::signbit(map.get_double("eps")), std::signbit(x));
    EXPECT_EQ(map.get_double("eps"), x);
  }
}

void expect_value_error(const std::function<void()>& fn, const std::vector<std::string>& mentions) {
  try {
    fn();
    ADD_FAILURE() << "no ValueError";
  } catch (const ValueError& e) {
    for (const std::string& m : mentions) EXPECT_NE(std::string(e.what()).find(m), std::string::npos) << e.what();
  }
}

TEST(PrimitiveRegistry, BadNamesAndAttributesAreValueErrors) {
  expect_value_error([] { make_primitive("frobnicate", ""); }, {"frobnicate"});
  expect_value_error([] { make_primitive("take", ""); }, {"take", "axis"});
  expect_value_error([] { make_primitive("take", "axis=x1"); }, {"take", "axis", "x1"});
  expect_value_error([] { make_primitive("take", "axis=1, axis=2"); }, {"take", "axis", "twice"});
  expect_value_error([] { make_primitive("take", "axis=1, color=red"); }, {"take", "color"});
  expect_value_error([] { make_primitive("take", "axis=99999999999"); }, {"take", "axis"});
  expect_value_error([] { make_primitive("reshape", "shape=[4, -1]"); }, {"reshape", "shape"});
  expect_value_error([] { make_primitive("reshape", "shape=[4, 2"); }, {"reshape", "shape"});
  expect_value_error([] { make_primitive("transpose", "perm=1, 0"); }, {"transpose"});
  expect_value_error([] { make_primitive("convert", "dtype=float33"); }, {"convert", "dtype", "float33"});
  expect_value_error([] { make_primitive("attention", "causal=yes, scale=1, mask=false"); },
                     {"attention", "causal", "yes"});
  expect_value_error([] { make_primitive("layer_norm", "eps=1e-5x, weight=true, bias=true"); },
                     {"layer_norm", "eps", "1e-5x"});
  expect_value_error([] { make_primitive("slice", "start=[0], stop=[1, 2], step=[1]"); }, {"slice"});
}

TEST(PrimitiveRegistry, RegisterPrimitiveAddsAFactory) {
  register_primitive("test_parser_custom", [](const AttributeMap& a) -> PrimitivePtr {
    return std::make_shared<Take>(static_cast<int>(a.get_int("axis")));
  });
  EXPECT_EQ(make_primitive("test_parser_custom", "axis=3")->attributes(), "axis=3");
}

// ---- graphs ----

// The constants of g in the order g.text() prints them (first read by a node, then
// returned directly).
std::vector<Array> constants_in_print_order(const Graph& g) {
  std::vector<Array> out;
  std::vector<char> seen(g.values.size(), 0);
  auto visit = [&](ValueId v) {
    const Value& value = g.value(v);
    if (value.kind != ValueKind::Constant || seen[static_cast<size_t>(v)]) return;
    seen[static_cast<size_t>(v)] = 1;
    out.push_back(value.constant);
  };
  for (const Node& node : g.nodes) {
    for (ValueId in : node.inputs) visit(in);
  }
  for (ValueId v : g.outputs) visit(v);
  return out;
}

// The ones printed by reference ({bytes=N, hash=H}), as executable serialization supplies them.
std::vector<Array> large_constants(const Graph& g) {
  std::vector<Array> out;
  for (const Array& c : constants_in_print_order(g)) {
    if (c.size() > 16) out.push_back(c);
  }
  return out;
}

void expect_round_trip(const Graph& g) {
  std::string text = g.text();
  SCOPED_TRACE(text);
  Graph parsed = parse_graph(text, large_constants(g));
  EXPECT_EQ(parsed.text(), text);
  EXPECT_EQ(parsed.name, g.name);
  ASSERT_EQ(parsed.values.size(), g.values.size());
  // Constant data reads back exactly.
  std::vector<Array> expected = constants_in_print_order(g), actual = constants_in_print_order(parsed);
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_EQ(type_of(actual[i]), type_of(expected[i])) << "constant #" << i;
    if (expected[i].nbytes() > 0) {
      EXPECT_EQ(std::memcmp(actual[i].raw_data(), expected[i].raw_data(), expected[i].nbytes()), 0)
          << "constant #" << i;
    }
  }
}

TEST(Parser, RoundTripsTheHeaderExample) {
  Graph g;
  ValueId x = g.add_parameter({{4, 8}, DType::Float32});
  ValueId b = g.add_parameter({{8}, DType::Float32});
  ValueId one = g.add_constant(Array::scalar(1.0));
  ValueId bb = g.add_node1(std::make_shared<BroadcastTo>(Shape{4, 8}), {b}, {{4, 8}, DType::Float32});
  ValueId sum = g.add_node1(std::make_shared<Binary>(BinaryKind::Add), {x, bb}, {{4, 8}, DType::Float32});
  ValueId out = g.add_node1(std::make_shared<Binary>(BinaryKind::Mul), {sum, one}, {{4, 8}, DType::Float32});
  g.outputs = {out};
  expect_round_trip(g);
}

TEST(Parser, RoundTripsMultiOutputNodesAndAllConstantKinds) {
  Graph g;
  g.name = "train_step";
  ValueId x = g.add_parameter({{2, 3, 8}, DType::BFloat16});
  ValueId w = g.add_parameter({{8}, DType::Float32});
  ValueId tokens = g.add_parameter({{6}, DType::Int64});
  ValueId big = g.add_constant(random_array({5, 8}, 7, DType::Float32));             // 40 elements: by reference
  ValueId big2 = g.add_constant(random_array({17}, 8, DType::Float64));              // 17 elements: by reference
  ValueId small = g.add_constant(make_array({1.5, -0.25, 3}, {3}, DType::Float16));  // inline list
  ValueId one_elem = g.add_constant(make_array({-7}, {1}, DType::Int32));            // [1]: inline list
  ValueId flags = g.add_constant(make_array({1, 0, 1, 1}, {2, 2}, DType::Bool));
  ValueId empty = g.add_constant(make_array({}, {0, 3}, DType::Float32));
  ValueId third = g.add_constant(Array::scalar(1.0 / 3.0, DType::Float64));
  ValueId returned = g.add_constant(random_array({4, 5}, 9, DType::Float32));  // only returned

  auto norm = g.add_node(std::make_shared<Norm>(false, true, false, 1e-5), {x, w},
                         {{{2, 3, 8}, DType::BFloat16}, {{2, 3}, DType::Float32}, {{2, 3}, DType::Float32}});
  ValueId mm = g.add_node1(std::make_shared<Matmul>(false, true), {norm[0], big}, {{2, 3, 5}, DType::BFloat16});
  ValueId emb = g.add_node1(std::make_shared<Take>(0), {big, tokens}, {{6, 8}, DType::Float32});
  ValueId cast = g.add_node1(std::make_shared<Cast>(DType::Float64), {emb}, {{6, 8}, DType::Float64});
  ValueId r = g.add_node1(std::make_shared<Reduce>(ReduceKind::Sum, std::vector<int>{0}), {big2}, {{}, DType::Float64});
  ValueId scaled = g.add_node1(std::make_shared<Binary>(BinaryKind::Mul), {r, third}, {{}, DType::Float64});
  auto adam = g.add_node(std::make_shared<AdamW>(AdamWConfig{3e-4, 0.9, 0.95, 1e-8, 0.1, 7}), {w, w, w, w},
                         {{{8}, DType::Float32}, {{8}, DType::Float32}, {{8}, DType::Float32}});
  ValueId sel = g.add_node1(std::make_shared<Where>(), {flags, flags, flags}, {{2, 2}, DType::Bool});
  ValueId cat = g.add_node1(std::make_shared<Concatenate>(0), {empty, empty}, {{0, 3}, DType::Float32});
  ValueId h = g.add_node1(std::make_shared<Binary>(BinaryKind::Add), {small, small}, {{3}, DType::Float16});
  ValueId i = g.add_node1(std::make_shared<Unary>(UnaryKind::Neg), {one_elem}, {{1}, DType::Int32});
  g.outputs = {norm[1], norm[2], mm, cast, scaled, adam[0], adam[2], sel, cat, h, i, returned, x};
  g.verify();
  expect_round_trip(g);
  EXPECT_EQ(large_constants(g).size(), 3u);
}

TEST(Parser, RoundTripsOptimizerUpdates) {
  // Every form of the fused updates: static and dynamic (lr, and AdamW's step, as values).
  Graph g;
  ValueId p = g.add_parameter({{8}, DType::BFloat16});
  ValueId m = g.add_parameter({{8}, DType::Float32});
  ValueId lr = g.add_parameter({{}, DType::Float32});
  ValueId step = g.add_parameter({{}, DType::Int64});
  const std::vector<TensorType> lion_out = {{{8}, DType::BFloat16}, {{8}, DType::Float32}};
  auto fixed = g.add_node(std::make_shared<Lion>(LionConfig{3e-4, 0.95, 0.98, 0.1}), {p, p, m}, lion_out);
  auto dynamic = g.add_node(std::make_shared<Lion>(LionConfig{.beta1 = 0.9, .beta2 = 0.99, .weight_decay = 0.0}, true),
                            {fixed[0], p, fixed[1], lr}, lion_out);
  auto adam = g.add_node(std::make_shared<AdamW>(AdamWConfig{.beta1 = 0.9, .beta2 = 0.95, .weight_decay = 0.1}, true),
                         {dynamic[0], p, dynamic[1], m, lr, step},
                         {{{8}, DType::BFloat16}, {{8}, DType::Float32}, {{8}, DType::Float32}});
  g.outputs = {adam[0], adam[1], adam[2], dynamic[1]};
  g.verify();
  expect_round_trip(g);
  EXPECT_NE(g.text().find("lion_update"), std::string::npos);
}

TEST(Parser, RoundTripsGraphsWithoutParametersOrOutputs) {
  Graph g;
  ValueId c = g.add_constant(Array::scalar(2.0, DType::Int64));
  ValueId k = g.add_node1(std::make_shared<RandomSample>(Distribution::Normal, 0.0, 0.02, Shape{4}, DType::Float32),
                          {c}, {{4}, DType::Float32});
  g.outputs = {k, k};
  expect_round_trip(g);

  Graph empty;
  expect_round_trip(empty);
}

TEST(Parser, RoundTripsRematAnnotations) {
  Graph g;
  ValueId x = g.add_parameter({{4}, DType::Float32});
  ValueId y = g.add_node1(std::make_shared<Unary>(UnaryKind::Tanh), {x}, {{4}, DType::Float32});
  ValueId z = g.add_node1(std::make_shared<Unary>(UnaryKind::Exp), {y}, {{4}, DType::Float32});
  g.remat_regions.resize(2);
  g.nodes[0].remat_region = 1;
  g.nodes[0].remat_name = "attn_out";
  g.nodes[1].remat_region = 0;
  g.outputs = {z};
  ASSERT_NE(g.text().find("#remat"), std::string::npos);
  expect_round_trip(g);
}

// Hand-written IR for pass tests: free value names, blank lines, attributes over
// several lines; printing renumbers.
TEST(Parser, ReadsHandWrittenText) {
  Graph g = parse_graph(R"(
func @f(%x: f32[2, 3]) -> (f32[3, 2], f32[]) {

  %t = transpose(%x) {perm=[1,
                          0]} : f32[3, 2]
  %s = reduce_sum(%t) {axes=[0, 1]} : f32[]
  return %t, %s
}
)");
  EXPECT_EQ(g.text(),
            "func @f(%0: f32[2, 3]) -> (f32[3, 2], f32[]) {\n"
            "  %1 = transpose(%0) {perm=[1, 0]} : f32[3, 2]\n"
            "  %2 = reduce_sum(%1) {axes=[0, 1]} : f32[]\n"
            "  return %1, %2\n"
            "}\n");
}

// Parses `text` and expects a ValueError naming `line` and each of `mentions`.
void expect_parse_error(const std::string& text, int line, const std::vector<std::string>& mentions,
                        const std::vector<Array>& constants = {}) {
  SCOPED_TRACE(text);
  std::vector<std::string> all = mentions;
  all.push_back(fmt::format("line {}:", line));
  expect_value_error([&] { parse_graph(text, constants); }, all);
}

TEST(Parser, MalformedTextNamesTheLine) {
  const std::string head = "func @main(%0: f32[4]) -> (f32[4]) {\n";
  expect_parse_error("fun @main() -> () {\n  return\n}\n", 1, {"'func'"});
  expect_parse_error("func @main(%0: f33[4]) -> (f32[4]) {\n  return %0\n}\n", 1, {"type"});
  expect_parse_error("func @main(%0: f32[4) -> (f32[4]) {\n  return %0\n}\n", 1, {"']'"});
  expect_parse_error(head + "  %1 = frobnicate(%0) : f32[4]\n  return %1\n}\n", 2, {"frobnicate"});
  expect_parse_error(head + "  %1 = negative(%7) : f32[4]\n  return %1\n}\n", 2, {"%7", "before it is defined"});
  expect_parse_error(head + "  %1 = negative(%0) : f32[4]\n  %1 = negative(%0) : f32[4]\n  return %1\n}\n", 3,
                     {"%1", "twice"});
  expect_parse_error(head + "  %1 = reshape(%0) {shape=[4, x]} : f32[4]\n  return %1\n}\n", 2, {"reshape", "x"});
  expect_parse_error(head + "  %1 = reshape(%0) {shap=[4]} : f32[4]\n  return %1\n}\n", 2, {"reshape", "'shape'"});
  expect_parse_error(head + "  %1 = transpose(%0) {perm=[0], extra=1} : f32[4]\n  return %1\n}\n", 2, {"extra"});
  expect_parse_error(head + "  %1 = reshape(%0) {shape=[4} : f32[4]\n  return %1\n}\n", 2, {"unbalanced"});
  expect_parse_error(head + "  %1, %2 = negative(%0) : f32[4]\n  return %1\n}\n", 2, {"2 values", "1 types"});
  expect_parse_error(head + "  %1 = negative(%0) f32[4]\n  return %1\n}\n", 2, {"':'"});
  expect_parse_error(head + "  return %0, %0\n}\n", 2, {"return", "2"});
  expect_parse_error("func @main(%0: f32[4]) -> (i32[4]) {\n  return %0\n}\n", 2, {"i32[4]"});
  expect_parse_error(head + "  return %0\n", 3, {"'}'"});
  expect_parse_error(head + "  return %0\n}\ntrailing\n", 4, {"end of the text"});
  expect_parse_error(head + "  %1 = constant {value=[1, 2]} : f32[3]\n  return %0\n}\n", 2, {"2 elements"});
  expect_parse_error(head + "  %1 = constant {value=abc} : f32[]\n  return %0\n}\n", 2, {"abc"});
  expect_parse_error(head + "  %1 = constant {val=1} : f32[]\n  return %0\n}\n", 2, {"constant"});
}

TEST(Parser, LargeConstantsMustMatchTheSuppliedArrays) {
  Graph g;
  ValueId x = g.add_parameter({{20}, DType::Float32});
  Array data = random_array({20}, 3, DType::Float32);
  ValueId c = g.add_constant(data);
  g.outputs = {g.add_node1(std::make_shared<Binary>(BinaryKind::Add), {x, c}, {{20}, DType::Float32})};
  std::string text = g.text();
  EXPECT_EQ(parse_graph(text, {data}).text(), text);
  expect_parse_error(text, 2, {"only 0 arrays"});
  expect_parse_error(text, 2, {"hash"}, {random_array({20}, 4, DType::Float32)});
  expect_parse_error(text, 2, {"f64[20]"}, {random_array({20}, 3, DType::Float64)});
  expect_parse_error(text, 2, {"f32[4, 5]"}, {random_array({4, 5}, 3, DType::Float32)});
  // An array the text never reads is a mismatch too.
  expect_value_error([&] { parse_graph(text, {data, data}); }, {"2 constant arrays", "reads 1"});
}

}  // namespace
}  // namespace tessera::compiler
