// Host offload: applies the offload checkpoint policy (core/checkpoint.h) after the
// remat pass has kept the policy's named values. For a value v made in an offload
// region by an op whose remat_name the policy lists:
//   forward readers  = the region's own nodes (remat_region == r),
//   backward readers = every other reader (the backward pass and remat clones),
// and when every backward reader comes after the last forward reader, the pass
// inserts
//   h  = offload_to_host(v)    right after the last forward reader (or v's producer),
//   v' = load_from_host(h)     kPrefetchNodes live nodes before the first backward
//                              reader (never before the offload),
// and redirects the backward readers to v'. Values are unchanged (both ops are
// identities); the memory planner puts h in the host arena, so v's device buffer
// is free from the offload to the load: the device peak drops by up to
// bytes(v) per offloaded value live across the forward -> backward turn.
//
// Skipped (nothing to gain): values with no backward reader, values read back right
// after their last forward use, and views of parameters or constants (their buffer
// is the caller's and stays alive anyway).
//
// Runs after the scheduler, last: the scheduler emits a node when its first user
// needs it, which would move the offload next to the load and undo it.
//
// A listed name that no op of the region carries is checked where the region is
// traced (checkpoint() in core/checkpoint.cpp), not here: a graph may hold only a
// fragment of a region (eager ops flush in pieces).
#pragma once

#include <string>

#include "tessera/compiler/pass.h"

namespace tessera::compiler {

class HostOffload : public Pass {
 public:
  // How many kernels ahead of its first backward reader a value is loaded back: on
  // a GPU the host->device copy runs on a side stream while they do.
  static constexpr int kPrefetchNodes = 4;
  std::string name() const override { return "offload"; }
  void run(Graph& graph) override;
};

}  // namespace tessera::compiler
