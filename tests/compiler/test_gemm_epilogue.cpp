// GEMM epilogue fusion: the gemm-epilogue pass (IR in, IR out), and the MatmulEpilogue
// primitive, whose results must be bitwise those of the unfused matmul -> add ->
// activation graph for every shape, transpose, batching, dtype and thread count.
// Graphs run through a small interpreter (each primitive's eval_cpu in node order).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>

#include "compiler/graph_test_util.h"
#include "core/test_util.h"
#include "tessera/base/thread_pool.h"
#include "tessera/compiler/graph.h"
#include "tessera/compiler/parser.h"
#include "tessera/compiler/pass.h"
#include "tessera/compiler/passes/gemm_epilogue.h"
#include "tessera/compiler/primitive_registry.h"
#include "tessera/ir/primitives/elementwise.h"
#include "tessera/ir/primitives/layout.h"
#include "tessera/ir/primitives/linalg.h"
#include "tessera/ir/primitives/matmul_epilogue.h"
#include "tessera/ir/primitives/quantized.h"

namespace tessera::compiler {
namespace {

using test_util::count_nodes;
using test_util::interpret;

using test::random_array;

::testing::AssertionResult bitwise_equal(const Array& a, const Array& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype())
    return ::testing::AssertionFailure() << type_string(a) << " vs " << type_string(b);
  const auto* pa = static_cast<const unsigned char*>(a.raw_data());
  const auto* pb = static_cast<const unsigned char*>(b.raw_data());
  const size_t item = a.itemsize();
  for (size_t i = 0; i < a.nbytes(); i += item)
    if (std::memcmp(pa + i, pb + i, item) != 0)
      return ::testing::AssertionFailure()
             << "element " << i / item << " differs: " << load_as_double(a.dtype(), pa, i / item) << " vs "
             << load_as_double(b.dtype(), pb, i / item);
  return ::testing::AssertionSuccess();
}

Graph fused_copy(const Graph& g) {
  Graph fused = g;
  GemmEpiloguePass().run(fused);
  fused.verify();
  return fused;
}

// One case of matmul(a, b) + bias -> activation.
struct Case {
  std::string what;
  Shape a, b;  // stored shapes (transposed when the flag is set)
  bool trans_a = false, trans_b = false;
  DType dtype = DType::Float32;
  std::optional<UnaryKind> activation = UnaryKind::GeluTanh;
  Shape bias;                   // empty: no bias
  bool bias_first = false;      // add(bias, mm)
  bool broadcast_bias = false;  // bias through an explicit broadcast_to
  bool keep_pre = false;        // the add's output is also returned
  bool int8 = false;            // a quantized_matmul (AQT int8, nearest rounding) instead of matmul
};

Case make_case(std::string what, Shape a, Shape b, bool trans_a = false, bool trans_b = false) {
  Case c;
  c.what = std::move(what);
  c.a = std::move(a);
  c.b = std::move(b);
  c.trans_a = trans_a;
  c.trans_b = trans_b;
  return c;
}

Shape out_shape(const Case& c) {
  if (c.int8) {  // a's leading dims are all rows; b is rank 2
    Shape out = c.trans_a ? Shape{c.a[1]} : Shape(c.a.begin(), c.a.end() - 1);
    out.push_back(c.trans_b ? c.b[0] : c.b[1]);
    return out;
  }
  const int64_t m = c.trans_a ? c.a[c.a.size() - 1] : c.a[c.a.size() - 2];
  const int64_t n = c.trans_b ? c.b[c.b.size() - 2] : c.b[c.b.size() - 1];
  Shape out = c.a.size() > 2 ? Shape(c.a.begin(), c.a.end() - 2) : Shape(c.b.begin(), c.b.end() - 2);
  out.push_back(m);
  out.push_back(n);
  return out;
}

Graph case_graph(const Case& c) {
  Graph g;
  const Shape out = out_shape(c);
  ValueId a = g.add_parameter({c.a, c.dtype});
  ValueId b = g.add_parameter({c.b, c.dtype});
  QuantizedMatmulConfig int8;
  int8.trans_a = c.trans_a;
  int8.trans_b = c.trans_b;
  ValueId v = c.int8 ? g.add_node1(std::make_shared<QuantizedMatmul>(int8), {a, b}, {out, c.dtype})
                     : g.add_node1(std::make_shared<Matmul>(c.trans_a, c.trans_b), {a, b}, {out, c.dtype});
  ValueId pre = v;
  if (!c.bias.empty()) {
    ValueId bias = g.add_parameter({c.bias, c.dtype});
    if (c.broadcast_bias) bias = g.add_node1(std::make_shared<BroadcastTo>(out), {bias}, {out, c.dtype});
    std::vector<ValueId> operands = c.bias_first ? std::vector<ValueId>{bias, v} : std::vector<ValueId>{v, bias};
    pre = g.add_node1(std::make_shared<Binary>(BinaryKind::Add), operands, {out, c.dtype});
  }
  ValueId y = pre;
  if (c.activation) y = g.add_node1(std::make_shared<Unary>(*c.activation), {pre}, {out, c.dtype});
  g.outputs = {y};
  if (c.keep_pre && c.activation) g.outputs.push_back(pre);
  return g;
}

std::vector<Array> case_params(const Case& c, uint32_t seed) {
  std::vector<Array> p = {random_array(c.a, seed, c.dtype, -1, 1), random_array(c.b, seed + 1, c.dtype, -1, 1)};
  if (!c.bias.empty()) p.push_back(random_array(c.bias, seed + 2, c.dtype, -1, 1));
  return p;
}

// Fuses the case's graph into one node and checks it against the unfused graph.
void check_case(const Case& c) {
  SCOPED_TRACE(c.what);
  Graph g = case_graph(c);
  Graph fused = fused_copy(g);
  ASSERT_EQ(fused.num_nodes(), 1u) << fused.text();
  ASSERT_EQ(count_nodes(fused, "matmul_epilogue"), 1u);
  auto params = case_params(c, 7);
  auto want = interpret(g, params);
  auto got = interpret(fused, params);
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(bitwise_equal(got[i], want[i])) << "output " << i;
}

// ---- int8 (AQT) GEMMs: the epilogue runs in the dequantizing pass, bitwise the unfused ops ----

TEST(GemmEpilogueInt8, FusedBitwiseForEveryLayoutDtypeAndEpilogue) {
  for (DType dtype : {DType::Float32, DType::BFloat16}) {
    for (int layout = 0; layout < 4; ++layout) {
      const bool ta = layout & 1, tb = layout & 2;
      Case c = make_case(std::string(name(dtype)) + " layout " + std::to_string(layout),
                         ta ? Shape{70, 100} : Shape{100, 70}, tb ? Shape{300, 70} : Shape{70, 300}, ta, tb);
      c.dtype = dtype;
      c.int8 = true;
      c.bias = {300};
      check_case(c);  // bias + gelu_tanh
      c.keep_pre = true;
      check_case(c);  // and the pre-activation output
      c.bias = {};
      c.activation = UnaryKind::Relu;
      check_case(c);  // activation only
      c.bias = {1, 300};
      c.bias_first = true;
      c.activation = std::nullopt;
      c.keep_pre = false;
      check_case(c);  // bias only, add(bias, x)
    }
    Case batched = make_case("rows in leading dims", {3, 40, 64}, {64, 96});  // [B, T, K] activations
    batched.dtype = dtype;
    batched.int8 = true;
    batched.bias = {96};
    check_case(batched);
  }
}

TEST(GemmEpilogueInt8, TheFusedNodeSaysInt8AndGradientGemmsStayUnfused) {
  Case c = make_case("int8", {64, 32}, {32, 48});
  c.int8 = true;
  c.bias = {48};
  const Graph fused = fused_copy(case_graph(c));
  ASSERT_EQ(count_nodes(fused, "matmul_epilogue"), 1u);
  EXPECT_NE(fused.text().find("int8=true"), std::string::npos) << fused.text();
  // A stochastically rounded (gradient) GEMM is not an epilogue's producer.
  Graph g;
  const ValueId a = g.add_parameter({{64, 32}, DType::Float32}), b = g.add_parameter({{32, 48}, DType::Float32});
  const ValueId key = g.add_parameter({{2}, DType::UInt32});
  const ValueId bias = g.add_parameter({{48}, DType::Float32});
  QuantizedMatmulConfig sr;
  sr.stochastic_a = true;
  const ValueId v = g.add_node1(std::make_shared<QuantizedMatmul>(sr), {a, b, key}, {{64, 48}, DType::Float32});
  g.outputs = {g.add_node1(std::make_shared<Binary>(BinaryKind::Add), {v, bias}, {{64, 48}, DType::Float32})};
  EXPECT_EQ(count_nodes(fused_copy(g), "matmul_epilogue"), 0u);
  // The attribute reads back.
  MatmulEpilogue::Options o;
  o.int8 = true;
  const MatmulEpilogue p(o);
  EXPECT_EQ(make_primitive(p.name(), p.attributes())->attributes(), p.attributes());
}

// ---- the rewrite, as IR text ----

TEST(GemmEpiloguePass, MatmulBiasGeluBecomesOneNode) {
  Graph g = parse_graph(R"(func @main(%0: f32[8, 4], %1: f32[4, 16], %2: f32[16]) -> (f32[8, 16]) {
  %3 = matmul(%0, %1) : f32[8, 16]
  %4 = add(%3, %2) : f32[8, 16]
  %5 = gelu_tanh(%4) : f32[8, 16]
  return %5
})");
  GemmEpiloguePass().run(g);
  g.verify();
  EXPECT_EQ(g.text(), R"(func @main(%0: f32[8, 4], %1: f32[4, 16], %2: f32[16]) -> (f32[8, 16]) {
  %3 = matmul_epilogue(%0, %1, %2) {activation=gelu_tanh} : f32[8, 16]
  return %3
}
)");
}

TEST(GemmEpiloguePass, PreActivationReadByOthersBecomesSecondOutput) {
  // The gelu vjp pattern: the pre-activation is read again by the backward pass. The
  // bias arrives through a broadcast_to, which is read through and removed.
  Graph g = parse_graph(
      R"(func @main(%0: f32[8, 4], %1: f32[16, 4], %2: f32[1, 16], %3: f32[8, 16]) -> (f32[8, 16], f32[8, 16]) {
  %4 = matmul(%0, %1) {trans_a=false, trans_b=true} : f32[8, 16]
  %5 = broadcast_to(%2) {shape=[8, 16]} : f32[8, 16]
  %6 = add(%5, %4) : f32[8, 16]
  %7 = relu(%6) : f32[8, 16]
  %8 = gelu_tanh_grad(%6, %3) : f32[8, 16]
  return %7, %8
})");
  Graph before = g;
  GemmEpiloguePass().run(g);
  g.verify();
  EXPECT_EQ(g.text(),
            R"(func @main(%0: f32[8, 4], %1: f32[16, 4], %2: f32[1, 16], %3: f32[8, 16]) -> (f32[8, 16], f32[8, 16]) {
  %4, %5 = matmul_epilogue(%0, %1, %2) {trans_a=false, trans_b=true, bias_first=true, activation=relu, pre_activation=true} : f32[8, 16], f32[8, 16]
  %6 = gelu_tanh_grad(%5, %3) : f32[8, 16]
  return %4, %6
}
)");
  std::vector<Array> params = {random_array({8, 4}, 1, DType::Float32), random_array({16, 4}, 2, DType::Float32),
                               random_array({1, 16}, 3, DType::Float32), random_array({8, 16}, 4, DType::Float32)};
  auto want = interpret(before, params), got = interpret(g, params);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(bitwise_equal(got[i], want[i])) << "output " << i;
}

TEST(GemmEpiloguePass, BiasOnlyAndActivationOnly) {
  Graph g = parse_graph(
      R"(func @main(%0: f32[8, 4], %1: f32[4, 16], %2: f32[16], %3: f32[4, 16]) -> (f32[8, 16], f32[8, 16]) {
  %4 = matmul(%0, %1) : f32[8, 16]
  %5 = add(%4, %2) : f32[8, 16]
  %6 = matmul(%0, %3) : f32[8, 16]
  %7 = silu(%6) : f32[8, 16]
  return %5, %7
})");
  GemmEpiloguePass().run(g);
  g.verify();
  EXPECT_EQ(g.text(),
            R"(func @main(%0: f32[8, 4], %1: f32[4, 16], %2: f32[16], %3: f32[4, 16]) -> (f32[8, 16], f32[8, 16]) {
  %4 = matmul_epilogue(%0, %1, %2) : f32[8, 16]
  %5 = matmul_epilogue(%0, %3) {bias=false, activation=silu} : f32[8, 16]
  return %4, %5
}
)");
}

TEST(GemmEpiloguePass, LeavesNonMatchingGraphsAlone) {
  // A matmul read twice keeps its add unfused; a full-matrix addend is not a bias;
  // exp is not an epilogue activation; a named checkpoint value stays a node.
  const std::string text =
      R"(func @main(%0: f32[8, 4], %1: f32[4, 16], %2: f32[16], %3: f32[8, 16]) -> (f32[8, 16], f32[8, 16], f32[8, 16], f32[8, 16]) {
  %4 = matmul(%0, %1) : f32[8, 16]
  %5 = add(%4, %2) : f32[8, 16]
  %6 = multiply(%4, %3) : f32[8, 16]
  %7 = matmul(%0, %1) : f32[8, 16]
  %8 = add(%7, %3) : f32[8, 16]
  %9 = matmul(%0, %1) : f32[8, 16]
  %10 = exp(%9) : f32[8, 16]
  return %5, %6, %8, %10
}
)";
  Graph g = parse_graph(text);
  GemmEpiloguePass().run(g);
  EXPECT_EQ(g.text(), text);

  Graph named = parse_graph(R"(func @main(%0: f32[8, 4], %1: f32[4, 16], %2: f32[16]) -> (f32[8, 16]) {
  %3 = matmul(%0, %1) : f32[8, 16]
  %4 = add(%3, %2) : f32[8, 16]
  %5 = gelu_tanh(%4) : f32[8, 16]
  return %5
})");
  named.nodes[1].remat_name = "pre";
  named.nodes[2].remat_name = "act";
  GemmEpiloguePass().run(named);
  EXPECT_EQ(count_nodes(named, "matmul_epilogue"), 0u) << named.text();
}

TEST(GemmEpiloguePass, RunsBeforeFusionInTheDefaultPipeline) {
  const std::string text = default_pipeline().text();
  const size_t epilogue = text.find("gemm-epilogue"), fusion = text.find("-> fusion");
  ASSERT_NE(epilogue, std::string::npos) << text;
  ASSERT_NE(fusion, std::string::npos) << text;
  EXPECT_LT(epilogue, fusion) << text;
}

// ---- bitwise equality with the unfused graph ----

TEST(MatmulEpilogue, BitwiseEqualsUnfusedAcrossShapesAndTiles) {
  // choose_tiles cuts M into ~512-row tiles (multiples of 16) and N into >= 256-column
  // tiles when there are few row tiles: 1040 x 300 gives 2 x 2 tiles with partial edges.
  const std::vector<std::array<int64_t, 3>> mkn = {{1, 1, 1},     {3, 5, 7},       {17, 33, 65},
                                                   {513, 9, 257}, {1040, 24, 300}, {1100, 40, 520}};
  for (const auto& [m, k, n] : mkn) {
    Case c;
    c.what = "m=" + std::to_string(m) + " k=" + std::to_string(k) + " n=" + std::to_string(n);
    c.a = {m, k};
    c.b = {k, n};
    c.bias = {n};
    check_case(c);
  }
}

TEST(MatmulEpilogue, BitwiseEqualsUnfusedForTransposesAndBatches) {
  const int64_t m = 530, k = 19, n = 270;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      Case c;
      c.what = std::string("trans_a=") + (ta ? "1" : "0") + " trans_b=" + (tb ? "1" : "0");
      c.a = ta ? Shape{k, m} : Shape{m, k};
      c.b = tb ? Shape{n, k} : Shape{k, n};
      c.trans_a = ta;
      c.trans_b = tb;
      c.bias = {1, n};
      check_case(c);
    }
  Case batched_a = make_case("batched a, shared b", {3, 37, 11}, {11, 29});
  batched_a.bias = {29};
  check_case(batched_a);
  Case batched_b = make_case("shared a, batched b, transposed", {11, 37}, {2, 3, 29, 11}, true, true);
  batched_b.bias = {1, 1, 29};
  check_case(batched_b);
  Case both = make_case("both batched", {4, 300, 8}, {4, 8, 260});
  both.bias = {260};
  both.keep_pre = true;
  check_case(both);
}

TEST(MatmulEpilogue, BitwiseEqualsUnfusedForEveryActivationAndDtype) {
  for (UnaryKind act :
       {UnaryKind::GeluTanh, UnaryKind::GeluErf, UnaryKind::Relu, UnaryKind::Silu, UnaryKind::Tanh, UnaryKind::Sigmoid})
    for (DType dtype : {DType::Float32, DType::Float64, DType::BFloat16, DType::Float16}) {
      Case c = make_case(std::string(unary_name(act)) + " " + std::string(name(dtype)), {70, 13}, {13, 45});
      c.dtype = dtype;
      c.activation = act;
      c.bias = {45};
      c.keep_pre = dtype == DType::Float32;
      check_case(c);
    }
  Case integer = make_case("int32 relu", {20, 6}, {6, 9});
  integer.dtype = DType::Int32;
  integer.activation = UnaryKind::Relu;
  integer.bias = {9};
  check_case(integer);
  Case empty_k = make_case("k = 0", {5, 0}, {0, 6});
  empty_k.bias = {6};
  empty_k.keep_pre = true;
  check_case(empty_k);
}

TEST(MatmulEpilogue, BitwiseEqualsUnfusedForBiasVariants) {
  Case first = make_case("add(bias, mm)", {40, 8}, {8, 300});
  first.bias = {300};
  first.bias_first = true;
  check_case(first);
  Case through = make_case("broadcast_to(bias)", {40, 8}, {8, 300});
  through.bias = {1, 300};
  through.broadcast_bias = true;
  check_case(through);
  Case no_act = make_case("bias only", {600, 8}, {8, 70});
  no_act.bias = {70};
  no_act.activation.reset();
  check_case(no_act);
  Case no_bias = make_case("activation only, pre returned", {600, 8}, {8, 70});
  no_bias.activation = UnaryKind::Sigmoid;
  no_bias.keep_pre = true;
  check_case(no_bias);
}

TEST(MatmulEpilogue, NaNAndInfinityPassThroughLikeUnfused) {
  Case c = make_case("nan", {30, 4}, {4, 20});
  c.bias = {20};
  c.activation = UnaryKind::Relu;
  Graph g = case_graph(c), fused = fused_copy(g);
  auto params = case_params(c, 3);
  float* bias = params[2].mutable_data<float>();
  bias[1] = std::nanf("");
  bias[2] = INFINITY;
  bias[3] = -INFINITY;
  auto want = interpret(g, params), got = interpret(fused, params);
  EXPECT_TRUE(bitwise_equal(got[0], want[0]));
}

TEST(MatmulEpilogue, MatchesFloat64Reference) {
  // Guards against the fused and unfused paths sharing one mistake.
  const int64_t m = 600, k = 31, n = 290;
  Case c = make_case("reference", {m, k}, {k, n});
  c.bias = {n};
  c.activation = UnaryKind::GeluErf;
  Graph fused = fused_copy(case_graph(c));
  auto params = case_params(c, 11);
  Array y = interpret(fused, params)[0];
  auto a = test::values(params[0]), b = test::values(params[1]), bias = test::values(params[2]);
  auto mm = test::ref_matmul(a, b, 1, m, k, n);
  std::vector<double> want(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m * n; ++i) {
    const double s = mm[static_cast<size_t>(i)] + bias[static_cast<size_t>(i % n)];
    want[static_cast<size_t>(i)] = 0.5 * s * (1 + std::erf(s / std::sqrt(2.0)));
  }
  EXPECT_TRUE(test::all_close(y, want, 1e-5, 1e-5));
}

TEST(MatmulEpilogue, ResultDoesNotDependOnThreadCount) {
  Case c = make_case("threads", {1100, 64}, {64, 700});
  c.bias = {700};
  c.keep_pre = true;
  Graph fused = fused_copy(case_graph(c));
  auto params = case_params(c, 5);
  const int saved = num_threads();
  set_num_threads(1);
  auto one = interpret(fused, params);
  set_num_threads(4);
  auto four = interpret(fused, params);
  set_num_threads(saved);
  for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(bitwise_equal(four[i], one[i])) << "output " << i;
}

// ---- the primitive ----

TEST(MatmulEpilogue, AttributesRoundTripThroughTheRegistry) {
  std::vector<MatmulEpilogue::Options> all;
  all.push_back({});
  MatmulEpilogue::Options o;
  o.trans_b = true;
  o.activation = UnaryKind::GeluErf;
  o.pre_activation = true;
  all.push_back(o);
  o = {};
  o.trans_a = true;
  o.bias_first = true;
  o.activation = UnaryKind::Tanh;
  all.push_back(o);
  o = {};
  o.bias = false;
  o.activation = UnaryKind::Sigmoid;
  all.push_back(o);
  for (const auto& opts : all) {
    auto p = std::make_shared<MatmulEpilogue>(opts);
    PrimitivePtr back = make_primitive(p->name(), p->attributes());
    EXPECT_EQ(back->attributes(), p->attributes());
    EXPECT_TRUE(back->is_equivalent(*p));
    const auto* e = dynamic_cast<const MatmulEpilogue*>(back.get());
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->options().trans_a, opts.trans_a);
    EXPECT_EQ(e->options().trans_b, opts.trans_b);
    EXPECT_EQ(e->options().bias, opts.bias);
    EXPECT_EQ(e->options().bias_first, opts.bias_first);
    EXPECT_EQ(e->options().activation, opts.activation);
    EXPECT_EQ(e->options().pre_activation, opts.pre_activation);
  }
  EXPECT_EQ(std::make_shared<MatmulEpilogue>(all[1])->attributes(),
            "trans_a=false, trans_b=true, activation=gelu_erf, pre_activation=true");
  EXPECT_THROW(make_primitive("matmul_epilogue", "activation=exp"), ValueError);
  EXPECT_THROW(make_primitive("matmul_epilogue", "activation=swish"), ValueError);
  EXPECT_THROW(make_primitive("matmul_epilogue", "bias=false"), ValueError);
  EXPECT_THROW(make_primitive("matmul_epilogue", "pre_activation=true"), ValueError);
  EXPECT_THROW(make_primitive("matmul_epilogue", "actvation=relu"), ValueError);
}

// The backward's form: matmul -> gelu_tanh_grad(x, product) becomes one node with
// activation_grad=gelu_tanh and inputs (a, b, x), placed where the gradient was (x may be
// made after the matmul), bitwise the unfused pair; a product with another reader stays.
TEST(GemmEpiloguePass, GeluGradientOfAProductBecomesOneNode) {
  Graph g = parse_graph(R"(func @main(%0: bf16[2, 8, 4], %1: bf16[16, 4], %2: bf16[2, 8, 16]) -> (bf16[2, 8, 16]) {
  %3 = matmul(%0, %1) {trans_a=false, trans_b=true} : bf16[2, 8, 16]
  %4 = exp(%2) : bf16[2, 8, 16]
  %5 = gelu_tanh_grad(%4, %3) : bf16[2, 8, 16]
  return %5
})");
  Graph fused = fused_copy(g);
  EXPECT_EQ(fused.text(), R"(func @main(%0: bf16[2, 8, 4], %1: bf16[16, 4], %2: bf16[2, 8, 16]) -> (bf16[2, 8, 16]) {
  %3 = exp(%2) : bf16[2, 8, 16]
  %4 = matmul_epilogue(%0, %1, %3) {trans_a=false, trans_b=true, bias=false, activation_grad=gelu_tanh} : bf16[2, 8, 16]
  return %4
}
)");
  for (DType dtype : {DType::BFloat16, DType::Float32}) {
    SCOPED_TRACE(name(dtype));
    const std::vector<Array> params = {random_array({2, 8, 4}, 3, dtype, -2, 2), random_array({16, 4}, 4, dtype, -2, 2),
                                       random_array({2, 8, 16}, 5, dtype, -2, 2)};
    Graph typed = g;
    for (Value& v : typed.values) v.type.dtype = dtype;
    Graph typed_fused = fused_copy(typed);
    ASSERT_EQ(count_nodes(typed_fused, "matmul_epilogue"), 1u);
    const auto want = interpret(typed, params);
    const auto got = interpret(typed_fused, params);
    EXPECT_TRUE(bitwise_equal(got[0], want[0]));
  }
  // The product also returned: unfused.
  Graph kept = parse_graph(R"(func @main(%0: f32[8, 4], %1: f32[4, 16], %2: f32[8, 16]) -> (f32[8, 16], f32[8, 16]) {
  %3 = matmul(%0, %1) : f32[8, 16]
  %4 = gelu_tanh_grad(%2, %3) : f32[8, 16]
  return %4, %3
})");
  EXPECT_EQ(count_nodes(fused_copy(kept), "matmul_epilogue"), 0u);
  // The product as the gradient's x (its first operand), not its g: unfused.
  Graph swapped = parse_graph(R"(func @main(%0: f32[8, 4], %1: f32[4, 16], %2: f32[8, 16]) -> (f32[8, 16]) {
  %3 = matmul(%0, %1) : f32[8, 16]
  %4 = gelu_tanh_grad(%3, %2) : f32[8, 16]
  return %4
})");
  EXPECT_EQ(count_nodes(fused_copy(swapped), "matmul_epilogue"), 0u);
}

TEST(MatmulEpilogue, ActivationGradOptionsAreChecked) {
  MatmulEpilogue::Options o;
  o.bias = false;
  o.activation_grad = UnaryKind::GeluTanh;
  auto p = std::make_shared<MatmulEpilogue>(o);
  EXPECT_EQ(p->attributes(), "bias=false, activation_grad=gelu_tanh");
  PrimitivePtr back = make_primitive(p->name(), p->attributes());
  EXPECT_TRUE(back->is_equivalent(*p));
  EXPECT_EQ(dynamic_cast<const MatmulEpilogue&>(*back).options().activation_grad, UnaryKind::GeluTanh);
  EXPECT_THROW(make_primitive("matmul_epilogue", "bias=false, activation_grad=relu"), ValueError);
  EXPECT_THROW(make_primitive("matmul_epilogue", "bias=true, activation_grad=gelu_tanh"), ValueError);
  EXPECT_THROW(make_primitive("matmul_epilogue", "bias=false, activation=gelu_tanh, activation_grad=gelu_tanh"),
               ValueError);
  // Three inputs, x of the output's type.
  Array a = random_array({4, 3}, 1, DType::Float32), b = random_array({3, 5}, 2, DType::Float32);
  std::vector<Array> outs = {Array::placeholder({4, 5}, DType::Float32)};
  EXPECT_THROW(p->eval_cpu({a, b}, outs), ValueError);
  EXPECT_THROW(p->eval_cpu({a, b, random_array({4, 4}, 3, DType::Float32)}, outs), ShapeError);
  // Cost: the GEMM and one FLOP per element.
  Cost c = p->cost({a, b, outs[0]}, outs);
  EXPECT_DOUBLE_EQ(c.flops, 2.0 * 4 * 5 * 3 + 4 * 5);
}

TEST(MatmulEpilogue, CostIsMatmulPlusEpilogue) {
  MatmulEpilogue::Options o;
  o.activation = UnaryKind::GeluTanh;
  MatmulEpilogue p(o);
  Array a = Array::placeholder({6, 5}, DType::Float32), b = Array::placeholder({5, 7}, DType::Float32);
  Array bias = Array::placeholder({7}, DType::Float32), y = Array::placeholder({6, 7}, DType::Float32);
  Cost c = p.cost({a, b, bias}, {y});
  EXPECT_DOUBLE_EQ(c.flops, 2.0 * 6 * 7 * 5 + 2.0 * 6 * 7);
  EXPECT_DOUBLE_EQ(c.bytes, 4.0 * (30 + 35 + 7 + 42));
}

TEST(MatmulEpilogue, BadInputsAndGradientsThrow) {
  MatmulEpilogue p({});
  Array a = random_array({4, 3}, 1, DType::Float32), b = random_array({3, 5}, 2, DType::Float32);
  std::vector<Array> outs = {Array::placeholder({4, 5}, DType::Float32)};
  EXPECT_THROW(p.eval_cpu({a, b, random_array({4, 5}, 3, DType::Float32)}, outs), ShapeError);
  EXPECT_THROW(p.eval_cpu({a, b, random_array({5}, 3, DType::Float64)}, outs), ShapeError);
  EXPECT_THROW(p.eval_cpu({a, b}, outs), ValueError);
  EXPECT_THROW(p.eval_cpu({a, random_array({4, 5}, 3, DType::Float32), random_array({5}, 3, DType::Float32)}, outs),
               ShapeError);
  EXPECT_THROW(p.vjp({a, b}, {outs[0]}, {0}, outs), TransformError);
}

// ---- speed ----

double elapsed_ms(const Graph& g, const std::vector<Array>& params) {
  auto start = std::chrono::steady_clock::now();
  auto out = interpret(g, params);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

TEST(MatmulEpilogue, TimingMatmulBiasGelu) {
  // Reported, not asserted (machines and load differ): the fused kernel saves two
  // passes over the 8 MiB output.
  const int64_t m = test::small_tests() ? 256 : 2048, k = 256, n = 1024;
  Case c = make_case("timing", {m, k}, {k, n});
  c.bias = {n};
  Graph g = case_graph(c), fused = fused_copy(g);
  auto params = case_params(c, 9);
  elapsed_ms(g, params);  // warm the buffer cache and the pool
  elapsed_ms(fused, params);
  // Alternating runs, so both versions see the same machine load; best of 10 each.
  double unfused_ms = 1e30, fused_ms = 1e30;
  for (int r = 0; r < 10; ++r) {
    unfused_ms = std::min(unfused_ms, elapsed_ms(g, params));
    fused_ms = std::min(fused_ms, elapsed_ms(fused, params));
  }
  std::printf(
      "[ timing ] matmul+bias+gelu_tanh [%lldx%lld]x[%lldx%lld], %d threads: unfused %.2f ms, fused %.2f ms "
      "(%.2fx)\n",
      static_cast<long long>(m), static_cast<long long>(k), static_cast<long long>(k), static_cast<long long>(n),
      num_threads(), unfused_ms, fused_ms, unfused_ms / fused_ms);
  EXPECT_TRUE(bitwise_equal(interpret(fused, params)[0], interpret(g, params)[0]));
}

}  // namespace
}  // namespace tessera::compiler
