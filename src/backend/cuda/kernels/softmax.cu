// Row softmax / log-softmax kernels (see softmax.h).
#include <string>
#include <type_traits>

#include "backend/cuda/kernels/row_common.cuh"
#include "backend/cuda/kernels/softmax.h"

namespace tessera::cuda {
namespace {

using rows::Acc;

template <typename T, int V>
__global__ void softmax_forward_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n_rows, int64_t cols,
                                       bool log) {
  using A = Acc<T>;
  __shared__ A red_m[33], red_s[33];
  for (int64_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
    const T* xr = x + r * cols;
    T* yr = y + r * cols;
    rows::MaxSum<A> st = rows::maxsum_init<A>();
    rows::row_segments<V>(xr, cols, [&](int64_t j, auto width) {
      constexpr int W = decltype(width)::value;
      A xv[W];
      rows::load_vec<W>(xr + j, xv);
#pragma unroll
      for (int k = 0; k < W; ++k) rows::maxsum_add(st, xv[k]);
    });
    st = rows::block_maxsum(st, red_m, red_s);
    const A m = st.m;
    const A log_s = rows::log_(st.s);
    const A inv_s = A(1) / st.s;
    rows::row_segments<V>(xr, cols, [&](int64_t j, auto width) {
      constexpr int W = decltype(width)::value;
      A xv[W], out[W];
      rows::load_vec<W>(xr + j, xv);
#pragma unroll
      for (int k = 0; k < W; ++k) out[k] = log ? (xv[k] - m) - log_s : rows::exp_(xv[k] - m) * inv_s;
      rows::store_vec<W>(yr + j, out);
    });
  }
}

template <typename T, int V>
__global__ void softmax_backward_kernel(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx,
                                        int64_t n_rows, int64_t cols, bool log) {
  using A = Acc<T>;
  __shared__ A red[33];
  for (int64_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
    const T* yr = y + r * cols;
    const T* dyr = dy + r * cols;
    T* dxr = dx + r * cols;
    A s = 0;
    rows::row_segments<V>(yr, cols, [&](int64_t j, auto width) {
      constexpr int W = decltype(width)::value;
      A yv[W], dv[W];
      rows::load_vec<W>(dyr + j, dv);
      if (log) {
#pragma unroll
        for (int k = 0; k < W; ++k) s += dv[k];
      } else {
        rows::load_vec<W>(yr + j, yv);
#pragma unroll
        for (int k = 0; k < W; ++k) s += dv[k] * yv[k];
      }
    });
    s = rows::block_sum(s, red);
    rows::row_segments<V>(yr, cols, [&](int64_t j, auto width) {
      constexpr int W = decltype(width)::value;
      A yv[W], dv[W], out[W];
      rows::load_vec<W>(yr + j, yv);
      rows::load_vec<W>(dyr + j, dv);
#pragma unroll
      for (int k = 0; k < W; ++k) out[k] = log ? dv[k] - rows::exp_(yv[k]) * s : yv[k] * (dv[k] - s);
      rows::store_vec<W>(dxr + j, out);
    });
  }
}

void check_rows(const char* op, int64_t n_rows, int64_t cols) {
  if (n_rows < 0 || cols < 0)
    throw_value_error(std::string(op) + ": negative size (got rows=" + std::to_string(n_rows) +
                      ", cols=" + std::to_string(cols) + "; expected >= 0)");
}

template <typename T, typename Launch>
void launch_rows(int64_t n_rows, int64_t cols, bool vec, Launch&& launch) {
  const int64_t units = vec ? (cols + rows::kVec<T> - 1) / rows::kVec<T> : cols;
  const int threads = rows::block_threads(units, 512);
  const unsigned blocks = rows::row_blocks(n_rows);
  if (vec) {
    launch(std::integral_constant<int, rows::kVec<T>>{}, blocks, threads);
  } else {
    launch(std::integral_constant<int, 1>{}, blocks, threads);
  }
  TESSERA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void softmax_forward(DType dtype, const void* x, void* y, int64_t n_rows, int64_t cols, bool log, cudaStream_t stream) {
  check_rows("softmax", n_rows, cols);
  if (n_rows == 0 || cols == 0) return;
  rows::dispatch_float(dtype, "softmax", [&](auto tag) {
    using T = decltype(tag);
    launch_rows<T>(n_rows, cols, rows::congruent16(x, y), [&](auto v, unsigned blocks, int threads) {
      softmax_forward_kernel<T, decltype(v)::value>
          <<<blocks, threads, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(y), n_rows, cols, log);
    });
  });
}

void softmax_backward(DType dtype, const void* y, const void* dy, void* dx, int64_t n_rows, int64_t cols, bool log,
                      cudaStream_t stream) {
  check_rows("softmax_backward", n_rows, cols);
  if (n_rows == 0 || cols == 0) return;
  rows::dispatch_float(dtype, "softmax_backward", [&](auto tag) {
    using T = decltype(tag);
    const bool vec = rows::congruent16(y, dy) && rows::congruent16(y, dx);
    launch_rows<T>(n_rows, cols, vec, [&](auto v, unsigned blocks, int threads) {
      softmax_backward_kernel<T, decltype(v)::value><<<blocks, threads, 0, stream>>>(
          static_cast<const T*>(y), static_cast<const T*>(dy), static_cast<T*>(dx), n_rows, cols, log);
    });
  });
}

}  // namespace tessera::cuda
