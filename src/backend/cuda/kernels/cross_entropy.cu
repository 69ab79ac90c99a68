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

// logits and dlogits may be one buffer (cross_entropy_with_grad): not __restrict__.
template <typename T, int V>
__global__ void cross_entropy_backward_kernel(const T* logits, const int64_t* __restrict__ targets,
                                              const Acc<T>* __restrict__ lse, const Acc<T>* __restrict__ dloss,
                                              T* dlogits, int64_t n_rows, int64_t stride, int64_t vocab,
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

}  // namespace

void cross_entropy_with_grad(DType dtype, const void* logits, const int64_t* targets, const void* dloss, int64_t n_rows,
                             int64_t stride, int64_t vocab, int64_t ignore_index, void* loss, void* lse, void* dlogits,
                             cudaStream_t stream) {
  // The forward and backward kernels one after the other: the backward may then write
  // over the logits (each element is read before it is overwritten, by the same thread).
  // A single kernel that re-read each row from L2 (grid capped at 2 blocks per SM so the
  // rows in flight fit) measured 2.55 ms against these two's 2.11 for GPT-2 124M's
  // [16384, 50304] bf16 logits on an H100 (2026-11-26), and one that staged each row in
  // shared memory (read once; 512 threads, 4 vectors in flight each) 2.98 ms against 2.07
  // (2026-11-28, with the whole L1 as shared memory or not), so the gain here is the memory.
  if (n_rows > 0 && (dloss == nullptr || dlogits == nullptr))
    throw_value_error("cross_entropy_with_grad: the dloss or dlogits buffer is null");
  cross_entropy_forward(dtype, logits, targets, n_rows, stride, vocab, ignore_index, loss, lse, stream);
  cross_entropy_backward(dtype, logits, targets, lse, dloss, dlogits, n_rows, stride, vocab, ignore_index, stream);
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
