// bfloat16 attention on AVX512-BF16 (attention_avx512bf16.h). The vector code is in
// functions with a target attribute and runs only after avx512bf16_usable().
//
// Tile GEMM: C[M, N] (+)= A[M, K] B[K, N] over K in bf16 pairs (k, k + 1): VDPBF16PS
// adds a_k b_k + a_k+1 b_k+1 to 16 float32 lanes. A pair of A (row i, pair p) is read at
// a + i * a_row + p * a_pair (bf16 units), so A may be rows stored [M, K] (a_pair = 2),
// or a "pair layout" [K/2, M] of interleaved pairs (a_row = 2), and is broadcast; B is
// in pair layout [K/2, N] (row p: N pairs, 16 columns per zmm). Register block: 6 rows x
// 64 columns (24 zmm sums), each sum adding its pairs in K order from zero or from C.
//
// Which operand is which (T: a query block, S: a key block, D: head_dim, pairs of D
// contiguous in the input rows, pairs of T or S built by interleaving two rows):
//   forward   S^T = K Q^T        A = K rows (in place)        B = Q transposed to pairs
//             O  += P V          A = P^T in pairs of keys      B = V rows interleaved
//   backward  S   = Q K^T        A = Q rows (in place)        B = K transposed to pairs
//             dP  = dO V^T       A = dO rows (in place)       B = V transposed to pairs
//             dV += P^T dO       A = P in pairs of queries     B = dO rows interleaved
//             dK += dS^T Q       A = dS in pairs of queries    B = Q rows interleaved
//             dQ += dS K         A = dS rows (bf16)            B = K rows interleaved
// The scale multiplies the float32 scores as they are stored (not a rounded operand).
#include "backend/cpu/kernels/attention_avx512bf16.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/kernels/attention_tiles.h"
#include "backend/cpu/kernels/matmul.h"
#include "backend/cpu/kernels/matmul_avx512bf16.h"
#include "backend/cpu/kernels/scratch.h"
#include "tessera/base/error.h"
#include "tessera/base/thread_pool.h"

// TESSERA_HAS_AVX512_KERNELS: as matmul_avx512bf16.cpp.
#if defined(__x86_64__) && TESSERA_HAS_AVX512_KERNELS
#include <immintrin.h>
#define TESSERA_ATTENTION_BF16 1
#define TESSERA_TARGET_ATTENTION_BF16 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")))
#else
#define TESSERA_ATTENTION_BF16 0
#endif

namespace tessera::cpu {

bool attention_bf16_native() {
  static const bool native = bf16_gemm_path().native && avx512bf16_usable();
  return native;
}

namespace {

void require_usable(const char* op) {
  const char* why = "";
  if (!avx512bf16_usable(&why)) fail<ValueError>("{}: the AVX512-BF16 attention kernel cannot run here ({})", op, why);
}

#if TESSERA_ATTENTION_BF16

using namespace attention_detail;

constexpr int kMaxRows = 6;  // rows of a register block
constexpr int kMaxVecs = 4;  // 16-column vectors of a register block
constexpr int64_t kLanes = 16;

int64_t pad16(int64_t x) { return round_up(x, kLanes); }
int64_t pairs_of(int64_t x) { return (x + 1) / 2; }

// All 16 lanes. (The maskz forms below: the plain intrinsics start from
// _mm512_undefined_*, which GCC 12's -Wmaybe-uninitialized reports once inlined.)
constexpr __mmask16 kAll = 0xffff;

TESSERA_TARGET_ATTENTION_BF16 inline __m512bh as_pairs(__m512i v) { return (__m512bh)v; }

// The pair at p (two bf16) broadcast to all 16 lanes.
TESSERA_TARGET_ATTENTION_BF16 inline __m512bh broadcast_pair(const bfloat16* p) {
  int32_t pair;
  std::memcpy(&pair, p, sizeof(pair));
  return as_pairs(_mm512_set1_epi32(pair));
}

template <int R, int V>
TESSERA_TARGET_ATTENTION_BF16 void dot_block(int64_t pairs, const bfloat16* a, int64_t a_row, int64_t a_pair,
                                             const bfloat16* b, int64_t ldb, float* c, int64_t ldc, bool accumulate,
                                             float mul) {
  __m512 acc[R][V];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[r][v] = accumulate ? _mm512_loadu_ps(c + r * ldc + 16 * v) : _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh bv[V];
    const bfloat16* bp = b + 2 * p * ldb;
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) bv[v] = as_pairs(_mm512_loadu_si512(bp + 32 * v));
    const bfloat16* ap = a + p * a_pair;
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m512bh av = broadcast_pair(ap + r * a_row);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], bv[v], av);
    }
  }
  const __m512 m = _mm512_set1_ps(mul);
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v)
      _mm512_storeu_ps(c + r * ldc + 16 * v, accumulate || mul == 1.0f ? acc[r][v] : _mm512_mul_ps(acc[r][v], m));
}

template <int R>
TESSERA_TARGET_ATTENTION_BF16 void dot_rows(int vecs, int64_t pairs, const bfloat16* a, int64_t a_row, int64_t a_pair,
                                            const bfloat16* b, int64_t ldb, float* c, int64_t ldc, bool accumulate,
                                            float mul) {
  switch (vecs) {
    case 4:
      dot_block<R, 4>(pairs, a, a_row, a_pair, b, ldb, c, ldc, accumulate, mul);
      break;
    case 3:
      dot_block<R, 3>(pairs, a, a_row, a_pair, b, ldb, c, ldc, accumulate, mul);
      break;
    case 2:
      dot_block<R, 2>(pairs, a, a_row, a_pair, b, ldb, c, ldc, accumulate, mul);
      break;
    default:
      dot_block<R, 1>(pairs, a, a_row, a_pair, b, ldb, c, ldc, accumulate, mul);
      break;
  }
}

// C[M, N] (+)= A B as described at the top (N a multiple of 16). Not accumulating, C
// is the sums times `mul`.
struct PairOperand {
  const bfloat16* data;
  int64_t row, pair;  // bf16 offsets of the next row and the next pair
};
TESSERA_TARGET_ATTENTION_BF16 void tile_dot(int64_t M, int64_t N, int64_t pairs, PairOperand a, const bfloat16* b,
                                            int64_t ldb, float* c, int64_t ldc, bool accumulate, float mul = 1.0f) {
  for (int64_t j = 0; j < N; j += kMaxVecs * kLanes) {
    const int vecs = static_cast<int>(std::min<int64_t>(kMaxVecs, (N - j) / kLanes));
    for (int64_t i = 0; i < M; i += kMaxRows) {
      const bfloat16* ai = a.data + i * a.row;
      const bfloat16* bj = b + 2 * j;
      float* cij = c + i * ldc + j;
      switch (std::min<int64_t>(kMaxRows, M - i)) {
        case 6:
          dot_rows<6>(vecs, pairs, ai, a.row, a.pair, bj, ldb, cij, ldc, accumulate, mul);
          break;
        case 5:
          dot_rows<5>(vecs, pairs, ai, a.row, a.pair, bj, ldb, cij, ldc, accumulate, mul);
          break;
        case 4:
          dot_rows<4>(vecs, pairs, ai, a.row, a.pair, bj, ldb, cij, ldc, accumulate, mul);
          break;
        case 3:
          dot_rows<3>(vecs, pairs, ai, a.row, a.pair, bj, ldb, cij, ldc, accumulate, mul);
          break;
        case 2:
          dot_rows<2>(vecs, pairs, ai, a.row, a.pair, bj, ldb, cij, ldc, accumulate, mul);
          break;
        default:
          dot_rows<1>(vecs, pairs, ai, a.row, a.pair, bj, ldb, cij, ldc, accumulate, mul);
          break;
      }
    }
  }
}

// ---- operand layouts ----

// 16 bf16 (lo) and 16 bf16 (hi) as 16 interleaved pairs (lo in the low half).
TESSERA_TARGET_ATTENTION_BF16 inline __m512i interleave(__m256i lo, __m256i hi) {
  return _mm512_or_si512(_mm512_maskz_cvtepu16_epi32(kAll, lo),
                         _mm512_maskz_slli_epi32(kAll, _mm512_maskz_cvtepu16_epi32(kAll, hi), 16));
}

TESSERA_TARGET_ATTENTION_BF16 inline __m256i to_bf16(__m512 x) { return (__m256i)_mm512_cvtneps_pbh(x); }

// Pair-layout row out[0, n_pad) = (r0[j], r1[j]) for j < n, zero pairs after; r1 null
// gives zero high halves (an odd count of rows).
TESSERA_TARGET_ATTENTION_BF16 void interleave_rows(const bfloat16* r0, const bfloat16* r1, int64_t n, int64_t n_pad,
                                                   bfloat16* out) {
  for (int64_t j = 0; j < n_pad; j += kLanes) {
    const int64_t left = std::clamp<int64_t>(n - j, 0, kLanes);
    const __mmask16 mask = static_cast<__mmask16>((1u << left) - 1);
    const __m256i lo = _mm256_maskz_loadu_epi16(mask, r0 + j);
    const __m256i hi = r1 ? _mm256_maskz_loadu_epi16(mask, r1 + j) : _mm256_setzero_si256();
    _mm512_storeu_si512(out + 2 * j, interleave(lo, hi));
  }
}

// The same from float32 rows of n (a multiple of 16) values, rounded to bf16.
TESSERA_TARGET_ATTENTION_BF16 void interleave_rows(const float* r0, const float* r1, int64_t n, bfloat16* out) {
  for (int64_t j = 0; j < n; j += kLanes) {
    const __m256i lo = to_bf16(_mm512_loadu_ps(r0 + j));
    const __m256i hi = r1 ? to_bf16(_mm512_loadu_ps(r1 + j)) : _mm256_setzero_si256();
    _mm512_storeu_si512(out + 2 * j, interleave(lo, hi));
  }
}

// dst[p, i] = the pair (src[i, 2p], src[i, 2p + 1]) of rows i < rows of src [rows, d]
// (the high half 0 when 2p + 1 = d), for p < pairs_of(d); zero pairs for rows <= i < cols.
void transpose_to_pairs(const bfloat16* src, int64_t rows, int64_t d, int64_t cols, bfloat16* dst) {
  const int64_t full = d / 2, pairs = pairs_of(d);
  for (int64_t i = 0; i < rows; ++i) {
    const bfloat16* s = src + i * d;
    for (int64_t p = 0; p < full; ++p) std::memcpy(dst + 2 * (p * cols + i), s + 2 * p, 4);
    if (full < pairs) {
      dst[2 * (full * cols + i)] = s[d - 1];
      dst[2 * (full * cols + i) + 1] = bfloat16{};
    }
  }
  for (int64_t p = 0; p < pairs; ++p) std::fill(dst + 2 * (p * cols + rows), dst + 2 * (p * cols + cols), bfloat16{});
}

// Rows of [rows, d] as the A operand "rows with contiguous pairs": in place when d is
// even, else copied to `copy` with a zero appended to each row.
PairOperand rows_operand(const bfloat16* src, int64_t rows, int64_t d, bfloat16* copy) {
  if (d % 2 == 0) return {src, d, 2};
  const int64_t width = 2 * pairs_of(d);
  for (int64_t i = 0; i < rows; ++i) {
    std::memcpy(copy + i * width, src + i * d, sizeof(bfloat16) * d);
    copy[i * width + d] = bfloat16{};
  }
  return {copy, width, 2};
}

// ---- softmax pieces (float32, 16 lanes) ----

// e^x as attention_tiles.h's exp256 (the same steps on 16 lanes): inputs below -87.3
// (and -inf) give exactly 0.
TESSERA_TARGET_ATTENTION_BF16 inline __m512 exp512(__m512 x) {
  const __mmask16 underflow = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_LT_OQ);
  x = _mm512_maskz_min_ps(kAll, x, _mm512_set1_ps(88.3762626647949f));
  x = _mm512_maskz_max_ps(kAll, x, _mm512_set1_ps(-87.3f));
  __m512 fx = _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f));
  fx = _mm512_maskz_roundscale_ps(kAll, fx, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
  const __m512 z = _mm512_mul_ps(x, x);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, z, x);
  y = _mm512_add_ps(y, _mm512_set1_ps(1.0f));
  const __m512i e = _mm512_add_epi32(_mm512_maskz_cvttps_epi32(kAll, fx), _mm512_set1_epi32(127));
  const __m512 pow2 = _mm512_castsi512_ps(_mm512_maskz_slli_epi32(kAll, e, 23));
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~underflow), _mm512_mul_ps(y, pow2));
}

// The online-softmax step on the transposed score tile st [nk, ld] (key j, query i <
// nq16): m' = max(m, max_j st), P^T = e^(st - m'), l = l e^(m - m') + sum_j P^T,
// alpha = e^(m - m'); P^T goes to `pairs` in pairs of keys ([pairs_of(nk), ld]), rounded
// to bf16 (the sum adds the float32 values). A query with no visible key keeps m = -inf
// and is shifted by 0, so its probabilities are 0.
TESSERA_TARGET_ATTENTION_BF16 void softmax_to_pairs(const float* st, int64_t ld, int64_t nk, int64_t nq16, float* m,
                                                    float* l, float* alpha, bfloat16* pairs) {
  const __m512 neg_inf = _mm512_set1_ps(kNegInf<float>);
  for (int64_t i = 0; i < nq16; i += kLanes) {
    const __m512 m_old = _mm512_loadu_ps(m + i);
    __m512 m_new = m_old;
    for (int64_t j = 0; j < nk; ++j) m_new = _mm512_maskz_max_ps(kAll, m_new, _mm512_loadu_ps(st + j * ld + i));
    const __m512 shift = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(m_new, neg_inf, _CMP_NEQ_UQ), m_new);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < nk; j += 2) {
      const __m512 p0 = exp512(_mm512_sub_ps(_mm512_loadu_ps(st + j * ld + i), shift));
      sum = _mm512_add_ps(sum, p0);
      __m512 p1 = _mm512_setzero_ps();
      if (j + 1 < nk) {
        p1 = exp512(_mm512_sub_ps(_mm512_loadu_ps(st + (j + 1) * ld + i), shift));
        sum = _mm512_add_ps(sum, p1);
      }
      _mm512_storeu_si512(pairs + 2 * (j / 2 * ld + i), interleave(to_bf16(p0), to_bf16(p1)));
    }
    const __m512 a = exp512(_mm512_sub_ps(m_old, shift));
    _mm512_storeu_ps(l + i, _mm512_fmadd_ps(_mm512_loadu_ps(l + i), a, sum));
    _mm512_storeu_ps(m + i, m_new);
    _mm512_storeu_ps(alpha + i, a);
  }
}

// Backward, one query row of n (a multiple of 16) keys: p = e^(s - lse), ds = p (dp - delta),
// and ds rounded to bf16 into ds_bf16.
TESSERA_TARGET_ATTENTION_BF16 void probs_and_score_grads(float* p, float* ds, int64_t n, float lse, float delta,
                                                         bfloat16* ds_bf16) {
  const __m512 lv = _mm512_set1_ps(lse), dv = _mm512_set1_ps(delta);
  for (int64_t j = 0; j < n; j += kLanes) {
    const __m512 pj = exp512(_mm512_sub_ps(_mm512_loadu_ps(p + j), lv));
    const __m512 dsj = _mm512_mul_ps(pj, _mm512_sub_ps(_mm512_loadu_ps(ds + j), dv));
    _mm512_storeu_ps(p + j, pj);
    _mm512_storeu_ps(ds + j, dsj);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(ds_bf16 + j), to_bf16(dsj));
  }
}

// Consecutive pieces of one scratch block, each 64-byte aligned.
class Carver {
 public:
  explicit Carver(void* base) : at_(static_cast<unsigned char*>(base)) {}
  template <typename T>
  T* take(int64_t count) {
    T* p = reinterpret_cast<T*>(at_);
    at_ += round_up(static_cast<int64_t>(sizeof(T)) * count, 64);
    return p;
  }
  static int64_t bytes(int64_t count, size_t size) { return round_up(static_cast<int64_t>(size) * count, 64); }

 private:
  unsigned char* at_;
};

// ---- forward ----

void forward(const AttentionShape& sh, const bfloat16* q, const bfloat16* k, const bfloat16* v, bfloat16* out,
             float* lse) {
  const int64_t B = sh.batch, H = sh.heads, T_len = sh.q_len, S_len = sh.kv_len, D = sh.head_dim;
  const int64_t group = H / sh.kv_heads;
  const int64_t d_pairs = pairs_of(D), dp = pad16(D), ld = kBlockQ;  // ld: query columns of a score tile
  const int64_t nqb = (T_len + kBlockQ - 1) / kBlockQ, nkb = (S_len + kBlockK - 1) / kBlockK;
  const float scale = static_cast<float>(sh.scale);
  const auto* mask = static_cast<const uint8_t*>(sh.mask);
  const SegmentBlocks segments(sh.segments, B, T_len);
  const int64_t key_pairs = pairs_of(kBlockK);
  const size_t bytes =
      static_cast<size_t>(Carver::bytes(d_pairs * ld * 2, 2) + Carver::bytes(kBlockK * d_pairs * 2, 2) +
                          Carver::bytes(key_pairs * dp * 2, 2) + Carver::bytes(key_pairs * ld * 2, 2) +
                          Carver::bytes(kBlockK * ld, 4) + Carver::bytes(kBlockQ * dp, 4) + 3 * Carver::bytes(ld, 4));
  const ChunkScratch tiles(bytes, Scratch::AttentionChunks);
  parallel_for(B * H * nqb, 1, [&](int64_t begin, int64_t end) {
    ChunkScratch::Lease lease(tiles);
    Carver carve(lease.as<unsigned char>());
    bfloat16* q_pairs = carve.take<bfloat16>(d_pairs * ld * 2);      // [d_pairs, ld] Q^T in pairs of D
    bfloat16* k_copy = carve.take<bfloat16>(kBlockK * d_pairs * 2);  // K rows, odd D only
    bfloat16* v_pairs = carve.take<bfloat16>(key_pairs * dp * 2);    // [key pairs, dp] V
    bfloat16* p_pairs = carve.take<bfloat16>(key_pairs * ld * 2);    // [key pairs, ld] P^T
    float* st = carve.take<float>(kBlockK * ld);                     // [kBlockK, ld] scores
    float* acc = carve.take<float>(kBlockQ * dp);                    // [kBlockQ, dp] unnormalized output
    float* m = carve.take<float>(ld);
    float* l = carve.take<float>(ld);
    float* alpha = carve.take<float>(ld);
    for (int64_t task = begin; task < end; ++task) {
      // Late query blocks first (they cost the most when causal), as the float32 kernel.
      const int64_t bh = task / nqb, qb = nqb - 1 - task % nqb;
      const int64_t b = bh / H, h = bh % H, kvh = h / group;
      const int64_t q0 = qb * kBlockQ, nq = std::min(kBlockQ, T_len - q0), nq16 = pad16(nq);
      const bfloat16* kp = k + (b * sh.kv_heads + kvh) * S_len * D;
      const bfloat16* vp = v + (b * sh.kv_heads + kvh) * S_len * D;
      const uint8_t* mask_bh = mask ? mask + b * sh.mask_b_stride + h * sh.mask_h_stride : nullptr;

      transpose_to_pairs(q + (bh * T_len + q0) * D, nq, D, ld, q_pairs);
      std::fill(acc, acc + nq * dp, 0.0f);
      std::fill(m, m + ld, kNegInf<float>);
      std::fill(l, l + ld, 0.0f);
      const int64_t kb_end = sh.causal ? std::min(nkb, (q0 + nq + kBlockK - 1) / kBlockK) : nkb;
      for (int64_t kb = 0; kb < kb_end; ++kb) {
        if (segments.disjoint(b, qb, kb)) continue;
        const int64_t k0 = kb * kBlockK, nk = std::min(kBlockK, S_len - k0);
        tile_dot(nk, nq16, d_pairs, rows_operand(kp + k0 * D, nk, D, k_copy), q_pairs, ld, st, ld, false, scale);
        mask_scores_transposed(st, ld, nq, nk, q0, k0, sh.causal, mask_bh, S_len, segments.tile_ids(b, qb, kb));
        softmax_to_pairs(st, ld, nk, nq16, m, l, alpha, p_pairs);
        for (int64_t i = 0; i < nq; ++i) {
          if (alpha[i] == 1.0f) continue;
          float* o = acc + i * dp;
          for (int64_t d = 0; d < dp; ++d) o[d] *= alpha[i];
        }
        for (int64_t j = 0; j < nk; j += 2)
          interleave_rows(vp + (k0 + j) * D, j + 1 < nk ? vp + (k0 + j + 1) * D : nullptr, D, dp,
                          v_pairs + 2 * (j / 2) * dp);
        tile_dot(nq, dp, pairs_of(nk), {p_pairs, 2, 2 * ld}, v_pairs, dp, acc, dp, true);
      }
      bfloat16* op = out + (bh * T_len + q0) * D;
      float* lp = lse + bh * T_len + q0;
      for (int64_t i = 0; i < nq; ++i) {
        const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
        for (int64_t d = 0; d < D; ++d) op[i * D + d] = float_to_bf16(acc[i * dp + d] * inv);
        lp[i] = l[i] > 0.0f ? m[i] + std::log(l[i]) : kNegInf<float>;
      }
    }
  });
}

// ---- backward ----

constexpr int64_t kMinTasks = 16;  // as attention_backward.cpp

void backward(const AttentionShape& sh, const bfloat16* q, const bfloat16* k, const bfloat16* v, const bfloat16* o,
              const float* lse, const bfloat16* dout, bfloat16* dq, bfloat16* dk, bfloat16* dv) {
  const int64_t B = sh.batch, H = sh.heads, Hkv = sh.kv_heads, T_len = sh.q_len, S_len = sh.kv_len, D = sh.head_dim;
  const int64_t group = H / Hkv;
  const int64_t d_pairs = pairs_of(D), dp = pad16(D), ld = kBlockK;  // ld: key columns of a score tile
  const int64_t nqb = (T_len + kBlockQ - 1) / kBlockQ, nkb = (S_len + kBlockK - 1) / kBlockK;
  const float scale = static_cast<float>(sh.scale);
  const auto* mask = static_cast<const uint8_t*>(sh.mask);
  const int64_t rows = B * H * T_len;
  const SegmentBlocks segments(sh.segments, B, T_len);

  if (nkb == 0) {
    std::fill(dq, dq + rows * D, bfloat16{});
    return;
  }
  float* delta = thread_scratch<float>(static_cast<size_t>(rows), Scratch::AttentionDelta);
  parallel_for(rows, 256, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float sum = 0;
      for (int64_t d = 0; d < D; ++d) sum += bf16_to_float(dout[r * D + d]) * bf16_to_float(o[r * D + d]);
      delta[r] = sum;
    }
  });

  const int64_t groups = B * Hkv;
  const int64_t splits = std::min(nkb, (kMinTasks + groups - 1) / groups);
  const int64_t dq_group_size = group * T_len * dp;
  float* dq_partial =
      splits > 1 ? thread_scratch<float>(static_cast<size_t>(groups * splits * dq_group_size), Scratch::AttentionDq)
                 : nullptr;
  const int64_t key_pairs = pairs_of(kBlockK), query_pairs = pairs_of(kBlockQ);
  const int64_t bytes = 2 * Carver::bytes(d_pairs * ld * 2, 2) + Carver::bytes(key_pairs * dp * 2, 2) +
                        2 * Carver::bytes(kBlockQ * d_pairs * 2, 2) + 2 * Carver::bytes(kBlockQ * ld, 4) +
                        Carver::bytes(kBlockQ * ld, 2) + 2 * Carver::bytes(query_pairs * ld * 2, 2) +
                        2 * Carver::bytes(query_pairs * dp * 2, 2) + 2 * Carver::bytes(kBlockK * dp, 4) +
                        (splits == 1 ? Carver::bytes(dq_group_size, 4) : 0);
  const ChunkScratch chunk_scratch(static_cast<size_t>(bytes), Scratch::AttentionChunks);
  parallel_for(groups * splits, 1, [&](int64_t begin, int64_t end) {
    ChunkScratch::Lease lease(chunk_scratch);
    Carver carve(lease.as<unsigned char>());
    bfloat16* k_t = carve.take<bfloat16>(d_pairs * ld * 2);          // [d_pairs, ld] K^T in pairs of D
    bfloat16* v_t = carve.take<bfloat16>(d_pairs * ld * 2);          // [d_pairs, ld] V^T in pairs of D
    bfloat16* k_pairs = carve.take<bfloat16>(key_pairs * dp * 2);    // [key pairs, dp] K
    bfloat16* q_copy = carve.take<bfloat16>(kBlockQ * d_pairs * 2);  // Q rows, odd D only
    bfloat16* g_copy = carve.take<bfloat16>(kBlockQ * d_pairs * 2);  // dO rows, odd D only
    float* p = carve.take<float>(kBlockQ * ld);                      // [kBlockQ, ld] P
    float* ds = carve.take<float>(kBlockQ * ld);                     // [kBlockQ, ld] dP, then dS
    bfloat16* ds_rows = carve.take<bfloat16>(kBlockQ * ld);          // [kBlockQ, ld] dS in bf16
    bfloat16* p_q = carve.take<bfloat16>(query_pairs * ld * 2);      // [query pairs, ld] P
    bfloat16* ds_q = carve.take<bfloat16>(query_pairs * ld * 2);     // [query pairs, ld] dS
    bfloat16* g_q = carve.take<bfloat16>(query_pairs * dp * 2);      // [query pairs, dp] dO
    bfloat16* q_q = carve.take<bfloat16>(query_pairs * dp * 2);      // [query pairs, dp] Q
    float* dk_acc = carve.take<float>(kBlockK * dp);
    float* dv_acc = carve.take<float>(kBlockK * dp);
    float* dq_own = splits == 1 ? carve.take<float>(dq_group_size) : nullptr;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t gi = task / splits, split = task % splits;
      const int64_t b = gi / Hkv;
      float* dq_acc = splits == 1 ? dq_own : dq_partial + task * dq_group_size;
      std::fill(dq_acc, dq_acc + dq_group_size, 0.0f);
      const bfloat16* kp = k + gi * S_len * D;
      const bfloat16* vp = v + gi * S_len * D;
      for (int64_t kb = split; kb < nkb; kb += splits) {
        const int64_t k0 = kb * kBlockK, nk = std::min(kBlockK, S_len - k0), nk16 = pad16(nk);
        transpose_to_pairs(kp + k0 * D, nk, D, ld, k_t);
        transpose_to_pairs(vp + k0 * D, nk, D, ld, v_t);
        for (int64_t j = 0; j < nk; j += 2)
          interleave_rows(kp + (k0 + j) * D, j + 1 < nk ? kp + (k0 + j + 1) * D : nullptr, D, dp,
                          k_pairs + 2 * (j / 2) * dp);
        std::fill(dk_acc, dk_acc + kBlockK * dp, 0.0f);
        std::fill(dv_acc, dv_acc + kBlockK * dp, 0.0f);
        for (int64_t g = 0; g < group; ++g) {
          const int64_t h = (gi % Hkv) * group + g, bh = b * H + h;
          const uint8_t* mask_bh = mask ? mask + b * sh.mask_b_stride + h * sh.mask_h_stride : nullptr;
          for (int64_t qb = sh.causal ? k0 / kBlockQ : 0; qb < nqb; ++qb) {
            if (segments.disjoint(b, qb, kb)) continue;
            const int64_t q0 = qb * kBlockQ, nq = std::min(kBlockQ, T_len - q0);
            const int64_t r0 = bh * T_len + q0;
            const bfloat16* qr = q + r0 * D;
            const bfloat16* gr = dout + r0 * D;
            tile_dot(nq, nk16, d_pairs, rows_operand(qr, nq, D, q_copy), k_t, ld, p, ld, false, scale);
            mask_scores(p, ld, nq, nk, nk16, q0, k0, sh.causal, mask_bh, S_len, segments.tile_ids(b, qb, kb));
            tile_dot(nq, nk16, d_pairs, rows_operand(gr, nq, D, g_copy), v_t, ld, ds, ld, false);
            for (int64_t i = 0; i < nq; ++i) {
              const float lse_i = lse[r0 + i];
              if (lse_i == kNegInf<float>) {  // fully masked row: no probability mass, no gradient
                std::fill(p + i * ld, p + i * ld + nk16, 0.0f);
                std::fill(ds + i * ld, ds + i * ld + nk16, 0.0f);
                std::fill(ds_rows + i * ld, ds_rows + i * ld + nk16, bfloat16{});
                continue;
              }
              probs_and_score_grads(p + i * ld, ds + i * ld, nk16, lse_i, delta[r0 + i], ds_rows + i * ld);
            }
            for (int64_t i = 0; i < nq; i += 2) {
              const bool pair = i + 1 < nq;
              const int64_t at = 2 * (i / 2);
              interleave_rows(p + i * ld, pair ? p + (i + 1) * ld : nullptr, nk16, p_q + at * ld);
              interleave_rows(ds + i * ld, pair ? ds + (i + 1) * ld : nullptr, nk16, ds_q + at * ld);
              interleave_rows(gr + i * D, pair ? gr + (i + 1) * D : nullptr, D, dp, g_q + at * dp);
              interleave_rows(qr + i * D, pair ? qr + (i + 1) * D : nullptr, D, dp, q_q + at * dp);
            }
            const int64_t nq_pairs = pairs_of(nq);
            tile_dot(nk, dp, nq_pairs, {p_q, 2, 2 * ld}, g_q, dp, dv_acc, dp, true);
            tile_dot(nk, dp, nq_pairs, {ds_q, 2, 2 * ld}, q_q, dp, dk_acc, dp, true);
            tile_dot(nq, dp, pairs_of(nk), {ds_rows, ld, 2}, k_pairs, dp, dq_acc + (g * T_len + q0) * dp, dp, true);
          }
        }
        for (int64_t j = 0; j < nk; ++j) {
          const int64_t r = gi * S_len + k0 + j;
          for (int64_t d = 0; d < D; ++d) {
            dk[r * D + d] = float_to_bf16(scale * dk_acc[j * dp + d]);
            dv[r * D + d] = float_to_bf16(dv_acc[j * dp + d]);
          }
        }
      }
      if (splits == 1) {
        for (int64_t g = 0; g < group; ++g) {
          const int64_t bh = b * H + (gi % Hkv) * group + g;
          for (int64_t t = 0; t < T_len; ++t)
            for (int64_t d = 0; d < D; ++d)
              dq[(bh * T_len + t) * D + d] = float_to_bf16(scale * dq_acc[(g * T_len + t) * dp + d]);
        }
      }
    }
  });

  if (splits > 1) sum_dq_partials(sh, splits, dp, dq_partial, scale, dq);
}

#endif  // TESSERA_ATTENTION_BF16

}  // namespace

void attention_forward_avx512bf16(const AttentionShape& shape, const bfloat16* q, const bfloat16* k, const bfloat16* v,
                                  bfloat16* out, float* lse) {
  require_usable("attention_forward");
#if TESSERA_ATTENTION_BF16
  if (shape.batch * shape.heads * shape.q_len == 0) return;
  forward(shape, q, k, v, out, lse);
#else
  (void)shape, (void)q, (void)k, (void)v, (void)out, (void)lse;
#endif
}

void attention_backward_avx512bf16(const AttentionShape& shape, const bfloat16* q, const bfloat16* k, const bfloat16* v,
                                   const bfloat16* out, const float* lse, const bfloat16* dout, bfloat16* dq,
                                   bfloat16* dk, bfloat16* dv) {
  require_usable("attention_backward");
#if TESSERA_ATTENTION_BF16
  const int64_t q_elems = shape.batch * shape.heads * shape.q_len * shape.head_dim;
  if (q_elems == 0 && shape.batch * shape.kv_heads * shape.kv_len * shape.head_dim == 0) return;
  backward(shape, q, k, v, out, lse, dout, dq, dk, dv);
#else
  (void)shape, (void)q, (void)k, (void)v, (void)out, (void)lse, (void)dout, (void)dq, (void)dk, (void)dv;
#endif
}

}  // namespace tessera::cpu
