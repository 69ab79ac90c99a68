// Rematerialization: applies checkpoint policies (core/checkpoint.h). Every node
// traced inside checkpoint(fn) carries remat_region = r; Graph::remat_regions[r] is
// the region's policy. For a region with policy full, save_named or offload, a value
// produced inside the region and read by a node outside it (the backward pass) is
// recomputed instead of kept alive, unless
//   * its producer has remat_name == kRegionOutput (the checkpointed function's
//     outputs, which the forward pass consumes; the tracer marks them), or
//   * the policy is save_named or offload and its producer's remat_name is a listed
//     name (offload then moves it to host memory: passes/offload.h).
// Recomputing clones the producing chain (recursively, stopping at values made
// outside the region, region outputs and saved values), inserts the clones right
// before the first outside reader in schedule order and redirects every outside
// reader to them. Clones get remat_region = -1 and remat_name = kRecomputed so CSE
// never merges them back into the originals. Policy none: no change.
//
// The passes after remat (attention-layout, gemm-epilogue, fusion) rewrite clones like
// any node (fusable_after_remat): a recomputed value must be computed by the same
// kernels as the original, or its low-precision roundings differ (a bf16 GEMM with its
// bias in the epilogue rounds once, a GEMM then an add twice) and remat changes results.
#pragma once

#include <string>

#include "tessera/compiler/graph.h"
#include "tessera/compiler/pass.h"

namespace tessera::compiler {

class Rematerialization : public Pass {
 public:
  static constexpr const char* kRegionOutput = "__output__";
  static constexpr const char* kRecomputed = "__recomputed__";
  std::string name() const override { return "remat"; }
  void run(Graph& graph) override;
};

// A node the passes after remat may fuse or replace: untagged, a remat clone or a region
// output (both marks served remat and CSE, which ran). Nodes named with checkpoint_name
// keep their names for the offload pass.
inline bool fusable_after_remat(const Node& node) {
  return node.remat_name.empty() || node.remat_name == Rematerialization::kRecomputed ||
         node.remat_name == Rematerialization::kRegionOutput;
}

}  // namespace tessera::compiler
