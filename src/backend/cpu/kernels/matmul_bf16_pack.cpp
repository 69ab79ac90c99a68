// Packing of the bf16 GEMM operands (matmul_bf16_pack.h). Baseline ISA (SSE2): it runs
// before either kernel and on any x86-64 CPU.
#include "backend/cpu/kernels/matmul_bf16_pack.h"

#include <algorithm>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace tessera::cpu::bf16_pack {

namespace {

#if defined(__SSE2__)
// dst[c][r] = src[r][c] for an 8 x 8 block of 16-bit elements (row strides in elements):
// three rounds of interleaves (16-, 32-, then 64-bit).
void transpose_8x8_u16(const bfloat16* src, int64_t src_ld, bfloat16* dst, int64_t dst_ld) {
  __m128i r[8], t[8], u[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i * src_ld));
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm_unpacklo_epi16(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm_unpackhi_epi16(r[2 * i], r[2 * i + 1]);
  }
  for (int h = 0; h < 2; ++h) {  // rows 0-3 (h = 0) and 4-7 (h = 1)
    u[4 * h + 0] = _mm_unpacklo_epi32(t[4 * h + 0], t[4 * h + 2]);
    u[4 * h + 1] = _mm_unpackhi_epi32(t[4 * h + 0], t[4 * h + 2]);
    u[4 * h + 2] = _mm_unpacklo_epi32(t[4 * h + 1], t[4 * h + 3]);
    u[4 * h + 3] = _mm_unpackhi_epi32(t[4 * h + 1], t[4 * h + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (2 * c) * dst_ld), _mm_unpacklo_epi64(u[c], u[4 + c]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (2 * c + 1) * dst_ld), _mm_unpackhi_epi64(u[c], u[4 + c]));
  }
}

// dst[c][r] = src[r][c] for a 4 x 4 block of 32-bit words (row strides in 32-bit words
// for dst, in elements for src, which need not be word aligned).
void transpose_4x4_u32(const bfloat16* src, int64_t src_ld, uint32_t* dst, int64_t dst_ld) {
  __m128i r[4];
  for (int i = 0; i < 4; ++i) r[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i * src_ld));
  const __m128i t0 = _mm_unpacklo_epi32(r[0], r[1]), t1 = _mm_unpacklo_epi32(r[2], r[3]);
  const __m128i t2 = _mm_unpackhi_epi32(r[0], r[1]), t3 = _mm_unpackhi_epi32(r[2], r[3]);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 0 * dst_ld), _mm_unpacklo_epi64(t0, t1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 1 * dst_ld), _mm_unpackhi_epi64(t0, t1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * dst_ld), _mm_unpacklo_epi64(t2, t3));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 3 * dst_ld), _mm_unpackhi_epi64(t2, t3));
}
#endif

}  // namespace

void pack_a(const bfloat16* a, int64_t lda, bool trans, int64_t r0, int64_t rows, int64_t k, bfloat16* out) {
  const int64_t kb_count = round_up(k, kBlockK) / kBlockK;
  // Zeros only where padding remains: a partial row block or a partial last K block.
  if (rows < kBlockM || k % kBlockK != 0) std::fill(out, out + kb_count * kBlockM * kBlockK, bfloat16{});
  // Read along memory's rows: A's rows when A is stored [m, k], its columns when [k, m].
  auto at = [&](int64_t r, int64_t p) -> bfloat16& {
    return out[((p / kBlockK) * kBlockM + r) * kBlockK + p % kBlockK];
  };
  if (trans) {
    // 8 x 8 blocks (8 K values of 8 rows) transposed in registers; the ragged edges of
    // rows and K element by element.
    const int64_t rows8 = rows / 8 * 8, k8 = k / 8 * 8;
    int64_t p8 = 0;
#if defined(__SSE2__)
    for (; p8 < k8; p8 += 8)
      for (int64_t r = 0; r < rows8; r += 8) transpose_8x8_u16(a + p8 * lda + r0 + r, lda, &at(r, p8), kBlockK);
#endif
    for (int64_t p = 0; p < k; ++p)
      for (int64_t r = p < p8 ? rows8 : 0; r < rows; ++r) at(r, p) = a[p * lda + r0 + r];
  } else {  // 32-element runs of a row are contiguous in both
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t p = 0; p < k; p += kBlockK) std::copy_n(a + (r0 + r) * lda + p, std::min(kBlockK, k - p), &at(r, p));
  }
}

void pack_b(const bfloat16* b, int64_t ldb, bool trans, int64_t k, int64_t n, int64_t n_pad, bfloat16* out) {
  const int64_t kb_count = round_up(k, kBlockK) / kBlockK, nb_count = n_pad / 16;
  if (n < n_pad || k % kBlockK != 0) std::fill(out, out + kb_count * kBlockK * n_pad, bfloat16{});
  auto at = [&](int64_t p, int64_t j) -> bfloat16& {
    return out[((((p / kBlockK) * nb_count + j / 16) * 16 + (p % kBlockK) / 2) * 16 + j % 16) * 2 + p % 2];
  };
  if (trans) {  // B stored [n, k]: a (k, k + 1) pair is one 32-bit word of row j
    // 4 columns x 4 pairs at a time: a 4 x 4 transpose of 32-bit words (the packed
    // 16-column strip of one pair is 16 consecutive words); ragged edges word by word.
    const int64_t n4 = n / 4 * 4, k8 = k / 8 * 8, k_even = k / 2 * 2;
    int64_t p8 = 0;
#if defined(__SSE2__)
    for (; p8 < k8; p8 += 8)
      for (int64_t j = 0; j < n4; j += 4)
        transpose_4x4_u32(b + j * ldb + p8, ldb, reinterpret_cast<uint32_t*>(&at(p8, j)), 16);
#endif
    for (int64_t j = 0; j < n; ++j) {
      const bfloat16* row = b + j * ldb;
      for (int64_t p = j < n4 ? p8 : 0; p < k_even; p += 2) std::memcpy(&at(p, j), row + p, 2 * sizeof(bfloat16));
      if (k_even < k) at(k_even, j) = row[k_even];
    }
    return;
  }
  // Rows p and p + 1 interleave into pairs: 8 columns at a time with unpacklo/hi.
  for (int64_t p = 0; p < k; p += 2) {
    const bfloat16* even = b + p * ldb;
    const bfloat16* odd = p + 1 < k ? b + (p + 1) * ldb : nullptr;
    int64_t j = 0;
#if defined(__SSE2__)
    for (; j + 8 <= n; j += 8) {
      const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(even + j));
      const __m128i o = odd ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(odd + j)) : _mm_setzero_si128();
      auto* dst = reinterpret_cast<__m128i*>(&at(p, j));
      _mm_storeu_si128(dst, _mm_unpacklo_epi16(e, o));
      _mm_storeu_si128(dst + 1, _mm_unpackhi_epi16(e, o));
    }
#endif
    for (; j < n; ++j) {
      at(p, j) = even[j];
      if (odd) at(p + 1, j) = odd[j];
    }
  }
}

}  // namespace tessera::cpu::bf16_pack
