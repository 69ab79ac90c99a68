// Graph utilities: topological order, the text form, cost totals.
#include <algorithm>

#include "test_util.h"

namespace tessera::test {
namespace {

TEST(Graph, TopologicalOrder) {
  Array a = random_array({2, 3}, 1, DType::Float32), b = random_array({3, 4}, 2, DType::Float32);
  Array c = matmul(a, b);
  Array d = tanh(c);
  Array e = d + c;  // c used twice: appears once
  auto order = topological_order({e, d});
  ASSERT_EQ(order.size(), 5u);
  auto pos = [&](const Array& x) {
    for (size_t i = 0; i < order.size(); ++i)
      if (order[i].is_same(x)) return static_cast<int>(i);
    return -1;
  };
  for (const Array* x : {&a, &b, &c, &d, &e}) EXPECT_GE(pos(*x), 0);
  EXPECT_LT(pos(a), pos(c));
  EXPECT_LT(pos(b), pos(c));
  EXPECT_LT(pos(c), pos(d));
  EXPECT_LT(pos(d), pos(e));
  EXPECT_LT(pos(c), pos(e));
  // Deterministic.
  auto again = topological_order({e, d});
  for (size_t i = 0; i < order.size(); ++i) EXPECT_TRUE(order[i].is_same(again[i]));
  // Graph structure accessors.
  EXPECT_TRUE(a.is_leaf());
  EXPECT_FALSE(c.is_leaf());
  EXPECT_EQ(c.primitive()->name(), "matmul");
  ASSERT_EQ(c.inputs().size(), 2u);
  EXPECT_TRUE(c.inputs()[0].is_same(a));
  EXPECT_FALSE(e.is_evaluated());
  e.eval();
  EXPECT_TRUE(e.is_evaluated());
}

TEST(Graph, TextForm) {
  Array a = random_array({2, 3}, 1, DType::Float32), b = random_array({3}, 2, DType::Float32);
  Array y = sum(exp(a + b), {1});
  std::string text = graph_text({y});
  for (const char* part : {"add", "exp", "sum", "f32[2, 3]", "f32[3]", "f32[2]", "input"})
    EXPECT_NE(text.find(part), std::string::npos) << "missing \"" << part << "\" in:\n" << text;
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n') + (text.empty() || text.back() == '\n' ? 0 : 1), 5) << text;
  EXPECT_EQ(type_string(y), "f32[2]");
  EXPECT_EQ(type_string(zeros({4, 1}, DType::BFloat16)), "bf16[4, 1]");
}

TEST(Graph, CostOfMatmul) {
  const int64_t M = 7, K = 33, N = 5;
  Array a = zeros({M, K}), b = zeros({K, N});
  Array c = matmul(a, b);
  Cost cost = graph_cost({c});
  EXPECT_DOUBLE_EQ(cost.flops, 2.0 * M * N * K);
  EXPECT_GE(cost.bytes, 4.0 * (M * K + K * N + M * N));
  // Batched: 2 * batch * M * N * K.
  Cost cb = graph_cost({matmul(zeros({3, M, K}), zeros({K, N}))});
  EXPECT_DOUBLE_EQ(cb.flops, 2.0 * 3 * M * N * K);
  // The evaluated part of a graph costs nothing more.
  c.eval();
  EXPECT_DOUBLE_EQ(graph_cost({c}).flops, 0.0);
}

}  // namespace
}  // namespace tessera::test
