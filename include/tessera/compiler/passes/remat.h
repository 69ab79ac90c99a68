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
#pragma once

#include <string>

#include "tessera/compiler/pass.h"

namespace tessera::compiler {

class Rematerialization : public Pass {
 public:
  static constexpr const char* kRegionOutput = "__output__";
  static constexpr const char* kRecomputed = "__recomputed__";
  std::string name() const override { return "remat"; }
  void run(Graph& graph) override;
};

}  // namespace tessera::compiler
