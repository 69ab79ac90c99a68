// Attention forward, FlashAttention-2 style. For each (b, h, query block of kBlockQ
// rows) and each visible key block of kBlockK rows:
//   S^T = K (scale Q)^T                     [tile GEMM, K = head_dim]
//   m' = max(m, colmax S^T); P^T = exp(S^T - m'); l = l e^(m - m') + colsum P^T
//   O = O e^(m - m') + P V                  [tile GEMM, K = key block]
// then O /= l and lse = m + log l. Causal key blocks above the diagonal, and blocks
// of other documents (segment ids), are never visited. Cost: 4 B H T S D flops (half when causal); extra memory
// O(block^2) per thread.
//
// Why the transposed score tile: Q^T is built once per query block, and K, V are then
// GEMM operands in place (float32 and float64 with head_dim % 8 == 0), so the inner
// loop moves no data; the softmax runs along columns, vectorized across 8 queries.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backend/cpu/kernels/attention.h"
#include "backend/cpu/kernels/attention_avx512bf16.h"
#include "backend/cpu/kernels/attention_tiles.h"
#include "backend/cpu/kernels/scratch.h"
#include "tessera/base/thread_pool.h"

namespace tessera::cpu {
namespace {

using namespace attention_detail;

// Online-softmax step on a transposed score tile st[j, i] (key j < nk, query i < nq):
// m' = max(m, max_j st), st = exp(st - m'), l = l e^(m - m') + sum_j st, alpha = e^(m - m').
// A query with no visible key so far keeps m = -inf; it is shifted by 0 instead of
// -inf so that its probabilities are 0 rather than NaN.
template <typename T>
void online_softmax_columns(T* st, int64_t ld, int64_t nk, int64_t nq, T* m, T* l, T* alpha) {
  int64_t i = 0;
#ifdef TESSERA_ATTENTION_AVX2
  if constexpr (std::is_same_v<T, float>) {
    const __m256 neg_inf = _mm256_set1_ps(kNegInf<float>);
    for (; i + 8 <= nq; i += 8) {
      const __m256 m_old = _mm256_loadu_ps(m + i);
      __m256 m_new = m_old;
      for (int64_t j = 0; j < nk; ++j) m_new = _mm256_max_ps(m_new, _mm256_loadu_ps(st + j * ld + i));
      const __m256 shift = _mm256_andnot_ps(_mm256_cmp_ps(m_new, neg_inf, _CMP_EQ_OQ), m_new);
      __m256 sum = _mm256_setzero_ps();
      for (int64_t j = 0; j < nk; ++j) {
        const __m256 p = exp256(_mm256_sub_ps(_mm256_loadu_ps(st + j * ld + i), shift));
        _mm256_storeu_ps(st + j * ld + i, p);
        sum = _mm256_add_ps(sum, p);
      }
      const __m256 a = exp256(_mm256_sub_ps(m_old, shift));
      _mm256_storeu_ps(l + i, _mm256_fmadd_ps(_mm256_loadu_ps(l + i), a, sum));
      _mm256_storeu_ps(m + i, m_new);
      _mm256_storeu_ps(alpha + i, a);
    }
  }
#endif
  for (; i < nq; ++i) {
    T m_new = m[i];
    for (int64_t j = 0; j < nk; ++j) m_new = std::max(m_new, st[j * ld + i]);
    const T shift = m_new == kNegInf<T> ? T(0) : m_new;
    T sum = 0;
    for (int64_t j = 0; j < nk; ++j) sum += st[j * ld + i] = std::exp(st[j * ld + i] - shift);
    alpha[i] = std::exp(m[i] - shift);
    l[i] = l[i] * alpha[i] + sum;
    m[i] = m_new;
  }
}

template <typename In>
void forward_impl(const AttentionShape& sh, const In* q, const In* k, const In* v, In* out, Acc<In>* lse) {
  using T = Acc<In>;
  const int64_t B = sh.batch, H = sh.heads, T_len = sh.q_len, S_len = sh.kv_len, D = sh.head_dim;
  const int64_t group = H / sh.kv_heads;
  const int64_t dp = round_up(D, kPad);
  const int64_t nqb = (T_len + kBlockQ - 1) / kBlockQ;
  const int64_t nkb = (S_len + kBlockK - 1) / kBlockK;
  const T scale = static_cast<T>(sh.scale);
  const auto* mask = static_cast<const uint8_t*>(sh.mask);
  // K and V serve as GEMM operands in place when no conversion or padding is needed.
  const bool in_place = std::is_same_v<In, T> && D == dp;
  const SegmentBlocks segments(sh.segments, B, T_len);

  // Query blocks are visited last-first within each (b, h): under causal masking the
  // late blocks cost the most, and starting them early balances the dynamic schedule.
  const ChunkScratch tiles(
      sizeof(T) * static_cast<size_t>(dp * kBlockQ * 2 + 2 * kBlockK * dp + kBlockK * kBlockQ + 3 * kBlockQ),
      Scratch::AttentionChunks);
  parallel_for(B * H * nqb, 1, [&](int64_t begin, int64_t end) {
    ChunkScratch::Lease lease(tiles);
    T* qt = lease.as<T>();
    T* acc = qt + dp * kBlockQ;     // [kBlockQ, dp] unnormalized output
    T* kr = acc + kBlockQ * dp;     // [kBlockK, dp] K block (when converted)
    T* vr = kr + kBlockK * dp;      // [kBlockK, dp] V block (when converted)
    T* st = vr + kBlockK * dp;      // [kBlockK, kBlockQ] scores, then probabilities
    T* m = st + kBlockK * kBlockQ;  // running max per query
    T* l = m + kBlockQ;             // running sum per query
    T* alpha = l + kBlockQ;         // per-step rescale factor
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bh = task / nqb, qb = nqb - 1 - task % nqb;
      const int64_t b = bh / H, h = bh % H, kvh = h / group;
      const int64_t q0 = qb * kBlockQ, nq = std::min(kBlockQ, T_len - q0), nqp = round_up(nq, kPad);
      const In* kp = k + (b * sh.kv_heads + kvh) * S_len * D;
      const In* vp = v + (b * sh.kv_heads + kvh) * S_len * D;
      const uint8_t* mask_bh = mask ? mask + b * sh.mask_b_stride + h * sh.mask_h_stride : nullptr;

      load_transposed(q + (bh * T_len + q0) * D, nq, nqp, D, qt, kBlockQ, scale);
      std::fill(acc, acc + nq * dp, T(0));
      std::fill(m, m + nqp, kNegInf<T>);
      std::fill(l, l + nqp, T(0));
      // Causal: key s is visible to some row of the block iff s <= q0 + nq - 1.
      const int64_t kb_end = sh.causal ? std::min(nkb, (q0 + nq + kBlockK - 1) / kBlockK) : nkb;
      for (int64_t kb = 0; kb < kb_end; ++kb) {
        if (segments.disjoint(b, qb, kb)) continue;  // no pair in one document
        const int64_t k0 = kb * kBlockK, nk = std::min(kBlockK, S_len - k0);
        const T* ka = kr;
        const T* vb = vr;
        if constexpr (std::is_same_v<In, T>) {
          if (in_place) ka = kp + k0 * D, vb = vp + k0 * D;
        }
        if (!in_place) {
          load_rows(kp + k0 * D, nk, D, kr, dp, T(1));
          load_rows(vp + k0 * D, nk, D, vr, dp, T(1));
        }
        tile_gemm<T>(nk, nqp, D, ka, dp, 1, qt, kBlockQ, st, kBlockQ, false);
        mask_scores_transposed(st, kBlockQ, nq, nk, q0, k0, sh.causal, mask_bh, S_len, segments.tile_ids(b, qb, kb));
        online_softmax_columns(st, kBlockQ, nk, nqp, m, l, alpha);
        for (int64_t i = 0; i < nq; ++i) {
          if (alpha[i] == T(1)) continue;
          T* o = acc + i * dp;
          for (int64_t d = 0; d < dp; ++d) o[d] *= alpha[i];
        }
        tile_gemm<T>(nq, dp, nk, st, 1, kBlockQ, vb, dp, acc, dp, true);
      }
      In* op = out + (bh * T_len + q0) * D;
      T* lp = lse + bh * T_len + q0;
      for (int64_t i = 0; i < nq; ++i) {
        // l > 0 exactly when some key is visible (the max element contributes e^0 = 1).
        const T inv = l[i] > T(0) ? T(1) / l[i] : T(0);
        for (int64_t d = 0; d < D; ++d) op[i * D + d] = from_acc<In>(acc[i * dp + d] * inv);
        lp[i] = l[i] > T(0) ? m[i] + std::log(l[i]) : kNegInf<T>;
      }
    }
  });
}

}  // namespace

void attention_forward(DType dtype, const AttentionShape& shape, const void* q, const void* k, const void* v, void* out,
                       void* lse) {
  validate("attention_forward", dtype, shape);
  const int64_t q_size = shape.batch * shape.heads * shape.q_len;
  if (q_size == 0) return;
  const bool has_qo = shape.head_dim > 0, has_kv = shape.kv_len > 0 && shape.head_dim > 0;
  if (lse == nullptr || (has_qo && (q == nullptr || out == nullptr)) || (has_kv && (k == nullptr || v == nullptr)))
    fail<ValueError>("attention_forward: null data pointer for a non-empty tensor");
  switch (dtype) {
    case DType::Float64:
      forward_impl(shape, static_cast<const double*>(q), static_cast<const double*>(k), static_cast<const double*>(v),
                   static_cast<double*>(out), static_cast<double*>(lse));
      break;
    case DType::Float32:
      forward_impl(shape, static_cast<const float*>(q), static_cast<const float*>(k), static_cast<const float*>(v),
                   static_cast<float*>(out), static_cast<float*>(lse));
      break;
    case DType::BFloat16:
      if (attention_bf16_native()) {
        attention_forward_avx512bf16(shape, static_cast<const bfloat16*>(q), static_cast<const bfloat16*>(k),
                                     static_cast<const bfloat16*>(v), static_cast<bfloat16*>(out),
                                     static_cast<float*>(lse));
        break;
      }
      forward_impl(shape, static_cast<const bfloat16*>(q), static_cast<const bfloat16*>(k),
                   static_cast<const bfloat16*>(v), static_cast<bfloat16*>(out), static_cast<float*>(lse));
      break;
    default:
      forward_impl(shape, static_cast<const float16*>(q), static_cast<const float16*>(k),
                   static_cast<const float16*>(v), static_cast<float16*>(out), static_cast<float*>(lse));
      break;
  }
}

}  // namespace tessera::cpu
