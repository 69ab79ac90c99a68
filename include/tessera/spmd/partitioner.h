// The SPMD partitioner: a global program with shardings -> one per-device program.
//
// Input: the traced global Graph (shapes are global), a Mesh, a sharding for every
// parameter (replicated when not given) and optionally for every output. The
// partitioner walks the nodes in order; for each it asks the primitive's sharding
// rule (sharding_rule.h) what its inputs must be, reshards them (reshard.h:
// all-gather, all-reduce, reduce-scatter, all-to-all, local slice), and applies the
// local op to the local shards. Outputs are resharded to their requested sharding;
// an output left partial is all-reduced (reduced values are replicated).
//
// The result is an ordinary Graph over local shapes with explicit collective
// primitives, compiled like any other (fusion, memory plan, ...) and run on every
// device with that device's shards.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tessera/compiler/graph.h"
#include "tessera/spmd/communicator.h"
#include "tessera/spmd/sharding.h"

namespace tessera::spmd {

struct CollectiveSummary {
  // Per kind: calls per step and bytes each device sends (ring count, CommStats).
  CommStats per_device;
  // One line per inserted collective: "all_gather {axes=[data], dim=0} f32[64, 32] -> f32[128, 32] (why)".
  std::vector<std::string> lines;
  std::string text() const;
};

struct PartitionedProgram {
  Mesh mesh;
  compiler::Graph local;  // per-device program (local shapes, collectives)
  std::vector<Sharding> parameter_shardings;
  std::vector<Sharding> output_shardings;
  std::vector<compiler::TensorType> global_parameter_types, global_output_types;
  CollectiveSummary summary;
  // The per-device program with the collective summary appended.
  std::string text() const;
};

struct PartitionOptions {
  // Names for messages ("argument 3 (params.layers.0.attn.wqkv)"), per parameter.
  std::vector<std::string> parameter_names;
  std::vector<std::string> output_names;
  // Combine small independent all-reduces into one call each (combine_all_reduces). Off
  // where the program is split afterwards (a pipeline stage's forward-and-backward,
  // compiler::partial_eval): a forward's reduction combined with a backward's would
  // make the forward wait for the backward's input. The caller combines each part.
  bool combine_all_reduces = true;
};

// The collectives of a per-device program (a partitioned program's local graph, or a
// part of one): calls per run and the bytes each device sends (ring counts, CommStats).
CommStats collective_stats(const compiler::Graph& local);

PartitionedProgram partition(const compiler::Graph& global, const Mesh& mesh,
                             const std::vector<std::optional<Sharding>>& parameter_shardings,
                             const std::vector<std::optional<Sharding>>& output_shardings,
                             const PartitionOptions& options = {});

}  // namespace tessera::spmd
