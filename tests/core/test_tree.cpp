// Tree: nested dict/list structures of arrays with deterministic flattening.
#include "test_util.h"

namespace tessera::test {
namespace {

Tree make_params() {
  return Tree{
      {"wte", random_array({5, 2}, 1)},
      {"layers", Tree::list({Tree{{"weight", random_array({2, 2}, 2)}, {"bias", random_array({2}, 3)}},
                             Tree{{"weight", random_array({2, 2}, 4)}, {"bias", random_array({2}, 5)}}})},
      {"alpha", random_array({}, 6)},
  };
}

TEST(Tree, StructureAndDeterministicOrder) {
  Tree p = make_params();
  EXPECT_TRUE(p.is_dict());
  EXPECT_EQ(p.size(), 3u);
  EXPECT_TRUE(p.at("layers").is_list());
  EXPECT_EQ(p.at("layers").size(), 2u);
  EXPECT_TRUE(p.at("wte").is_leaf());
  EXPECT_EQ(p.at("wte").size(), 1u);
  // Dict keys in sorted order, lists in index order.
  std::vector<std::string> expected = {"alpha",         "layers.0.bias",   "layers.0.weight",
                                       "layers.1.bias", "layers.1.weight", "wte"};
  EXPECT_EQ(p.paths(), expected);
  auto leaves = p.leaves();
  ASSERT_EQ(leaves.size(), 6u);
  EXPECT_TRUE(leaves[0].is_same(p.at("alpha").leaf()));
  EXPECT_TRUE(leaves[2].is_same(p.at("layers").at(size_t{0}).at("weight").leaf()));
  EXPECT_TRUE(leaves[5].is_same(p.at("wte").leaf()));
  // Insertion order does not matter.
  Tree q;
  q["wte"] = p.at("wte");
  q["alpha"] = p.at("alpha");
  q["layers"] = p.at("layers");
  EXPECT_EQ(q.paths(), expected);
  EXPECT_TRUE(q.same_structure(p));
}

TEST(Tree, WithLeavesMapAndTreeMap) {
  Tree p = make_params();
  Tree doubled = p.map([](const Array& a) { return a * 2.0; });
  EXPECT_TRUE(doubled.same_structure(p));
  auto pl = p.leaves(), dl = doubled.leaves();
  for (size_t i = 0; i < pl.size(); ++i)
    EXPECT_CLOSE(dl[i], ref_unary(values(pl[i]), [](double x) { return 2 * x; }), 0, 0) << p.paths()[i];
  Tree summed = tree_map([](const Array& a, const Array& b) { return a + b; }, p, doubled);
  auto sl = summed.leaves();
  for (size_t i = 0; i < pl.size(); ++i)
    EXPECT_CLOSE(sl[i], ref_unary(values(pl[i]), [](double x) { return 3 * x; }), 1e-15, 0);
  std::vector<Array> zs;
  for (const auto& l : pl) zs.push_back(zeros_like(l));
  Tree z = p.with_leaves(zs);
  EXPECT_TRUE(z.same_structure(p));
  EXPECT_TRUE(z.leaves()[3].is_same(zs[3]));
  EXPECT_ANY_THROW(p.with_leaves({zs[0]}));
  // same_structure compares leaf shapes and dtypes too.
  Tree other = p;
  other["wte"] = Tree(zeros({5, 3}, DType::Float64));
  EXPECT_FALSE(other.same_structure(p));
  Tree other2 = p;
  other2["wte"] = Tree(zeros({5, 2}, DType::Float32));
  EXPECT_FALSE(other2.same_structure(p));
  Tree other3 = p;
  other3["extra"] = Tree(zeros({1}));
  EXPECT_FALSE(other3.same_structure(p));
  EXPECT_ANY_THROW(tree_map([](const Array& a, const Array&) { return a; }, p, other3));
}

TEST(Tree, AccessErrors) {
  Tree p = make_params();
  EXPECT_ANY_THROW(p.leaf());
  EXPECT_ANY_THROW(p.at("missing"));
  EXPECT_ANY_THROW(p.at("layers").at(size_t{7}));
  EXPECT_ANY_THROW(p.at("wte").items());
  Tree leaf(zeros({2}));
  EXPECT_EQ(leaf.leaves().size(), 1u);
  EXPECT_EQ(leaf.paths(), std::vector<std::string>{""});
  Tree empty;
  EXPECT_TRUE(empty.leaves().empty());
}

}  // namespace
}  // namespace tessera::test
