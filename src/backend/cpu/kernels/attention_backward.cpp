// Attention backward, FlashAttention-2 style, probabilities recomputed from lse:
//   Delta_t = sum_d dO[t,d] O[t,d]
//   for each key block (K_j, V_j), for each query block (Q_i, dO_i) it is visible to
//   (causally, and sharing a document when there are segment ids):
//     P  = exp(Q_i (scale K_j)^T - lse_i)      dV_j += P^T dO_i
//     dP = dO_i V_j^T                          dS = P * (dP - Delta_i)
//     dK_j += scale dS^T Q_i                   dQ_i += scale dS K_j
// Five tile GEMMs per visited tile pair: 2.5x the forward's flops.
//
// Work is split over (b, kv head, split), where split s owns key blocks s, s + n, ...
// (n = splits, fixed by the shape alone). A task owns dK/dV of its key blocks (summing
// the query heads of its GQA group in order) and a dQ accumulator for its group; with
// n > 1 the per-split dQ partials are added in split order afterwards. Nothing depends
// on the thread count, so results are bitwise reproducible.
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "backend/cpu/kernels/attention.h"
#include "backend/cpu/kernels/attention_avx512bf16.h"
#include "backend/cpu/kernels/attention_tiles.h"
#include "backend/cpu/kernels/scratch.h"
#include "tessera/base/thread_pool.h"

namespace tessera::cpu {
namespace {

using namespace attention_detail;

// Enough (b, kv head, split) tasks to keep a pool busy with dynamic scheduling even
// when batch * kv_heads is small.
constexpr int64_t kMinTasks = 16;

template <typename In>
void backward_impl(const AttentionShape& sh, const In* q, const In* k, const In* v, const In* o, const Acc<In>* lse,
                   const In* dout, In* dq, In* dk, In* dv) {
  using T = Acc<In>;
  const int64_t B = sh.batch, H = sh.heads, Hkv = sh.kv_heads, T_len = sh.q_len, S_len = sh.kv_len, D = sh.head_dim;
  const int64_t group = H / Hkv;
  const int64_t dp = round_up(D, kPad);
  const int64_t nqb = (T_len + kBlockQ - 1) / kBlockQ;
  const int64_t nkb = (S_len + kBlockK - 1) / kBlockK;
  const T scale = static_cast<T>(sh.scale);
  const auto* mask = static_cast<const uint8_t*>(sh.mask);
  const int64_t rows = B * H * T_len;
  const SegmentBlocks segments(sh.segments, B, T_len);

  if (nkb == 0) {  // no keys: the output is identically 0
    for (int64_t i = 0; i < rows * D; ++i) dq[i] = from_acc<In>(T(0));
    return;
  }

  T* delta = thread_scratch<T>(static_cast<size_t>(rows), Scratch::AttentionDelta);
  parallel_for(rows, 256, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      T sum = 0;
      for (int64_t d = 0; d < D; ++d) sum += to_acc(dout[r * D + d]) * to_acc(o[r * D + d]);
      delta[r] = sum;
    }
  });

  // Q and dO serve as GEMM operands in place when no conversion or padding is needed.
  const bool in_place = std::is_same_v<In, T> && D == dp;
  const int64_t groups = B * Hkv;
  const int64_t splits = std::min(nkb, (kMinTasks + groups - 1) / groups);
  const int64_t dq_group_size = group * T_len * dp;  // one task's dQ accumulator
  // Each task zeroes its own dQ partial before accumulating into it.
  T* dq_partial = splits > 1
                      ? thread_scratch<T>(static_cast<size_t>(groups * splits * dq_group_size), Scratch::AttentionDq)
                      : nullptr;

  const int64_t tiles = 3 * dp * kBlockK + 2 * kBlockQ * dp + 2 * kBlockQ * kBlockK + 2 * kBlockK * dp;
  const ChunkScratch chunk_scratch(sizeof(T) * static_cast<size_t>(tiles + (splits == 1 ? dq_group_size : 0)),
                                   Scratch::AttentionChunks);
  parallel_for(groups * splits, 1, [&](int64_t begin, int64_t end) {
    ChunkScratch::Lease lease(chunk_scratch);
    T* kt = lease.as<T>();
    T* vt = kt + dp * kBlockK;      // [dp, kBlockK] V^T
    T* kr = vt + dp * kBlockK;      // [kBlockK, dp] K rows
    T* qs = kr + kBlockK * dp;      // [kBlockQ, dp] Q (when converted)
    T* go = qs + kBlockQ * dp;      // [kBlockQ, dp] dO (when converted)
    T* p = go + kBlockQ * dp;       // [kBlockQ, kBlockK] probabilities
    T* ds = p + kBlockQ * kBlockK;  // [kBlockQ, kBlockK] dP, then dS
    T* dk_acc = ds + kBlockQ * kBlockK;
    T* dv_acc = dk_acc + kBlockK * dp;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t gi = task / splits, split = task % splits;
      const int64_t b = gi / Hkv;
      T* dq_acc = splits == 1 ? dv_acc + kBlockK * dp : dq_partial + task * dq_group_size;
      std::fill(dq_acc, dq_acc + dq_group_size, T(0));
      const In* kp = k + gi * S_len * D;
      const In* vp = v + gi * S_len * D;
      for (int64_t kb = split; kb < nkb; kb += splits) {
        const int64_t k0 = kb * kBlockK, nk = std::min(kBlockK, S_len - k0), nkp = round_up(nk, kPad);
        load_transposed(kp + k0 * D, nk, nkp, D, kt, kBlockK, scale);
        load_transposed(vp + k0 * D, nk, nkp, D, vt, kBlockK, T(1));
        load_rows(kp + k0 * D, nk, D, kr, dp, T(1));
        std::fill(dk_acc, dk_acc + 2 * kBlockK * dp, T(0));  // dk_acc and dv_acc
        for (int64_t g = 0; g < group; ++g) {
          const int64_t h = (gi % Hkv) * group + g, bh = b * H + h;
          const uint8_t* mask_bh = mask ? mask + b * sh.mask_b_stride + h * sh.mask_h_stride : nullptr;
          // Causal: query t sees key block kb iff t >= k0.
          for (int64_t qb = sh.causal ? k0 / kBlockQ : 0; qb < nqb; ++qb) {
            if (segments.disjoint(b, qb, kb)) continue;  // no pair in one document
            const int64_t q0 = qb * kBlockQ, nq = std::min(kBlockQ, T_len - q0);
            const int64_t r0 = bh * T_len + q0;
            const T* qa = qs;
            const T* ga = go;
            if constexpr (std::is_same_v<In, T>) {
              if (in_place) qa = q + r0 * D, ga = dout + r0 * D;
            }
            if (!in_place) {
              load_rows(q + r0 * D, nq, D, qs, dp, T(1));
              load_rows(dout + r0 * D, nq, D, go, dp, T(1));
            }
            tile_gemm<T>(nq, nkp, D, qa, dp, 1, kt, kBlockK, p, kBlockK, false);
            mask_scores(p, kBlockK, nq, nk, nkp, q0, k0, sh.causal, mask_bh, S_len, segments.tile_ids(b, qb, kb));
            tile_gemm<T>(nq, nkp, D, ga, dp, 1, vt, kBlockK, ds, kBlockK, false);
            for (int64_t i = 0; i < nq; ++i) {
              T* pi = p + i * kBlockK;
              T* dsi = ds + i * kBlockK;
              const T lse_i = lse[r0 + i], delta_i = delta[r0 + i];
              if (lse_i == kNegInf<T>) {  // fully masked row: no probability mass, no gradient
                std::fill(pi, pi + nkp, T(0));
                std::fill(dsi, dsi + nkp, T(0));
                continue;
              }
              exp_shift(pi, nkp, lse_i);
              for (int64_t j = 0; j < nkp; ++j) dsi[j] = pi[j] * (dsi[j] - delta_i);
            }
            tile_gemm<T>(nk, dp, nq, p, 1, kBlockK, ga, dp, dv_acc, dp, true);
            tile_gemm<T>(nk, dp, nq, ds, 1, kBlockK, qa, dp, dk_acc, dp, true);
            tile_gemm<T>(nq, dp, nk, ds, kBlockK, 1, kr, dp, dq_acc + (g * T_len + q0) * dp, dp, true);
          }
        }
        for (int64_t j = 0; j < nk; ++j) {
          const int64_t r = gi * S_len + k0 + j;
          for (int64_t d = 0; d < D; ++d) {
            dk[r * D + d] = from_acc<In>(scale * dk_acc[j * dp + d]);
            dv[r * D + d] = from_acc<In>(dv_acc[j * dp + d]);
          }
        }
      }
      if (splits == 1) {
        for (int64_t g = 0; g < group; ++g) {
          const int64_t bh = b * H + (gi % Hkv) * group + g;
          for (int64_t t = 0; t < T_len; ++t)
            for (int64_t d = 0; d < D; ++d)
              dq[(bh * T_len + t) * D + d] = from_acc<In>(scale * dq_acc[(g * T_len + t) * dp + d]);
        }
      }
    }
  });

  if (splits > 1) sum_dq_partials(sh, splits, dp, dq_partial, scale, dq);
}

}  // namespace

void attention_backward(DType dtype, const AttentionShape& shape, const void* q, const void* k, const void* v,
                        const void* out, const void* lse, const void* dout, void* dq, void* dk, void* dv) {
  validate("attention_backward", dtype, shape);
  const int64_t q_elems = shape.batch * shape.heads * shape.q_len * shape.head_dim;
  const int64_t kv_elems = shape.batch * shape.kv_heads * shape.kv_len * shape.head_dim;
  if (q_elems == 0 && kv_elems == 0) return;
  if ((q_elems > 0 && (q == nullptr || out == nullptr || dout == nullptr || dq == nullptr || lse == nullptr)) ||
      (kv_elems > 0 && (k == nullptr || v == nullptr || dk == nullptr || dv == nullptr)))
    fail<ValueError>("attention_backward: null data pointer for a non-empty tensor");
  switch (dtype) {
    case DType::Float64:
      backward_impl(shape, static_cast<const double*>(q), static_cast<const double*>(k), static_cast<const double*>(v),
                    static_cast<const double*>(out), static_cast<const double*>(lse), static_cast<const double*>(dout),
                    static_cast<double*>(dq), static_cast<double*>(dk), static_cast<double*>(dv));
      break;
    case DType::Float32:
      backward_impl(shape, static_cast<const float*>(q), static_cast<const float*>(k), static_cast<const float*>(v),
                    static_cast<const float*>(out), static_cast<const float*>(lse), static_cast<const float*>(dout),
                    static_cast<float*>(dq), static_cast<float*>(dk), static_cast<float*>(dv));
      break;
    case DType::BFloat16:
      if (attention_bf16_native()) {
        attention_backward_avx512bf16(
            shape, static_cast<const bfloat16*>(q), static_cast<const bfloat16*>(k), static_cast<const bfloat16*>(v),
            static_cast<const bfloat16*>(out), static_cast<const float*>(lse), static_cast<const bfloat16*>(dout),
            static_cast<bfloat16*>(dq), static_cast<bfloat16*>(dk), static_cast<bfloat16*>(dv));
        break;
      }
      backward_impl(shape, static_cast<const bfloat16*>(q), static_cast<const bfloat16*>(k),
                    static_cast<const bfloat16*>(v), static_cast<const bfloat16*>(out), static_cast<const float*>(lse),
                    static_cast<const bfloat16*>(dout), static_cast<bfloat16*>(dq), static_cast<bfloat16*>(dk),
                    static_cast<bfloat16*>(dv));
      break;
    default:
      backward_impl(shape, static_cast<const float16*>(q), static_cast<const float16*>(k),
                    static_cast<const float16*>(v), static_cast<const float16*>(out), static_cast<const float*>(lse),
                    static_cast<const float16*>(dout), static_cast<float16*>(dq), static_cast<float16*>(dk),
                    static_cast<float16*>(dv));
      break;
  }
}

}  // namespace tessera::cpu
