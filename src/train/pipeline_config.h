// [parallel]'s pipeline keys resolved against the mesh, the batch and the model: what
// `tessera train` builds its PipelineTrainStep from (train/pipeline_step.h).
#pragma once

#include <optional>

#include "tessera/spmd/mesh.h"
#include "tessera/train/config.h"
#include "tessera/train/pipeline.h"

namespace tessera::train {

struct PipelinePlan {
  spmd::Mesh mesh;          // parallel.mesh
  PipelineOptions options;  // devices = the pipeline axis; micro-batches and virtual stages resolved
  int replicas = 1;         // the data axis
};

// nullopt when parallel.mesh has no `pipeline` axis. ConfigErrors name the key and the
// rule: a mesh axis besides pipeline and data with more than one device (FSDP and tensor
// parallelism do not combine with the pipeline yet), a pipeline axis of one device, an
// unknown schedule, micro-batches that do not divide a replica's rows (or, interleaved,
// are not a multiple of the pipeline size), virtual stages outside interleaved, stage
// ranges that do not cover the layers in order, more stages than layers.
std::optional<PipelinePlan> pipeline_plan(const TrainConfig& config);

}  // namespace tessera::train
