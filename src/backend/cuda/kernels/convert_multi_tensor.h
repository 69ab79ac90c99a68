// Many float32 tensors converted to bfloat16 or float16 in a few launches: the bf16 /
// f16 copies of a model's float32 weights that a mixed-precision step makes first (the
// schedule puts them together, the CUDA executable hands the run here). Bitwise the
// results of the convert kernel (round to nearest even; a NaN stays a quiet NaN).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "tessera/base/dtype.h"

namespace tessera::cuda {

struct ConvertTensor {
  const void* src = nullptr;
  void* dst = nullptr;
  int64_t n = 0;
};

// True when the pair is supported (from float32 to bfloat16 or float16): every tensor is
// converted, tensors cut into chunks of 64K elements, one block per chunk, up to 48
// tensors and 400 chunks per launch (multi_tensor_apply style). False, launching
// nothing, for any other pair. dst must not overlap src.
bool convert_multi_tensor(DType from, DType to, const std::vector<ConvertTensor>& tensors, cudaStream_t stream);

}  // namespace tessera::cuda
