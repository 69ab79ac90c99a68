// TESSERA_ATTENTION_KERNEL (flash_attention.h): which tensor-core attention kernels run
// ("auto" and "cudnn" run cuDNN where it applies, cudnn_attention.h, and v2 elsewhere).
#include <cstring>
#include <string>

#include "backend/cuda/kernels/cuda_check.h"
#include "backend/cuda/kernels/flash_attention.h"
#include "tessera/base/flags.h"

namespace tessera::cuda {

FlashAttentionKernel flash_attention_kernel() {
  const char* v = flags::env("TESSERA_ATTENTION_KERNEL");
  if (v == nullptr || *v == '\0' || std::strcmp(v, "v2") == 0 || std::strcmp(v, "cudnn") == 0 ||
      std::strcmp(v, "auto") == 0)
    return FlashAttentionKernel::V2;
  if (std::strcmp(v, "v1") == 0) return FlashAttentionKernel::V1;
  throw_value_error("TESSERA_ATTENTION_KERNEL: expected auto, cudnn, v2 or v1, got '" + std::string(v) + "'");
}

}  // namespace tessera::cuda
