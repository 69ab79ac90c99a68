// Helpers shared by the vjp and batching rules.
#pragma once

#include <vector>

#include "tessera/core/array.h"

namespace tessera::rules {

// Sums a broadcast cotangent back to `shape` (the inverse of numpy broadcasting).
Array sum_to_shape(const Array& g, const Shape& shape);

// Moves the batch axis to 0 (no-op when it already is).
Array batch_to_front(const Array& x, int axis);

// Batch size shared by the batched inputs (axes[i] >= 0); throws if they disagree.
int64_t batch_size(const std::vector<Array>& inputs, const std::vector<int>& axes, const char* op);

// Input i with its batch at axis 0 and exactly `rank` unbatched dims (size-1 dims
// inserted after the batch), so it broadcasts against other operands of that rank;
// an unbatched input is returned unchanged (it broadcasts from the right).
Array batched_operand(const Array& x, int axis, int rank);

// Input i with its batch at axis 0, or broadcast to a new leading batch of `size`.
Array batched_or_broadcast(const Array& x, int axis, int64_t size);

}  // namespace tessera::rules

#include <functional>

namespace tessera::rules {

// The generic batching rule: applies fn to each example (batched inputs sliced at
// their batch axis, unbatched ones shared) and stacks the results along axis 0.
// Correct for any op; used where a vectorized rule is not worth it (random
// sampling per key, scatter-adds with batched indices).
std::pair<std::vector<Array>, std::vector<int>> loop_vmap(
    const std::function<std::vector<Array>(const std::vector<Array>&)>& fn, const std::vector<Array>& inputs,
    const std::vector<int>& axes, const char* op);

}  // namespace tessera::rules

namespace tessera::rules {

// Cotangents with the missing ones (invalid Arrays: outputs that received no
// gradient) replaced by zeros of the matching output.
std::vector<Array> with_zero_cotangents(const std::vector<Array>& cotangents, const std::vector<Array>& outputs);

}  // namespace tessera::rules
