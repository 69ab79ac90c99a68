// Internal: reading a sharded array's values on the host.
#pragma once

#include "tessera/core/array.h"

namespace tessera::spmd {

// Fills x's storage with the global value assembled from its shards (a leaf with
// ArrayImpl::shards). Throws ValueError when a shard lives in another process.
void assemble_on_host(const Array& x);

}  // namespace tessera::spmd
