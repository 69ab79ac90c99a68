// Rematerialization (gradient checkpointing), JAX's jax.checkpoint: ops traced
// inside checkpoint(fn) are tagged with a region and its policy; when the program is
// compiled (jit, or eval of a grad), the remat pass recomputes the region's
// intermediates right before the backward pass reads them instead of keeping them
// alive from the forward pass. Policies:
//   * none       - keep every intermediate (no recomputation; the default without checkpoint)
//   * full       - keep only the region's inputs and outputs; recompute the rest
//   * save_named - keep the values tagged with checkpoint_name(x, name) for a listed
//                  name, recompute the rest
// Values are identical with and without checkpointing (the recomputation runs the
// same kernels on the same inputs); only memory and FLOPs change.
#pragma once

#include <string>
#include <vector>

#include "tessera/core/array.h"
#include "tessera/core/transforms.h"

namespace tessera {

struct CheckpointPolicy {
  enum class Kind { None, Full, SaveNamed };
  Kind kind = Kind::Full;
  std::vector<std::string> saved_names;

  static CheckpointPolicy none() { return {Kind::None, {}}; }
  static CheckpointPolicy full() { return {Kind::Full, {}}; }
  static CheckpointPolicy save_named(std::vector<std::string> names) { return {Kind::SaveNamed, std::move(names)}; }
  std::string text() const;  // "none", "full", "save_named[a, b]"
};

// fn with its ops tagged as one checkpoint region.
ArrayFn checkpoint(ArrayFn fn, CheckpointPolicy policy = CheckpointPolicy::full());
std::function<Array(const Array&)> checkpoint(std::function<Array(const Array&)> fn,
                                              CheckpointPolicy policy = CheckpointPolicy::full());

// Tags x with a name the save_named policy can refer to (an identity op).
Array checkpoint_name(const Array& x, const std::string& name);

namespace detail {
// The policy of a region id stamped on OpNode::remat_region.
const CheckpointPolicy& checkpoint_policy(int region);
// A new region id with `policy` (graph rewriters that rebuild traced ops, e.g. the
// SPMD partitioner, re-stamp them with it).
int new_checkpoint_region(const CheckpointPolicy& policy);
}  // namespace detail

}  // namespace tessera
