// Cross-entropy over rows of logits, forward and backward.
//
// A row holds `stride` logits of which the first `classes` are the classes; the rest
// are padding (a vocabulary padded to a multiple of 128 for the GEMMs): they never enter
// the softmax and their gradient is 0. j below runs over [0, classes).
//
//   forward:  lse_r = m_r + log(sum_j exp(x_rj - m_r)), m_r = max_j x_rj
//             loss_r = lse_r - x_r,t_r   (0 where t_r == ignore_index)
//   backward: dx_rj = dloss_r * (exp(x_rj - lse_r) - [j == t_r])   (0 rows where ignored)
//
// The forward never stores probabilities: per row it reads the logits twice (the
// second pass from L2 for vocabularies up to ~100k floats) and writes two scalars.
// The backward recomputes the probabilities from the saved lse in one read + one write.
#include <cmath>
#include <limits>

#include "backend/cpu/kernels/nn.h"
#include "backend/cpu/kernels/nn_common.h"
#include "tessera/base/thread_pool.h"

namespace tessera::cpu {
namespace {

using namespace nn_detail;

// The row max m and log(sum exp(x - m)); kept apart so the loss (m - x_t) + log s
// keeps its precision for large logits.
template <typename A>
struct MaxLogSum {
  A m, log_s;
};

template <typename A>
MaxLogSum<A> row_lse(const A* x, int64_t n, const A* /*next*/) {
  A m = -std::numeric_limits<A>::infinity();
  for (int64_t j = 0; j < n; ++j) m = std::max(m, x[j]);
  A s = 0;
  for (int64_t j = 0; j < n; ++j) s += std::exp(x[j] - m);
  return {m, std::log(s)};
}

// dx_j = scale * exp(x_j - shift).
template <typename A>
void scaled_exp(const A* x, A shift, A scale, A* dx, int64_t n) {
  for (int64_t j = 0; j < n; ++j) dx[j] = scale * std::exp(x[j] - shift);
}

#ifdef __AVX2__
MaxLogSum<float> row_lse(const float* x, int64_t n, const float* next) {
  float m = row_max(x, n);
  return {m, std::log(sum_exp(x, m, nullptr, n, next))};
}

void scaled_exp(const float* x, float shift, float scale, float* dx, int64_t n) {
  const __m256 vs = _mm256_set1_ps(shift), vk = _mm256_set1_ps(scale);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    _mm256_storeu_ps(dx + j, _mm256_mul_ps(vk, exp_nonpos(_mm256_sub_ps(_mm256_loadu_ps(x + j), vs))));
  }
  if (j < n) {
    __m256i mask = tail_mask(n - j);
    __m256 e = exp_nonpos(_mm256_sub_ps(_mm256_maskload_ps(x + j, mask), vs));
    _mm256_maskstore_ps(dx + j, mask, _mm256_mul_ps(vk, e));
  }
}
#endif

// Validates every target before any work starts (workers must not throw).
void check_targets(const char* op, const int64_t* targets, int64_t rows, int64_t stride, int64_t vocab,
                   int64_t ignore_index) {
  check_rows(op, rows, stride);
  if (vocab < 0 || vocab > stride)
    fail<ValueError>("{}: {} classes in rows of {} logits (expected classes <= the row length)", op, vocab, stride);
  if (rows > 0 && !targets) fail<ValueError>("{}: targets buffer is null", op);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = targets[r];
    if (t == ignore_index) continue;
    if (t < 0 || t >= vocab) {
      fail<ValueError>(
          "{}: target out of range at row {} (got {}; expected 0 <= target < vocab size {}, or ignore_index {})", op, r,
          t, vocab, ignore_index);
    }
  }
}

template <typename T>
void cross_entropy_impl(const T* logits, const int64_t* targets, int64_t rows, int64_t stride, int64_t vocab,
                        int64_t ignore_index, Acc<T>* loss, Acc<T>* lse) {
  using A = Acc<T>;
  parallel_for_widened<T>(rows, row_grain(vocab), vocab, Scratch::CrossEntropyChunks,
                          [&](int64_t begin, int64_t end, float* scratch) {
                            for (int64_t r = begin; r < end; ++r) {
                              const A* x;
                              const A* next = nullptr;  // the next row of this chunk, prefetched during this one
                              if constexpr (kIsHalf<T>) {
                                widen(logits + r * stride, scratch, vocab);
                                x = scratch;
                              } else {
                                x = logits + r * stride;
                                if (r + 1 < end) next = x + stride;
                              }
                              const MaxLogSum<A> l = row_lse(x, vocab, next);
                              const int64_t t = targets[r];
                              if (lse) lse[r] = l.m + l.log_s;
                              loss[r] = t == ignore_index ? A(0) : (l.m - x[t]) + l.log_s;
                            }
                          });
}

template <typename T>
void cross_entropy_backward_impl(const T* logits, const int64_t* targets, const Acc<T>* lse, const Acc<T>* dloss,
                                 T* dlogits, int64_t rows, int64_t stride, int64_t vocab, int64_t ignore_index) {
  using A = Acc<T>;
  parallel_for_widened<T>(rows, row_grain(vocab), 2 * vocab, Scratch::CrossEntropyChunks,
                          [&](int64_t begin, int64_t end, float* scratch) {
                            for (int64_t r = begin; r < end; ++r) {
                              T* out = dlogits + r * stride;
                              for (int64_t j = vocab; j < stride; ++j) out[j] = from_acc<T>(A(0));
                              const int64_t t = targets[r];
                              if (t == ignore_index) {
                                for (int64_t j = 0; j < vocab; ++j) out[j] = from_acc<T>(A(0));
                                continue;
                              }
                              if constexpr (kIsHalf<T>) {
                                float* xs = scratch;
                                float* ds = scratch + vocab;
                                widen(logits + r * stride, xs, vocab);
                                scaled_exp(xs, lse[r], dloss[r], ds, vocab);
                                ds[t] -= dloss[r];
                                narrow(ds, out, vocab);
                              } else {
                                scaled_exp(logits + r * stride, lse[r], dloss[r], out, vocab);
                                out[t] -= dloss[r];
                              }
                            }
                          });
}

}  // namespace

void cross_entropy_rows(DType dtype, const void* logits, const int64_t* targets, int64_t rows, int64_t stride,
                        int64_t vocab, int64_t ignore_index, void* loss, void* lse) {
  check_targets("cross_entropy", targets, rows, stride, vocab, ignore_index);
  dispatch_float(dtype, "cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    using A = Acc<T>;
    cross_entropy_impl(static_cast<const T*>(logits), targets, rows, stride, vocab, ignore_index, static_cast<A*>(loss),
                       static_cast<A*>(lse));
  });
}

void cross_entropy_rows_backward(DType dtype, const void* logits, const int64_t* targets, const void* lse,
                                 const void* dloss, void* dlogits, int64_t rows, int64_t stride, int64_t vocab,
                                 int64_t ignore_index) {
  check_targets("cross_entropy_backward", targets, rows, stride, vocab, ignore_index);
  if (rows > 0 && (!lse || !dloss)) fail<ValueError>("cross_entropy_backward: lse and dloss must not be null");
  dispatch_float(dtype, "cross_entropy_backward", [&](auto tag) {
    using T = decltype(tag);
    using A = Acc<T>;
    cross_entropy_backward_impl(static_cast<const T*>(logits), targets, static_cast<const A*>(lse),
                                static_cast<const A*>(dloss), static_cast<T*>(dlogits), rows, stride, vocab,
                                ignore_index);
  });
}

}  // namespace tessera::cpu
