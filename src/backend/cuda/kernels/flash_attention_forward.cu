// Attention forward, FlashAttention-2 style (see flash_attention.h for the math and
// layouts). For one (batch, head) and a tile of query rows, walk the key tiles
// k0 = 0, kBN, ... (causal: only those with a key <= the tile's last query) and keep,
// per query row, the running max m, the running sum l and the unnormalized output o:
//   s   = scale * q k^T over the tile (masked entries -inf)
//   m'  = max(m, rowmax s);  p = exp(s - m');  alpha = exp(m - m')
//   l   = alpha l + rowsum p;  o = alpha o + p v
// and at the end out = o / l, lse = m + log l. A row that has seen no visible key yet has
// m = -inf; it is shifted by 0 instead (exp(-inf - 0) = 0, never NaN), and ends with
// l = 0: out = 0, lse = -inf, like the CPU kernel.
//
// Two kernels:
//  * fwd_tc_kernel<T, D> (bf16/f16, D = 64/128): 4 warps, 64 query rows (16 per warp,
//    held in MMA fragments for the whole kernel), 64-key tiles in shared memory (K
//    row-major, V transposed so both GEMMs read B pairs with 32-bit loads). The softmax
//    runs in registers on the S fragments, in base 2 (the scale folded with log2 e:
//    exp2 is one instruction), and P is re-packed as the A operand of P V.
//  * fwd_generic_kernel<T, kDPL> (any dtype, D <= 256, masks, segment ids): fp32 CUDA cores. 4 warps x
//    4 query rows; 32-key tiles, one key per lane for the scores (a dot product read from
//    shared memory), lanes split over head_dim for P V (p broadcast by shuffles).
// This file also holds the entry points of the strided layouts (the v2 kernels only; see
// flash_attention.h) and copy_rows_kernel, their fallback's row copy.
#include <algorithm>

#include "backend/cuda/kernels/flash_attention.h"
#include "backend/cuda/kernels/flash_attention_common.cuh"
#include "backend/cuda/kernels/flash_attention_v2.cuh"

namespace tessera::cuda {
namespace flash {
namespace {

// ---------------------------------------------------------------------------------
// Tensor-core forward.

template <int D>
struct FwdTcConfig {
  static constexpr int kWarps = 4, kThreads = 32 * kWarps;
  static constexpr int kBM = 16 * kWarps;  // query rows per CTA (16 per warp: one MMA row block)
  static constexpr int kBN = 64;           // keys per tile
  static constexpr int kLdK = D + 8;       // sK row stride in elements (also stages Q)
  static constexpr int kLdV = kBN + 8;     // sVt row stride
  // +8 elements (16 bytes) per row: fragment loads of 8 rows x 4 words then hit 32
  // different banks (row stride = 4 mod 32 words), and rows stay 16-byte aligned.
  static constexpr size_t kSmemBytes = sizeof(uint16_t) * (kBN * kLdK + D * kLdV);
  static_assert(kBM <= kBN, "Q is staged in the K buffer");
};

template <typename T, int D>
__global__ void __launch_bounds__(128) fwd_tc_kernel(const Params p) {
  using C = FwdTcConfig<D>;
  constexpr int kBM = C::kBM, kBN = C::kBN, kLdK = C::kLdK, kLdV = C::kLdV;
  uint16_t* sK = reinterpret_cast<uint16_t*>(dynamic_smem());  // [kBN][kLdK]: K tile (Q first)
  uint16_t* sVt = sK + kBN * kLdK;                             // [D][kLdV]: V tile transposed

  const int tid = thread_index(), warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  // Block -> (batch*head, query tile), the last query tiles (the most key tiles when
  // causal) first.
  const int64_t BH = p.B * p.H, n_qtiles = ceil_div(p.T, kBM);
  const int64_t bh = block_index() % BH, qt = n_qtiles - 1 - block_index() / BH;
  const int64_t b = bh / p.H, h = bh % p.H, kvh = h / (p.H / p.Hkv);
  const int64_t q0 = qt * kBM, Tq = p.T, S = p.S;
  const int q_valid = static_cast<int>(std::min<int64_t>(Tq - q0, kBM));
  const uint16_t* q = static_cast<const uint16_t*>(p.q) + (bh * Tq + q0) * D;
  const uint16_t* k = static_cast<const uint16_t*>(p.k) + (b * p.Hkv + kvh) * S * D;
  const uint16_t* v = static_cast<const uint16_t*>(p.v) + (b * p.Hkv + kvh) * S * D;

  // This thread's rows of the warp's 16: tile rows r_lo (C elements 0, 1) and r_lo + 8
  // (elements 2, 3).
  const int r_lo = warp * 16 + g;
  const int64_t row[2] = {q0 + r_lo, q0 + r_lo + 8};

  // Q fragments (A operand of S = Q K^T) for all D / 16 k-steps, kept in registers.
  load_tile<D, kBM, C::kThreads>(sK, kLdK, q, q_valid);
  cta_sync();
  uint32_t qa[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const uint16_t* base = sK + r_lo * kLdK + kk * 16 + 2 * t;
    qa[kk][0] = ld32(base);
    qa[kk][1] = ld32(base + 8 * kLdK);
    qa[kk][2] = ld32(base + 8);
    qa[kk][3] = ld32(base + 8 * kLdK + 8);
  }

  float o[D / 8][4];  // O fragments: 16 rows x D per warp
#pragma unroll
  for (int nd = 0; nd < D / 8; ++nd) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY};  // running max (base-2 units), identical in the 4 lanes of a row
  float l[2] = {0.0f, 0.0f};            // running sum: this lane's columns only (summed over the quad at the end)
  const float scale_log2 = p.scale * kLog2e;

  const int64_t n_ktiles = ceil_div(S, kBN);
  // Causal: key s is visible to some row of the tile iff s <= q0 + q_valid - 1.
  const int64_t kt_end = p.causal ? std::min(n_ktiles, ceil_div(q0 + q_valid, kBN)) : n_ktiles;
  for (int64_t kt = 0; kt < kt_end; ++kt) {
    const int64_t k0 = kt * kBN;
    const int k_valid = static_cast<int>(std::min<int64_t>(S - k0, kBN));
    cta_sync();  // every warp is done with the previous tile (and, at kt = 0, with the staged Q)
    load_tile<D, kBN, C::kThreads>(sK, kLdK, k + k0 * D, k_valid);
    load_tile_transposed<D, kBN, C::kThreads>(sVt, kLdV, v + k0 * D, k_valid);
    cta_sync();

    // S = Q K^T: 16 x kBN per warp, kBN / 8 MMA column tiles. B[kd][n] = K[n][kd]: the
    // pair (kd, kd + 1) of column n is two adjacent elements of K row n.
    float s[kBN / 8][4];
#pragma unroll
    for (int n = 0; n < kBN / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int n = 0; n < kBN / 8; ++n) {
        const uint16_t* base = sK + (n * 8 + g) * kLdK + kk * 16 + 2 * t;
        const uint32_t kb[2] = {ld32(base), ld32(base + 8)};
        mma_16816<T>(s[n], qa[kk], kb);
      }
    }

    // Scale into base-2 units and mask: key columns past S, and keys after the query
    // when causal. Element e of tile n is (row[e / 2], column n * 8 + 2t + e % 2).
#pragma unroll
    for (int n = 0; n < kBN / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t col = k0 + n * 8 + 2 * t + (e & 1);
        const bool visible = col < S && (!p.causal || col <= row[e >> 1]);
        s[n][e] = visible ? s[n][e] * scale_log2 : -INFINITY;
      }
    }

    // Online softmax, per row (r = 0: elements 0, 1; r = 1: elements 2, 3).
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < kBN / 8; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
      mx = quad_max(mx);  // the row's 64 columns live in the 4 lanes of the group
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

    // O += P V. The k-step kk covers keys 16 kk .. 16 kk + 15 = S tiles 2 kk, 2 kk + 1,
    // whose C fragments are the A fragment (header of flash_attention_common.cuh).
    // B[key][d] = V[key][d] = sVt[d][key]: pairs along the key are adjacent in sVt.
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      const uint32_t pa[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]), pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                              pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int nd = 0; nd < D / 8; ++nd) {
        const uint16_t* base = sVt + (nd * 8 + g) * kLdV + kk * 16 + 2 * t;
        const uint32_t vb[2] = {ld32(base), ld32(base + 8)};
        mma_16816<T>(o[nd], pa, vb);
      }
    }
  }

  // Epilogue: out = o / l (l summed over the 4 lanes of the row), lse = m ln 2 + ln l.
  uint16_t* out = static_cast<uint16_t*>(p.o);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l_row = quad_sum(l[r]);
    if (row[r] >= Tq) continue;
    const float inv = l_row > 0.0f ? 1.0f / l_row : 0.0f;
    uint16_t* orow = out + (bh * Tq + row[r]) * D;
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd)
      st32(orow + nd * 8 + 2 * t, pack2<T>(o[nd][2 * r] * inv, o[nd][2 * r + 1] * inv));
    if (t == 0) p.lse[bh * Tq + row[r]] = l_row > 0.0f ? m[r] * kLn2 + logf(l_row) : -INFINITY;
  }
}

// ---------------------------------------------------------------------------------
// Generic fp32 forward.

struct FwdGenericConfig {
  static constexpr int kWarps = 4, kThreads = 32 * kWarps;
  static constexpr int kRowsPerWarp = 4;
  static constexpr int kBM = kWarps * kRowsPerWarp;  // query rows per CTA
  static constexpr int kBN = 32;                     // keys per tile: one per lane
  // Row stride D | 1 (odd): lanes reading the same column of 32 different rows hit 32
  // different banks.
  __host__ __device__ static int ld(int D) { return D | 1; }
  static size_t smem_bytes(int D) { return sizeof(float) * static_cast<size_t>((kBM + 2 * kBN) * ld(D)); }
};

template <typename T, int kDPL>
__global__ void __launch_bounds__(128) fwd_generic_kernel(const Params p) {
  using C = FwdGenericConfig;
  constexpr int kBM = C::kBM, kBN = C::kBN, kRows = C::kRowsPerWarp;
  const int D = p.D, ld = C::ld(D);
  float* sQ = reinterpret_cast<float*>(dynamic_smem());  // [kBM][ld], pre-scaled by `scale`
  float* sK = sQ + kBM * ld;                             // [kBN][ld]
  float* sV = sK + kBN * ld;                             // [kBN][ld]

  const int tid = thread_index(), warp = tid / 32, lane = tid % 32;
  const int64_t BH = p.B * p.H, n_qtiles = ceil_div(p.T, kBM);
  const int64_t bh = block_index() % BH, qt = n_qtiles - 1 - block_index() / BH;
  const int64_t b = bh / p.H, h = bh % p.H, kvh = h / (p.H / p.Hkv);
  const int64_t q0 = qt * kBM, Tq = p.T, S = p.S;
  const int q_valid = static_cast<int>(std::min<int64_t>(Tq - q0, kBM));
  const T* k = static_cast<const T*>(p.k) + (b * p.Hkv + kvh) * S * D;
  const T* v = static_cast<const T*>(p.v) + (b * p.Hkv + kvh) * S * D;
  const uint8_t* mask = p.mask ? p.mask + b * p.mask_b_stride + h * p.mask_h_stride : nullptr;
  const int32_t* seg = p.segments ? p.segments + b * Tq : nullptr;

  // Scores as the CPU computes them: (scale q) . k.
  load_tile_float(sQ, ld, static_cast<const T*>(p.q) + (bh * Tq + q0) * D, D, kBM, q_valid, p.scale, C::kThreads);

  float o[kRows][kDPL], m[kRows], l[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
#pragma unroll
    for (int i = 0; i < kDPL; ++i) o[r][i] = 0.0f;
  }

  const int64_t n_ktiles = ceil_div(S, kBN);
  const int64_t kt_end = p.causal ? std::min(n_ktiles, ceil_div(q0 + q_valid, kBN)) : n_ktiles;
  for (int64_t kt = 0; kt < kt_end; ++kt) {
    const int64_t k0 = kt * kBN;
    const int k_valid = static_cast<int>(std::min<int64_t>(S - k0, kBN));
    cta_sync();  // the previous tile is consumed (and at kt = 0, sQ is written)
    load_tile_float(sK, ld, k + k0 * D, D, kBN, k_valid, 1.0f, C::kThreads);
    load_tile_float(sV, ld, v + k0 * D, D, kBN, k_valid, 1.0f, C::kThreads);
    cta_sync();
    const int64_t key = k0 + lane;  // this lane's key
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int local = warp * kRows + r;
      const int64_t row = q0 + local;
      if (row >= Tq) continue;  // uniform across the warp
      const bool visible = key < S && (!p.causal || key <= row) && (mask == nullptr || mask[row * S + key] != 0) &&
                           (seg == nullptr || seg[key] == seg[row]);
      float s = -INFINITY;
      if (visible) {
        const float* qr = sQ + local * ld;
        const float* kr = sK + lane * ld;
        float dot = 0.0f;
        for (int d = 0; d < D; ++d) dot = fmaf(qr[d], kr[d], dot);
        s = dot;
      }
      const float m_new = fmaxf(m[r], warp_max(s));
      const float shift = m_new == -INFINITY ? 0.0f : m_new;
      const float pr = expf(s - shift);  // 0 for masked keys
      const float alpha = expf(m[r] - shift);
      l[r] = l[r] * alpha + warp_sum(pr);
      m[r] = m_new;
      float acc[kDPL];
#pragma unroll
      for (int i = 0; i < kDPL; ++i) acc[i] = 0.0f;
      for (int j = 0; j < kBN; ++j) {
        const float pj = shfl_idx(pr, j);
        const float* vr = sV + j * ld;
#pragma unroll
        for (int i = 0; i < kDPL; ++i) {
          const int d = lane + 32 * i;
          if (d < D) acc[i] = fmaf(pj, vr[d], acc[i]);
        }
      }
#pragma unroll
      for (int i = 0; i < kDPL; ++i) o[r][i] = o[r][i] * alpha + acc[i];
    }
  }

  T* out = static_cast<T*>(p.o);
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t row = q0 + warp * kRows + r;
    if (row >= Tq) continue;
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
#pragma unroll
    for (int i = 0; i < kDPL; ++i) {
      const int d = lane + 32 * i;
      if (d < D) out[(bh * Tq + row) * D + d] = from_float<T>(o[r][i] * inv);
    }
    if (lane == 0) p.lse[bh * Tq + row] = l[r] > 0.0f ? m[r] + logf(l[r]) : -INFINITY;
  }
}

template <typename T>
void launch_generic_forward(const Params& p, cudaStream_t stream) {
  using C = FwdGenericConfig;
  const int64_t blocks = p.B * p.H * ceil_div(p.T, C::kBM);
  void (*kernel)(Params) = nullptr;
  switch (dims_per_lane(p.D)) {
    case 1:
      kernel = fwd_generic_kernel<T, 1>;
      break;
    case 2:
      kernel = fwd_generic_kernel<T, 2>;
      break;
    case 4:
      kernel = fwd_generic_kernel<T, 4>;
      break;
    default:
      kernel = fwd_generic_kernel<T, 8>;
      break;
  }
  launch(kernel, blocks, C::kThreads, C::smem_bytes(p.D), stream, p);
}

template <typename T>
void launch_tc_forward(const Params& p, cudaStream_t stream) {
  if (p.D == 64) {
    using C = FwdTcConfig<64>;
    launch(fwd_tc_kernel<T, 64>, p.B * p.H * ceil_div(p.T, C::kBM), C::kThreads, C::kSmemBytes, stream, p);
  } else {
    using C = FwdTcConfig<128>;
    launch(fwd_tc_kernel<T, 128>, p.B * p.H * ceil_div(p.T, C::kBM), C::kThreads, C::kSmemBytes, stream, p);
  }
}

// ---------------------------------------------------------------------------------
// Row copies between layouts (flash_attention_copy_rows), in units U of 2, 4 or 16 bytes:
// thread i moves unit i % units of row i / units, row = (b heads + h) rows + t.

struct CopyRowsParams {
  const void* src = nullptr;
  void* dst = nullptr;
  FlashAttentionStrides ss, ds;  // in units
  int64_t heads = 0, group_size = 1, rows = 0, units = 0, total = 0;
};

constexpr int kCopyThreads = 256;

template <typename U>
__global__ void __launch_bounds__(kCopyThreads) copy_rows_kernel(const CopyRowsParams c) {
  const int64_t i = block_index() * kCopyThreads + thread_index();
  if (i >= c.total) return;
  const int64_t r = i / c.units, u = i - r * c.units;
  const int64_t bh = r / c.rows, t = r - bh * c.rows, b = bh / c.heads, h = bh - b * c.heads;
  const int64_t hg = h / c.group_size, hi = h - hg * c.group_size;
  const int64_t from = b * c.ss.batch + hg * c.ss.group + hi * c.ss.head + t * c.ss.row + u;
  const int64_t to = b * c.ds.batch + hg * c.ds.group + hi * c.ds.head + t * c.ds.row + u;
  static_cast<U*>(c.dst)[to] = static_cast<const U*>(c.src)[from];
}

}  // namespace
}  // namespace flash

FlashAttentionLayout contiguous_attention_layout(const FlashAttentionShape& shape) {
  const int64_t D = shape.head_dim, T = shape.q_len, S = shape.kv_len;
  const int64_t G = shape.kv_heads > 0 ? shape.heads / shape.kv_heads : 0;
  FlashAttentionLayout l;
  l.q = {shape.heads * T * D, G * T * D, T * D, D};
  // group = head for the kinds without groups: the strides then also describe them to
  // flash_attention_copy_rows with group_size 1.
  l.kv = {shape.kv_heads * S * D, S * D, S * D, D};
  l.o = {shape.heads * T * D, T * D, T * D, D};
  return l;
}

FlashAttentionLayout packed_qkv_attention_layout(const FlashAttentionShape& shape) {
  if (shape.q_len != shape.kv_len)
    throw_value_error("packed_qkv_attention_layout: q_len " + std::to_string(shape.q_len) + " != kv_len " +
                      std::to_string(shape.kv_len) + " (one projection gives q, k, v per token)");
  if (shape.kv_heads < 1 || shape.heads % shape.kv_heads != 0)
    throw_value_error("packed_qkv_attention_layout: heads=" + std::to_string(shape.heads) +
                      " is not a positive multiple of kv_heads=" + std::to_string(shape.kv_heads));
  const int64_t D = shape.head_dim, T = shape.q_len, G = shape.heads / shape.kv_heads;
  const int64_t W = shape.kv_heads * (G + 2) * D;  // elements per token of qkv
  FlashAttentionLayout l;
  l.q = {T * W, (G + 2) * D, D, W};
  l.kv = {T * W, (G + 2) * D, (G + 2) * D, W};  // group = head, as above
  l.o = {T * shape.heads * D, D, D, shape.heads * D};
  return l;
}

bool flash_attention_forward_strided(DType dtype, const FlashAttentionShape& shape, const FlashAttentionLayout& layout,
                                     const void* q, const void* k, const void* v, void* out, float* lse,
                                     cudaStream_t stream) {
  using namespace flash;
  validate("flash_attention_forward_strided", dtype, shape);
  if (!strided_v2_shape(dtype, shape, layout)) return false;
  if (shape.batch * shape.heads * shape.q_len == 0) return true;  // nothing to write
  if (lse == nullptr || q == nullptr || out == nullptr || (shape.kv_len > 0 && (k == nullptr || v == nullptr)))
    throw_value_error("flash_attention_forward_strided: null data pointer for a non-empty tensor");
  if (!(aligned16(q) && aligned16(k) && aligned16(v) && aligned16(out))) return false;
  Params p = make_params(shape);
  p.qs = layout.q;
  p.kvs = layout.kv;
  p.os = layout.o;
  p.q = q;
  p.k = k;
  p.v = v;
  p.o = out;
  p.lse = lse;
  return launch_forward_v2(dtype, p, stream);
}

void flash_attention_copy_rows(DType dtype, int64_t batch, int64_t heads, int64_t group_size, int64_t rows,
                               int64_t head_dim, const void* src, const FlashAttentionStrides& src_strides, void* dst,
                               const FlashAttentionStrides& dst_strides, cudaStream_t stream) {
  using namespace flash;
  const bool two = dtype == DType::BFloat16 || dtype == DType::Float16;
  if (!two && dtype != DType::Float32 && dtype != DType::Int32 && dtype != DType::UInt32)
    throw_dtype_error("flash_attention_copy_rows: unsupported dtype " + std::string(name(dtype)) +
                      " (expected one of 2 or 4 bytes)");
  if (batch < 0 || heads < 0 || rows < 0 || head_dim < 0 || group_size < 1 || heads % group_size != 0)
    throw_value_error("flash_attention_copy_rows: bad sizes (batch=" + std::to_string(batch) +
                      ", heads=" + std::to_string(heads) + ", group_size=" + std::to_string(group_size) +
                      ", rows=" + std::to_string(rows) + ", head_dim=" + std::to_string(head_dim) + ")");
  if (batch * heads * rows * head_dim == 0) return;
  if (src == nullptr || dst == nullptr) throw_value_error("flash_attention_copy_rows: null data pointer");
  // 16-byte units when the rows and every stride whose index can be nonzero allow them
  // (the contiguous and packed attention layouts with 16-bit D = 64/128 always do).
  const int64_t esize = two ? 2 : 4;
  const auto fits = [&](int64_t unit) {
    const auto ok = [&](int64_t stride, int64_t extent) { return extent <= 1 || (stride * esize) % unit == 0; };
    const auto ok_all = [&](const FlashAttentionStrides& s) {
      return ok(s.batch, batch) && ok(s.group, heads / group_size) && ok(s.head, group_size) && ok(s.row, rows);
    };
    return (head_dim * esize) % unit == 0 && reinterpret_cast<uintptr_t>(src) % unit == 0 &&
           reinterpret_cast<uintptr_t>(dst) % unit == 0 && ok_all(src_strides) && ok_all(dst_strides);
  };
  const int64_t unit = fits(16) ? 16 : esize;
  const auto in_units = [&](const FlashAttentionStrides& s) {
    const int64_t n = unit / esize;  // exact where the index can be nonzero
    return FlashAttentionStrides{s.batch / n, s.group / n, s.head / n, s.row / n};
  };
  CopyRowsParams c;
  c.src = src;
  c.dst = dst;
  c.ss = in_units(src_strides);
  c.ds = in_units(dst_strides);
  c.heads = heads;
  c.group_size = group_size;
  c.rows = rows;
  c.units = head_dim * esize / unit;
  c.total = batch * heads * rows * c.units;
  const int64_t blocks = ceil_div(c.total, kCopyThreads);
  if (unit == 16)
    launch(copy_rows_kernel<uint4>, blocks, kCopyThreads, 0, stream, c);
  else if (unit == 4)
    launch(copy_rows_kernel<uint32_t>, blocks, kCopyThreads, 0, stream, c);
  else
    launch(copy_rows_kernel<uint16_t>, blocks, kCopyThreads, 0, stream, c);
}

bool flash_attention_uses_tensor_cores(DType dtype, const FlashAttentionShape& shape) {
  return flash_attention_kernel() == FlashAttentionKernel::V2 ? flash::tensor_core_shape(dtype, shape)
                                                              : flash::tensor_core_v1_shape(dtype, shape);
}

void flash_attention_forward(DType dtype, const FlashAttentionShape& shape, const void* q, const void* k, const void* v,
                             void* out, float* lse, cudaStream_t stream, FlashAttentionPath path) {
  using namespace flash;
  validate("flash_attention_forward", dtype, shape);
  if (shape.batch * shape.heads * shape.q_len == 0) return;  // nothing to write
  const bool has_q = shape.head_dim > 0, has_kv = shape.kv_len > 0 && shape.head_dim > 0;
  if (lse == nullptr || (has_q && (q == nullptr || out == nullptr)) || (has_kv && (k == nullptr || v == nullptr)))
    throw_value_error("flash_attention_forward: null data pointer for a non-empty tensor");
  Params p = make_params(shape);
  p.q = q;
  p.k = k;
  p.v = v;
  p.o = out;
  p.lse = lse;
  bool tc = path == FlashAttentionPath::Auto && tensor_core_shape(dtype, shape) && aligned16(q) && aligned16(k) &&
            aligned16(v) && aligned16(out);
  if (tc && flash_attention_kernel() == FlashAttentionKernel::V2 && launch_forward_v2(dtype, p, stream)) return;
  tc = tc && tensor_core_v1_shape(dtype, shape);
  switch (dtype) {
    case DType::BFloat16:
      tc ? launch_tc_forward<__nv_bfloat16>(p, stream) : launch_generic_forward<__nv_bfloat16>(p, stream);
      break;
    case DType::Float16:
      tc ? launch_tc_forward<__half>(p, stream) : launch_generic_forward<__half>(p, stream);
      break;
    default:
      launch_generic_forward<float>(p, stream);
      break;
  }
}

}  // namespace tessera::cuda
