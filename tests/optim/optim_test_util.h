// Helpers for the optimizer tests: a small parameter set with one leaf of every kind,
// trees built from float64 host values, and reading trees back by path.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/test_util.h"
#include "tessera/nn/param.h"
#include "tessera/optim/optimizer.h"

namespace tessera::test {

struct LeafSpec {
  std::string path;
  Shape shape;
  nn::ParamKind kind;
};

// One parameter of every kind, nested like a model's ("layers.0.w").
inline std::vector<LeafSpec> test_leaves() {
  return {{"emb", {5, 3}, nn::ParamKind::Embedding},
          {"head", {3, 2}, nn::ParamKind::Weight},
          {"layers.0.b", {4}, nn::ParamKind::Bias},
          {"layers.0.w", {3, 4}, nn::ParamKind::Weight},
          {"ln.scale", {3}, nn::ParamKind::Norm}};
}

inline nn::ParamSpecs specs_of(const std::vector<LeafSpec>& leaves) {
  nn::ParamSpecs specs;
  for (const LeafSpec& l : leaves) {
    nn::ParamInfo& info = specs[l.path];
    info.shape = l.shape;
    info.axes = nn::AxisNames(l.shape.size(), "x");
    info.kind = l.kind;
  }
  return specs;
}

// Host values per path (float64 references work on these).
using Values = std::map<std::string, std::vector<double>>;

inline Values random_values_for(const std::vector<LeafSpec>& leaves, uint32_t seed, DType dtype) {
  Values out;
  for (const LeafSpec& l : leaves) out[l.path] = round_to(random_values(numel(l.shape), seed++), dtype);
  return out;
}

// A nested dict tree with the leaves at their dotted paths.
inline Tree tree_of(const std::vector<LeafSpec>& leaves, const Values& values, DType dtype) {
  Tree t;
  for (const LeafSpec& l : leaves) {
    Tree* node = &t;
    std::string rest = l.path;
    for (size_t dot; (dot = rest.find('.')) != std::string::npos; rest = rest.substr(dot + 1))
      node = &(*node)[rest.substr(0, dot)];
    (*node)[rest] = make_array(values.at(l.path), l.shape, dtype);
  }
  return t;
}

inline Values values_of(const Tree& t) {
  Values out;
  std::vector<Array> leaves = t.leaves();
  std::vector<std::string> paths = t.paths();
  eval(leaves);
  for (size_t i = 0; i < leaves.size(); ++i) out[paths[i]] = leaves[i].to_vector<double>();
  return out;
}

inline void expect_close(const Values& got, const Values& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [path, w] : want) {
    ASSERT_TRUE(got.count(path)) << what << ": missing " << path;
    const std::vector<double>& g = got.at(path);
    ASSERT_EQ(g.size(), w.size()) << what << " " << path;
    for (size_t i = 0; i < w.size(); ++i)
      ASSERT_NEAR(g[i], w[i], tol * (1 + std::abs(w[i]))) << what << " " << path << "[" << i << "]";
  }
}

// Global-norm clipping in float64: returns the norm and scales `g` when clip > 0.
inline double ref_clip(Values& g, double clip) {
  double sq = 0;
  for (const auto& [path, v] : g)
    for (double x : v) sq += x * x;
  double norm = std::sqrt(sq);
  if (clip > 0) {
    double scale = std::min(1.0, clip / (norm + 1e-6));
    for (auto& [path, v] : g)
      for (double& x : v) x *= scale;
  }
  return norm;
}

inline bool ref_decays(nn::ParamKind kind) {
  return kind != nn::ParamKind::Norm && kind != nn::ParamKind::Bias && kind != nn::ParamKind::Embedding;
}

// Runs fn and checks it throws E with every one of `parts` in its message.
template <typename E>
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "expected an error mentioning " << parts.at(0);
  } catch (const E& e) {
    for (const std::string& part : parts)
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << "message: " << e.what() << "\nlacks: " << part;
  }
}

}  // namespace tessera::test
