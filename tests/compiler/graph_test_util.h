// Helpers for compiler pass tests: a node-by-node reference interpreter of a Graph
// (each primitive's eval_cpu in schedule order, no passes, no memory plan), random
// parameters for it, a count of a primitive's live nodes and a bitwise comparison of
// outputs.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "core/test_util.h"
#include "tessera/compiler/graph.h"

namespace tessera::compiler::test_util {

// Evaluates the graph node by node in schedule order; returns the graph outputs.
inline std::vector<Array> interpret(const Graph& g, const std::vector<Array>& params) {
  std::map<ValueId, Array> env;
  for (size_t i = 0; i < g.parameters.size(); ++i) env[g.parameters[i]] = params.at(i);
  auto get = [&](ValueId v) { return g.value(v).kind == ValueKind::Constant ? g.value(v).constant : env.at(v); };
  for (const Node& node : g.nodes) {
    if (node.dead) continue;
    std::vector<Array> inputs, outputs;
    for (ValueId in : node.inputs) inputs.push_back(get(in));
    for (ValueId out : node.outputs) outputs.push_back(Array::placeholder(g.type(out).shape, g.type(out).dtype));
    node.primitive->eval_cpu(inputs, outputs);
    for (size_t i = 0; i < outputs.size(); ++i) env[node.outputs[i]] = outputs[i];
  }
  std::vector<Array> result;
  for (ValueId out : g.outputs) result.push_back(get(out));
  return result;
}

// Uniform(-1, 1) values for every parameter, seeds seed, seed + 1, ...
inline std::vector<Array> random_params(const Graph& g, uint32_t seed) {
  std::vector<Array> params;
  for (ValueId p : g.parameters) {
    const TensorType& t = g.type(p);
    params.push_back(tessera::test::make_array(tessera::test::random_values(numel(t.shape), seed++), t.shape, t.dtype));
  }
  return params;
}

// The live nodes of primitive `name`.
inline size_t count_nodes(const Graph& g, const std::string& name) {
  size_t n = 0;
  for (const Node& node : g.nodes)
    if (!node.dead && node.primitive->name() == name) ++n;
  return n;
}

// Same shapes, dtypes and bytes, output by output.
inline void expect_bitwise(const std::vector<Array>& got, const std::vector<Array>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].shape(), want[i].shape()) << "output " << i;
    ASSERT_EQ(got[i].dtype(), want[i].dtype()) << "output " << i;
    EXPECT_EQ(std::memcmp(got[i].raw_data(), want[i].raw_data(), want[i].nbytes()), 0) << "output " << i;
  }
}

}  // namespace tessera::compiler::test_util
