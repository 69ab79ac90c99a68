// FusionPass and the Fusion primitive: graphs are built by hand, fused, and both
// versions are run by a tiny interpreter (each primitive's eval_cpu in node order);
// the fused results must be bitwise the unfused ones. The fused kernel is also checked
// directly against float64 references.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>

#include "backend/cpu/kernels/elementwise.h"
#include "backend/cpu/kernels/fused_elementwise.h"
#include "compiler/graph_test_util.h"
#include "core/test_util.h"
#include "tessera/base/thread_pool.h"
#include "tessera/compiler/graph.h"
#include "tessera/compiler/passes/fusion.h"
#include "tessera/compiler/primitive_registry.h"
#include "tessera/ir/primitives/elementwise.h"
#include "tessera/ir/primitives/fusion.h"
#include "tessera/ir/primitives/layout.h"
#include "tessera/ir/primitives/reduce.h"

namespace tessera::compiler {
namespace {

using test_util::count_nodes;
using test_util::interpret;

using test::random_array;

PrimitivePtr unary(UnaryKind k) { return std::make_shared<Unary>(k); }
PrimitivePtr binary(BinaryKind k) { return std::make_shared<Binary>(k); }

void expect_bitwise(const Array& a, const Array& b, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  const auto* pa = static_cast<const unsigned char*>(a.raw_data());
  const auto* pb = static_cast<const unsigned char*>(b.raw_data());
  const size_t n = a.nbytes(), item = a.itemsize();
  for (size_t i = 0; i < n; i += item)
    if (std::memcmp(pa + i, pb + i, item) != 0) {
      FAIL() << what << ": element " << i / item << " differs: " << load_as_double(a.dtype(), pa, i / item) << " vs "
             << load_as_double(b.dtype(), pb, i / item);
    }
}

// Fuses a copy of `g`, checks it verifies, and compares outputs bitwise.
Graph fuse_and_compare(const Graph& g, const std::vector<Array>& params, const std::string& what) {
  Graph fused = g;
  FusionPass().run(fused);
  fused.verify();
  auto want = interpret(g, params);
  auto got = interpret(fused, params);
  EXPECT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size() && i < got.size(); ++i)
    expect_bitwise(got[i], want[i], what + " output " + std::to_string(i));
  return fused;
}

// x * broadcast_to(b) -> exp -> + scalar constant -> tanh -> * x
Graph chain_graph(const Shape& shape, DType dtype) {
  Graph g;
  const Shape row{shape.back()};
  ValueId x = g.add_parameter({shape, dtype});
  ValueId b = g.add_parameter({row, dtype});
  ValueId c = g.add_constant(Array::scalar(0.25, dtype));
  ValueId bb = g.add_node1(std::make_shared<BroadcastTo>(shape), {b}, {shape, dtype});
  ValueId t0 = g.add_node1(binary(BinaryKind::Mul), {x, bb}, {shape, dtype});
  ValueId t1 = g.add_node1(unary(UnaryKind::Exp), {t0}, {shape, dtype});
  ValueId t2 = g.add_node1(binary(BinaryKind::Add), {t1, c}, {shape, dtype});
  ValueId t3 = g.add_node1(unary(UnaryKind::Tanh), {t2}, {shape, dtype});
  ValueId t4 = g.add_node1(binary(BinaryKind::Mul), {t3, x}, {shape, dtype});
  g.outputs = {t4};
  return g;
}

TEST(FusionPass, ChainWithBroadcastAndScalarIsOneKernelBitwise) {
  const Shape shape{301, 257};  // several parallel chunks, a partial last tile
  for (DType dtype : {DType::Float32, DType::Float64, DType::BFloat16, DType::Float16}) {
    Graph g = chain_graph(shape, dtype);
    std::vector<Array> params = {random_array(shape, 1, dtype, -2, 2), random_array({shape.back()}, 2, dtype, -1, 1)};
    Graph fused = fuse_and_compare(g, params, std::string(name(dtype)));
    EXPECT_EQ(fused.num_nodes(), 1u) << fused.text();
    EXPECT_EQ(count_nodes(fused, "broadcast_to"), 0u);
    if (dtype == DType::Float32) {
      EXPECT_NE(fused.text().find("= fusion(%0, %1, %2) {shape=[301, 257], inputs=[f32[301, 257], f32[257], f32[]], "
                                  "body={t0 = multiply(in0, in1); t1 = exp(t0); t2 = add(t1, in2); t3 = tanh(t2); "
                                  "t4 = multiply(t3, in0); out=[t4]}} : f32[301, 257]"),
                std::string::npos)
          << fused.text();
    }
  }
}

TEST(FusionPass, ValuesUsedOutsideBecomeExtraOutputs) {
  const Shape shape{64, 100};
  const DType f = DType::Float32;
  Graph g;
  ValueId x = g.add_parameter({shape, f});
  ValueId y = g.add_parameter({shape, f});
  ValueId a = g.add_node1(unary(UnaryKind::Sigmoid), {x}, {shape, f});
  ValueId b = g.add_node1(binary(BinaryKind::Mul), {a, y}, {shape, f});
  ValueId t = g.add_node1(std::make_shared<Transpose>(std::vector<int>{1, 0}), {a}, {{100, 64}, f});  // reads a
  ValueId c = g.add_node1(unary(UnaryKind::Silu), {b}, {shape, f});
  g.outputs = {c, t, b};
  Graph fused = fuse_and_compare(g, {random_array(shape, 3, f), random_array(shape, 4, f)}, "multi-output");
  EXPECT_EQ(count_nodes(fused, "fusion"), 1u);
  EXPECT_EQ(count_nodes(fused, "transpose"), 1u);
  // a (read by the transpose), b (returned) and c leave the fusion.
  EXPECT_NE(fused.text().find("out=[t0, t1, t2]}} : f32[64, 100], f32[64, 100], f32[64, 100]"), std::string::npos)
      << fused.text();
}

TEST(FusionPass, RefusesGroupsThatWouldCloseACycle) {
  const Shape shape{40, 40};
  const DType f = DType::Float64;
  Graph g;
  ValueId x = g.add_parameter({shape, f});
  ValueId a = g.add_node1(unary(UnaryKind::Exp), {x}, {shape, f});
  ValueId t = g.add_node1(std::make_shared<Transpose>(std::vector<int>{1, 0}), {a}, {shape, f});
  ValueId b = g.add_node1(binary(BinaryKind::Add), {a, t}, {shape, f});  // {exp, add} would feed and read t
  ValueId c = g.add_node1(unary(UnaryKind::Neg), {b}, {shape, f});
  ValueId d = g.add_node1(unary(UnaryKind::Sqrt), {c}, {shape, f});
  g.outputs = {d};
  Graph fused = fuse_and_compare(g, {random_array(shape, 5, f)}, "cycle");
  EXPECT_EQ(count_nodes(fused, "exp"), 1u) << fused.text();
  EXPECT_EQ(count_nodes(fused, "fusion"), 1u) << fused.text();
  EXPECT_NE(fused.text().find("body={t0 = add(in0, in1); t1 = negative(t0); t2 = sqrt(t1); out=[t2]}"),
            std::string::npos)
      << fused.text();
}

TEST(FusionPass, TwoGroupsThatWouldNeedEachOtherAreNotBothFused) {
  // Group A {x*2, +1} and group B {neg, *} are each convex, but A feeds B through a
  // transpose and B feeds A through another: fused together the program would be a
  // cycle (found in a vocabulary-parallel cross-entropy). One group must stay unfused.
  const Shape shape{16, 16};
  const DType f = DType::Float64;
  Graph g;
  ValueId x = g.add_parameter({shape, f});
  ValueId y = g.add_parameter({shape, f});
  ValueId two = g.add_constant(Array::scalar(2.0, f));
  auto transpose = [&](ValueId v) {
    return g.add_node1(std::make_shared<Transpose>(std::vector<int>{1, 0}), {v}, {shape, f});
  };
  ValueId a1 = g.add_node1(binary(BinaryKind::Mul), {x, two}, {shape, f});  // A
  ValueId ta = transpose(a1);
  ValueId b1 = g.add_node1(unary(UnaryKind::Neg), {y}, {shape, f});         // B
  ValueId b2 = g.add_node1(binary(BinaryKind::Mul), {b1, ta}, {shape, f});  // B, reads A through ta
  ValueId tb = transpose(b1);
  ValueId a2 = g.add_node1(binary(BinaryKind::Add), {a1, tb}, {shape, f});  // A, reads B through tb
  g.outputs = {a2, b2};
  Graph fused = fuse_and_compare(g, {random_array(shape, 6, f), random_array(shape, 7, f)}, "two groups");
  EXPECT_EQ(count_nodes(fused, "fusion"), 1u) << fused.text();
}

TEST(FusionPass, SingleOpsAndOtherShapesStayUnfused) {
  const DType f = DType::Float32;
  Graph g;
  ValueId x = g.add_parameter({{8, 16}, f});
  ValueId y = g.add_parameter({{16}, f});
  ValueId a = g.add_node1(binary(BinaryKind::Add), {x, y}, {{8, 16}, f});
  ValueId s = g.add_node1(std::make_shared<Reduce>(ReduceKind::Prod, std::vector<int>{1}), {a}, {{8}, f});
  ValueId e = g.add_node1(unary(UnaryKind::Exp), {s}, {{8}, f});
  g.outputs = {e};
  Graph fused = fuse_and_compare(g, {random_array({8, 16}, 6, f), random_array({16}, 7, f)}, "unfused");
  EXPECT_EQ(count_nodes(fused, "fusion"), 0u) << fused.text();
  EXPECT_EQ(fused.num_nodes(), 3u);
}

TEST(FusionPass, WhereComparisonsAndConvertsMatchUnfusedRounding) {
  const Shape shape{33, 129};
  const DType f = DType::Float32, h = DType::BFloat16;
  Graph g;
  ValueId x = g.add_parameter({shape, f});
  ValueId y = g.add_parameter({{33, 1}, f});
  ValueId w = g.add_parameter({shape, h});
  ValueId cond = g.add_node1(binary(BinaryKind::Greater), {x, y}, {shape, DType::Bool});
  ValueId sel = g.add_node1(std::make_shared<Where>(), {cond, x, y}, {shape, f});
  ValueId lo = g.add_node1(std::make_shared<Cast>(h), {sel}, {shape, h});
  ValueId prod = g.add_node1(binary(BinaryKind::Mul), {lo, w}, {shape, h});  // rounded to bf16 like the unfused op
  ValueId gelu = g.add_node1(unary(UnaryKind::GeluTanh), {prod}, {shape, h});
  ValueId back = g.add_node1(std::make_shared<Cast>(f), {gelu}, {shape, f});
  ValueId out = g.add_node1(binary(BinaryKind::Sub), {back, x}, {shape, f});
  g.outputs = {out};
  Graph fused = fuse_and_compare(
      g, {random_array(shape, 8, f, -3, 3), random_array({33, 1}, 9, f), random_array(shape, 10, h, -2, 2)}, "where");
  EXPECT_EQ(fused.num_nodes(), 1u) << fused.text();
  EXPECT_NE(fused.text().find("t1 = where(t0, in0, in1); t2 = convert(t1, bf16);"), std::string::npos) << fused.text();
}

Graph softmax_denominator(const Shape& shape, DType dtype, ReduceKind kind) {
  Graph g;
  Shape rows(shape.begin(), shape.end() - 1), keep = rows;
  keep.push_back(1);
  ValueId x = g.add_parameter({shape, dtype});
  ValueId m = g.add_parameter({keep, dtype});
  ValueId d = g.add_node1(binary(BinaryKind::Sub), {x, m}, {shape, dtype});
  ValueId e = g.add_node1(unary(UnaryKind::Exp), {d}, {shape, dtype});
  ValueId s = g.add_node1(std::make_shared<Reduce>(kind, std::vector<int>{static_cast<int>(shape.size()) - 1}), {e},
                          {rows, dtype});
  g.outputs = {s};
  return g;
}

TEST(FusionPass, FusedReductionIsBitwiseTheUnfusedReduce) {
  struct Case {
    Shape shape;
    DType dtype;
    ReduceKind kind;
  };
  std::vector<Case> cases = {{{37, 5000}, DType::Float32, ReduceKind::Sum},  // two blocks per row
                             {{3, 70001}, DType::Float32, ReduceKind::Sum},  // few long rows
                             {{1000, 7}, DType::Float32, ReduceKind::Max},   // rows shorter than a lane group
                             {{64, 300}, DType::BFloat16, ReduceKind::Sum},  // rows straddle tiles
                             {{9, 4097}, DType::Float64, ReduceKind::Sum},   // a one-element last block
                             {{50, 1}, DType::Float32, ReduceKind::Sum}};    // nothing to combine
  for (const Case& c : cases) {
    Graph g = softmax_denominator(c.shape, c.dtype, c.kind);
    Shape keep(c.shape.begin(), c.shape.end() - 1);
    keep.push_back(1);
    std::vector<Array> params = {random_array(c.shape, 11, c.dtype, -3, 3), random_array(keep, 12, c.dtype)};
    Graph fused = fuse_and_compare(g, params, tessera::to_string(c.shape));
    EXPECT_EQ(fused.num_nodes(), 1u) << fused.text();
    EXPECT_NE(fused.text().find(c.kind == ReduceKind::Sum ? "reduce=sum, axes=[1]" : "reduce=max, axes=[1]"),
              std::string::npos)
        << fused.text();
  }
}

TEST(FusionPass, ReductionResultsDoNotDependOnThreadCount) {
  Graph g = softmax_denominator({5, 50000}, DType::Float32, ReduceKind::Sum);
  FusionPass().run(g);
  std::vector<Array> params = {random_array({5, 50000}, 13, DType::Float32), random_array({5, 1}, 14, DType::Float32)};
  const int threads = num_threads();
  set_num_threads(1);
  auto one = interpret(g, params);
  set_num_threads(std::max(threads, 3));
  auto many = interpret(g, params);
  set_num_threads(threads);
  expect_bitwise(one[0], many[0], "threads");
}

TEST(FusionPrimitive, AttributesParseBack) {
  Graph g = chain_graph({4, 8}, DType::Float32);
  FusionPass().run(g);
  const Node* node = nullptr;
  for (const Node& n : g.nodes)
    if (!n.dead && n.primitive->name() == "fusion") node = &n;
  ASSERT_NE(node, nullptr);
  const std::string attrs = node->primitive->attributes();
  PrimitivePtr back = parse_fusion(AttributeMap("fusion", attrs));
  EXPECT_EQ(back->attributes(), attrs);
  EXPECT_TRUE(back->is_equivalent(*node->primitive));

  Graph r = softmax_denominator({4, 8}, DType::BFloat16, ReduceKind::Max);
  FusionPass().run(r);
  const std::string rattrs = r.nodes[0].primitive->attributes();
  EXPECT_EQ(parse_fusion(AttributeMap("fusion", rattrs))->attributes(), rattrs);

  EXPECT_THROW(
      parse_fusion(AttributeMap("fusion", "shape=[4], inputs=[f32[4]], body={t0 = frobnicate(in0); out=[t0]}")),
      ValueError);
  EXPECT_THROW(parse_fusion(AttributeMap("fusion", "shape=[4], inputs=[f32[4]], body={t0 = exp(in3); out=[t0]}")),
               ValueError);
  EXPECT_THROW(parse_fusion(AttributeMap("fusion", "shape=[4], inputs=[f32[5]], body={t0 = exp(in0); out=[t0]}")),
               ShapeError);
  EXPECT_THROW(
      parse_fusion(AttributeMap("fusion", "shape=[4], inputs=[f32[4], i32[4]], body={t0 = add(in0, in1); out=[t0]}")),
      DTypeError);
}

TEST(FusionPrimitive, IsNotDifferentiableAndCostsOneReadPerInput) {
  FusionProgram p;
  p.shape = {10, 20};
  p.inputs = {{{10, 20}, DType::Float32}, {{20}, DType::Float32}};
  int t0 = p.add_binary(BinaryKind::Add, 0, 1);
  int t1 = p.add_unary(UnaryKind::Exp, t0);
  p.outputs = {t1};
  Fusion fusion(p);
  Array x = Array::placeholder({10, 20}, DType::Float32), b = Array::placeholder({20}, DType::Float32);
  Array y = Array::placeholder({10, 20}, DType::Float32);
  Cost c = fusion.cost({x, b}, {y});
  EXPECT_EQ(c.flops, 400.0);
  EXPECT_EQ(c.bytes, (200.0 + 20.0 + 200.0) * 4);
  EXPECT_TRUE(fusion.can_write_in_place(0, 0));
  EXPECT_FALSE(fusion.can_write_in_place(1, 0));
  EXPECT_THROW(fusion.vjp({x, b}, {y}, {0}, {y}), TransformError);
}

// ---- the kernel alone ----

TEST(FusedElementwiseKernel, MatchesFloat64ReferenceWithBroadcasts) {
  using cpu::FusedOpKind;
  // out0 = sqrt(|a * b[col] + c|), out1 = (a > 0) as f64 bool, from a [R, C], b [C], c [] (float32).
  const int64_t R = 123, C = 77;
  cpu::FusedProgram p;
  p.input_dtypes = {DType::Float32, DType::Float32, DType::Float32};
  p.body.push_back({FusedOpKind::Binary, static_cast<int>(cpu::BinaryOp::Mul), DType::Float32, {0, 1, -1}});  // r3
  p.body.push_back({FusedOpKind::Binary, static_cast<int>(cpu::BinaryOp::Add), DType::Float32, {3, 2, -1}});  // r4
  p.body.push_back({FusedOpKind::Unary, static_cast<int>(cpu::UnaryOp::Abs), DType::Float32, {4, -1, -1}});   // r5
  p.body.push_back({FusedOpKind::Unary, static_cast<int>(cpu::UnaryOp::Sqrt), DType::Float32, {5, -1, -1}});  // r6
  p.body.push_back({FusedOpKind::Cast, 0, DType::Float64, {6, -1, -1}});                                      // r7
  p.outputs = {7, 4};
  auto a = test::random_values(R * C, 21, -2, 2), b = test::random_values(C, 22, -2, 2);
  std::vector<float> fa(a.begin(), a.end()), fb(b.begin(), b.end());
  float c = 0.375f;
  std::vector<double> out0(R * C);
  std::vector<float> out1(R * C);
  cpu::fused_elementwise(p, {fa.data(), fb.data(), &c}, {{C, 1}, {0, 1}, {0, 0}}, {out0.data(), out1.data()}, {R, C});
  for (int64_t i = 0; i < R * C; ++i) {
    const double pre = static_cast<double>(fa[i]) * fb[i % C] + c;
    ASSERT_NEAR(out1[i], pre, 1e-6 * (1 + std::abs(pre))) << i;
    ASSERT_NEAR(out0[i], std::sqrt(std::abs(pre)), 1e-6 * (1 + std::sqrt(std::abs(pre)))) << i;
  }
  // Writing out1 over its own input a (same shape and dtype) gives the same values.
  std::vector<float> inplace = fa;
  std::vector<double> out0b(R * C);
  cpu::fused_elementwise(p, {inplace.data(), fb.data(), &c}, {{C, 1}, {0, 1}, {0, 0}}, {out0b.data(), inplace.data()},
                         {R, C});
  EXPECT_EQ(0, std::memcmp(inplace.data(), out1.data(), sizeof(float) * R * C));
  EXPECT_EQ(0, std::memcmp(out0b.data(), out0.data(), sizeof(double) * R * C));
}

TEST(FusedElementwiseKernel, ZeroDimInputSharedWithAnEarlierOutputIsReadBeforeItIsWritten) {
  // A 0-d program out0 = a + b, out1 = a * b with out0 written over a (a donated scalar
  // whose buffer the planner gave to out0): out1 must use a's old value.
  cpu::FusedProgram p;
  p.input_dtypes = {DType::Float32, DType::Float32};
  p.body.push_back({cpu::FusedOpKind::Binary, static_cast<int>(cpu::BinaryOp::Add), DType::Float32, {0, 1, -1}});
  p.body.push_back({cpu::FusedOpKind::Binary, static_cast<int>(cpu::BinaryOp::Mul), DType::Float32, {0, 1, -1}});
  p.outputs = {2, 3};
  float a = 3.0f, b = 5.0f, product = 0.0f;
  cpu::fused_elementwise(p, {&a, &b}, {{}, {}}, {&a, &product}, {});
  EXPECT_EQ(a, 8.0f);
  EXPECT_EQ(product, 15.0f) << "the product read the sum written over its input";
}

TEST(FusedElementwiseKernel, FusedReduceMatchesFloat64Reference) {
  cpu::FusedProgram p;
  p.input_dtypes = {DType::Float64};
  p.body.push_back({cpu::FusedOpKind::Unary, static_cast<int>(cpu::UnaryOp::Square), DType::Float64, {0, -1, -1}});
  p.outputs = {1};
  const int64_t rows = 7, len = 9000;
  auto x = test::random_values(rows * len, 31, -1, 1);
  std::vector<double> out(rows);
  cpu::fused_reduce(p, {x.data()}, {{len, 1}}, {rows, len}, cpu::FusedReduceOp::Sum, rows, len, out.data());
  for (int64_t r = 0; r < rows; ++r) {
    long double ref = 0;
    for (int64_t i = 0; i < len; ++i) ref += static_cast<long double>(x[r * len + i]) * x[r * len + i];
    EXPECT_NEAR(out[r], static_cast<double>(ref), 1e-12 * static_cast<double>(ref));
  }
  EXPECT_THROW(cpu::fused_reduce(p, {x.data()}, {{len, 1}}, {rows, len}, cpu::FusedReduceOp::Max, rows, 0, out.data()),
               ShapeError);
}

TEST(FusedElementwiseKernel, RejectsMalformedPrograms) {
  cpu::FusedProgram p;
  p.input_dtypes = {DType::Float32, DType::Float64};
  p.body.push_back({cpu::FusedOpKind::Binary, static_cast<int>(cpu::BinaryOp::Add), DType::Float32, {0, 1, -1}});
  p.outputs = {2};
  float a[4] = {}, o[4];
  double b[4] = {};
  EXPECT_THROW(cpu::fused_elementwise(p, {a, b}, {{1}, {1}}, {o}, {4}), DTypeError);
  p.body[0].args[1] = 5;
  EXPECT_THROW(cpu::fused_elementwise(p, {a, b}, {{1}, {1}}, {o}, {4}), ValueError);
}

// Timing of a 5-op chain on 4M floats, fused vs unfused (run with
// --gtest_also_run_disabled_tests; prints milliseconds).
TEST(FusionPass, DISABLED_SpeedOfFiveOpChain) {
  const Shape shape{2048, 2048};
  Graph g = chain_graph(shape, DType::Float32);
  Graph fused = g;
  FusionPass().run(fused);
  std::vector<Array> params = {random_array(shape, 1, DType::Float32), random_array({2048}, 2, DType::Float32)};
  auto time = [&](const Graph& graph) {
    interpret(graph, params);
    double best = 1e30;
    for (int rep = 0; rep < 10; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      interpret(graph, params);
      best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
  };
  const double unfused_ms = time(g), fused_ms = time(fused);
  std::printf("5-op chain on 4M f32, %d threads: unfused %.2f ms, fused %.2f ms (%.2fx)\n", num_threads(), unfused_ms,
              fused_ms, unfused_ms / fused_ms);
}

}  // namespace
}  // namespace tessera::compiler
