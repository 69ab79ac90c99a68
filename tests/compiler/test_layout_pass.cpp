// IR-in / IR-out tests of LayoutSimplification: each test parses a hand-written
// graph, runs the pass, compares the text with the expected IR, and checks with a
// node-by-node interpreter (every primitive's eval_cpu) that the graph computes
// bitwise the same values before and after. Negative cases expect the input back.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "compiler/graph_test_util.h"
#include "core/test_util.h"
#include "tessera/compiler/graph.h"
#include "tessera/compiler/parser.h"
#include "tessera/compiler/passes/layout.h"

namespace tessera::compiler {
namespace {

using test_util::interpret;
using test_util::random_params;

using test::make_array;
using test::random_values;

// Runs the pass on `input` and expects the IR `expected` (hand-written; compared in
// printed form) and bitwise-equal outputs on random parameters.
void expect_rewrite(const std::string& input, const std::string& expected, bool fold_matmul_transposes = false) {
  Graph g = parse_graph(input);
  const std::vector<Array> params = random_params(g, 11);
  const std::vector<Array> before = interpret(g, params);
  LayoutSimplification(fold_matmul_transposes).run(g);
  g.verify();
  EXPECT_EQ(g.text(), parse_graph(expected).text());
  const std::vector<Array> after = interpret(g, params);
  ASSERT_EQ(before.size(), after.size());
  for (size_t i = 0; i < before.size(); ++i) {
    ASSERT_EQ(before[i].shape(), after[i].shape()) << "output " << i;
    ASSERT_EQ(before[i].dtype(), after[i].dtype()) << "output " << i;
    EXPECT_EQ(std::memcmp(before[i].raw_data(), after[i].raw_data(), before[i].nbytes()), 0) << "output " << i;
  }
}

void expect_unchanged(const std::string& input, bool fold_matmul_transposes = false) {
  expect_rewrite(input, input, fold_matmul_transposes);
}

// ---- add of slice_pads -> concatenate ----

TEST(LayoutPass, ChainedPadsThatTileOneAxisBecomeOneConcatenate) {
  // The vjp of a q/k/v split: three pieces padded back into [2, 6, 3] and summed,
  // in an order unrelated to their positions.
  expect_rewrite(R"(
func @f(%a: f32[2, 2, 3], %b: f32[2, 1, 3], %c: f32[2, 3, 3]) -> (f32[2, 6, 3]) {
  %pa = slice_pad(%a) {shape=[2, 6, 3], start=[0, 0, 0], step=[1, 1, 1]} : f32[2, 6, 3]
  %pc = slice_pad(%c) {shape=[2, 6, 3], start=[0, 3, 0], step=[1, 1, 1]} : f32[2, 6, 3]
  %pb = slice_pad(%b) {shape=[2, 6, 3], start=[0, 2, 0], step=[1, 1, 1]} : f32[2, 6, 3]
  %s1 = add(%pc, %pa) : f32[2, 6, 3]
  %s2 = add(%pb, %s1) : f32[2, 6, 3]
  return %s2
}
)",
                 R"(
func @f(%a: f32[2, 2, 3], %b: f32[2, 1, 3], %c: f32[2, 3, 3]) -> (f32[2, 6, 3]) {
  %r = concatenate(%a, %b, %c) {axis=1} : f32[2, 6, 3]
  return %r
}
)");
}

TEST(LayoutPass, TwoPadsAlongTheFirstAxis) {
  expect_rewrite(R"(
func @f(%x: f32[4, 5]) -> (f32[6, 5]) {
  %n = negative(%x) : f32[4, 5]
  %top = slice(%x) {start=[0, 0], stop=[2, 5], step=[1, 1]} : f32[2, 5]
  %p1 = slice_pad(%top) {shape=[6, 5], start=[0, 0], step=[1, 1]} : f32[6, 5]
  %p2 = slice_pad(%n) {shape=[6, 5], start=[2, 0], step=[1, 1]} : f32[6, 5]
  %s = add(%p1, %p2) : f32[6, 5]
  return %s
}
)",
                 R"(
func @f(%x: f32[4, 5]) -> (f32[6, 5]) {
  %n = negative(%x) : f32[4, 5]
  %top = slice(%x) {start=[0, 0], stop=[2, 5], step=[1, 1]} : f32[2, 5]
  %r = concatenate(%top, %n) {axis=0} : f32[6, 5]
  return %r
}
)");
}

TEST(LayoutPass, PadsWithAGapStay) {
  expect_unchanged(R"(
func @f(%a: f32[2, 3], %b: f32[3, 3]) -> (f32[6, 3]) {
  %pa = slice_pad(%a) {shape=[6, 3], start=[0, 0], step=[1, 1]} : f32[6, 3]
  %pb = slice_pad(%b) {shape=[6, 3], start=[3, 0], step=[1, 1]} : f32[6, 3]
  %s = add(%pa, %pb) : f32[6, 3]
  return %s
}
)");
}

TEST(LayoutPass, OverlappingPadsStay) {
  expect_unchanged(R"(
func @f(%a: f32[3, 3], %b: f32[3, 3]) -> (f32[5, 3]) {
  %pa = slice_pad(%a) {shape=[5, 3], start=[0, 0], step=[1, 1]} : f32[5, 3]
  %pb = slice_pad(%b) {shape=[5, 3], start=[2, 0], step=[1, 1]} : f32[5, 3]
  %s = add(%pa, %pb) : f32[5, 3]
  return %s
}
)");
  // The same piece twice covers its range twice.
  expect_unchanged(R"(
func @f(%a: f32[2, 3]) -> (f32[4, 3]) {
  %p = slice_pad(%a) {shape=[4, 3], start=[0, 0], step=[1, 1]} : f32[4, 3]
  %q = slice_pad(%a) {shape=[4, 3], start=[2, 0], step=[1, 1]} : f32[4, 3]
  %s = add(%p, %p) : f32[4, 3]
  %t = add(%s, %q) : f32[4, 3]
  return %t
}
)");
}

TEST(LayoutPass, PadsCutAlongTwoAxesOrStridedStay) {
  expect_unchanged(R"(
func @f(%a: f32[2, 2], %b: f32[2, 2]) -> (f32[4, 3]) {
  %pa = slice_pad(%a) {shape=[4, 3], start=[0, 0], step=[1, 1]} : f32[4, 3]
  %pb = slice_pad(%b) {shape=[4, 3], start=[2, 0], step=[1, 1]} : f32[4, 3]
  %s = add(%pa, %pb) : f32[4, 3]
  return %s
}
)");
  expect_unchanged(R"(
func @f(%a: f32[2, 3], %b: f32[2, 3]) -> (f32[4, 3]) {
  %pa = slice_pad(%a) {shape=[4, 3], start=[0, 0], step=[2, 1]} : f32[4, 3]
  %pb = slice_pad(%b) {shape=[4, 3], start=[1, 0], step=[2, 1]} : f32[4, 3]
  %s = add(%pa, %pb) : f32[4, 3]
  return %s
}
)");
}

TEST(LayoutPass, ChainThroughAnAddWithAnotherReaderStays) {
  // %s1 is also returned, so the three-piece chain may not be collapsed, and
  // %s1 alone does not cover the axis.
  expect_unchanged(R"(
func @f(%a: f32[1, 3], %b: f32[1, 3], %c: f32[1, 3]) -> (f32[3, 3], f32[3, 3]) {
  %pa = slice_pad(%a) {shape=[3, 3], start=[0, 0], step=[1, 1]} : f32[3, 3]
  %pb = slice_pad(%b) {shape=[3, 3], start=[1, 0], step=[1, 1]} : f32[3, 3]
  %pc = slice_pad(%c) {shape=[3, 3], start=[2, 0], step=[1, 1]} : f32[3, 3]
  %s1 = add(%pa, %pb) : f32[3, 3]
  %s2 = add(%s1, %pc) : f32[3, 3]
  return %s1, %s2
}
)");
}

TEST(LayoutPass, AddOfAPadAndSomethingElseStays) {
  expect_unchanged(R"(
func @f(%a: f32[2, 3], %b: f32[4, 3]) -> (f32[4, 3]) {
  %pa = slice_pad(%a) {shape=[4, 3], start=[0, 0], step=[1, 1]} : f32[4, 3]
  %s = add(%pa, %b) : f32[4, 3]
  return %s
}
)");
}

// ---- transposes around matmul ----

TEST(LayoutPass, TransposedOperandsBecomeMatmulFlags) {
  expect_rewrite(R"(
func @f(%x: f32[2, 4, 3], %y: f32[2, 4, 5], %w: f32[6, 4], %v: f32[3, 4]) -> (f32[2, 3, 5], f32[2, 3, 6], f32[4, 4]) {
  %xt = transpose(%x) {perm=[0, 2, 1]} : f32[2, 3, 4]
  %m1 = matmul(%xt, %y) : f32[2, 3, 5]
  %wt = transpose(%w) {perm=[1, 0]} : f32[4, 6]
  %m2 = matmul(%xt, %wt) {trans_a=false, trans_b=false} : f32[2, 3, 6]
  %vt = transpose(%v) {perm=[1, 0]} : f32[4, 3]
  %m3 = matmul(%vt, %vt) {trans_a=false, trans_b=true} : f32[4, 4]
  return %m1, %m2, %m3
}
)",
                 R"(
func @f(%x: f32[2, 4, 3], %y: f32[2, 4, 5], %w: f32[6, 4], %v: f32[3, 4]) -> (f32[2, 3, 5], f32[2, 3, 6], f32[4, 4]) {
  %m1 = matmul(%x, %y) {trans_a=true, trans_b=false} : f32[2, 3, 5]
  %m2 = matmul(%x, %w) {trans_a=true, trans_b=true} : f32[2, 3, 6]
  %m3 = matmul(%v, %v) {trans_a=true, trans_b=false} : f32[4, 4]
  return %m1, %m2, %m3
}
)",
                 /*fold_matmul_transposes=*/true);
}

TEST(LayoutPass, TransposeOfAMatmulSwapsTheOperands) {
  // Rank 2, and batched with a shared rank-2 operand (the tied-embedding gradient).
  expect_rewrite(R"(
func @f(%a: f32[3, 4], %b: f32[4, 5], %x: f32[2, 3, 4], %w: f32[5, 4]) -> (f32[5, 3], f32[2, 5, 3]) {
  %m = matmul(%a, %b) : f32[3, 5]
  %t = transpose(%m) {perm=[1, 0]} : f32[5, 3]
  %n = matmul(%x, %w) {trans_a=false, trans_b=true} : f32[2, 3, 5]
  %u = transpose(%n) {perm=[0, 2, 1]} : f32[2, 5, 3]
  return %t, %u
}
)",
                 R"(
func @f(%a: f32[3, 4], %b: f32[4, 5], %x: f32[2, 3, 4], %w: f32[5, 4]) -> (f32[5, 3], f32[2, 5, 3]) {
  %t = matmul(%b, %a) {trans_a=true, trans_b=true} : f32[5, 3]
  %u = matmul(%w, %x) {trans_a=false, trans_b=true} : f32[2, 5, 3]
  return %t, %u
}
)",
                 /*fold_matmul_transposes=*/true);
}

TEST(LayoutPass, OtherTransposesAroundMatmulStay) {
  // A batch-axis transpose is no matmul flag; a product with another reader is
  // not recomputed transposed.
  expect_unchanged(R"(
func @f(%x: f32[4, 2, 3], %y: f32[2, 3, 5], %a: f32[3, 4], %b: f32[4, 5]) -> (f32[2, 4, 5], f32[5, 3], f32[3, 5]) {
  %xt = transpose(%x) {perm=[1, 0, 2]} : f32[2, 4, 3]
  %m1 = matmul(%xt, %y) : f32[2, 4, 5]
  %m = matmul(%a, %b) : f32[3, 5]
  %t = transpose(%m) {perm=[1, 0]} : f32[5, 3]
  return %m1, %t, %m
}
)",
                   /*fold_matmul_transposes=*/true);
}

TEST(LayoutPass, MatmulTransposesStayByDefault) {
  expect_unchanged(R"(
func @f(%x: f32[2, 3], %w: f32[4, 3]) -> (f32[4, 2]) {
  %wt = transpose(%w) {perm=[1, 0]} : f32[3, 4]
  %m = matmul(%x, %wt) : f32[2, 4]
  %t = transpose(%m) {perm=[1, 0]} : f32[4, 2]
  return %t
}
)");
}

// ---- slices ----

TEST(LayoutPass, SliceOfOneConcatenatedPieceReadsThePiece) {
  expect_rewrite(R"(
func @f(%a: f32[2, 3], %b: f32[2, 4], %c: f32[2, 2]) -> (f32[2, 4], f32[1, 2], f32[2, 3]) {
  %cat = concatenate(%a, %b, %c) {axis=1} : f32[2, 9]
  %whole = slice(%cat) {start=[0, 3], stop=[2, 7], step=[1, 1]} : f32[2, 4]
  %part = slice(%cat) {start=[1, 4], stop=[2, 7], step=[1, 2]} : f32[1, 2]
  %across = slice(%cat) {start=[0, 2], stop=[2, 5], step=[1, 1]} : f32[2, 3]
  return %whole, %part, %across
}
)",
                 R"(
func @f(%a: f32[2, 3], %b: f32[2, 4], %c: f32[2, 2]) -> (f32[2, 4], f32[1, 2], f32[2, 3]) {
  %cat = concatenate(%a, %b, %c) {axis=1} : f32[2, 9]
  %part = slice(%b) {start=[1, 1], stop=[2, 4], step=[1, 2]} : f32[1, 2]
  %across = slice(%cat) {start=[0, 2], stop=[2, 5], step=[1, 1]} : f32[2, 3]
  return %b, %part, %across
}
)");
}

TEST(LayoutPass, SliceOfASliceIsOneSlice) {
  expect_rewrite(R"(
func @f(%x: f32[10, 4]) -> (f32[2, 2]) {
  %s1 = slice(%x) {start=[1, 0], stop=[10, 4], step=[2, 1]} : f32[5, 4]
  %s2 = slice(%s1) {start=[1, 1], stop=[5, 4], step=[2, 2]} : f32[2, 2]
  return %s2
}
)",
                 R"(
func @f(%x: f32[10, 4]) -> (f32[2, 2]) {
  %s = slice(%x) {start=[3, 1], stop=[8, 4], step=[4, 2]} : f32[2, 2]
  return %s
}
)");
}

TEST(LayoutPass, IdentitySlicesAndPadsDisappear) {
  expect_rewrite(R"(
func @f(%x: f32[2, 3]) -> (f32[2, 3], f32[2, 3], f32[2, 3]) {
  %p = slice_pad(%x) {shape=[5, 3], start=[1, 0], step=[2, 1]} : f32[5, 3]
  %back = slice(%p) {start=[1, 0], stop=[5, 3], step=[2, 1]} : f32[2, 3]
  %full = slice(%x) {start=[0, 0], stop=[2, 3], step=[1, 1]} : f32[2, 3]
  %same = slice_pad(%x) {shape=[2, 3], start=[0, 0], step=[1, 1]} : f32[2, 3]
  return %back, %full, %same
}
)",
                 R"(
func @f(%x: f32[2, 3]) -> (f32[2, 3], f32[2, 3], f32[2, 3]) {
  return %x, %x, %x
}
)");
}

TEST(LayoutPass, SliceOfAPadElsewhereStays) {
  expect_unchanged(R"(
func @f(%x: f32[2, 3]) -> (f32[2, 3]) {
  %p = slice_pad(%x) {shape=[5, 3], start=[1, 0], step=[2, 1]} : f32[5, 3]
  %s = slice(%p) {start=[0, 0], stop=[2, 3], step=[1, 1]} : f32[2, 3]
  return %s
}
)");
}

// ---- transposes of unit axes ----

TEST(LayoutPass, TransposeMovingOnlyUnitAxesIsAReshape) {
  expect_rewrite(R"(
func @f(%x: f32[2, 1, 3, 1]) -> (f32[1, 2, 1, 3], f32[3, 1, 2, 1]) {
  %t = transpose(%x) {perm=[1, 0, 3, 2]} : f32[1, 2, 1, 3]
  %u = transpose(%x) {perm=[2, 1, 0, 3]} : f32[3, 1, 2, 1]
  return %t, %u
}
)",
                 R"(
func @f(%x: f32[2, 1, 3, 1]) -> (f32[1, 2, 1, 3], f32[3, 1, 2, 1]) {
  %t = reshape(%x) {shape=[1, 2, 1, 3]} : f32[1, 2, 1, 3]
  %u = transpose(%x) {perm=[2, 1, 0, 3]} : f32[3, 1, 2, 1]
  return %t, %u
}
)");
}

}  // namespace
}  // namespace tessera::compiler
