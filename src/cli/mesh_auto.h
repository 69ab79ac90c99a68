// `tessera train --mesh auto`: the planner (plan/planner.h) picks the layout of the
// devices present for the job's model, batch and precision.
#pragma once

#include <string>

#include "tessera/train/config.h"

namespace tessera::cli {

// The mesh for `config` on spmd::device_count() devices, with one line on stdout saying
// which and why. One device: "data=1". The choice is kept in RUN_DIR/mesh_auto, and a
// later start of the same run directory (a resume) reuses it, so the run goes on in the
// layout it began with (bitwise, as a resume must). In one process the layouts are costed
// on this machine, measured; under mpirun on the catalog's CPU entry (every rank must
// choose the same layout, and measurements differ between ranks).
std::string choose_mesh_auto(const train::TrainConfig& config);

}  // namespace tessera::cli
