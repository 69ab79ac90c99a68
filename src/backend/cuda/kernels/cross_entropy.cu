// Cross-entropy kernels (see cross_entropy.h).
#include <cstring>
#include <string>
#include <type_traits>

#include "backend/cuda/kernels/cross_entropy.h"
#include "backend/cuda/kernels/cuda_check.h"
#include "backend/cuda/kernels/row_common.cuh"
#include "tessera/base/flags.h"

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

// Forward and backward in one pass over HBM (cross_entropy_with_grad): each block
// stages its row in shared memory while it computes the row's statistics, then writes
// the gradient from there, so the logits are read once instead of twice. Every row
// starts on a 16-byte boundary (the launcher checks), so the vector part has no head;
// the statistics are the forward kernel's, element for element (the same threads, the
// same per-thread order, the same block reduction), and the gradient the backward's:
// the results are bitwise those of the two kernels. Four vectors are loaded before
// they are folded in, so each thread keeps 64 bytes in flight.
template <typename T>
__global__ void cross_entropy_fused_kernel(const T* logits, const int64_t* __restrict__ targets,
                                           const Acc<T>* __restrict__ dloss, T* dlogits, int64_t n_rows, int64_t stride,
                                           int64_t vocab, int64_t ignore_index, Acc<T>* __restrict__ loss,
                                           Acc<T>* __restrict__ lse) {
  using A = Acc<T>;
  constexpr int V = rows::kVec<T>;
  constexpr int kUnroll = 4;
  using P = rows::Pack<T, V>;
  extern __shared__ __align__(16) unsigned char staged_bytes[];
  T* staged = reinterpret_cast<T*>(staged_bytes);
  __shared__ A red_m[33], red_s[33];
  const int64_t nvec = vocab / V;
  for (int64_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
    const T* xr = logits + r * stride;
    rows::MaxSum<A> st = rows::maxsum_init<A>();
    for (int64_t v0 = threadIdx.x; v0 < nvec; v0 += kUnroll * blockDim.x) {
      P pk[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t v = v0 + static_cast<int64_t>(u) * blockDim.x;
        if (v < nvec) pk[u] = reinterpret_cast<const P*>(xr)[v];
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t v = v0 + static_cast<int64_t>(u) * blockDim.x;
        if (v < nvec) {
          reinterpret_cast<P*>(staged)[v] = pk[u];
#pragma unroll
          for (int k = 0; k < V; ++k) rows::maxsum_add(st, rows::to_acc<A>(pk[u].v[k]));
        }
      }
    }
    for (int64_t j = nvec * V + threadIdx.x; j < vocab; j += blockDim.x) {
      const T x = xr[j];
      staged[j] = x;
      rows::maxsum_add(st, rows::to_acc<A>(x));
    }
    st = rows::block_maxsum(st, red_m, red_s);  // its barriers also publish `staged`
    const A log_s = rows::log_(st.s);
    const A shift = st.m + log_s;
    const int64_t t = targets[r];
    const bool ignored = t == ignore_index;
    const bool bad = !ignored && (t < 0 || t >= vocab);
    if (threadIdx.x == 0) {
      if (lse != nullptr) lse[r] = shift;
      loss[r] = ignored ? A(0) : bad ? rows::quiet_nan<A>() : (st.m - rows::to_acc<A>(staged[t])) + log_s;
    }
    const A d = dloss[r];
    T* out = dlogits + r * stride;
    // The whole row is written: the padding columns [vocab, stride) get 0.
    rows::row_segments<V>(out, stride, [&](int64_t j, auto width) {
      constexpr int W = decltype(width)::value;
      A x[W];
      if (ignored || j >= vocab) {
#pragma unroll
        for (int k = 0; k < W; ++k) x[k] = A(0);
      } else if (bad) {
#pragma unroll
        for (int k = 0; k < W; ++k) x[k] = rows::quiet_nan<A>();
      } else {
        rows::load_vec<W>(staged + j, x);
#pragma unroll
        for (int k = 0; k < W; ++k) {
          x[k] = j + k < vocab ? d * rows::exp_(x[k] - shift) : A(0);
          if (j + k == t) x[k] -= d;
        }
      }
      rows::store_vec<W>(out + j, x);
    });
    __syncthreads();  // the next row overwrites `staged`
  }
}

// Shared memory for the fused kernel's staged row, or 0 when it does not apply: rows
// not 16-byte aligned, TESSERA_CROSS_ENTROPY_KERNEL=two_pass, or a row too long for two
// blocks per SM (GPT-2's 50304 bf16 logits take 98 KiB: two fit on an H100's 228 KiB,
// not on an A100's 164, which keeps the two kernels).
size_t fused_smem_bytes(size_t item, const void* logits, const void* dlogits, int64_t stride) {
  const char* flag = flags::env("TESSERA_CROSS_ENTROPY_KERNEL");
  if (flag != nullptr && *flag != '\0' && std::strcmp(flag, "fused") != 0) {
    if (std::strcmp(flag, "two_pass") == 0) return 0;
    throw_value_error("TESSERA_CROSS_ENTROPY_KERNEL: expected fused or two_pass, got '" + std::string(flag) + "'");
  }
  const size_t bytes = item * static_cast<size_t>(stride);
  if (!rows::aligned16(logits) || !rows::aligned16(dlogits) || bytes % 16 != 0 || bytes == 0) return 0;
  int device = 0, per_sm = 0, per_block = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&device));
  TESSERA_CUDA_CHECK(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
  TESSERA_CUDA_CHECK(cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  constexpr size_t kReservedPerBlock = 2048;  // the runtime's 1 KiB and the kernel's static arrays
  if (bytes > static_cast<size_t>(per_block) || 2 * (bytes + kReservedPerBlock) > static_cast<size_t>(per_sm)) return 0;
  return bytes;
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
  // One kernel that stages each row in shared memory (cross_entropy_fused_kernel) where
  // the row fits twice per SM; else the forward and backward kernels one after the
  // other: the backward may then write over the logits (each element is read before it
  // is overwritten, by the same thread). A single kernel that re-read each row from L2
  // (grid capped at 2 blocks per SM so the rows in flight fit) measured 2.55 ms against
  // the two kernels' 2.11 for GPT-2 124M's [16384, 50304] bf16 logits on an H100
  // (2026-11-26).
  if (n_rows > 0 && (dloss == nullptr || dlogits == nullptr))
    throw_value_error("cross_entropy_with_grad: the dloss or dlogits buffer is null");
  check_sizes("cross_entropy_with_grad", n_rows, stride, vocab, targets);
  if (n_rows == 0) return;
  if (loss == nullptr) throw_value_error("cross_entropy_with_grad: loss buffer is null");
  bool fused = false;
  rows::dispatch_float(dtype, "cross_entropy_with_grad", [&](auto tag) {
    using T = decltype(tag);
    using A = Acc<T>;
    const size_t smem = fused_smem_bytes(sizeof(T), logits, dlogits, stride);
    if (smem == 0) return;
    auto* kernel = cross_entropy_fused_kernel<T>;
    if (smem > 48 * 1024)
      TESSERA_CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    // All of the SM's unified L1 as shared memory: the driver's own split left room for
    // one 98 KiB block per H100 SM (25% occupancy; 2.95 ms against the two kernels' 2.07).
    TESSERA_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
    const int threads = rows::block_threads((vocab + rows::kVec<T> - 1) / rows::kVec<T>, 512);
    kernel<<<rows::row_blocks(n_rows), threads, smem, stream>>>(
        static_cast<const T*>(logits), targets, static_cast<const A*>(dloss), static_cast<T*>(dlogits), n_rows, stride,
        vocab, ignore_index, static_cast<A*>(loss), static_cast<A*>(lse));
    TESSERA_CUDA_CHECK(cudaGetLastError());
    fused = true;
  });
  if (fused) return;
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
