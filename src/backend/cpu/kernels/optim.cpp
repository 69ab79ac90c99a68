// Optimizer updates, in place, elementwise.
//
// AdamW (decoupled weight decay):
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p = p - lr (m c1 / (sqrt(v c2) + eps) + wd p),   c1 = 1/(1 - b1^t), c2 = 1/(1 - b2^t)
// Memory bound: reads p, g, m, v and writes p, m, v (7 streams).
//
// Lion:
//   c = b1 m + (1 - b1) g;  p = p - lr (sign(c) + wd p);  m = b2 m + (1 - b2) g
// Memory bound: reads p, g, m and writes p, m (5 streams).
//
// float32 runs 8 lanes with masked tails (every element takes the same arithmetic);
// bfloat16/float16 parameters are widened per chunk into float32 scratch and share the
// float32 path.
#include "backend/cpu/kernels/optim.h"

#include <cmath>
#include <type_traits>

#include "backend/cpu/kernels/nn_common.h"
#include "tessera/base/thread_pool.h"

namespace tessera::cpu {
namespace {

using namespace nn_detail;

constexpr int64_t kGrain = int64_t{1} << 14;

template <typename A>
struct Coeffs {
  A lr, b1, b2, one_minus_b1, one_minus_b2, c1, c2, eps, wd;
};

template <typename A>
Coeffs<A> coeffs(const AdamWConfig& c) {
  const double c1 = 1.0 / (1.0 - std::pow(c.beta1, static_cast<double>(c.step)));
  const double c2 = 1.0 / (1.0 - std::pow(c.beta2, static_cast<double>(c.step)));
  return {
      static_cast<A>(c.lr),          static_cast<A>(c.beta1), static_cast<A>(c.beta2), static_cast<A>(1.0 - c.beta1),
      static_cast<A>(1.0 - c.beta2), static_cast<A>(c1),      static_cast<A>(c2),      static_cast<A>(c.eps),
      static_cast<A>(c.weight_decay)};
}

template <typename A>
void adamw_span(A* p, const A* g, A* m, A* v, int64_t n, const Coeffs<A>& k) {
  for (int64_t i = 0; i < n; ++i) {
    const A mi = k.b1 * m[i] + k.one_minus_b1 * g[i];
    const A vi = k.b2 * v[i] + k.one_minus_b2 * g[i] * g[i];
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] - k.lr * (mi * k.c1 / (std::sqrt(vi * k.c2) + k.eps) + k.wd * p[i]);
  }
}

#ifdef __AVX2__
void adamw_span(float* p, const float* g, float* m, float* v, int64_t n, const Coeffs<float>& k) {
  const __m256 b1 = _mm256_set1_ps(k.b1), b2 = _mm256_set1_ps(k.b2);
  const __m256 a1 = _mm256_set1_ps(k.one_minus_b1), a2 = _mm256_set1_ps(k.one_minus_b2);
  const __m256 c1 = _mm256_set1_ps(k.c1), c2 = _mm256_set1_ps(k.c2), eps = _mm256_set1_ps(k.eps);
  const __m256 lr = _mm256_set1_ps(k.lr), wd = _mm256_set1_ps(k.wd);
  auto step = [&](__m256 pv, __m256 gv, __m256 mv, __m256 vv, __m256& po, __m256& mo, __m256& vo) {
    mo = _mm256_fmadd_ps(b1, mv, _mm256_mul_ps(a1, gv));
    vo = _mm256_fmadd_ps(b2, vv, _mm256_mul_ps(_mm256_mul_ps(a2, gv), gv));
    __m256 den = _mm256_add_ps(_mm256_sqrt_ps(_mm256_mul_ps(vo, c2)), eps);
    __m256 upd = _mm256_fmadd_ps(wd, pv, _mm256_div_ps(_mm256_mul_ps(mo, c1), den));
    po = _mm256_fnmadd_ps(lr, upd, pv);
  };
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 po, mo, vo;
    step(_mm256_loadu_ps(p + i), _mm256_loadu_ps(g + i), _mm256_loadu_ps(m + i), _mm256_loadu_ps(v + i), po, mo, vo);
    _mm256_storeu_ps(p + i, po);
    _mm256_storeu_ps(m + i, mo);
    _mm256_storeu_ps(v + i, vo);
  }
  if (i < n) {
    const __m256i mask = tail_mask(n - i);
    __m256 po, mo, vo;
    step(_mm256_maskload_ps(p + i, mask), _mm256_maskload_ps(g + i, mask), _mm256_maskload_ps(m + i, mask),
         _mm256_maskload_ps(v + i, mask), po, mo, vo);
    _mm256_maskstore_ps(p + i, mask, po);
    _mm256_maskstore_ps(m + i, mask, mo);
    _mm256_maskstore_ps(v + i, mask, vo);
  }
}
#endif

// Runs span(p, g, begin, len) over chunks of [0, n) in parallel, where p and g point at
// the chunk: bfloat16/float16 parameters and gradients are widened into float32 scratch
// first and the parameters narrowed back after (the moments are float32 already).
template <typename T, typename Span>
void widened_update(T* p, const T* g, int64_t n, Span&& span) {
  parallel_for_widened<T>(n, kGrain, 2 * std::min(n, kGrain), Scratch::OptimChunks,
                          [&](int64_t begin, int64_t end, float* scratch) {
                            const int64_t len = end - begin;
                            if constexpr (kIsHalf<T>) {
                              float* ps = scratch;
                              float* gs = scratch + len;
                              widen(p + begin, ps, len);
                              widen(g + begin, gs, len);
                              span(ps, gs, begin, len);
                              narrow(ps, p + begin, len);
                            } else {
                              span(p + begin, g + begin, begin, len);
                            }
                          });
}

// widened_update's twin for a gradient that is scaled or of another dtype G: each
// chunk's gradient, widened to T (exact) and, with `scale`, times the scale rounded to T
// as the multiply op rounds it, is written to scratch in the accumulation type (next to
// the widened parameters of a 16-bit T) and the span reads it from there.
template <typename T, typename G, typename Span>
void staged_update(T* p, const G* g, int64_t n, const T* scale, Span&& span) {
  using A = Acc<T>;
  const ChunkScratch scratch(sizeof(A) * 2 * static_cast<size_t>(std::min(n, kGrain)), Scratch::OptimChunks);
  auto wide = [](auto x) -> A {
    if constexpr (kIsHalf<decltype(x)>) {
      return to_float(x);
    } else {
      return static_cast<A>(x);
    }
  };
  const A s = scale != nullptr ? wide(*scale) : A(1);
  parallel_for(n, kGrain, [&](int64_t begin, int64_t end) {
    ChunkScratch::Lease lease(scratch);
    const int64_t len = end - begin;
    A* ps = lease.as<A>();
    A* gs = ps + len;
    if (scale != nullptr) {
      for (int64_t i = 0; i < len; ++i) gs[i] = wide(from_acc<T>(wide(g[begin + i]) * s));
    } else {
      for (int64_t i = 0; i < len; ++i) gs[i] = wide(g[begin + i]);
    }
    if constexpr (kIsHalf<T>) {
      widen(p + begin, ps, len);
      span(ps, gs, begin, len);
      narrow(ps, p + begin, len);
    } else {
      span(p + begin, gs, begin, len);
    }
  });
}

template <typename T>
void adamw_impl(T* p, const void* g, Acc<T>* m, Acc<T>* v, int64_t n, const AdamWConfig& config) {
  const Coeffs<Acc<T>> k = coeffs<Acc<T>>(config);
  auto span = [&](auto* ps, const auto* gs, int64_t begin, int64_t len) {
    adamw_span(ps, gs, m + begin, v + begin, len, k);
  };
  const auto* scale = static_cast<const T*>(config.grad_scale);
  const DType grad_dtype = config.grad_dtype.value_or(dtype_of<T>::value);
  if constexpr (std::is_same_v<T, float>) {
    if (grad_dtype == DType::BFloat16) return staged_update(p, static_cast<const bfloat16*>(g), n, scale, span);
    if (grad_dtype == DType::Float16) return staged_update(p, static_cast<const float16*>(g), n, scale, span);
  }
  if (grad_dtype != dtype_of<T>::value)
    fail<DTypeError>(
        "adamw_update: {} gradients for {} parameters (expected the parameter's dtype, or "
        "bfloat16/float16 for float32)",
        name(grad_dtype), name(dtype_of<T>::value));
  if (scale != nullptr) {
    staged_update(p, static_cast<const T*>(g), n, scale, span);
  } else {
    widened_update(p, static_cast<const T*>(g), n, span);
  }
}

// ---- Lion ----

template <typename A>
struct LionCoeffs {
  A lr, b1, b2, one_minus_b1, one_minus_b2, wd;
};

template <typename A>
LionCoeffs<A> lion_coeffs(const LionConfig& c) {
  return {static_cast<A>(c.lr),          static_cast<A>(c.beta1),       static_cast<A>(c.beta2),
          static_cast<A>(1.0 - c.beta1), static_cast<A>(1.0 - c.beta2), static_cast<A>(c.weight_decay)};
}

// The one sequence every path computes (explicit fmas, so no contraction choice of
// the compiler changes a bit; the CUDA kernel runs it too):
//   c = fma(b1, m, (1-b1) g);  m' = fma(b2, m, (1-b2) g);  p' = fma(-lr, fma(wd, p, sign(c)), p)
template <typename A>
void lion_span(A* p, const A* g, A* m, int64_t n, const LionCoeffs<A>& k) {
  for (int64_t i = 0; i < n; ++i) {
    const A c = std::fma(k.b1, m[i], k.one_minus_b1 * g[i]);
    const A s = c > A(0) ? A(1) : c < A(0) ? A(-1) : c;  // keeps +-0 and NaN
    m[i] = std::fma(k.b2, m[i], k.one_minus_b2 * g[i]);
    p[i] = std::fma(-k.lr, std::fma(k.wd, p[i], s), p[i]);
  }
}

#ifdef __AVX2__
void lion_span(float* p, const float* g, float* m, int64_t n, const LionCoeffs<float>& k) {
  const __m256 b1 = _mm256_set1_ps(k.b1), b2 = _mm256_set1_ps(k.b2);
  const __m256 a1 = _mm256_set1_ps(k.one_minus_b1), a2 = _mm256_set1_ps(k.one_minus_b2);
  const __m256 lr = _mm256_set1_ps(k.lr), wd = _mm256_set1_ps(k.wd);
  const __m256 one = _mm256_set1_ps(1.0f), sign_bit = _mm256_set1_ps(-0.0f), zero = _mm256_setzero_ps();
  auto step = [&](__m256 pv, __m256 gv, __m256 mv, __m256& po, __m256& mo) {
    const __m256 c = _mm256_fmadd_ps(b1, mv, _mm256_mul_ps(a1, gv));
    // sign(c): +-1 where c is nonzero and not NaN (ordered compare), c itself elsewhere.
    const __m256 unit = _mm256_or_ps(one, _mm256_and_ps(c, sign_bit));
    const __m256 s = _mm256_blendv_ps(c, unit, _mm256_cmp_ps(c, zero, _CMP_NEQ_OQ));
    mo = _mm256_fmadd_ps(b2, mv, _mm256_mul_ps(a2, gv));
    po = _mm256_fnmadd_ps(lr, _mm256_fmadd_ps(wd, pv, s), pv);
  };
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 po, mo;
    step(_mm256_loadu_ps(p + i), _mm256_loadu_ps(g + i), _mm256_loadu_ps(m + i), po, mo);
    _mm256_storeu_ps(p + i, po);
    _mm256_storeu_ps(m + i, mo);
  }
  if (i < n) {
    const __m256i mask = tail_mask(n - i);
    __m256 po, mo;
    step(_mm256_maskload_ps(p + i, mask), _mm256_maskload_ps(g + i, mask), _mm256_maskload_ps(m + i, mask), po, mo);
    _mm256_maskstore_ps(p + i, mask, po);
    _mm256_maskstore_ps(m + i, mask, mo);
  }
}
#endif

template <typename T>
void lion_impl(T* p, const T* g, Acc<T>* m, int64_t n, const LionConfig& config) {
  const LionCoeffs<Acc<T>> k = lion_coeffs<Acc<T>>(config);
  widened_update(p, g, n,
                 [&](auto* ps, const auto* gs, int64_t begin, int64_t len) { lion_span(ps, gs, m + begin, len, k); });
}

}  // namespace

void adamw_update(DType dtype, void* param, const void* grad, void* m, void* v, int64_t n, const AdamWConfig& config) {
  if (n < 0) fail<ValueError>("adamw_update: negative size (got {}; expected >= 0)", n);
  if (config.step < 1) fail<ValueError>("adamw_update: step is 1-based (got {}; expected >= 1)", config.step);
  if (!(config.beta1 >= 0.0 && config.beta1 < 1.0) || !(config.beta2 >= 0.0 && config.beta2 < 1.0)) {
    fail<ValueError>("adamw_update: betas out of range (got beta1={}, beta2={}; expected 0 <= beta < 1)", config.beta1,
                     config.beta2);
  }
  if (!(config.eps >= 0.0)) fail<ValueError>("adamw_update: eps must be >= 0 (got {})", config.eps);
  dispatch_float(dtype, "adamw_update", [&](auto tag) {
    using T = decltype(tag);
    using A = Acc<T>;
    adamw_impl(static_cast<T*>(param), grad, static_cast<A*>(m), static_cast<A*>(v), n, config);
  });
}

void lion_update(DType dtype, void* param, const void* grad, void* m, int64_t n, const LionConfig& config) {
  if (n < 0) fail<ValueError>("lion_update: negative size (got {}; expected >= 0)", n);
  if (!(config.beta1 >= 0.0 && config.beta1 < 1.0) || !(config.beta2 >= 0.0 && config.beta2 < 1.0)) {
    fail<ValueError>("lion_update: betas out of range (got beta1={}, beta2={}; expected 0 <= beta < 1)", config.beta1,
                     config.beta2);
  }
  if (!(config.lr >= 0.0)) fail<ValueError>("lion_update: lr {} (expected >= 0)", config.lr);
  dispatch_float(dtype, "lion_update", [&](auto tag) {
    using T = decltype(tag);
    lion_impl(static_cast<T*>(param), static_cast<const T*>(grad), static_cast<Acc<T>*>(m), n, config);
  });
}

}  // namespace tessera::cpu
