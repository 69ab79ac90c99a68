// Helpers for compiler pass tests: a node-by-node reference interpreter of a Graph
// (each primitive's eval_cpu in schedule order, no passes, no memory plan) and random
// parameters for it.
#pragma once

#include <map>
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

}  // namespace tessera::compiler::test_util
