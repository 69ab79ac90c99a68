// Attention backward, v2 (TESSERA_ATTENTION_KERNEL=v2, the default): the deterministic
// scheme of flash_attention_backward.cu (delta first; one kernel owns dK/dV of a key
// tile, summing the G query heads of its kv head in a fixed order; a second kernel owns
// dQ of a query tile, recomputing S and dP; no atomics) with the memory path of the v2
// forward (flash_attention_forward_v2.cu):
//  * the streamed operands (Q, dO, lse, delta in the dK/dV kernel; K, V in the dQ kernel)
//    are double-buffered with cp.async, one barrier per step;
//  * every MMA operand comes from a row-major shared tile through ldmatrix, the ones
//    needed transposed (Q and dO as B of dV += P^T dO, dK += dS^T Q; K as B of
//    dQ += dS K) through ldmatrix.trans, so no tile is stored transposed any more;
//  * 16 rows (keys, resp. queries) per warp; dK/dV: 4 warps (D = 64, 154 registers, 3
//    CTAs per SM) or 8 warps (D = 128, 245 registers, 1 CTA); dQ: 8 warps, 128 queries,
//    at most 128 registers (2 CTAs per SM);
//  * causal: steps wholly masked for a warp skip its math (they add exact zeros), only
//    steps crossing the diagonal or a sequence end pay for the mask (every step, with
//    segment ids, whose streamed rows come into shared memory with the tiles);
//  * strided operands (Params' strides; dQ with q's, dK and dV with k's and v's): only
//    row bases and the tile copies' row stride change, so the results are bitwise those of
//    the contiguous layout. The per-step row bases are stashed in shared memory (QSources,
//    KvSources) and the epilogues derive the block's (b, head) again from the block index,
//    so no 64-bit base lives in registers through the loops.
// P uses the lse the forward wrote, in base 2: P = exp2(S scale log2 e - lse log2 e). A
// row with lse = -inf (no visible key) takes +inf instead, so its P is exactly 0; rows
// past the end of the sequence are zero-filled (lse, delta 0 and Q, dO rows 0, so their
// P^T dO and dS^T are 0 as well) and masked where a tile crosses the end.
//
// dK/dV kernel (bwd_dkdv_v2_kernel<T, D>): CTA = (batch, kv head, 16 kWarps keys); warp w owns
// keys k0 + 16 w .. + 15 and computes per step of kBM = 32 queries
//   S^T = K Q^T, dP^T = V dO^T                [16 keys x 32 queries]
//   P^T, dS^T = P^T (dP^T - delta)
//   dV += P^T dO, dK += dS^T Q                [16 keys x D]
// dK, dV (2 D floats per thread) stay in registers; K, V in shared memory for the whole
// kernel. The steps walk (query head g = 0 .. G-1) x (query tiles from the first that
// sees the CTA's first key), the same order on every run.
//
// dQ kernel (bwd_dq_v2_kernel<T, D>): CTA = (batch * head, 128 queries); warp w owns
// queries q0 + 16 w .. + 15; per key tile of kBN = 32 (D = 64) or 16 (D = 128) keys:
//   S = Q K^T, dP = dO V^T                    [16 queries x kBN keys]
//   dS = P (dP - delta), dQ += dS K            [16 queries x D]
//
// Pipelines as in the forward: prologue copies (the CTA's resident tiles and step 0),
// one commit group; step j: wait_group 0, __syncthreads, copies of step j + 1 into the
// other buffer, commit, compute step j from buffer j % 2.
#include <algorithm>

#include "backend/cuda/kernels/flash_attention_common.cuh"
#include "backend/cuda/kernels/flash_attention_fragments.h"
#include "backend/cuda/kernels/flash_attention_v2.cuh"

namespace tessera::cuda::flash {
namespace {

// lse in base 2 for P = exp2(s - lse2); +inf for a row without a visible key (P = 0).
__device__ __forceinline__ float lse_base2(float lse) { return lse == -INFINITY ? INFINITY : lse * kLog2e; }

// ---------------------------------------------------------------------------------
// dK, dV.

// The rows a dK/dV step reads, for the kv head's first query head (gi = 0) and query 0:
// CTA-uniform pointers kept in shared memory rather than registers (dK and dV fill the
// register budget); thread 0 stores them before the loop's first barrier, each step loads
// them after its barrier and adds its query head and first query.
struct QSources {
  const uint16_t* q;
  const uint16_t* dout;
  const float* lse;
  const float* delta;
  const int32_t* seg;
};

template <int D>
struct BwdKvV2Config {
  // dK and dV alone take D / 2 registers per thread: D = 64 fits 168 registers (3 CTAs
  // of 4 warps per SM), D = 128 needs nearly 255 (one CTA of 8 warps).
  static constexpr int kWarps = D == 64 ? 4 : 8, kThreads = 32 * kWarps;
  static constexpr int kMinBlocks = D == 64 ? 3 : 1;
  static constexpr int kBN = 16 * kWarps;  // keys per CTA
  static constexpr int kBM = 32;           // queries per step
  static constexpr int kLd = D + 8;        // row stride (elements) of the 16-bit tiles
  static constexpr int kKvElems = kBN * kLd, kStepElems = kBM * kLd;
  // sK, sV, then per buffer sQ, sdO; then per buffer lse, delta (float), segment ids
  // (int32); then the QSources.
  static constexpr size_t kTile16Bytes = sizeof(uint16_t) * static_cast<size_t>(2 * kKvElems + 4 * kStepElems);
  static constexpr size_t kSmemBytes = kTile16Bytes + sizeof(float) * 6 * kBM + sizeof(QSources);
  static_assert(kTile16Bytes % 16 == 0, "the float arrays follow the 16-bit tiles");
};

template <typename T, int D, bool kSegments>
__global__ void __launch_bounds__(BwdKvV2Config<D>::kThreads, BwdKvV2Config<D>::kMinBlocks)
    bwd_dkdv_v2_kernel(const Params p) {
  using C = BwdKvV2Config<D>;
  constexpr int kBN = C::kBN, kBM = C::kBM, kLd = C::kLd, kThreads = C::kThreads;
  constexpr uint32_t kStepBytes = 2 * C::kStepElems;
  unsigned char* smem = dynamic_smem();
  const uint32_t sK = smem_u32(smem);                                           // [kBN][kLd]
  const uint32_t sV = sK + 2 * C::kKvElems;                                     // [kBN][kLd]
  const uint32_t sQ = sV + 2 * C::kKvElems;                                     // [2][kBM][kLd]
  const uint32_t sdO = sQ + 2 * kStepBytes;                                     // [2][kBM][kLd]
  const uint32_t sLse = sdO + 2 * kStepBytes;                                   // [2][kBM] float
  const uint32_t sDelta = sLse + 4 * 2 * kBM;                                   // [2][kBM] float
  const uint32_t sSeg = sDelta + 4 * 2 * kBM;                                   // [2][kBM] int32
  const float* lse_f = reinterpret_cast<const float*>(smem + C::kTile16Bytes);  // same bytes as sLse
  const float* delta_f = lse_f + 2 * kBM;                                       // same bytes as sDelta
  const int32_t* seg_f = reinterpret_cast<const int32_t*>(delta_f + 2 * kBM);   // same bytes as sSeg
  QSources* stash = reinterpret_cast<QSources*>(smem + C::kTile16Bytes + sizeof(float) * 6 * kBM);

  const int tid = thread_index(), warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  // Block -> (batch * kv head, key tile), the first key tiles (the most query tiles when
  // causal) first.
  const int64_t BHkv = p.B * p.Hkv;
  const int64_t bkv = block_index() % BHkv, kt = block_index() / BHkv;
  const int64_t b = bkv / p.Hkv, kvh = bkv % p.Hkv, G = p.H / p.Hkv;
  // Positions in 32 bits (the launcher checks T, S < 2^31 - 2 * 128).
  const int k0 = static_cast<int>(kt * kBN), Tq = static_cast<int>(p.T), S = static_cast<int>(p.S);
  const int k_valid = std::min(S - k0, kBN);
  // Row bases (strides: Params), once per CTA: the QSources of the steps.
  const int64_t lse_base = (b * p.H + kvh * G) * Tq;
  const int32_t* seg_row = kSegments ? p.segments + b * Tq : nullptr;
  const QSources sources = {static_cast<const uint16_t*>(p.q) + b * p.qs.batch + kvh * p.qs.group,
                            static_cast<const uint16_t*>(p.dout) + b * p.os.batch + kvh * G * p.os.head,
                            p.lse + lse_base, p.delta + lse_base, seg_row};
  if (tid == 0) *stash = sources;

  // This thread's keys (C fragment rows g, g + 8 of the warp's 16): elements 0, 1 are
  // key[0], elements 2, 3 key[1].
  const int key[2] = {k0 + warp * 16 + g, k0 + warp * 16 + g + 8};
  const int warp_first = k0 + warp * 16, warp_last = warp_first + 15;
  // Segment ids (T == S): a query sees only the keys of its own document. A template
  // parameter, so that the kernel without them keeps its registers (runtime tests of
  // p.segments cost the unpacked backward ~13%).
  const int32_t key_seg[2] = {kSegments && key[0] < S ? seg_row[key[0]] : 0,
                              kSegments && key[1] < S ? seg_row[key[1]] : 0};

  // Steps: query head gi = j / steps_per_head, query tile qt_begin + j % steps_per_head.
  const int n_qtiles = (Tq + kBM - 1) / kBM;
  const int qt_begin = p.causal ? k0 / kBM : 0;  // query t sees key k0 iff t >= k0
  const int steps_per_head = std::max(n_qtiles - qt_begin, 0);
  const int64_t n_steps = G * steps_per_head;

  const LaneRowCol la = ldsm_a_lane(lane), lb = ldsm_b_nk_lane(lane), lt = ldsm_b_kn_trans_lane(lane);
  const uint32_t k_lane = sK + 2 * ((warp * 16 + la.row) * kLd + la.col);  // A: K rows of the warp
  const uint32_t v_lane = sV + 2 * ((warp * 16 + la.row) * kLd + la.col);
  const uint32_t qb_off = 2 * (lb.row * kLd + lb.col);  // B = Q^T, dO^T of S^T, dP^T (plain)
  const uint32_t qt_off = 2 * (lt.row * kLd + lt.col);  // B = Q, dO of dK, dV (.trans)

  // Queues the copies of step j into buffer buf.
  const auto load_step = [&](int64_t j, uint32_t buf, const QSources& src) {
    const int64_t gi = j / steps_per_head;
    const int q0 = (qt_begin + static_cast<int>(j % steps_per_head)) * kBM;
    const int q_valid = std::min(Tq - q0, kBM);
    cp_async_tile<D, kBM, kThreads, kLd>(sQ + buf * kStepBytes, src.q + gi * p.qs.head + q0 * p.qs.row, p.qs.row,
                                         q_valid);
    cp_async_tile<D, kBM, kThreads, kLd>(sdO + buf * kStepBytes, src.dout + gi * p.os.head + q0 * p.os.row, p.os.row,
                                         q_valid);
    if (tid < 2 * kBM) {  // lse (threads 0 .. kBM - 1), delta (kBM .. 2 kBM - 1); rows past T: 0
      const int i = tid % kBM;
      const float* from = (tid < kBM ? src.lse : src.delta) + gi * Tq + q0 + (i < q_valid ? i : 0);
      cp_async_4((tid < kBM ? sLse : sDelta) + 4 * (buf * kBM + i), from, i < q_valid ? 4 : 0);
    }
    if (kSegments) cp_async_ids<kBM, 2 * kBM>(sSeg + 4 * buf * kBM, src.seg + q0, q_valid);  // threads 2 kBM ..
  };

  if (n_steps > 0) {
    const int64_t kv_offset = b * p.kvs.batch + kvh * p.kvs.head + k0 * p.kvs.row;
    cp_async_tile<D, kBN, kThreads, kLd>(sK, static_cast<const uint16_t*>(p.k) + kv_offset, p.kvs.row, k_valid);
    cp_async_tile<D, kBN, kThreads, kLd>(sV, static_cast<const uint16_t*>(p.v) + kv_offset, p.kvs.row, k_valid);
    load_step(0, 0, sources);
    cp_async_commit();
  }

  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int nd = 0; nd < D / 8; ++nd)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[nd][e] = dv[nd][e] = 0.0f;
  const float scale_log2 = p.scale * kLog2e;

  for (int64_t j = 0; j < n_steps; ++j) {
    const uint32_t buf = static_cast<uint32_t>(j & 1);
    cp_async_wait<0>();
    cta_sync();
    if (j + 1 < n_steps) {
      load_step(j + 1, buf ^ 1u, *stash);
      cp_async_commit();
    }

    const int q0 = (qt_begin + static_cast<int>(j % steps_per_head)) * kBM;
    // Causal: a step whose last query precedes the warp's first key adds P^T = 0: skip.
    if (p.causal && q0 + kBM - 1 < warp_first) continue;  // warp-uniform

    const uint32_t q_buf = sQ + buf * kStepBytes, o_buf = sdO + buf * kStepBytes;

    // S^T = K Q^T and dP^T = V dO^T: A = the warp's K / V rows; B[d][query] = Q[query][d]
    // from Q's row-major tile (two 8-query n-tiles per ldmatrix).
    float st[kBM / 8][4], dpt[kBM / 8][4];
#pragma unroll
    for (int n = 0; n < kBM / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) st[n][e] = dpt[n][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t ka[4], va[4];
      ldsm_x4(ka, k_lane + 2 * kk * 16);
      ldsm_x4(va, v_lane + 2 * kk * 16);
#pragma unroll
      for (int np = 0; np < kBM / 16; ++np) {
        uint32_t qb[4], ob[4];
        ldsm_x4(qb, q_buf + qb_off + 2 * (np * 16 * kLd + kk * 16));
        ldsm_x4(ob, o_buf + qb_off + 2 * (np * 16 * kLd + kk * 16));
        const uint32_t q0b[2] = {qb[0], qb[1]}, q1b[2] = {qb[2], qb[3]};
        const uint32_t o0b[2] = {ob[0], ob[1]}, o1b[2] = {ob[2], ob[3]};
        mma_16816<T>(st[2 * np], ka, q0b);
        mma_16816<T>(st[2 * np + 1], ka, q1b);
        mma_16816<T>(dpt[2 * np], va, o0b);
        mma_16816<T>(dpt[2 * np + 1], va, o1b);
      }
    }

    // P^T and dS^T. Element e of n-tile n: key[e / 2], query column qi = 8 n + 2 t + e % 2.
    // Masked: queries past T, keys past S, (causal) keys after the query, and (segment
    // ids) keys of other documents.
    const bool needs_mask = q0 + kBM > Tq || warp_last >= S || (p.causal && q0 < warp_last) || kSegments;
#pragma unroll
    for (int n = 0; n < kBM / 8; ++n) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int qi = n * 8 + 2 * t + h;
        const float lse2 = lse_base2(lse_f[buf * kBM + qi]), delta = delta_f[buf * kBM + qi];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int e = 2 * r + h;
          bool visible = true;
          if (needs_mask) {
            const int q = q0 + qi;
            visible = q < Tq && key[r] < S && (!p.causal || key[r] <= q) &&
                      (!kSegments || seg_f[buf * kBM + qi] == key_seg[r]);
          }
          const float pt = visible ? exp2f(st[n][e] * scale_log2 - lse2) : 0.0f;
          st[n][e] = pt;
          dpt[n][e] = pt * (dpt[n][e] - delta);
        }
      }
    }

    // dV += P^T dO, dK += dS^T Q: k-step kk covers queries 16 kk .. 16 kk + 15 (n-tiles
    // 2 kk, 2 kk + 1 of P^T / dS^T are the A fragment); B[query][d] = dO[query][d] by
    // ldmatrix.trans of the row-major tile (two 8-wide d-tiles per ldmatrix).
#pragma unroll
    for (int kk = 0; kk < kBM / 16; ++kk) {
      const uint32_t pa[4] = {pack2<T>(st[2 * kk][0], st[2 * kk][1]), pack2<T>(st[2 * kk][2], st[2 * kk][3]),
                              pack2<T>(st[2 * kk + 1][0], st[2 * kk + 1][1]),
                              pack2<T>(st[2 * kk + 1][2], st[2 * kk + 1][3])};
      const uint32_t da[4] = {pack2<T>(dpt[2 * kk][0], dpt[2 * kk][1]), pack2<T>(dpt[2 * kk][2], dpt[2 * kk][3]),
                              pack2<T>(dpt[2 * kk + 1][0], dpt[2 * kk + 1][1]),
                              pack2<T>(dpt[2 * kk + 1][2], dpt[2 * kk + 1][3])};
#pragma unroll
      for (int nd2 = 0; nd2 < D / 16; ++nd2) {
        uint32_t ob[4], qb[4];
        ldsm_x4_trans(ob, o_buf + qt_off + 2 * (kk * 16 * kLd + nd2 * 16));
        ldsm_x4_trans(qb, q_buf + qt_off + 2 * (kk * 16 * kLd + nd2 * 16));
        const uint32_t o0b[2] = {ob[0], ob[1]}, o1b[2] = {ob[2], ob[3]};
        const uint32_t q0b[2] = {qb[0], qb[1]}, q1b[2] = {qb[2], qb[3]};
        mma_16816<T>(dv[2 * nd2], pa, o0b);
        mma_16816<T>(dv[2 * nd2 + 1], pa, o1b);
        mma_16816<T>(dk[2 * nd2], da, q0b);
        mma_16816<T>(dk[2 * nd2 + 1], da, q1b);
      }
    }
  }

  // dK = scale * (dS^T Q), dV as accumulated; rows past S are not written. With no step
  // (causal keys past the last query) both are 0.
  // Row 0 of the kv head, from the block index again: the loop above held neither b nor kvh.
  const int64_t bkv_e = block_index_again() % BHkv, b_e = bkv_e / p.Hkv, kvh_e = bkv_e - b_e * p.Hkv;
  const int64_t kv_base = b_e * p.kvs.batch + kvh_e * p.kvs.head;
  uint16_t* dkg = static_cast<uint16_t*>(p.dk) + kv_base;
  uint16_t* dvg = static_cast<uint16_t*>(p.dv) + kv_base;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (key[r] >= S) continue;
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd) {
      const int64_t at = key[r] * p.kvs.row + nd * 8 + 2 * t;
      st32(dkg + at, pack2<T>(p.scale * dk[nd][2 * r], p.scale * dk[nd][2 * r + 1]));
      st32(dvg + at, pack2<T>(dv[nd][2 * r], dv[nd][2 * r + 1]));
    }
  }
}

// ---------------------------------------------------------------------------------
// dQ.

template <int D>
struct BwdQV2Config {
  static constexpr int kWarps = 8, kThreads = 32 * kWarps;
  static constexpr int kBM = 16 * kWarps;        // queries per CTA
  static constexpr int kBN = D == 64 ? 32 : 16;  // keys per tile (128 registers, no spills)
  static constexpr int kLd = D + 8;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  // sm_80's ptxas spills 8 bytes of the D = 128 kernel at 128 registers: one CTA per SM
  // there (the H100 keeps two).
  static constexpr int kMinBlocks = D == 128 ? 1 : 2;
#else
  static constexpr int kMinBlocks = 2;
#endif
  static constexpr int kQElems = kBM * kLd, kTileElems = kBN * kLd;
  // sQ, sdO, then per buffer sK, sV; then [2][kBN] segment ids of the key tiles (int32)
  // and the KvSources.
  static constexpr size_t kTileBytes = sizeof(uint16_t) * static_cast<size_t>(2 * kQElems + 4 * kTileElems);
  static constexpr size_t kSegBytes = sizeof(int32_t) * 2 * kBN;
  static constexpr size_t kSmemBytes = kTileBytes + kSegBytes + sizeof(KvSources);
};

template <typename T, int D, bool kSegments>
__global__ void __launch_bounds__(BwdQV2Config<D>::kThreads, BwdQV2Config<D>::kMinBlocks)
    bwd_dq_v2_kernel(const Params p) {
  using C = BwdQV2Config<D>;
  constexpr int kBM = C::kBM, kBN = C::kBN, kLd = C::kLd, kThreads = C::kThreads;
  constexpr uint32_t kTileBytes = 2 * C::kTileElems;
  const uint32_t sQ = smem_u32(dynamic_smem());  // [kBM][kLd]
  const uint32_t sdO = sQ + 2 * C::kQElems;      // [kBM][kLd]
  const uint32_t sK = sdO + 2 * C::kQElems;      // [2][kBN][kLd]
  const uint32_t sV = sK + 2 * kTileBytes;       // [2][kBN][kLd]
  const uint32_t sSeg = sQ + C::kTileBytes;      // [2][kBN] int32
  const int32_t* seg_tiles = reinterpret_cast<const int32_t*>(dynamic_smem() + C::kTileBytes);
  KvSources* stash = reinterpret_cast<KvSources*>(dynamic_smem() + C::kTileBytes + C::kSegBytes);

  const int tid = thread_index(), warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int64_t BH = p.B * p.H, n_qtiles = ceil_div(p.T, kBM);
  const int64_t bh = block_index() % BH, qt = n_qtiles - 1 - block_index() / BH;
  const int64_t b = bh / p.H, h = bh % p.H, G = p.H / p.Hkv, kvh = h / G;
  const int q0 = static_cast<int>(qt * kBM), Tq = static_cast<int>(p.T), S = static_cast<int>(p.S);
  const int q_valid = std::min(Tq - q0, kBM);
  // Row bases (strides: Params): key/value row 0 of the kv head, also stashed for the loop
  // (KvSources), with the batch's segment ids.
  const int64_t kv_base = b * p.kvs.batch + kvh * p.kvs.head;
  const uint16_t* k = static_cast<const uint16_t*>(p.k) + kv_base;
  const uint16_t* v = static_cast<const uint16_t*>(p.v) + kv_base;
  const int32_t* seg_row = kSegments ? p.segments + b * Tq : nullptr;
  if (tid == 0) *stash = {k, v, seg_row};

  const int r_lo = warp * 16 + g;
  const int row[2] = {q0 + r_lo, q0 + r_lo + 8};
  const int warp_first = q0 + warp * 16, warp_last = warp_first + 15;
  const int32_t row_seg[2] = {kSegments && row[0] < Tq ? seg_row[row[0]] : 0,
                              kSegments && row[1] < Tq ? seg_row[row[1]] : 0};
  float lse2[2], delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const bool real = row[r] < Tq;
    lse2[r] = real ? lse_base2(p.lse[bh * Tq + row[r]]) : INFINITY;  // rows past T: P = 0
    delta[r] = real ? p.delta[bh * Tq + row[r]] : 0.0f;
  }

  const int n_ktiles = (S + kBN - 1) / kBN;
  const int kt_end = p.causal ? std::min(n_ktiles, (q0 + q_valid + kBN - 1) / kBN) : n_ktiles;

  const LaneRowCol la = ldsm_a_lane(lane), lb = ldsm_b_nk_lane(lane), lt = ldsm_b_kn_trans_lane(lane);
  const uint32_t q_lane = sQ + 2 * ((warp * 16 + la.row) * kLd + la.col);  // A: Q rows of the warp
  const uint32_t o_lane = sdO + 2 * ((warp * 16 + la.row) * kLd + la.col);
  const uint32_t kb_lane = sK + 2 * (lb.row * kLd + lb.col);  // B = K^T of S (plain)
  const uint32_t vb_lane = sV + 2 * (lb.row * kLd + lb.col);  // B = V^T of dP (plain)
  const uint32_t kt_lane = sK + 2 * (lt.row * kLd + lt.col);  // B = K of dQ (.trans)

  if (kt_end > 0) {  // S = 0: dQ = 0
    const uint16_t* q = static_cast<const uint16_t*>(p.q) + b * p.qs.batch + kvh * p.qs.group +
                        (h - kvh * G) * p.qs.head + q0 * p.qs.row;
    const uint16_t* dout = static_cast<const uint16_t*>(p.dout) + b * p.os.batch + h * p.os.head + q0 * p.os.row;
    cp_async_tile<D, kBM, kThreads, kLd>(sQ, q, p.qs.row, q_valid);
    cp_async_tile<D, kBM, kThreads, kLd>(sdO, dout, p.os.row, q_valid);
    const int k_valid0 = std::min(S, kBN);
    cp_async_tile<D, kBN, kThreads, kLd>(sK, k, p.kvs.row, k_valid0);
    cp_async_tile<D, kBN, kThreads, kLd>(sV, v, p.kvs.row, k_valid0);
    if (kSegments) cp_async_ids<kBN>(sSeg, seg_row, k_valid0);
    cp_async_commit();
  }

  float dq[D / 8][4];
#pragma unroll
  for (int nd = 0; nd < D / 8; ++nd) dq[nd][0] = dq[nd][1] = dq[nd][2] = dq[nd][3] = 0.0f;
  const float scale_log2 = p.scale * kLog2e;

  for (int kt = 0; kt < kt_end; ++kt) {
    const uint32_t buf = static_cast<uint32_t>(kt & 1);
    cp_async_wait<0>();
    cta_sync();
    if (kt + 1 < kt_end) {
      const int k1 = (kt + 1) * kBN;
      const int valid1 = std::min(S - k1, kBN);
      const int64_t offset = k1 * p.kvs.row;
      cp_async_tile<D, kBN, kThreads, kLd>(sK + (buf ^ 1u) * kTileBytes, stash->k + offset, p.kvs.row, valid1);
      cp_async_tile<D, kBN, kThreads, kLd>(sV + (buf ^ 1u) * kTileBytes, stash->v + offset, p.kvs.row, valid1);
      if (kSegments) cp_async_ids<kBN>(sSeg + (buf ^ 1u) * 4 * kBN, stash->seg + k1, valid1);
      cp_async_commit();
    }

    const int k0 = kt * kBN;
    // Causal: a tile wholly after the warp's last query adds dS = 0: skip it.
    if (p.causal && k0 > warp_last) continue;  // warp-uniform

    const uint32_t tile = buf * kTileBytes;

    // S = Q K^T, dP = dO V^T: A = the warp's Q / dO rows, B[d][key] = K[key][d] (V) from
    // the row-major tiles (two 8-key n-tiles per ldmatrix).
    float s[kBN / 8][4], dp[kBN / 8][4];
#pragma unroll
    for (int n = 0; n < kBN / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t qa[4], oa[4];
      ldsm_x4(qa, q_lane + 2 * kk * 16);
      ldsm_x4(oa, o_lane + 2 * kk * 16);
#pragma unroll
      for (int np = 0; np < kBN / 16; ++np) {
        uint32_t kb[4], vb[4];
        ldsm_x4(kb, kb_lane + tile + 2 * (np * 16 * kLd + kk * 16));
        ldsm_x4(vb, vb_lane + tile + 2 * (np * 16 * kLd + kk * 16));
        const uint32_t k0b[2] = {kb[0], kb[1]}, k1b[2] = {kb[2], kb[3]};
        const uint32_t v0b[2] = {vb[0], vb[1]}, v1b[2] = {vb[2], vb[3]};
        mma_16816<T>(s[2 * np], qa, k0b);
        mma_16816<T>(s[2 * np + 1], qa, k1b);
        mma_16816<T>(dp[2 * np], oa, v0b);
        mma_16816<T>(dp[2 * np + 1], oa, v1b);
      }
    }

    // dS = P (dP - delta), in place of s. Element e: row[e / 2], key k0 + 8 n + 2 t + e % 2.
    const bool needs_mask = k0 + kBN > S || (p.causal && k0 + kBN - 1 > warp_first) || kSegments;
    const int32_t* seg = seg_tiles + buf * kBN;  // keys k0 ..
#pragma unroll
    for (int n = 0; n < kBN / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        bool visible = true;
        if (needs_mask) {
          const int col = k0 + n * 8 + 2 * t + (e & 1);
          visible = col < S && (!p.causal || col <= row[r]) && (!kSegments || seg[col - k0] == row_seg[r]);
        }
        const float pr = visible ? exp2f(s[n][e] * scale_log2 - lse2[r]) : 0.0f;
        s[n][e] = pr * (dp[n][e] - delta[r]);
      }
    }

    // dQ += dS K: k-step kk covers keys 16 kk .. 16 kk + 15; B[key][d] = K[key][d] by
    // ldmatrix.trans of the row-major tile (two 8-wide d-tiles per ldmatrix).
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      const uint32_t da[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]), pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                              pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int nd2 = 0; nd2 < D / 16; ++nd2) {
        uint32_t kb[4];
        ldsm_x4_trans(kb, kt_lane + tile + 2 * (kk * 16 * kLd + nd2 * 16));
        const uint32_t k0b[2] = {kb[0], kb[1]}, k1b[2] = {kb[2], kb[3]};
        mma_16816<T>(dq[2 * nd2], da, k0b);
        mma_16816<T>(dq[2 * nd2 + 1], da, k1b);
      }
    }
  }

  // dQ row 0 of the head, from the block index again: the loop above held neither b nor h.
  const int64_t bh_e = block_index_again() % BH, b_e = bh_e / p.H, h_e = bh_e - b_e * p.H, kvh_e = h_e / G;
  uint16_t* dqg = static_cast<uint16_t*>(p.dq) + b_e * p.qs.batch + kvh_e * p.qs.group + (h_e - kvh_e * G) * p.qs.head;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= Tq) continue;
    uint16_t* out = dqg + row[r] * p.qs.row;
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd)
      st32(out + nd * 8 + 2 * t, pack2<T>(p.scale * dq[nd][2 * r], p.scale * dq[nd][2 * r + 1]));
  }
}

// The conditions of backward_v2_applies that depend on D.
template <int D>
bool bwd_v2_fits(const Params& p) {
  using Kv = BwdKvV2Config<D>;
  using Q = BwdQV2Config<D>;
  if (p.T > INT32_MAX - 2 * Q::kBM || p.S > INT32_MAX - 2 * Kv::kBN) return false;  // 32-bit positions
  const size_t optin = static_cast<size_t>(max_dynamic_smem_per_block());
  return optin >= Kv::kSmemBytes && optin >= Q::kSmemBytes;
}

template <typename T, int D>
void launch_bwd_v2(const Params& p, cudaStream_t stream) {
  using Kv = BwdKvV2Config<D>;
  using Q = BwdQV2Config<D>;
  const int64_t kv_blocks = p.B * p.Hkv * ceil_div(p.S, Kv::kBN), q_blocks = p.B * p.H * ceil_div(p.T, Q::kBM);
  if (p.segments != nullptr) {
    launch(bwd_dkdv_v2_kernel<T, D, true>, kv_blocks, Kv::kThreads, Kv::kSmemBytes, stream, p);
    launch(bwd_dq_v2_kernel<T, D, true>, q_blocks, Q::kThreads, Q::kSmemBytes, stream, p);
  } else {
    launch(bwd_dkdv_v2_kernel<T, D, false>, kv_blocks, Kv::kThreads, Kv::kSmemBytes, stream, p);
    launch(bwd_dq_v2_kernel<T, D, false>, q_blocks, Q::kThreads, Q::kSmemBytes, stream, p);
  }
}

template <typename T>
void launch_bwd_v2_dims(const Params& p, cudaStream_t stream) {
  if (p.D == 64)
    launch_bwd_v2<T, 64>(p, stream);
  else
    launch_bwd_v2<T, 128>(p, stream);
}

}  // namespace

bool backward_v2_applies(DType dtype, const Params& p) {
  if (p.mask != nullptr || (dtype != DType::BFloat16 && dtype != DType::Float16)) return false;
  return p.D == 64 ? bwd_v2_fits<64>(p) : p.D == 128 && bwd_v2_fits<128>(p);
}

bool launch_backward_v2(DType dtype, const Params& p, cudaStream_t stream) {
  if (!backward_v2_applies(dtype, p)) return false;
  if (dtype == DType::BFloat16)
    launch_bwd_v2_dims<__nv_bfloat16>(p, stream);
  else
    launch_bwd_v2_dims<__half>(p, stream);
  return true;
}

}  // namespace tessera::cuda::flash
