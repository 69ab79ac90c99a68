// Attention forward, v2 (TESSERA_ATTENTION_KERNEL=v2, the default): the math of
// flash_attention_forward.cu's fwd_tc_kernel (online softmax in base 2, float32 m and l,
// lse = m ln 2 + ln l, out = 0 and lse = -inf for a row without a visible key), with the
// memory path rebuilt for latency:
//  * 8 warps x 16 query rows = 128 rows per CTA (v1: 64), so each K/V tile brought into
//    shared memory serves twice the rows;
//  * K/V tiles of 64 keys double-buffered with cp.async: tile kt + 1 is in flight while
//    tile kt is computed, one barrier per tile, no registers spent on the copies;
//  * ldmatrix x4 for every MMA operand (Q as A; K as B straight from its row-major tile;
//    V as B through ldmatrix.trans, so V is no longer transposed by scalar stores);
//  * causal: key tiles past the CTA's last query are not visited, a warp skips the math
//    of a tile that lies wholly after its 16 rows (exact: such a tile has p = 0 and
//    alpha = 1 for all of them), and only tiles that cross the diagonal or the sequence
//    end pay for the mask;
//  * Q stays in shared memory and its fragments are re-read (ldmatrix) every tile: held
//    in registers for the whole kernel they made ptxas spill under the 128-register cap
//    of two CTAs per SM (Q adds 1/8 to the shared-memory reads of K and V for D = 64).
//  * D = 128 uses 32-key tiles (the S fragments in half the registers).
//  * segment ids (packed documents): every tile is masked per element (no tile skipping
//    yet); the key tile's ids come into shared memory with K and V.
//  * strided operands (Params' strides, e.g. q, k, v read out of a fused QKV projection):
//    only the row bases and the row stride of the tile copies change, so the results are
//    bitwise those of the contiguous layout. The K/V row-0 pointers the loop needs are
//    stashed in shared memory (KvSources) and the epilogue derives (b, h) again from the
//    block index, so no 64-bit base lives in registers through the loop.
//
// Per CTA (kLd = D + 8): shared memory = Q [128][kLd] + 2 x K [kBN][kLd] + 2 x V [kBN][kLd]
// 16-bit elements, + 2 x kBN segment ids and 24 bytes of KvSources: 54.5 KiB (D = 64,
// kBN = 64), 68.3 KiB (D = 128, kBN = 32); 256 threads, at most 128 registers
// (__launch_bounds__(256, 2)): two CTAs (16 warps) per SM.
//
// Pipeline (one commit group per tile, issued one tile ahead):
//   prologue: cp.async Q, K_0, V_0; commit
//   tile kt:  wait_group 0          this thread's copies of tile kt (and Q) landed
//             __syncthreads         everyone's copies visible; everyone finished tile
//                                   kt - 1, so buffer (kt + 1) % 2 may be overwritten
//             cp.async K_kt+1, V_kt+1 into buffer (kt + 1) % 2; commit
//             compute on buffer kt % 2
// A buffer is written only after the barrier that follows the last reads of it, and read
// only after the wait + barrier that follow its writes; the last tile issues nothing, so
// no copy is in flight when the kernel ends.
#include <algorithm>

#include "backend/cuda/kernels/flash_attention_common.cuh"
#include "backend/cuda/kernels/flash_attention_fragments.h"
#include "backend/cuda/kernels/flash_attention_v2.cuh"

namespace tessera::cuda::flash {
namespace {

template <int D>
struct FwdV2Config {
  static constexpr int kWarps = 8, kThreads = 32 * kWarps;
  static constexpr int kBM = 16 * kWarps;        // query rows per CTA (16 per warp: one MMA row block)
  static constexpr int kBN = D == 64 ? 64 : 32;  // keys per tile (D = 128: S fragments in fewer registers)
  static constexpr int kLd = D + 8;              // row stride (elements) of every shared tile
  static constexpr int kMinBlocks = 2;           // CTAs per SM the register cap must allow
  static constexpr int kTileElems = kBN * kLd;
  static constexpr size_t kTileBytes = sizeof(uint16_t) * static_cast<size_t>(kBM * kLd + 4 * kTileElems);
  // Then [2][kBN] segment ids of the key tiles (int32) and the KvSources.
  static constexpr size_t kSegBytes = sizeof(int32_t) * 2 * kBN;
  static constexpr size_t kSmemBytes = kTileBytes + kSegBytes + sizeof(KvSources);
};

template <typename T, int D, bool kSegments>
__global__ void __launch_bounds__(FwdV2Config<D>::kThreads, FwdV2Config<D>::kMinBlocks) fwd_v2_kernel(const Params p) {
  using C = FwdV2Config<D>;
  constexpr int kBM = C::kBM, kBN = C::kBN, kLd = C::kLd, kThreads = C::kThreads;
  constexpr uint32_t kTileBytes = 2 * C::kTileElems;
  uint16_t* smem = reinterpret_cast<uint16_t*>(dynamic_smem());
  const uint32_t sQ = smem_u32(smem);        // [kBM][kLd]
  const uint32_t sK = sQ + 2 * kBM * kLd;    // [2][kBN][kLd]
  const uint32_t sV = sK + 2 * kTileBytes;   // [2][kBN][kLd]
  const uint32_t sSeg = sQ + C::kTileBytes;  // [2][kBN] int32
  const int32_t* seg_tiles = reinterpret_cast<const int32_t*>(dynamic_smem() + C::kTileBytes);
  KvSources* stash = reinterpret_cast<KvSources*>(dynamic_smem() + C::kTileBytes + C::kSegBytes);

  const int tid = thread_index(), warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  // Block -> (batch*head, query tile), the last query tiles (the most key tiles when
  // causal) first.
  const int64_t BH = p.B * p.H, n_qtiles = ceil_div(p.T, kBM);
  const int64_t bh = block_index() % BH, qt = n_qtiles - 1 - block_index() / BH;
  const int64_t b = bh / p.H, h = bh % p.H, G = p.H / p.Hkv, kvh = h / G;
  // Positions in 32 bits (the launcher checks T, S < 2^31 - kBM): fewer registers.
  const int q0 = static_cast<int>(qt * kBM), Tq = static_cast<int>(p.T), S = static_cast<int>(p.S);
  const int q_valid = std::min(Tq - q0, kBM);
  // Row bases (strides: Params): the CTA's first query row, key/value row 0 of its kv head.
  const uint16_t* q =
      static_cast<const uint16_t*>(p.q) + b * p.qs.batch + kvh * p.qs.group + (h - kvh * G) * p.qs.head + q0 * p.qs.row;
  const int64_t kv_base = b * p.kvs.batch + kvh * p.kvs.head;
  const uint16_t* k = static_cast<const uint16_t*>(p.k) + kv_base;
  const uint16_t* v = static_cast<const uint16_t*>(p.v) + kv_base;
  // Segment ids (T == S): a key is visible only from rows of its own document (a template
  // parameter: the kernel without them keeps its registers).
  const int32_t* seg_row = kSegments ? p.segments + b * Tq : nullptr;
  if (tid == 0) *stash = {k, v, seg_row};

  // This thread's rows of the warp's 16 (C fragment rows g and g + 8): elements 0, 1 are
  // row[0], elements 2, 3 row[1].
  const int r_lo = warp * 16 + g;
  const int row[2] = {q0 + r_lo, q0 + r_lo + 8};
  const int warp_first = q0 + warp * 16, warp_last = warp_first + 15;
  const int32_t row_seg[2] = {kSegments && row[0] < Tq ? seg_row[row[0]] : 0,
                              kSegments && row[1] < Tq ? seg_row[row[1]] : 0};

  const int n_ktiles = (S + kBN - 1) / kBN;
  // Causal: key s is visible to some row of the CTA iff s <= q0 + q_valid - 1.
  const int kt_end = p.causal ? std::min(n_ktiles, (q0 + q_valid + kBN - 1) / kBN) : n_ktiles;

  // Per-lane byte offsets of the ldmatrix addresses (flash_attention_fragments.h); the
  // loops below add compile-time offsets of whole 16 x 16 blocks.
  const LaneRowCol la = ldsm_a_lane(lane);
  const LaneRowCol lk = ldsm_b_nk_lane(lane);
  const LaneRowCol lv = ldsm_b_kn_trans_lane(lane);
  const uint32_t q_lane = sQ + 2 * ((warp * 16 + la.row) * kLd + la.col);
  const uint32_t k_lane = sK + 2 * (lk.row * kLd + lk.col);
  const uint32_t v_lane = sV + 2 * (lv.row * kLd + lv.col);

  if (kt_end > 0) {  // S = 0: nothing to load, every row ends with out = 0, lse = -inf
    cp_async_tile<D, kBM, kThreads, kLd>(sQ, q, p.qs.row, q_valid);
    const int k_valid0 = std::min(S, kBN);
    cp_async_tile<D, kBN, kThreads, kLd>(sK, k, p.kvs.row, k_valid0);
    cp_async_tile<D, kBN, kThreads, kLd>(sV, v, p.kvs.row, k_valid0);
    if (kSegments) cp_async_ids<kBN>(sSeg, seg_row, k_valid0);
    cp_async_commit();
  }

  float o[D / 8][4];  // O fragments: 16 rows x D per warp
#pragma unroll
  for (int nd = 0; nd < D / 8; ++nd) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY};  // running max (base-2 units), the same in the 4 lanes of a row
  float l[2] = {0.0f, 0.0f};            // running sum of this lane's columns (summed over the quad at the end)
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
    // Causal: a tile wholly after the warp's last row adds p = 0 to every row, with alpha
    // = 1 (each row saw key 0 <= its index at tile 0, so m is finite): skip it exactly.
    if (p.causal && k0 > warp_last) continue;  // warp-uniform; the barrier above stays shared

    const uint32_t k_buf = k_lane + buf * kTileBytes, v_buf = v_lane + buf * kTileBytes;

    // S = Q K^T: 16 x kBN per warp. ldmatrix of K's row-major tile gives the B fragments
    // of two 8-key n-tiles (np: keys 16 np .. 16 np + 15) for one 16-wide k-step kk.
    float s[kBN / 8][4];
#pragma unroll
    for (int n = 0; n < kBN / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[4];  // Q's A fragment of this k-step
      ldsm_x4(a, q_lane + 2 * kk * 16);
#pragma unroll
      for (int np = 0; np < kBN / 16; ++np) {
        uint32_t kb[4];
        ldsm_x4(kb, k_buf + 2 * (np * 16 * kLd + kk * 16));
        const uint32_t b0[2] = {kb[0], kb[1]}, b1[2] = {kb[2], kb[3]};
        mma_16816<T>(s[2 * np], a, b0);
        mma_16816<T>(s[2 * np + 1], a, b1);
      }
    }

    // Scale into base-2 units; mask only a tile that crosses the sequence end or (causal)
    // has a key after the warp's first row, and every tile with segment ids. Element e of
    // n-tile n is (row[e / 2], key k0 + 8 n + 2 t + e % 2).
    const bool needs_mask = k0 + kBN > S || (p.causal && k0 + kBN - 1 > warp_first) || kSegments;
    if (needs_mask) {
      const int32_t* seg = seg_tiles + buf * kBN;  // keys k0 ..
#pragma unroll
      for (int n = 0; n < kBN / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = k0 + n * 8 + 2 * t + (e & 1);
          const bool visible =
              col < S && (!p.causal || col <= row[e >> 1]) && (!kSegments || seg[col - k0] == row_seg[e >> 1]);
          s[n][e] = visible ? s[n][e] * scale_log2 : -INFINITY;
        }
      }
    } else {
#pragma unroll
      for (int n = 0; n < kBN / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] *= scale_log2;
    }

    // Online softmax, per row (r = 0: elements 0, 1; r = 1: elements 2, 3). A row whose
    // max is still -inf (no visible key yet) shifts by 0: exp2(-inf) = 0, never NaN.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < kBN / 8; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
      mx = quad_max(mx);  // the row's kBN columns live in the 4 lanes of the group
      const float m_new = fmaxf(m[r], mx);
      const float shift = m_new == -INFINITY ? 0.0f : m_new;
      const float alpha = exp2f(m[r] - shift);
      m[r] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < kBN / 8; ++n) {
        s[n][2 * r] = exp2f(s[n][2 * r] - shift);
        s[n][2 * r + 1] = exp2f(s[n][2 * r + 1] - shift);
        sum += s[n][2 * r] + s[n][2 * r + 1];
      }
      l[r] = l[r] * alpha + sum;
#pragma unroll
      for (int nd = 0; nd < D / 8; ++nd) {
        o[nd][2 * r] *= alpha;
        o[nd][2 * r + 1] *= alpha;
      }
    }

    // O += P V. k-step kk covers keys 16 kk .. 16 kk + 15 = S n-tiles 2 kk, 2 kk + 1, whose
    // C fragments are the A fragment (flash_attention_common.cuh). ldmatrix.trans of V's
    // row-major tile gives the B fragments of two 8-wide d-tiles (nd2: dims 16 nd2 ..
    // 16 nd2 + 15).
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      const uint32_t pa[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]), pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                              pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int nd2 = 0; nd2 < D / 16; ++nd2) {
        uint32_t vb[4];
        ldsm_x4_trans(vb, v_buf + 2 * (kk * 16 * kLd + nd2 * 16));
        const uint32_t b0[2] = {vb[0], vb[1]}, b1[2] = {vb[2], vb[3]};
        mma_16816<T>(o[2 * nd2], pa, b0);
        mma_16816<T>(o[2 * nd2 + 1], pa, b1);
      }
    }
  }

  // Epilogue: out = o / l (l summed over the 4 lanes of the row), lse = m ln 2 + ln l.
  // (b, h) derived again from the block index: the loop above then holds neither.
  const int64_t bh_e = block_index_again() % BH, b_e = bh_e / p.H, h_e = bh_e - b_e * p.H;
  uint16_t* out = static_cast<uint16_t*>(p.o) + b_e * p.os.batch + h_e * p.os.head;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l_row = quad_sum(l[r]);
    if (row[r] >= Tq) continue;
    const float inv = l_row > 0.0f ? 1.0f / l_row : 0.0f;
    uint16_t* orow = out + row[r] * p.os.row;  // 64-bit: the stride is int64_t
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd)
      st32(orow + nd * 8 + 2 * t, pack2<T>(o[nd][2 * r] * inv, o[nd][2 * r + 1] * inv));
    if (t == 0) p.lse[bh_e * Tq + row[r]] = l_row > 0.0f ? m[r] * kLn2 + logf(l_row) : -INFINITY;
  }
}

// The conditions of forward_v2_applies that depend on D.
template <int D>
bool v2_fits(const Params& p) {
  using C = FwdV2Config<D>;
  // Positions are 32-bit in the kernel.
  if (p.T > INT32_MAX - 2 * C::kBM || p.S > INT32_MAX - 2 * C::kBM) return false;
  // Not enough shared memory per block (e.g. sm_86/89 with 99 KiB): v1.
  return static_cast<size_t>(max_dynamic_smem_per_block()) >= C::kSmemBytes;
}

template <typename T, int D>
void launch_v2(const Params& p, cudaStream_t stream) {
  using C = FwdV2Config<D>;
  const int64_t blocks = p.B * p.H * ceil_div(p.T, C::kBM);
  if (p.segments != nullptr)
    launch(fwd_v2_kernel<T, D, true>, blocks, C::kThreads, C::kSmemBytes, stream, p);
  else
    launch(fwd_v2_kernel<T, D, false>, blocks, C::kThreads, C::kSmemBytes, stream, p);
}

template <typename T>
void launch_v2_dims(const Params& p, cudaStream_t stream) {
  if (p.D == 64)
    launch_v2<T, 64>(p, stream);
  else
    launch_v2<T, 128>(p, stream);
}

}  // namespace

bool forward_v2_applies(DType dtype, const Params& p) {
  if (p.mask != nullptr || (dtype != DType::BFloat16 && dtype != DType::Float16)) return false;
  return p.D == 64 ? v2_fits<64>(p) : p.D == 128 && v2_fits<128>(p);
}

bool launch_forward_v2(DType dtype, const Params& p, cudaStream_t stream) {
  if (!forward_v2_applies(dtype, p)) return false;
  if (dtype == DType::BFloat16)
    launch_v2_dims<__nv_bfloat16>(p, stream);
  else
    launch_v2_dims<__half>(p, stream);
  return true;
}

}  // namespace tessera::cuda::flash
