// Attention backward on tensor cores (bf16/f16, D = 64/128): the dK/dV and dQ kernels
// of flash_attention_backward.cu's scheme (see there for the math and the order of
// every sum), and their launch.
#include <algorithm>

#include "backend/cuda/kernels/flash_attention.h"
#include "backend/cuda/kernels/flash_attention_backward_kernels.h"
#include "backend/cuda/kernels/flash_attention_common.cuh"

namespace tessera::cuda::flash {
namespace {

// ---------------------------------------------------------------------------------
// Tensor-core dK, dV: one CTA per (batch, kv head, 64-key tile). Warp w owns keys
// k0 + 16 w .. k0 + 16 w + 15 and computes the transposed products directly:
//   S^T = K Q^T, dP^T = V dO^T                 [16 keys x kBM queries per warp]
//   P^T = exp2(S^T scale log2 e - lse log2 e), dS^T = P^T * (dP^T - delta)
//   dV += P^T dO, dK += dS^T Q                 [16 keys x D]
// K and V (A operands) are read from shared memory; Q and dO row-major are the B operand
// of the first two (pairs along d), Q^T and dO^T that of the last two (pairs along the
// query). kBM (queries per step) is 64 for D = 64 and 32 for D = 128 (registers: the
// dK and dV fragments alone are D floats per thread).

template <int D, int kBM_>
struct BwdKvTcConfig {
  static constexpr int kWarps = 4, kThreads = 32 * kWarps;
  static constexpr int kBN = 16 * kWarps;  // keys per CTA
  static constexpr int kBM = kBM_;         // queries per step
  static constexpr int kLd = D + 8;        // row stride of the row-major tiles
  static constexpr int kLdT = kBM + 8;     // row stride of Q^T, dO^T
  static constexpr size_t kTile16 = sizeof(uint16_t) * (2 * kBN * kLd + 2 * kBM * kLd + 2 * D * kLdT);
  static constexpr size_t kSmemBytes = kTile16 + sizeof(float) * 2 * kBM;
  static_assert(kTile16 % 16 == 0, "float arrays follow the 16-bit tiles");
};

template <typename T, int D, int kBM>
__global__ void __launch_bounds__(128) bwd_dkdv_tc_kernel(const Params p) {
  using C = BwdKvTcConfig<D, kBM>;
  constexpr int kBN = C::kBN, kLd = C::kLd, kLdT = C::kLdT;
  uint16_t* sK = reinterpret_cast<uint16_t*>(dynamic_smem());  // [kBN][kLd]
  uint16_t* sV = sK + kBN * kLd;                               // [kBN][kLd]
  uint16_t* sQ = sV + kBN * kLd;                               // [kBM][kLd]
  uint16_t* sdO = sQ + kBM * kLd;                              // [kBM][kLd]
  uint16_t* sQt = sdO + kBM * kLd;                             // [D][kLdT]
  uint16_t* sdOt = sQt + D * kLdT;                             // [D][kLdT]
  float* sLse = reinterpret_cast<float*>(sdOt + D * kLdT);     // [kBM]
  float* sDelta = sLse + kBM;                                  // [kBM]

  const int tid = thread_index(), warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  // Block -> (batch*kv head, key tile), the first key tiles (the most query tiles when
  // causal) first.
  const int64_t BHkv = p.B * p.Hkv;
  const int64_t bkv = block_index() % BHkv, kt = block_index() / BHkv;
  const int64_t b = bkv / p.Hkv, kvh = bkv % p.Hkv, G = p.H / p.Hkv;
  const int64_t k0 = kt * kBN, Tq = p.T, S = p.S;
  const int k_valid = static_cast<int>(std::min<int64_t>(S - k0, kBN));
  const int64_t kv_offset = (bkv * S + k0) * D;

  load_tile<D, kBN, C::kThreads>(sK, kLd, static_cast<const uint16_t*>(p.k) + kv_offset, k_valid);
  load_tile<D, kBN, C::kThreads>(sV, kLd, static_cast<const uint16_t*>(p.v) + kv_offset, k_valid);

  // This thread's keys: tile rows kr (C elements 0, 1) and kr + 8 (elements 2, 3).
  const int kr = warp * 16 + g;
  const int64_t key[2] = {k0 + kr, k0 + kr + 8};

  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int nd = 0; nd < D / 8; ++nd)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[nd][e] = dv[nd][e] = 0.0f;
  const float scale_log2 = p.scale * kLog2e;

  const int64_t n_qtiles = ceil_div(Tq, kBM);
  const int64_t qt_begin = p.causal ? k0 / kBM : 0;  // query t sees key k0 iff t >= k0
  for (int64_t gi = 0; gi < G; ++gi) {
    const int64_t bh = b * p.H + kvh * G + gi;
    for (int64_t qt = qt_begin; qt < n_qtiles; ++qt) {
      const int64_t q0 = qt * kBM;
      const int q_valid = static_cast<int>(std::min<int64_t>(Tq - q0, kBM));
      const int64_t q_offset = (bh * Tq + q0) * D;
      cta_sync();  // the previous step's readers are done (first step: sK, sV written)
      const uint16_t* q = static_cast<const uint16_t*>(p.q) + q_offset;
      const uint16_t* dout = static_cast<const uint16_t*>(p.dout) + q_offset;
      load_tile<D, kBM, C::kThreads>(sQ, kLd, q, q_valid);
      load_tile<D, kBM, C::kThreads>(sdO, kLd, dout, q_valid);
      load_tile_transposed<D, kBM, C::kThreads>(sQt, kLdT, q, q_valid);
      load_tile_transposed<D, kBM, C::kThreads>(sdOt, kLdT, dout, q_valid);
      for (int i = tid; i < kBM; i += C::kThreads) {
        sLse[i] = i < q_valid ? p.lse[bh * Tq + q0 + i] : 0.0f;
        sDelta[i] = i < q_valid ? p.delta[bh * Tq + q0 + i] : 0.0f;
      }
      cta_sync();

      // S^T = K Q^T and dP^T = V dO^T: B[d][query] = Q[query][d] (pairs along d).
      float st[kBM / 8][4], dpt[kBM / 8][4];
#pragma unroll
      for (int n = 0; n < kBM / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[n][e] = dpt[n][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const uint16_t* kbase = sK + kr * kLd + kk * 16 + 2 * t;
        const uint16_t* vbase = sV + kr * kLd + kk * 16 + 2 * t;
        const uint32_t ka[4] = {ld32(kbase), ld32(kbase + 8 * kLd), ld32(kbase + 8), ld32(kbase + 8 * kLd + 8)};
        const uint32_t va[4] = {ld32(vbase), ld32(vbase + 8 * kLd), ld32(vbase + 8), ld32(vbase + 8 * kLd + 8)};
#pragma unroll
        for (int n = 0; n < kBM / 8; ++n) {
          const uint16_t* qbase = sQ + (n * 8 + g) * kLd + kk * 16 + 2 * t;
          const uint16_t* obase = sdO + (n * 8 + g) * kLd + kk * 16 + 2 * t;
          const uint32_t qb[2] = {ld32(qbase), ld32(qbase + 8)};
          const uint32_t ob[2] = {ld32(obase), ld32(obase + 8)};
          mma_16816<T>(st[n], ka, qb);
          mma_16816<T>(dpt[n], va, ob);
        }
      }

      // P^T and dS^T. Element e of tile n: key[e / 2], query column qi = n * 8 + 2t + e % 2.
      // Invisible pairs (padding, causal, a row with no visible key: lse = -inf) get 0.
#pragma unroll
      for (int n = 0; n < kBM / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int qi = n * 8 + 2 * t + (e & 1);
          const float lse_q = sLse[qi];
          const bool visible =
              qi < q_valid && key[e >> 1] < S && (!p.causal || key[e >> 1] <= q0 + qi) && lse_q != -INFINITY;
          const float pt = visible ? exp2f(st[n][e] * scale_log2 - lse_q * kLog2e) : 0.0f;
          st[n][e] = pt;
          dpt[n][e] = pt * (dpt[n][e] - sDelta[qi]);
        }
      }

      // dV += P^T dO, dK += dS^T Q: k-step kk covers queries 16 kk .. 16 kk + 15 (tiles
      // 2 kk, 2 kk + 1 of P^T / dS^T are the A fragment); B[query][d] = dO^T[d][query].
#pragma unroll
      for (int kk = 0; kk < kBM / 16; ++kk) {
        const uint32_t pa[4] = {pack2<T>(st[2 * kk][0], st[2 * kk][1]), pack2<T>(st[2 * kk][2], st[2 * kk][3]),
                                pack2<T>(st[2 * kk + 1][0], st[2 * kk + 1][1]),
                                pack2<T>(st[2 * kk + 1][2], st[2 * kk + 1][3])};
        const uint32_t da[4] = {pack2<T>(dpt[2 * kk][0], dpt[2 * kk][1]), pack2<T>(dpt[2 * kk][2], dpt[2 * kk][3]),
                                pack2<T>(dpt[2 * kk + 1][0], dpt[2 * kk + 1][1]),
                                pack2<T>(dpt[2 * kk + 1][2], dpt[2 * kk + 1][3])};
#pragma unroll
        for (int nd = 0; nd < D / 8; ++nd) {
          const uint16_t* obase = sdOt + (nd * 8 + g) * kLdT + kk * 16 + 2 * t;
          const uint16_t* qbase = sQt + (nd * 8 + g) * kLdT + kk * 16 + 2 * t;
          const uint32_t ob[2] = {ld32(obase), ld32(obase + 8)};
          const uint32_t qb[2] = {ld32(qbase), ld32(qbase + 8)};
          mma_16816<T>(dv[nd], pa, ob);
          mma_16816<T>(dk[nd], da, qb);
        }
      }
    }
  }

  // dK = scale * (dS^T Q), dV as accumulated; rows past S are not written.
  uint16_t* dkg = static_cast<uint16_t*>(p.dk) + bkv * S * D;
  uint16_t* dvg = static_cast<uint16_t*>(p.dv) + bkv * S * D;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (key[r] >= S) continue;
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd) {
      const int64_t at = key[r] * D + nd * 8 + 2 * t;
      st32(dkg + at, pack2<T>(p.scale * dk[nd][2 * r], p.scale * dk[nd][2 * r + 1]));
      st32(dvg + at, pack2<T>(dv[nd][2 * r], dv[nd][2 * r + 1]));
    }
  }
}

// ---------------------------------------------------------------------------------
// Tensor-core dQ: one CTA per (batch*head, 64-query tile); warp w owns queries
// q0 + 16 w .. q0 + 16 w + 15. Per key tile:
//   S = Q K^T, dP = dO V^T (B pairs along d: K, V row-major)
//   dS = P * (dP - delta), dQ += dS K (B[key][d] = K^T[d][key]: K^T in shared memory).

template <int D>
struct BwdQTcConfig {
  static constexpr int kWarps = 4, kThreads = 32 * kWarps;
  static constexpr int kBM = 16 * kWarps;  // queries per CTA
  static constexpr int kBN = 64;           // keys per tile
  static constexpr int kLd = D + 8;
  static constexpr int kLdT = kBN + 8;  // K^T row stride
  static constexpr size_t kSmemBytes = sizeof(uint16_t) * (2 * kBM * kLd + 2 * kBN * kLd + D * kLdT);
};

template <typename T, int D>
__global__ void __launch_bounds__(128) bwd_dq_tc_kernel(const Params p) {
  using C = BwdQTcConfig<D>;
  constexpr int kBM = C::kBM, kBN = C::kBN, kLd = C::kLd, kLdT = C::kLdT;
  uint16_t* sQ = reinterpret_cast<uint16_t*>(dynamic_smem());  // [kBM][kLd]
  uint16_t* sdO = sQ + kBM * kLd;                              // [kBM][kLd]
  uint16_t* sK = sdO + kBM * kLd;                              // [kBN][kLd]
  uint16_t* sV = sK + kBN * kLd;                               // [kBN][kLd]
  uint16_t* sKt = sV + kBN * kLd;                              // [D][kLdT]

  const int tid = thread_index(), warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int64_t BH = p.B * p.H, n_qtiles = ceil_div(p.T, kBM);
  const int64_t bh = block_index() % BH, qt = n_qtiles - 1 - block_index() / BH;
  const int64_t b = bh / p.H, h = bh % p.H, kvh = h / (p.H / p.Hkv);
  const int64_t q0 = qt * kBM, Tq = p.T, S = p.S;
  const int q_valid = static_cast<int>(std::min<int64_t>(Tq - q0, kBM));
  const uint16_t* k = static_cast<const uint16_t*>(p.k) + (b * p.Hkv + kvh) * S * D;
  const uint16_t* v = static_cast<const uint16_t*>(p.v) + (b * p.Hkv + kvh) * S * D;

  load_tile<D, kBM, C::kThreads>(sQ, kLd, static_cast<const uint16_t*>(p.q) + (bh * Tq + q0) * D, q_valid);
  load_tile<D, kBM, C::kThreads>(sdO, kLd, static_cast<const uint16_t*>(p.dout) + (bh * Tq + q0) * D, q_valid);

  const int r_lo = warp * 16 + g;
  const int64_t row[2] = {q0 + r_lo, q0 + r_lo + 8};
  float lse_log2[2], delta[2];
  bool row_live[2];  // a real row with some visible key
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float lse = row[r] < Tq ? p.lse[bh * Tq + row[r]] : -INFINITY;
    row_live[r] = lse != -INFINITY;
    lse_log2[r] = row_live[r] ? lse * kLog2e : 0.0f;
    delta[r] = row[r] < Tq ? p.delta[bh * Tq + row[r]] : 0.0f;
  }

  float dq[D / 8][4];
#pragma unroll
  for (int nd = 0; nd < D / 8; ++nd) dq[nd][0] = dq[nd][1] = dq[nd][2] = dq[nd][3] = 0.0f;
  const float scale_log2 = p.scale * kLog2e;

  const int64_t n_ktiles = ceil_div(S, kBN);
  const int64_t kt_end = p.causal ? std::min(n_ktiles, ceil_div(q0 + q_valid, kBN)) : n_ktiles;
  for (int64_t kt = 0; kt < kt_end; ++kt) {
    const int64_t k0 = kt * kBN;
    const int k_valid = static_cast<int>(std::min<int64_t>(S - k0, kBN));
    cta_sync();  // the previous tile is consumed (first: sQ, sdO written)
    load_tile<D, kBN, C::kThreads>(sK, kLd, k + k0 * D, k_valid);
    load_tile<D, kBN, C::kThreads>(sV, kLd, v + k0 * D, k_valid);
    load_tile_transposed<D, kBN, C::kThreads>(sKt, kLdT, k + k0 * D, k_valid);
    cta_sync();

    float s[kBN / 8][4], dp[kBN / 8][4];
#pragma unroll
    for (int n = 0; n < kBN / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint16_t* qbase = sQ + r_lo * kLd + kk * 16 + 2 * t;
      const uint16_t* obase = sdO + r_lo * kLd + kk * 16 + 2 * t;
      const uint32_t qa[4] = {ld32(qbase), ld32(qbase + 8 * kLd), ld32(qbase + 8), ld32(qbase + 8 * kLd + 8)};
      const uint32_t oa[4] = {ld32(obase), ld32(obase + 8 * kLd), ld32(obase + 8), ld32(obase + 8 * kLd + 8)};
#pragma unroll
      for (int n = 0; n < kBN / 8; ++n) {
        const uint16_t* kbase = sK + (n * 8 + g) * kLd + kk * 16 + 2 * t;
        const uint16_t* vbase = sV + (n * 8 + g) * kLd + kk * 16 + 2 * t;
        const uint32_t kb[2] = {ld32(kbase), ld32(kbase + 8)};
        const uint32_t vb[2] = {ld32(vbase), ld32(vbase + 8)};
        mma_16816<T>(s[n], qa, kb);
        mma_16816<T>(dp[n], oa, vb);
      }
    }

    // dS = P * (dP - delta), in place of s. Element e: row[e / 2], key column
    // k0 + n * 8 + 2t + e % 2.
#pragma unroll
    for (int n = 0; n < kBN / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        const int64_t col = k0 + n * 8 + 2 * t + (e & 1);
        const bool visible = row_live[r] && col < S && (!p.causal || col <= row[r]);
        const float pr = visible ? exp2f(s[n][e] * scale_log2 - lse_log2[r]) : 0.0f;
        s[n][e] = pr * (dp[n][e] - delta[r]);
      }
    }

    // dQ += dS K.
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      const uint32_t da[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]), pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                              pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int nd = 0; nd < D / 8; ++nd) {
        const uint16_t* base = sKt + (nd * 8 + g) * kLdT + kk * 16 + 2 * t;
        const uint32_t kb[2] = {ld32(base), ld32(base + 8)};
        mma_16816<T>(dq[nd], da, kb);
      }
    }
  }

  uint16_t* dqg = static_cast<uint16_t*>(p.dq);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= Tq) continue;
    uint16_t* out = dqg + (bh * Tq + row[r]) * D;
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd)
      st32(out + nd * 8 + 2 * t, pack2<T>(p.scale * dq[nd][2 * r], p.scale * dq[nd][2 * r + 1]));
  }
}

template <typename T, int D, int kBMkv>
void launch_tc_backward_d(const Params& p, cudaStream_t stream) {
  using Kv = BwdKvTcConfig<D, kBMkv>;
  using Q = BwdQTcConfig<D>;
  launch(bwd_dkdv_tc_kernel<T, D, kBMkv>, p.B * p.Hkv * ceil_div(p.S, Kv::kBN), Kv::kThreads, Kv::kSmemBytes, stream,
         p);
  launch(bwd_dq_tc_kernel<T, D>, p.B * p.H * ceil_div(p.T, Q::kBM), Q::kThreads, Q::kSmemBytes, stream, p);
}

template <typename T>
void launch_tc_backward(const Params& p, cudaStream_t stream) {
  if (p.D == 64) {
    launch_tc_backward_d<T, 64, 64>(p, stream);
  } else {
    launch_tc_backward_d<T, 128, 32>(p, stream);
  }
}

}  // namespace

void launch_backward_tensor_core(DType dtype, const Params& p, cudaStream_t stream) {
  switch (dtype) {
    case DType::BFloat16:
      launch_tc_backward<__nv_bfloat16>(p, stream);
      break;
    case DType::Float16:
      launch_tc_backward<__half>(p, stream);
      break;
    default:
      throw_value_error("flash_attention_backward: the tensor-core path takes bf16 or f16");
  }
}

}  // namespace tessera::cuda::flash
