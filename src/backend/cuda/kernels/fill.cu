#include <cstring>
#include <string>

#include "backend/cuda/kernels/cuda_check.h"
#include "backend/cuda/kernels/fill.h"
#include "backend/cuda/kernels/launch_config.h"

namespace tessera::cuda {

namespace {

template <typename T>
__global__ void fill_kernel(T* dst, T value, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) dst[i] = value;
}

template <typename T>
void launch(void* dst, const unsigned char* bits, int64_t n, cudaStream_t stream) {
  T value;
  std::memcpy(&value, bits, sizeof(T));
  fill_kernel<T><<<grid_for(n), kThreadsPerBlock, 0, stream>>>(static_cast<T*>(dst), value, n);
  TESSERA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void fill(void* dst, DType dtype, double value, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  unsigned char bits[8] = {};
  store_from_double(dtype, bits, 0, value);
  switch (itemsize(dtype)) {
    case 1:
      launch<uint8_t>(dst, bits, n, stream);
      break;
    case 2:
      launch<uint16_t>(dst, bits, n, stream);
      break;
    case 4:
      launch<uint32_t>(dst, bits, n, stream);
      break;
    case 8:
      launch<uint64_t>(dst, bits, n, stream);
      break;
    default:
      throw_dtype_error("fill: unsupported element size of " + std::string(name(dtype)));
  }
}

}  // namespace tessera::cuda
