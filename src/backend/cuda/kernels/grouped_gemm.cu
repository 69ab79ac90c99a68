// Grouped GEMM kernels (see grouped_gemm.h).
#include "backend/cuda/kernels/cuda_check.h"
#include "backend/cuda/kernels/grouped_gemm.h"
#include "backend/cuda/kernels/launch_config.h"
#include "backend/cuda/kernels/reduce_element.cuh"

namespace tessera::cuda {
namespace {

using reduce_element::Acc;
using reduce_element::load;
using reduce_element::store;

template <typename S>
__device__ __forceinline__ int64_t group_size(const S* sizes, int64_t i) {
  const int64_t n = static_cast<int64_t>(sizes[i]);
  return n > 0 ? n : 0;
}

template <typename T, typename S>
__global__ void grouped_gemm_kernel(const T* __restrict__ a, const T* __restrict__ w, const S* __restrict__ sizes,
                                    T* __restrict__ out, int64_t batches, int64_t rows, int64_t k, int64_t m,
                                    int64_t groups, bool trans_w) {
  const int64_t total = batches * rows * m;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t col = i % m, row = (i / m) % rows, g = i / (m * rows);
    int64_t e = 0, end = 0;
    for (; e < groups; ++e) {
      end += group_size(sizes, g * groups + e);
      if (row < end) break;
    }
    Acc<T> acc = 0;
    if (e < groups) {
      const T* a_row = a + (g * rows + row) * k;
      const T* w_e = w + e * k * m;
      for (int64_t j = 0; j < k; ++j) acc += load(a_row, j) * load(w_e, trans_w ? col * k + j : j * m + col);
    }
    store(out, i, acc);
  }
}

template <typename T, typename S>
__global__ void grouped_gemm_weight_grad_kernel(const T* __restrict__ x, const T* __restrict__ y,
                                                const S* __restrict__ sizes, T* __restrict__ out, int64_t batches,
                                                int64_t rows, int64_t k, int64_t m, int64_t groups, bool trans_out) {
  const int64_t total = groups * k * m;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    // out[e, p, q]: [k, m] (p over x's columns) or [m, k] (trans_out: p over y's).
    const int64_t q = i % (trans_out ? k : m), p = (i / (trans_out ? k : m)) % (trans_out ? m : k);
    const int64_t e = i / (k * m);
    const int64_t xc = trans_out ? q : p, yc = trans_out ? p : q;
    Acc<T> acc = 0;
    for (int64_t g = 0; g < batches; ++g) {
      int64_t begin = 0;
      for (int64_t f = 0; f < e; ++f) begin += group_size(sizes, g * groups + f);
      int64_t end = begin + group_size(sizes, g * groups + e);
      if (end > rows) end = rows;
      for (int64_t n = begin; n < end; ++n) acc += load(x, (g * rows + n) * k + xc) * load(y, (g * rows + n) * m + yc);
    }
    store(out, i, acc);
  }
}

template <typename F>
void dispatch(const char* op, DType dtype, DType sizes_dtype, F&& launch) {
  if (sizes_dtype != DType::Int32 && sizes_dtype != DType::Int64)
    value_error(op, ": group sizes of dtype ", name(sizes_dtype), " (expected int32 or int64)");
  auto with_sizes = [&](auto ttag) {
    if (sizes_dtype == DType::Int32)
      launch(ttag, int32_t{});
    else
      launch(ttag, int64_t{});
  };
  switch (dtype) {
    case DType::Float32:
      return with_sizes(float{});
    case DType::Float64:
      return with_sizes(double{});
    case DType::BFloat16:
      return with_sizes(bfloat16{});
    case DType::Float16:
      return with_sizes(float16{});
    default:
      value_error(op, ": ", name(dtype), " operands (expected float32, float64, bfloat16 or float16)");
  }
}

}  // namespace

void grouped_gemm(DType dtype, const void* a, const void* w, const void* sizes, DType sizes_dtype, int64_t batches,
                  int64_t rows, int64_t k, int64_t m, int64_t groups, bool trans_w, void* out, cudaStream_t stream) {
  const int64_t total = batches * rows * m;
  if (total == 0) return;
  dispatch("grouped_matmul", dtype, sizes_dtype, [&](auto ttag, auto stag) {
    using T = decltype(ttag);
    using S = decltype(stag);
    grouped_gemm_kernel<T, S><<<grid_for(total), kThreadsPerBlock, 0, stream>>>(
        static_cast<const T*>(a), static_cast<const T*>(w), static_cast<const S*>(sizes), static_cast<T*>(out), batches,
        rows, k, m, groups, trans_w);
    TESSERA_CUDA_CHECK(cudaGetLastError());
  });
}

void grouped_gemm_weight_grad(DType dtype, const void* x, const void* y, const void* sizes, DType sizes_dtype,
                              int64_t batches, int64_t rows, int64_t k, int64_t m, int64_t groups, bool trans_out,
                              void* out, cudaStream_t stream) {
  const int64_t total = groups * k * m;
  if (total == 0) return;
  dispatch("grouped_matmul_weight_grad", dtype, sizes_dtype, [&](auto ttag, auto stag) {
    using T = decltype(ttag);
    using S = decltype(stag);
    grouped_gemm_weight_grad_kernel<T, S><<<grid_for(total), kThreadsPerBlock, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(y), static_cast<const S*>(sizes), static_cast<T*>(out), batches,
        rows, k, m, groups, trans_out);
    TESSERA_CUDA_CHECK(cudaGetLastError());
  });
}

}  // namespace tessera::cuda
