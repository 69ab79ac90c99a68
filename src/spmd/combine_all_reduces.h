// Internal: combines independent small all-reduces of a per-device program into one
// (XLA's all-reduce combiner): their operands are flattened and concatenated, reduced
// in one collective call, and sliced back. Bytes sent are unchanged; calls (latency)
// drop, e.g. the gradients of a model's many biases and norm scales in data
// parallelism. Two all-reduces combine only when neither reads the other's result.
#pragma once

#include <cstddef>

#include "tessera/compiler/graph.h"

namespace tessera::spmd {

// Returns the number of combined collectives made. Operands above
// `max_operand_bytes` stay alone (copying them would cost more than a call).
int combine_all_reduces(compiler::Graph& graph, size_t max_operand_bytes = size_t{1} << 20,
                        size_t max_bucket_bytes = size_t{16} << 20);

}  // namespace tessera::spmd
