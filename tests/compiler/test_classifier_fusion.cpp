// Classifier fusion (compiler/passes/classifier_fusion.h): a mean cross-entropy and its
// gradient become one cross_entropy_with_grad node whose outputs are bitwise the
// unfused graph's (the CPU kernel runs the same row kernels), for float32 and bfloat16,
// with and without a padded vocabulary and ignored targets, through the whole pipeline;
// a loss that feeds back into its own gradient is left alone; the fused node can take
// the logits' buffer and parses back from its text.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "compiler/graph_test_util.h"
#include "core/test_util.h"
#include "tessera/api/jit.h"
#include "tessera/compiler/compile.h"
#include "tessera/compiler/graph.h"
#include "tessera/compiler/parser.h"
#include "tessera/compiler/passes/classifier_fusion.h"
#include "tessera/compiler/passes/schedule.h"
#include "tessera/ir/primitives/nn.h"
#include "tessera/tessera.h"

namespace tessera::compiler {
namespace {

using test_util::count_nodes;
using test_util::expect_bitwise;
using test_util::interpret;

Graph fused_copy(const Graph& g) {
  Graph fused = g;
  ClassifierFusionPass().run(fused);
  fused.verify();
  SchedulePass().run(fused);
  fused.verify();
  return fused;
}

Array targets_with_ignored(int64_t rows, int64_t classes, uint32_t seed) {
  std::vector<int64_t> t = test::random_ints(rows, seed, 0, classes - 1);
  t[1] = -100;
  return Array::from_vector(t, {rows});
}

// The mean loss over rows of `classes` of V logits, and its gradient, as a model's
// training step differentiates it.
Tree loss_and_grad(const Tree& args, int64_t classes, bool squared) {
  const Array targets = args.at("targets").leaf();
  auto loss_of = [&](const Tree& p) {
    Array loss = cross_entropy(p.at("logits").leaf(), targets, -100, Reduction::Mean, classes);
    return squared ? loss * loss : loss;
  };
  Tree params{{"logits", args.at("logits")}};
  auto [loss, grads] = value_and_grad(TreeFn(loss_of))(params);
  return Tree{{"loss", Tree(loss)}, {"grad", grads.at("logits")}};
}

Graph traced(int64_t rows, int64_t width, int64_t classes, DType dtype, bool squared = false) {
  const Tree args{{"logits", Tree(Array::placeholder({rows, width}, dtype))},
                  {"targets", Tree(Array::placeholder({rows}, DType::Int64))}};
  return trace([classes, squared](const Tree& a, const StaticArgs&) { return loss_and_grad(a, classes, squared); },
               args);
}

std::vector<Array> inputs_for(const Graph& g, int64_t rows, int64_t classes, uint32_t seed) {
  std::vector<Array> params = test_util::random_params(g, seed);
  for (size_t i = 0; i < g.parameters.size(); ++i)
    if (g.type(g.parameters[i]).dtype == DType::Int64) params[i] = targets_with_ignored(rows, classes, seed + 7);
  return params;
}

TEST(ClassifierFusion, LossAndGradientInOneNodeBitwiseTheSame) {
  for (DType dtype : {DType::Float32, DType::BFloat16}) {
    for (auto [width, classes] : {std::pair<int64_t, int64_t>{37, 0}, {48, 37}}) {
      SCOPED_TRACE(::testing::Message() << name(dtype) << " width " << width << " classes " << classes);
      const int64_t rows = 6;
      const Graph g = traced(rows, width, classes, dtype);
      ASSERT_EQ(count_nodes(g, "cross_entropy"), 1u) << g.text();
      ASSERT_EQ(count_nodes(g, "cross_entropy_grad"), 1u) << g.text();
      const Graph fused = fused_copy(g);
      EXPECT_EQ(count_nodes(fused, "cross_entropy_with_grad"), 1u) << fused.text();
      EXPECT_EQ(count_nodes(fused, "cross_entropy"), 0u);
      EXPECT_EQ(count_nodes(fused, "cross_entropy_grad"), 0u);
      const std::vector<Array> in = inputs_for(g, rows, classes > 0 ? classes : width, 11);
      expect_bitwise(interpret(fused, in), interpret(g, in));
    }
  }
}

TEST(ClassifierFusion, ALossThatFeedsItsOwnGradientIsLeftAlone) {
  // d(loss^2) = 2 loss dloss: the gradient's dloss reads the forward's loss.
  const Graph g = traced(5, 16, 0, DType::Float32, /*squared=*/true);
  const Graph fused = fused_copy(g);
  EXPECT_EQ(count_nodes(fused, "cross_entropy_with_grad"), 0u) << fused.text();
  EXPECT_EQ(count_nodes(fused, "cross_entropy"), 1u);
  const std::vector<Array> in = inputs_for(g, 5, 16, 3);
  expect_bitwise(interpret(fused, in), interpret(g, in));
}

// A language model's head: logits = h W^T over a padded vocabulary (250 classes of 256
// rows), bfloat16 compute from float32 weights, through the whole default pipeline.
TEST(ClassifierFusion, TheCompiledHeadFusesItsLossAndParsesBack) {
  const int64_t rows = 32, dim = 16, padded = 256, classes = 250;
  auto step = [&](const Tree& a, const StaticArgs&) {
    const Array targets = a.at("targets").leaf();
    auto loss_of = [&](const Tree& p) {
      const Array h = astype(tanh(p.at("h").leaf()), DType::BFloat16);
      const Array logits = matmul(h, transpose(astype(p.at("w").leaf(), DType::BFloat16)));
      return cross_entropy(logits, targets, -100, Reduction::Mean, classes);
    };
    auto [loss, grads] = value_and_grad(TreeFn(loss_of))(Tree{{"h", a.at("h")}, {"w", a.at("w")}});
    return Tree{{"loss", Tree(loss)}, {"grads", grads}};
  };
  const Tree args{{"h", Tree(test::random_array({rows, dim}, 1, DType::Float32))},
                  {"w", Tree(test::random_array({padded, dim}, 2, DType::Float32))},
                  {"targets", Tree(targets_with_ignored(rows, classes, 3))}};
  const Graph g = trace(step, args);
  Graph compiled = g;
  default_pipeline().run(compiled);
  EXPECT_EQ(count_nodes(compiled, "cross_entropy_with_grad"), 1u) << compiled.text();
  EXPECT_EQ(count_nodes(compiled, "cross_entropy"), 0u);
  EXPECT_EQ(count_nodes(compiled, "cross_entropy_grad"), 0u);
  const Graph reparsed = parse_graph(compiled.text());
  EXPECT_EQ(reparsed.text(), compiled.text());
  std::vector<Array> in;
  for (const Array& leaf : args.leaves()) in.push_back(leaf.eval());
  expect_bitwise(interpret(compiled, in), interpret(g, in));
}

TEST(ClassifierFusion, TheGradientMayTakeTheLogitsBuffer) {
  const CrossEntropyWithGrad fused(-100, 0);
  EXPECT_TRUE(fused.can_write_in_place(0, 2));
  EXPECT_FALSE(fused.can_write_in_place(0, 0));
  EXPECT_FALSE(fused.can_write_in_place(2, 2));
}

}  // namespace
}  // namespace tessera::compiler
