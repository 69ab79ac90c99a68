// Internal: the two paths of the attention backward (flash_attention_backward.cu picks
// one). Each launches its dK/dV and dQ kernels on `stream`; p.delta must already hold
// delta (the delta kernel ran first on the same stream).
#pragma once

#include <cuda_runtime_api.h>

#include "backend/cuda/kernels/flash_attention_common.cuh"
#include "tessera/base/dtype.h"

namespace tessera::cuda::flash {

// bf16/f16 tensor cores, D = 64 or 128, 16-byte aligned operands.
void launch_backward_tensor_core(DType dtype, const Params& p, cudaStream_t stream);
// fp32 CUDA cores: any dtype, D <= 256, masks.
void launch_backward_generic(DType dtype, const Params& p, cudaStream_t stream);

}  // namespace tessera::cuda::flash
