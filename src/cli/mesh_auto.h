// `tessera train --mesh auto`: the planner (plan/planner.h) picks the layout of the
// devices present for the job's model, batch and precision.
#pragma once

#include <string>

#include "tessera/train/config.h"

namespace tessera::cli {

// The layout for `config` on spmd::device_count() devices, with one line on stdout
// saying which and why, as plan::PlanLayout::name() writes it: the mesh, and for a
// pipeline its micro-batch count ("pipeline=2,data=2 m=8"). One device: "data=1". The
// choice is kept in RUN_DIR/mesh_auto, and a later start of the same run directory (a
// resume) reuses it, so the run goes on in the layout it began with (bitwise, as a
// resume must). In one process the layouts are costed on this machine, measured; under
// mpirun on the catalog's CPU entry (every rank must choose the same layout, and
// measurements differ between ranks).
std::string choose_mesh_auto(const train::TrainConfig& config);

// Sets parallel.mesh (and parallel.pipeline_micro_batches when the layout names a
// count) from a layout choose_mesh_auto returned.
void apply_mesh_auto(const std::string& layout, train::TrainConfig& config);

}  // namespace tessera::cli
