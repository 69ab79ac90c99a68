// ordered_sum: dst[i] = ((src[i] + src[stride + i]) + src[2 stride + i]) + ... over
// `members` blocks — the sum the SPMD collectives reduce with (spmd/collective_plan.h),
// in group order and rounded as the CPU's add_into rounds: 16-bit floats back to 16 bits
// after every addition, integers wrapping, float32/float64 in their own precision, so a
// reduction on the GPU is bitwise the CPU communicators'.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "tessera/base/dtype.h"

namespace tessera::cuda {

// float32, float64, bfloat16, float16, int32, int64; src and dst must not overlap.
void ordered_sum(const void* src, int members, size_t stride, size_t count, DType dtype, void* dst,
                 cudaStream_t stream);

}  // namespace tessera::cuda
