// Pipeline-parallel gradients: a model's loss and parameter gradients computed by p
// pipeline devices (threads of this process, virtual devices) that run contiguous
// stages of its layers on micro-batches, in the order of a schedule
// (train/pipeline_schedule.h: GPipe, 1F1B, interleaved 1F1B).
//
// Each stage is two programs, compiled once: the forward of its layers
// (Model::stage_forward; the first stage embeds the tokens, the last ends with the
// loss summed over its micro-batch) and its backward (the vjp of that forward, which
// recomputes it: only the stage's input is kept per micro-batch in flight). Device d
// runs its ops in schedule order; a forward waits for its input activations, a
// backward for the gradient of its output, each handed over from the neighbouring
// stage's device. A stage's parameter gradients are added over micro-batches in
// micro-batch order (every schedule runs a stage's backwards in that order), so the
// result does not depend on timing; the loss is the sum over micro-batches divided by
// the targets that count, as Model::loss. A tied embedding ("wte" in the first and the
// last stage) gets the sum of both stages' gradients.
//
// Not yet: the `pipeline` mesh axis in `tessera train`, other axes (DP/FSDP/TP) on the
// same mesh, processes instead of threads, mixture of experts (issue 26).
#pragma once

#include <utility>
#include <vector>

#include "tessera/core/array.h"
#include "tessera/core/tree.h"
#include "tessera/models/model.h"
#include "tessera/train/pipeline_schedule.h"

namespace tessera::train {

struct PipelineOptions {
  PipelineKind kind = PipelineKind::kOneFOneB;
  int devices = 2;         // p: pipeline devices (threads)
  int micro_batches = 4;   // m: the batch splits into m equal micro-batches
  int virtual_stages = 1;  // v: stages per device (interleaved only)
  // Layers [first, last) of each of the p * v stages; empty: balance_stages over equal
  // layer costs.
  std::vector<std::pair<int, int>> stage_layers;
};

struct PipelineResult {
  double loss = 0;  // mean over the counted targets
  Tree grads;       // the structure of the parameters
  std::vector<std::pair<int, int>> stage_layers;
  PipelineSchedule schedule;
  // The ops as they ran: each device thread's start and end times (seconds from the
  // step's start), the measured idle share and the micro-batches in flight.
  PipelineTimeline measured;
};

// Loss and gradients of model.loss(params, tokens, targets) (no dropout, no packing)
// computed by the pipeline. ValueErrors: a batch that does not split into the
// micro-batches, stages that cannot be formed (more stages than layers, ranges that
// do not cover the layers in order), a bad schedule shape.
PipelineResult pipeline_value_and_grad(const models::Model& model, const Tree& params, const Array& tokens,
                                       const Array& targets, const PipelineOptions& options);

}  // namespace tessera::train
