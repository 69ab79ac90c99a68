// Rematerialization (gradient checkpointing), JAX's jax.checkpoint: ops traced
// inside checkpoint(fn) are tagged with a region and its policy; when the program is
// compiled (jit, or eval of a grad), the remat pass recomputes the region's
// intermediates right before the backward pass reads them instead of keeping them
// alive from the forward pass. Policies:
//   * none       - keep every intermediate (no recomputation; the default without checkpoint)
//   * full       - keep only the region's inputs and outputs; recompute the rest
//   * save_named - keep the values tagged with checkpoint_name(x, name) for a listed
//                  name, recompute the rest
//   * offload    - like save_named, but the listed values wait for the backward pass
//                  in host memory: the compiler copies each to host after its last
//                  forward use and back before its first backward use (passes/
//                  offload.h); the unlisted intermediates are recomputed as in full.
//                  Naming a value no op of the region carries is an error when the
//                  checkpointed function runs (a typo would otherwise silently save
//                  nothing).
// Values are identical with and without checkpointing (the recomputation runs the
// same kernels on the same inputs); only memory and FLOPs change.
#pragma once

#include <string>
#include <vector>

#include "tessera/core/array.h"
#include "tessera/core/transforms.h"

namespace tessera {

struct CheckpointPolicy {
  enum class Kind { None, Full, SaveNamed, Offload };
  Kind kind = Kind::Full;
  std::vector<std::string> saved_names;

  static CheckpointPolicy none() { return {Kind::None, {}}; }
  static CheckpointPolicy full() { return {Kind::Full, {}}; }
  static CheckpointPolicy save_named(std::vector<std::string> names) { return {Kind::SaveNamed, std::move(names)}; }
  static CheckpointPolicy offload(std::vector<std::string> names) { return {Kind::Offload, std::move(names)}; }
  // The listed names are kept from the forward pass (on device or on host).
  bool saves_named() const { return kind == Kind::SaveNamed || kind == Kind::Offload; }
  std::string text() const;  // "none", "full", "save_named[a, b]", "offload[a, b]"
};

// fn with its ops tagged as one checkpoint region.
ArrayFn checkpoint(ArrayFn fn, CheckpointPolicy policy = CheckpointPolicy::full());
std::function<Array(const Array&)> checkpoint(std::function<Array(const Array&)> fn,
                                              CheckpointPolicy policy = CheckpointPolicy::full());

// Tags x with a name the save_named and offload policies can refer to (an identity op).
Array checkpoint_name(const Array& x, const std::string& name);

namespace detail {
// The policy of a region id stamped on OpNode::remat_region.
const CheckpointPolicy& checkpoint_policy(int region);
// A new region id with `policy` (graph rewriters that rebuild traced ops, e.g. the
// SPMD partitioner, re-stamp them with it).
int new_checkpoint_region(const CheckpointPolicy& policy);
}  // namespace detail

}  // namespace tessera
