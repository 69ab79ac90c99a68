// Cross-entropy kernels (see cross_entropy.h).
#include <string>
#include <type_traits>

#include "backend/cuda/kernels/cross_entropy.h"
#include "backend/cuda/kernels/row_common.cuh"

namespace tessera::cuda {
namespace {

using rows::Acc;

template <typename T, int V>
__global__ void cross_entropy_forward_kernel(const T* __restrict__ logits, const int64_t* __restrict__ targets,
                                             int64_t n_rows, int64_t stride, int64_t vocab, int64_t ignore_index,
                                             Acc<T>* __restrict__ loss, Acc<T>* __restrict__ lse) {
  using A = Acc<T>;
  __shared__ A red_m[33], red_s[33];
  for (int64_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
    const T* xr = logits + r * stride;
    rows::MaxSum<A> st = rows::maxsum_init<A>();
    rows::row_segments<V>(xr, vocab, [&](int64_t j, auto width) {
      constexpr int W = decltype(width)::value;
      A xv[W];
      rows::load_vec<W>(xr + j, xv);
#pragma unroll
      for (int k = 0; k < W; ++k) rows::maxsum_add(st, xv[k]);
    });
    st = rows::block_maxsum(st, red_m, red_s);
    if (threadIdx.x == 0) {
      const A log_s = rows::log_(st.s);
      const int64_t t = targets[r];
      if (lse != nullptr) lse[r] = st.m + log_s;
      if (t == ignore_index) {
        loss[r] = A(0);
      } else if (t < 0 || t >= vocab) {
        loss[r] = rows::quiet_nan<A>();  // the CPU throws; see the header
      } else {
        loss[r] = (st.m - rows::to_acc<A>(xr[t])) + log_s;
      }
    }
  }
}

template <typename T, int V>
__global__ void cross_entropy_backward_kernel(const T* __restrict__ logits, const int64_t* __restrict__ targets,
                                              const Acc<T>* __restrict__ lse, const Acc<T>* __restrict__ dloss,
                                              T* __restrict__ dlogits, int64_t n_rows, int64_t stride, int64_t vocab,
                                              int64_t ignore_index) {
  using A = Acc<T>;
  for (int64_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
    const T* xr = logits + r * stride;
    T* out = dlogits + r * stride;
    const int64_t t = targets[r];
    const bool ignored = t == ignore_index;
    const bool bad = !ignored && (t < 0 || t >= vocab);
    const A d = dloss[r];
    const A shift = lse[r];
    // The whole row is written: the padding columns [vocab, stride) get 0.
    rows::row_segments<V>(xr, stride, [&](int64_t j, auto width) {
      constexpr int W = decltype(width)::value;
      A v[W];
      if (ignored || j >= vocab) {
#pragma unroll
        for (int k = 0; k < W; ++k) v[k] = A(0);
      } else if (bad) {
#pragma unroll
        for (int k = 0; k < W; ++k) v[k] = rows::quiet_nan<A>();
      } else {
        rows::load_vec<W>(xr + j, v);
#pragma unroll
        for (int k = 0; k < W; ++k) {
          v[k] = j + k < vocab ? d * rows::exp_(v[k] - shift) : A(0);
          if (j + k == t) v[k] -= d;
        }
      }
      rows::store_vec<W>(out + j, v);
    });
  }
}

// Both in one kernel (the fused classifier): per row the forward's online max / sum,
// then the backward's write of dlogits with the lse just found. The second read of the
// row comes from L2: the launcher caps the grid so that the rows in flight fit in it.
// dlogits may be the logits (in place): every thread of the block is past the first
// read (block_maxsum's barriers) before any thread writes.
template <typename T, int V>
__global__ void cross_entropy_with_grad_kernel(const T* logits, const int64_t* __restrict__ targets,
                                               const Acc<T>* __restrict__ dloss, int64_t n_rows, int64_t stride,
                                               int64_t vocab, int64_t ignore_index, Acc<T>* __restrict__ loss,
                                               Acc<T>* __restrict__ lse, T* dlogits) {
  using A = Acc<T>;
  __shared__ A red_m[33], red_s[33];
  for (int64_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
    const T* xr = logits + r * stride;
    T* out = dlogits + r * stride;
    rows::MaxSum<A> st = rows::maxsum_init<A>();
    rows::row_segments<V>(xr, vocab, [&](int64_t j, auto width) {
      constexpr int W = decltype(width)::value;
      A xv[W];
      rows::load_vec<W>(xr + j, xv);
#pragma unroll
      for (int k = 0; k < W; ++k) rows::maxsum_add(st, xv[k]);
    });
    st = rows::block_maxsum(st, red_m, red_s);
    const A log_s = rows::log_(st.s);
    const A shift = st.m + log_s;
    const int64_t t = targets[r];
    const bool ignored = t == ignore_index;
    const bool bad = !ignored && (t < 0 || t >= vocab);
    if (threadIdx.x == 0) {
      lse[r] = shift;
      // The target logit before the row is overwritten (thread 0 is past the barrier
      // only after every thread's first pass, and writes nothing before reading it).
      loss[r] = ignored ? A(0) : bad ? rows::quiet_nan<A>() : (st.m - rows::to_acc<A>(xr[t])) + log_s;
    }
    __syncthreads();  // thread 0 has read xr[t] before anyone overwrites it
    const A d = dloss[r];
    rows::row_segments<V>(xr, stride, [&](int64_t j, auto width) {
      constexpr int W = decltype(width)::value;
      A v[W];
      if (ignored || j >= vocab) {
#pragma unroll
        for (int k = 0; k < W; ++k) v[k] = A(0);
      } else if (bad) {
#pragma unroll
        for (int k = 0; k < W; ++k) v[k] = rows::quiet_nan<A>();
      } else {
        rows::load_vec<W>(xr + j, v);
#pragma unroll
        for (int k = 0; k < W; ++k) {
          v[k] = j + k < vocab ? d * rows::exp_(v[k] - shift) : A(0);
          if (j + k == t) v[k] -= d;
        }
      }
      rows::store_vec<W>(out + j, v);
    });
  }
}

void check_sizes(const char* op, int64_t n_rows, int64_t stride, int64_t vocab, const int64_t* targets) {
  if (n_rows < 0 || vocab < 0)
    throw_value_error(std::string(op) + ": negative size (got rows=" + std::to_string(n_rows) +
                      ", vocab=" + std::to_string(vocab) + "; expected >= 0)");
  if (vocab > stride)
    throw_value_error(std::string(op) + ": " + std::to_string(vocab) + " classes in rows of " + std::to_string(stride) +
                      " logits (expected classes <= the row length)");
  if (n_rows > 0 && targets == nullptr) throw_value_error(std::string(op) + ": targets buffer is null");
}

template <typename T, typename Launch>
void launch_rows(int64_t n_rows, int64_t vocab, bool vec, Launch&& launch) {
  const int64_t units = vec ? (vocab + rows::kVec<T> - 1) / rows::kVec<T> : vocab;
  const int threads = rows::block_threads(units, 512);
  const unsigned blocks = rows::row_blocks(n_rows);
  if (vec) {
    launch(std::integral_constant<int, rows::kVec<T>>{}, blocks, threads);
  } else {
    launch(std::integral_constant<int, 1>{}, blocks, threads);
  }
  TESSERA_CUDA_CHECK(cudaGetLastError());
}

// Blocks of the fused kernel: 2 of 1024 threads per SM, so the rows in flight (264 on
// an H100, 26 MB of GPT-2's bf16 logits) stay well inside L2 for the second read.
unsigned fused_blocks(int64_t n_rows) {
  int device = 0, sms = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&device));
  TESSERA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t cap = 2 * static_cast<int64_t>(sms > 0 ? sms : 1);
  return static_cast<unsigned>(n_rows < cap ? (n_rows < 1 ? 1 : n_rows) : cap);
}

}  // namespace

void cross_entropy_with_grad(DType dtype, const void* logits, const int64_t* targets, const void* dloss,
                             int64_t n_rows, int64_t stride, int64_t vocab, int64_t ignore_index, void* loss,
                             void* lse, void* dlogits, cudaStream_t stream) {
  check_sizes("cross_entropy_with_grad", n_rows, stride, vocab, targets);
  if (n_rows == 0) return;
  if (loss == nullptr || lse == nullptr || dloss == nullptr || (stride > 0 && dlogits == nullptr))
    throw_value_error("cross_entropy_with_grad: a loss, lse, dloss or dlogits buffer is null");
  rows::dispatch_float(dtype, "cross_entropy_with_grad", [&](auto tag) {
    using T = decltype(tag);
    using A = Acc<T>;
    const bool vec = rows::congruent16(logits, dlogits);
    const int64_t units = vec ? (stride + rows::kVec<T> - 1) / rows::kVec<T> : stride;
    const int threads = rows::block_threads(units, 1024);
    const unsigned blocks = fused_blocks(n_rows);
    auto launch = [&](auto kernel) {
      kernel<<<blocks, threads, 0, stream>>>(static_cast<const T*>(logits), targets, static_cast<const A*>(dloss),
                                             n_rows, stride, vocab, ignore_index, static_cast<A*>(loss),
                                             static_cast<A*>(lse), static_cast<T*>(dlogits));
    };
    if (vec) {
      launch(cross_entropy_with_grad_kernel<T, rows::kVec<T>>);
    } else {
      launch(cross_entropy_with_grad_kernel<T, 1>);
    }
    TESSERA_CUDA_CHECK(cudaGetLastError());
  });
}

void cross_entropy_forward(DType dtype, const void* logits, const int64_t* targets, int64_t n_rows, int64_t stride,
                           int64_t vocab, int64_t ignore_index, void* loss, void* lse, cudaStream_t stream) {
  check_sizes("cross_entropy", n_rows, stride, vocab, targets);
  if (n_rows == 0) return;
  if (loss == nullptr) throw_value_error("cross_entropy: loss buffer is null");
  rows::dispatch_float(dtype, "cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    using A = Acc<T>;
    launch_rows<T>(n_rows, vocab, true, [&](auto v, unsigned blocks, int threads) {
      cross_entropy_forward_kernel<T, decltype(v)::value>
          <<<blocks, threads, 0, stream>>>(static_cast<const T*>(logits), targets, n_rows, stride, vocab, ignore_index,
                                           static_cast<A*>(loss), static_cast<A*>(lse));
    });
  });
}

void cross_entropy_backward(DType dtype, const void* logits, const int64_t* targets, const void* lse, const void* dloss,
                            void* dlogits, int64_t n_rows, int64_t stride, int64_t vocab, int64_t ignore_index,
                            cudaStream_t stream) {
  check_sizes("cross_entropy_backward", n_rows, stride, vocab, targets);
  if (n_rows == 0 || stride == 0) return;
  if (lse == nullptr || dloss == nullptr) throw_value_error("cross_entropy_backward: lse and dloss must not be null");
  rows::dispatch_float(dtype, "cross_entropy_backward", [&](auto tag) {
    using T = decltype(tag);
    using A = Acc<T>;
    launch_rows<T>(n_rows, stride, rows::congruent16(logits, dlogits), [&](auto v, unsigned blocks, int threads) {
      cross_entropy_backward_kernel<T, decltype(v)::value><<<blocks, threads, 0, stream>>>(
          static_cast<const T*>(logits), targets, static_cast<const A*>(lse), static_cast<const A*>(dloss),
          static_cast<T*>(dlogits), n_rows, stride, vocab, ignore_index);
    });
  });
}

}  // namespace tessera::cuda
