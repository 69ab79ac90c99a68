// Row softmax / log-softmax, forward and backward.
//
//   softmax:     y_j = exp(x_j - m) / s,          m = max_j x_j, s = sum_j exp(x_j - m)
//   log_softmax: y_j = x_j - m - log(s)
//   backward:    softmax: dx = y * (dy - sum(dy * y));  log: dx = dy - exp(y) * sum(dy)
//
// Cost per row of n: forward reads x twice (the second time from L1/L2) and writes y
// once; n exps. The float32 path is AVX2 with 4 independent accumulators; the tail
// uses masked lanes so the whole row goes through the same vector arithmetic.
#include <cmath>
#include <limits>

#include "backend/cpu/kernels/nn.h"
#include "backend/cpu/kernels/nn_common.h"
#include "tessera/base/thread_pool.h"

namespace tessera::cpu {
namespace {

using namespace nn_detail;

// Generic (float64, and float32 without AVX2) row kernels, in A = double or float.
template <typename A>
void softmax_row(const A* x, A* y, int64_t n, bool log, const A* /*next*/) {
  A m = -std::numeric_limits<A>::infinity();
  for (int64_t j = 0; j < n; ++j) m = std::max(m, x[j]);
  A s = 0;
  if (log) {
    for (int64_t j = 0; j < n; ++j) s += std::exp(x[j] - m);
    const A ls = std::log(s);
    for (int64_t j = 0; j < n; ++j) y[j] = (x[j] - m) - ls;
  } else {
    for (int64_t j = 0; j < n; ++j) {
      y[j] = std::exp(x[j] - m);
      s += y[j];
    }
    A inv = A(1) / s;
    for (int64_t j = 0; j < n; ++j) y[j] *= inv;
  }
}

template <typename A>
void softmax_row_backward(const A* y, const A* dy, A* dx, int64_t n, bool log) {
  A s = 0;
  if (log) {
    for (int64_t j = 0; j < n; ++j) s += dy[j];
    for (int64_t j = 0; j < n; ++j) dx[j] = dy[j] - std::exp(y[j]) * s;
  } else {
    for (int64_t j = 0; j < n; ++j) s += dy[j] * y[j];
    for (int64_t j = 0; j < n; ++j) dx[j] = y[j] * (dy[j] - s);
  }
}

#ifdef __AVX2__
// y = (x - m) * a - b over a row (m, a, b broadcast), masked tail. x - m first: exact
// for x near m, so large logits keep their precision in log-softmax.
void shift_scale(const float* x, float m, float a, float b, float* y, int64_t n) {
  const __m256 vm = _mm256_set1_ps(m), va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    _mm256_storeu_ps(y + j, _mm256_fmsub_ps(_mm256_sub_ps(_mm256_loadu_ps(x + j), vm), va, vb));
  }
  if (j < n) {
    __m256i mask = tail_mask(n - j);
    _mm256_maskstore_ps(y + j, mask, _mm256_fmsub_ps(_mm256_sub_ps(_mm256_maskload_ps(x + j, mask), vm), va, vb));
  }
}

void softmax_row(const float* x, float* y, int64_t n, bool log, const float* next) {
  if (n == 0) return;
  float m = row_max(x, n);
  if (log) {
    float s = sum_exp(x, m, nullptr, n, next);
    shift_scale(x, m, 1.0f, std::log(s), y, n);
  } else {
    float s = sum_exp(x, m, y, n, next);
    shift_scale(y, 0.0f, 1.0f / s, 0.0f, y, n);
  }
}

void softmax_row_backward(const float* y, const float* dy, float* dx, int64_t n, bool log) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0;
  int64_t j = 0;
  // s = sum(dy) (log) or sum(dy * y) (softmax).
  for (; j + 16 <= n; j += 16) {
    __m256 d0 = _mm256_loadu_ps(dy + j), d1 = _mm256_loadu_ps(dy + j + 8);
    if (log) {
      s0 = _mm256_add_ps(s0, d0);
      s1 = _mm256_add_ps(s1, d1);
    } else {
      s0 = _mm256_fmadd_ps(d0, _mm256_loadu_ps(y + j), s0);
      s1 = _mm256_fmadd_ps(d1, _mm256_loadu_ps(y + j + 8), s1);
    }
  }
  for (; j < n; j += 8) {
    __m256i mask = tail_mask(std::min<int64_t>(8, n - j));
    __m256 d = _mm256_maskload_ps(dy + j, mask);
    s0 = log ? _mm256_add_ps(s0, d) : _mm256_fmadd_ps(d, _mm256_maskload_ps(y + j, mask), s0);
  }
  const __m256 vs = _mm256_set1_ps(hsum(_mm256_add_ps(s0, s1)));
  for (j = 0; j < n; j += 8) {
    __m256i mask = tail_mask(std::min<int64_t>(8, n - j));
    __m256 yv = _mm256_maskload_ps(y + j, mask), d = _mm256_maskload_ps(dy + j, mask);
    __m256 r = log ? _mm256_fnmadd_ps(exp_nonpos(yv), vs, d) : _mm256_mul_ps(yv, _mm256_sub_ps(d, vs));
    _mm256_maskstore_ps(dx + j, mask, r);
  }
}
#endif  // __AVX2__

template <typename T>
void softmax_impl(const T* x, T* y, int64_t rows, int64_t cols, bool log) {
  parallel_for_widened<T>(rows, row_grain(cols), 2 * cols, Scratch::SoftmaxChunks,
                          [&](int64_t begin, int64_t end, float* scratch) {
                            for (int64_t r = begin; r < end; ++r) {
                              const T* xr = x + r * cols;
                              T* yr = y + r * cols;
                              if constexpr (kIsHalf<T>) {
                                float* xs = scratch;
                                float* ys = scratch + cols;
                                widen(xr, xs, cols);
                                softmax_row(xs, ys, cols, log, static_cast<const float*>(nullptr));
                                narrow(ys, yr, cols);
                              } else {
                                // The next row of this chunk is prefetched while this one is exponentiated.
                                softmax_row(xr, yr, cols, log, r + 1 < end ? xr + cols : nullptr);
                              }
                            }
                          });
}

template <typename T>
void softmax_backward_impl(const T* y, const T* dy, T* dx, int64_t rows, int64_t cols, bool log) {
  parallel_for_widened<T>(rows, row_grain(cols), 3 * cols, Scratch::SoftmaxChunks,
                          [&](int64_t begin, int64_t end, float* scratch) {
                            for (int64_t r = begin; r < end; ++r) {
                              const T* yr = y + r * cols;
                              const T* dyr = dy + r * cols;
                              T* dxr = dx + r * cols;
                              if constexpr (kIsHalf<T>) {
                                float* ys = scratch;
                                float* ds = scratch + cols;
                                float* xs = scratch + 2 * cols;
                                widen(yr, ys, cols);
                                widen(dyr, ds, cols);
                                softmax_row_backward(ys, ds, xs, cols, log);
                                narrow(xs, dxr, cols);
                              } else {
                                softmax_row_backward(yr, dyr, dxr, cols, log);
                              }
                            }
                          });
}

}  // namespace

void softmax_rows(DType dtype, const void* x, void* y, int64_t rows, int64_t cols, bool log) {
  check_rows("softmax", rows, cols);
  dispatch_float(dtype, "softmax", [&](auto tag) {
    using T = decltype(tag);
    softmax_impl(static_cast<const T*>(x), static_cast<T*>(y), rows, cols, log);
  });
}

void softmax_rows_backward(DType dtype, const void* y, const void* dy, void* dx, int64_t rows, int64_t cols, bool log) {
  check_rows("softmax_backward", rows, cols);
  dispatch_float(dtype, "softmax_backward", [&](auto tag) {
    using T = decltype(tag);
    softmax_backward_impl(static_cast<const T*>(y), static_cast<const T*>(dy), static_cast<T*>(dx), rows, cols, log);
  });
}

}  // namespace tessera::cpu
