// Packing of the bf16 GEMM operands (matmul_bf16_pack.h). Baseline ISA (SSE2): it runs
// before either kernel and on any x86-64 CPU.
#include "backend/cpu/kernels/matmul_bf16_pack.h"

#include <algorithm>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace tessera::cpu::bf16_pack {

void pack_a(const bfloat16* a, int64_t lda, bool trans, int64_t r0, int64_t rows, int64_t k, bfloat16* out) {
  const int64_t kb_count = round_up(k, kBlockK) / kBlockK;
  std::fill(out, out + kb_count * kBlockM * kBlockK, bfloat16{});
  // Read along memory's rows: A's rows when A is stored [m, k], its columns when [k, m].
  auto at = [&](int64_t r, int64_t p) -> bfloat16& {
    return out[((p / kBlockK) * kBlockM + r) * kBlockK + p % kBlockK];
  };
  if (trans) {
    for (int64_t p = 0; p < k; ++p)
      for (int64_t r = 0; r < rows; ++r) at(r, p) = a[p * lda + r0 + r];
  } else {  // 32-element runs of a row are contiguous in both
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t p = 0; p < k; p += kBlockK) std::copy_n(a + (r0 + r) * lda + p, std::min(kBlockK, k - p), &at(r, p));
  }
}

void pack_b(const bfloat16* b, int64_t ldb, bool trans, int64_t k, int64_t n, int64_t n_pad, bfloat16* out) {
  const int64_t kb_count = round_up(k, kBlockK) / kBlockK, nb_count = n_pad / 16;
  std::fill(out, out + kb_count * kBlockK * n_pad, bfloat16{});
  auto at = [&](int64_t p, int64_t j) -> bfloat16& {
    return out[((((p / kBlockK) * nb_count + j / 16) * 16 + (p % kBlockK) / 2) * 16 + j % 16) * 2 + p % 2];
  };
  if (trans) {  // B stored [n, k]: a (k, k + 1) pair is one 32-bit word of row j
    const int64_t k_even = k / 2 * 2;
    for (int64_t j = 0; j < n; ++j) {
      const bfloat16* row = b + j * ldb;
      for (int64_t p = 0; p < k_even; p += 2) std::memcpy(&at(p, j), row + p, 2 * sizeof(bfloat16));
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
