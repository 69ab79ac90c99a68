#include <string>
#include <type_traits>

#include "backend/cuda/kernels/cuda_check.h"
#include "backend/cuda/kernels/launch_config.h"
#include "backend/cuda/kernels/ordered_sum.h"
#include "backend/cuda/kernels/reduce_element.cuh"

namespace tessera::cuda {

namespace {

using reduce_element::Acc;
using reduce_element::load;
using reduce_element::store;

// a + b in T's own arithmetic: 16-bit floats add in float and round back to 16 bits,
// integers wrap modulo 2^bits (summed unsigned in the int64 accumulator; the store
// keeps the low bits, the same residue as wrapping at every addition).
template <typename T>
__device__ __forceinline__ Acc<T> add(Acc<T> a, Acc<T> b) {
  if constexpr (std::is_integral_v<Acc<T>>) {
    return static_cast<Acc<T>>(static_cast<unsigned long long>(a) + static_cast<unsigned long long>(b));
  } else if constexpr (std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>) {
    unsigned short bits = 0;
    store(reinterpret_cast<T*>(&bits), 0, a + b);
    return load(reinterpret_cast<const T*>(&bits), 0);
  } else {
    return a + b;
  }
}

template <typename T>
__global__ void ordered_sum_kernel(const T* src, int members, int64_t stride, int64_t count, T* dst) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += step) {
    Acc<T> acc = load(src, i);
    for (int k = 1; k < members; ++k) acc = add<T>(acc, load(src + k * stride, i));
    store(dst, i, acc);
  }
}

template <typename T>
void launch(const void* src, int members, size_t stride, size_t count, void* dst, cudaStream_t stream) {
  const auto n = static_cast<int64_t>(count);
  ordered_sum_kernel<T><<<grid_for(n), kThreadsPerBlock, 0, stream>>>(
      static_cast<const T*>(src), members, static_cast<int64_t>(stride), n, static_cast<T*>(dst));
  TESSERA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void ordered_sum(const void* src, int members, size_t stride, size_t count, DType dtype, void* dst,
                 cudaStream_t stream) {
  if (count == 0 || members <= 0) return;
  switch (dtype) {
    case DType::Float32:
      return launch<float>(src, members, stride, count, dst, stream);
    case DType::Float64:
      return launch<double>(src, members, stride, count, dst, stream);
    case DType::BFloat16:
      return launch<bfloat16>(src, members, stride, count, dst, stream);
    case DType::Float16:
      return launch<float16>(src, members, stride, count, dst, stream);
    case DType::Int32:
      return launch<int32_t>(src, members, stride, count, dst, stream);
    case DType::Int64:
      return launch<int64_t>(src, members, stride, count, dst, stream);
    default:
      throw_dtype_error("ordered_sum: cannot sum " + std::string(name(dtype)) +
                        " values (expected float32, float64, bfloat16, float16, int32 or int64)");
  }
}

}  // namespace tessera::cuda
