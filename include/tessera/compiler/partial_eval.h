// Partial evaluation (JAX's pe.partial_eval_jaxpr): a graph split at some of its
// parameters into the part that can run before they are known and the part that needs
// them. A pipeline stage's traced forward-and-backward, split at the output gradient
// `dy`, becomes a forward that also returns the activations the backward reads (the
// residuals) and a backward that starts from them instead of recomputing the forward
// (train/pipeline.h, PipelineOptions::recompute = false).
#pragma once

#include <cstddef>
#include <vector>

#include "tessera/compiler/graph.h"

namespace tessera::compiler {

struct SplitGraph {
  // Every node that reads no unknown parameter, directly or through other nodes.
  // Parameters: the graph's known parameters, in order. Outputs: the graph outputs asked
  // for as known (known_outputs, in that order), then the residuals: the values of
  // known nodes that unknown nodes or unknown outputs read.
  Graph known;
  // The other nodes (and copies of the known nodes it recomputes: `recomputed_from`
  // below). Parameters: the residuals (in the order `known` returns them), then
  // the graph's parameters listed in `unknown_parameters` (the unknown ones, and known
  // ones that unknown nodes read directly: those are passed again rather than returned
  // as residuals). Outputs: the graph outputs asked for (unknown_outputs, in order).
  Graph unknown;
  size_t residuals = 0;
  std::vector<size_t> unknown_parameters;  // indices into the graph's parameters
};

// Splits `graph` at the parameters marked in `unknown` (one flag per parameter).
// known_outputs must not depend on an unknown parameter (a ValueError names the output
// otherwise); unknown_outputs may be anything. Constants are copied into the part that
// reads them. Each node keeps its remat region and name.
//
// `recomputed_from` (empty, or one flag per parameter) marks known parameters whose
// functions the unknown part computes again rather than receiving them as residuals: a
// known node whose inputs are all such parameters, constants or outputs of such nodes
// (and that has an input) is copied into the unknown part when that part reads it, and
// the parameters it reads are passed again. A pipeline stage partitioned with FSDP marks
// its parameters: the backward gathers the weights it reads again (as a recomputing
// backward and ZeRO-3 do) instead of keeping a whole copy per micro-batch in flight.
SplitGraph partial_eval(const Graph& graph, const std::vector<bool>& unknown, const std::vector<size_t>& known_outputs,
                        const std::vector<size_t>& unknown_outputs, const std::vector<bool>& recomputed_from = {});

}  // namespace tessera::compiler
