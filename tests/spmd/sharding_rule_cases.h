// The sharding-rule cases (test_sharding_rules.cpp runs them): what a case is and the
// helpers that build one. The lists live in test_sharding_rules_cases_*.cpp by family.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "spmd_test_util.h"
#include "tessera/core/transforms.h"
#include "tessera/ir/primitives/linalg.h"
#include "tessera/ir/primitives/optim.h"

namespace tessera::sharding_cases {

using spmd::Axes;
using spmd::Mesh;
using spmd::NamedSharding;
using spmd::None;
using spmd::P;
using spmd::PartitionSpec;
using testing::expect_close;
using testing::VirtualDevices;

using Fn = std::function<std::vector<Array>(const std::vector<Array>&)>;

// How a test input's values are drawn.
enum class Gen {
  Float,     // uniform [-1, 1)
  Positive,  // uniform [0.1, 1.1) (second moments, learning rates)
  Index,     // int64 in [0, bound)
  Targets,   // int64 in [0, bound), every 5th one ignore_index (-100)
  Mask,      // bool, ~75% true, the diagonal true (no fully masked row)
  Step,      // int64 scalar 3
};

struct Arg {
  Shape shape;
  PartitionSpec spec;
  Gen gen = Gen::Float;
  int64_t bound = 0;
};

struct Case {
  std::string name;
  std::string mesh;
  std::vector<Arg> args;
  Fn fn;
  bool grad = true;  // also compare value_and_grad of a scalar function of the outputs
  // When set: the layout (Sharding::to_string) output 0 propagates to. Checks a rule
  // keeps a split it can keep instead of gathering.
  std::string layout;
  // When set: the layout cannot be derived and partitioning must throw ShardingError
  // containing this text (rules never guess).
  std::string error;
  // When set: a known partitioner/rule bug; the case is skipped with this text.
  std::string bug;
};

inline void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

inline std::string tag(const PartitionSpec& spec) {
  std::string s;
  for (size_t d = 0; d < spec.dims.size(); ++d) {
    s += d ? "_" : "";
    if (spec.dims[d].empty()) s += "N";
    for (const std::string& a : spec.dims[d]) s += a;
  }
  return s.empty() ? "R" : s;
}

inline std::string mesh_tag(const std::string& mesh) {
  std::string s;
  for (char ch : mesh)
    if (std::isalnum(static_cast<unsigned char>(ch))) s += ch;
  return s;
}

// Name: op + mesh + every input's layout.
inline Case make(const std::string& op, const std::string& mesh, std::vector<Arg> args, Fn fn, bool grad = true,
                 std::string layout = "") {
  std::string name = op + "__" + mesh_tag(mesh);
  for (const Arg& a : args) name += "__" + tag(a.spec);
  return Case{name, mesh, std::move(args), std::move(fn), grad, std::move(layout), "", ""};
}

inline Fn unary(Array (*f)(const Array&)) {
  return [f](const std::vector<Array>& a) { return std::vector<Array>{f(a[0])}; };
}

// The lists, one function per family (test_sharding_rules_cases_*.cpp).
std::vector<Case> elementwise_cases();
std::vector<Case> partial_cases();
std::vector<Case> reduce_cases();
std::vector<Case> layout_cases();
std::vector<Case> matmul_cases();
std::vector<Case> nn_cases();
std::vector<Case> indexing_cases();

}  // namespace tessera::sharding_cases
