// Partial evaluation (compiler/partial_eval.h): a traced forward-and-backward split at its
// output gradient runs as two programs whose composition gives the whole graph's bits,
// with every node in exactly one part (the backward part recomputes nothing), and the
// split's errors.
#include <gtest/gtest.h>

#include "compiler/graph_test_util.h"
#include "tessera/api/jit.h"
#include "tessera/compiler/compile.h"
#include "tessera/compiler/partial_eval.h"
#include "tessera/core/ops.h"
#include "tessera/core/transforms.h"

namespace tessera::compiler {
namespace {

// y = tanh(x w) * x + b (with exp_of_w: tanh(x exp(w)) * x + b), and the vjp of (w, x,
// b) at dy: outputs dp.b, dp.w, dx, y (the tree's path order). Parameters: b, dy, w, x.
Graph forward_and_backward(Tree* out_structure, bool exp_of_w = false) {
  const Tree args{{"b", Array::placeholder({8}, DType::Float32)},
                  {"dy", Array::placeholder({4, 8}, DType::Float32)},
                  {"w", Array::placeholder({8, 8}, DType::Float32)},
                  {"x", Array::placeholder({4, 8}, DType::Float32)}};
  const JitFn fn = [exp_of_w](const Tree& a, const StaticArgs&) {
    const ArrayFn f = [exp_of_w](const std::vector<Array>& in) -> std::vector<Array> {
      return {add(multiply(tanh(matmul(in[1], exp_of_w ? exp(in[0]) : in[0])), in[1]), in[2])};
    };
    const auto [y, grads] = vjp(f, {a.at("w").leaf(), a.at("x").leaf(), a.at("b").leaf()}, {a.at("dy").leaf()});
    return Tree{{"dp", Tree{{"b", grads[2]}, {"w", grads[0]}}}, {"dx", grads[1]}, {"y", y[0]}};
  };
  return trace(fn, args, {}, out_structure);
}

// The split's two parts, interpreted on random parameters (seed), compose to the whole
// graph's outputs bitwise (the known part's first output is the whole graph's last).
// Returns the parameters.
std::vector<Array> expect_parts_compose(const Graph& g, const SplitGraph& split, uint64_t seed) {
  const std::vector<Array> params = test_util::random_params(g, seed);
  const std::vector<Array> whole = test_util::interpret(g, params);
  const std::vector<Array> known = test_util::interpret(split.known, {params[0], params[2], params[3]});
  EXPECT_EQ(known.size(), 1 + split.residuals);
  std::vector<Array> unknown_args(known.begin() + 1, known.end());
  for (size_t p : split.unknown_parameters) unknown_args.push_back(params[p]);
  std::vector<Array> got = test_util::interpret(split.unknown, unknown_args);
  got.push_back(known[0]);
  test_util::expect_bitwise(got, whole);
  return params;
}

TEST(PartialEval, TheTwoPartsComposeToTheWholeGraphBitwiseAndShareNoNode) {
  Tree structure;
  const Graph g = forward_and_backward(&structure);
  ASSERT_EQ(structure.paths(), (std::vector<std::string>{"dp.b", "dp.w", "dx", "y"}));
  const SplitGraph split = partial_eval(g, {false, true, false, false}, {3}, {0, 1, 2});
  // Every node is in one part: the backward starts from the residuals.
  EXPECT_EQ(split.known.num_nodes() + split.unknown.num_nodes(), g.num_nodes());
  EXPECT_EQ(test_util::count_nodes(split.unknown, "tanh"), 0u) << split.unknown.text();
  EXPECT_EQ(test_util::count_nodes(split.known, "tanh"), test_util::count_nodes(g, "tanh"));
  EXPECT_EQ(split.residuals, 1u) << "only tanh(x w) is kept: " << split.known.text();
  // The backward reads dy, and w and x again (dx = ... w^T, dw = x^T ...) as parameters,
  // not as residual copies of them.
  EXPECT_EQ(split.unknown_parameters, (std::vector<size_t>{1, 2, 3})) << split.unknown.text();

  const std::vector<Array> params = expect_parts_compose(g, split, 7);
  const std::vector<Array> whole = test_util::interpret(g, params);

  // Compiled (the pass pipeline on each part) they give the same values.
  const std::vector<Array> compiled_known = compile(split.known)->run({params[0], params[2], params[3]});
  std::vector<Array> compiled_args(compiled_known.begin() + 1, compiled_known.end());
  for (size_t p : split.unknown_parameters) compiled_args.push_back(params[p]);
  const std::vector<Array> compiled = compile(split.unknown)->run(compiled_args);
  for (size_t i = 0; i < compiled.size(); ++i)
    tessera::test::expect_close(compiled[i], whole[i].to_vector<double>(), 1e-6, 1e-6,
                                "compiled output " + std::to_string(i));
}

TEST(PartialEval, AKnownOutputThatNeedsAnUnknownParameterIsAnError) {
  const Graph g = forward_and_backward(nullptr);
  try {
    (void)partial_eval(g, {false, true, false, false}, {2}, {0});
    ADD_FAILURE() << "dx depends on dy";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("output 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("unknown parameter"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)partial_eval(g, {true}, {}, {0}), ValueError) << "one flag per parameter";
  EXPECT_THROW((void)partial_eval(g, {false, true, false, false}, {9}, {}), ValueError) << "no output 9";
}

// y = tanh(x exp(w)) * x + b: exp(w) is a function of the parameter w alone. Kept, it is
// a residual beside tanh(x exp(w)); recomputed from w, the backward computes it again
// from w (passed again) and keeps only tanh's value, and the parts still compose to the
// whole graph's bits.
TEST(PartialEval, ValuesOfRecomputedParametersAreComputedAgainNotKept) {
  const Graph g = forward_and_backward(nullptr, /*exp_of_w=*/true);
  const std::vector<bool> unknown{false, true, false, false};
  const SplitGraph kept = partial_eval(g, unknown, {3}, {0, 1, 2});
  EXPECT_EQ(kept.residuals, 2u) << "tanh(x exp(w)) and exp(w): " << kept.known.text();
  EXPECT_EQ(test_util::count_nodes(kept.unknown, "exp"), 0u) << kept.unknown.text();

  const SplitGraph split = partial_eval(g, unknown, {3}, {0, 1, 2}, {false, false, true, false});
  EXPECT_EQ(split.residuals, 1u) << "only tanh(x exp(w)): " << split.known.text();
  EXPECT_EQ(test_util::count_nodes(split.unknown, "exp"), 1u) << split.unknown.text();
  EXPECT_EQ(test_util::count_nodes(split.known, "exp"), 1u) << split.known.text();
  EXPECT_EQ(split.unknown_parameters, (std::vector<size_t>{1, 2, 3})) << "w is passed again";
  (void)expect_parts_compose(g, split, 11);

  // One flag per parameter, and none on an unknown one.
  EXPECT_THROW((void)partial_eval(g, unknown, {3}, {0}, {true}), ValueError);
  try {
    (void)partial_eval(g, unknown, {3}, {0}, {false, true, false, false});
    ADD_FAILURE() << "dy is unknown";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("is unknown"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera::compiler
