// Resharding: the collectives that turn one sharding of a local shard into another,
// one mesh axis at a time (the table of ARCHITECTURE.md):
//
//   from \ to    Replicate        Shard(d)             Partial
//   Replicate    -                local slice          (never needed)
//   Shard(d)     all-gather(d)    all-to-all(d -> e)   -
//   Partial      all-reduce       reduce-scatter(d)    -
//
// Order: partial axes are resolved first (reduce-scatter where the target splits a
// dimension on that axis, else all-reduce), then splits that change are gathered,
// moved (all-to-all) or sliced. Dimensions split over several axes gather from the
// minor axis out and slice from the major axis in, so shard offsets stay row-major.
#pragma once

#include <string>
#include <vector>

#include "tessera/core/array.h"
#include "tessera/spmd/sharding.h"

namespace tessera::spmd {

// One inserted collective, for summaries.
struct ReshardStep {
  std::string description;  // "all_gather {axes=[data], dim=0} f32[4, 8] -> f32[8, 8]"
};

// `local` is a shard of an array with global shape `global` laid out as `from`;
// returns the shard laid out as `to` (built with the collective builders).
Array reshard_local(const Array& local, const Shape& global, const Sharding& from, const Sharding& to,
                    std::vector<ReshardStep>* steps = nullptr);

}  // namespace tessera::spmd
