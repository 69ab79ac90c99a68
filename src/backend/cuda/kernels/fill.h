// fill: sets n elements of a device buffer of any dtype to one value (zero-initialised
// accumulators, masks, constants created on the device).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tessera/base/dtype.h"

namespace tessera::cuda {

// The value is converted to `dtype` with the host's rules (base/dtype.h), then copied.
void fill(void* dst, DType dtype, double value, int64_t n, cudaStream_t stream);

}  // namespace tessera::cuda
