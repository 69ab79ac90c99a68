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
  int replicas = 1;         // the data axis, when no other axis partitions the stages
};

// nullopt when parallel.mesh has no `pipeline` axis. With only a data axis besides it,
// data=R gives R replicas of the pipeline; with any other axis of more than one device
// (fsdp, tensor) the stages are partitioned over the mesh's other axes, data included
// (options.mesh and options.rules from parallel.rules). ConfigErrors name the key and the
// rule: a pipeline axis of one device, an
// unknown schedule, micro-batches that do not divide a replica's rows (or, interleaved,
// are not a multiple of the pipeline size), virtual stages outside interleaved, stage
// ranges that do not cover the layers in order, more stages than layers.
std::optional<PipelinePlan> pipeline_plan(const TrainConfig& config);

}  // namespace tessera::train
