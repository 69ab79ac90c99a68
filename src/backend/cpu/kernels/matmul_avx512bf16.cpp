// AVX512-BF16 bf16 GEMM tiles (matmul_avx512bf16.h). The vector code is in functions
// with a target attribute (the file itself is compiled for the baseline ISA, so nothing
// else in it can pick up AVX-512 instructions) and runs only after avx512bf16_usable().
//
// Micro-kernel: C rows [g, g + 8) x columns [j, j + 48) of a 32-row block as 8 x 3 zmm
// float32 sums. Per K pair: 3 loads of B (16 columns x one pair each), 8 broadcasts of
// an A pair, 24 VDPBF16PS (2 x 16 multiply-adds each): 28 of the 32 zmm registers, and
// 11 loads per 24 dot products, so the two FMA ports, not the loads, are the limit.
// Loop order per 32-row block: column groups outside, row groups inside, so the group's
// B strip (48 columns x K) is read from L1/L2 four times and A's block stays in L2. The
// float32 sums of the block go to scratch and are rounded to bf16 row by row (the
// vectorized cast, as the AMX kernel).
#include "backend/cpu/kernels/matmul_avx512bf16.h"

#include <algorithm>
#include <cstring>

#include "backend/cpu/kernels/bf16_rows_avx512.h"
#include "backend/cpu/kernels/cpu_isa.h"
#include "backend/cpu/kernels/elementwise.h"
#include "backend/cpu/kernels/matmul_bf16_pack.h"
#include "tessera/base/error.h"

// TESSERA_HAS_AVX512_KERNELS: the compiler takes AVX512-BF16 / VNNI target attributes
// (CMakeLists.txt checks it); the build compiles this file once more with it off
// (cmake/feature_variants.cmake).
#if defined(__x86_64__) && TESSERA_HAS_AVX512_KERNELS
#include <immintrin.h>
#define TESSERA_AVX512BF16 1
#define TESSERA_TARGET_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")))
#else
#define TESSERA_AVX512BF16 0
#endif

namespace tessera::cpu {
namespace {

using bf16_pack::kBlockK;
using bf16_pack::kBlockM;
using bf16_pack::round_up;

bool probe(const char** why) {
  const X86Isa& isa = x86_isa();
  if (!TESSERA_AVX512BF16) {
    *why = "built without AVX512-BF16 kernels (not x86-64, or the compiler lacks the target)";
    return false;
  }
  if (!isa.avx512) {
    *why = isa.why_no_avx512;
    return false;
  }
  if (!isa.avx512_bf16) {
    *why = "the CPU has no AVX512-BF16";
    return false;
  }
  *why = "";
  return true;
}

#if TESSERA_AVX512BF16

constexpr int kRows = 8;             // rows of the micro-tile
constexpr int64_t kPairs = 16;       // K pairs per packed K block
constexpr int64_t kStrip = 16 * 32;  // elements of one 16-column block of one K block in packed B

TESSERA_TARGET_AVX512BF16 inline __m512bh as_pairs(__m512i v) { return (__m512bh)v; }

// Where the A block's rows are: packed (row r of K block kb at kb * 32 * 32 + r * 32)
// or read in place from A stored [m, k] (at kb * 32 + r * lda), which skips the copy
// when no padding is needed.
struct ARows {
  int64_t row_stride, kb_stride;
};

// Sums of rows [0, 8) of `a` (A at the group's first row) times kVecs 16-column
// blocks of `b` (packed B at the group's first block) over kb_count K blocks, stored to
// out (row stride out_stride floats). Every lane adds its pairs in K order from +0.
template <int kVecs>
TESSERA_TARGET_AVX512BF16 void micro_tile(const bfloat16* a, ARows a_rows, const bfloat16* b, int64_t kb_count,
                                          int64_t b_kb_stride, float* out, int64_t out_stride) {
  __m512 acc[kRows][kVecs];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 3
    for (int v = 0; v < kVecs; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t kb = 0; kb < kb_count; ++kb) {
    const bfloat16* pa = a + kb * a_rows.kb_stride;
    const bfloat16* pb = b + kb * b_kb_stride;
    for (int64_t q = 0; q < kPairs; ++q) {
      __m512bh bv[kVecs];
#pragma GCC unroll 3
      for (int v = 0; v < kVecs; ++v) bv[v] = as_pairs(_mm512_loadu_si512(pb + v * kStrip + q * 32));
#pragma GCC unroll 8
      for (int r = 0; r < kRows; ++r) {
        int32_t pair;
        std::memcpy(&pair, pa + r * a_rows.row_stride + 2 * q, sizeof(pair));
        const __m512bh av = as_pairs(_mm512_set1_epi32(pair));
#pragma GCC unroll 3
        for (int v = 0; v < kVecs; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], bv[v], av);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 3
    for (int v = 0; v < kVecs; ++v) _mm512_storeu_ps(out + r * out_stride + 16 * v, acc[r][v]);
}

// The float32 sums of a 32-row block of A (`rows` of them real; rows past them only
// when packed) times all of packed B (n_pad columns) into acc [32][n_pad].
TESSERA_TARGET_AVX512BF16 void block_product(const bfloat16* a_block, ARows a_rows, const bfloat16* b_packed,
                                             int64_t rows, int64_t kb_count, int64_t n_pad, float* acc) {
  const int64_t b_kb_stride = n_pad * kBlockK;
  for (int64_t j = 0; j < n_pad; j += 48) {
    const int64_t vecs = std::min<int64_t>(3, (n_pad - j) / 16);
    const bfloat16* b = b_packed + (j / 16) * kStrip;
    for (int64_t g = 0; g < rows; g += kRows) {
      const bfloat16* a = a_block + g * a_rows.row_stride;
      float* out = acc + g * n_pad + j;
      if (vecs == 3)
        micro_tile<3>(a, a_rows, b, kb_count, b_kb_stride, out, n_pad);
      else if (vecs == 2)
        micro_tile<2>(a, a_rows, b, kb_count, b_kb_stride, out, n_pad);
      else
        micro_tile<1>(a, a_rows, b, kb_count, b_kb_stride, out, n_pad);
    }
  }
}

#endif  // TESSERA_AVX512BF16

}  // namespace

bool avx512bf16_usable(const char** why_not) {
  static const char* why = "";
  static const bool usable = probe(&why);
  if (why_not) *why_not = why;
  return usable;
}

size_t avx512bf16_scratch_bytes(const MatmulShape& sub) {
  const int64_t k_pad = round_up(sub.k, kBlockK), n_pad = round_up(sub.n, 16);
  return bf16_pack::TileScratch::bytes(k_pad, n_pad);
}

void avx512bf16_gemm_tile(const bfloat16* a, const bfloat16* b, bfloat16* c, int64_t ldc, const MatmulShape& sub,
                          const MatmulShape& full, void* scratch, const bf16_rows::Epilogue* epilogue,
                          bfloat16* pre_activation) {
#if !TESSERA_AVX512BF16
  fail<Error>("matmul: the AVX512-BF16 kernel was not built (avx512bf16_usable() is false here)");
#else
  const int64_t k_pad = round_up(sub.k, kBlockK), n_pad = round_up(sub.n, 16);
  const auto [a_packed, b_packed, acc] = bf16_pack::TileScratch::carve(scratch, k_pad, n_pad);
  const int64_t lda = sub.trans_a ? full.m : sub.k, ldb = sub.trans_b ? sub.k : full.n;
  bf16_pack::pack_b(b, ldb, sub.trans_b, sub.k, sub.n, n_pad, b_packed);
  for (int64_t r0 = 0; r0 < sub.m; r0 += kBlockM) {
    const int64_t rows = std::min(kBlockM, sub.m - r0);
    // A stored [m, k] already has each row's pairs contiguous: read it in place unless
    // the block needs zero padding (a partial K block, or rows past the last 8-row group).
    if (!sub.trans_a && sub.k == k_pad && rows % kRows == 0) {
      block_product(a + r0 * lda, ARows{lda, kBlockK}, b_packed, rows, k_pad / kBlockK, n_pad, acc);
    } else {
      bf16_pack::pack_a(a, lda, sub.trans_a, r0, rows, sub.k, a_packed);
      block_product(a_packed, ARows{kBlockK, kBlockM * kBlockK}, b_packed, rows, k_pad / kBlockK, n_pad, acc);
    }
    for (int64_t r = 0; r < rows; ++r) {
      bfloat16* out = c + (r0 + r) * ldc;
      if (epilogue) {
        bfloat16* pre = pre_activation ? pre_activation + (r0 + r) * ldc : nullptr;
        bf16_rows::store_row(acc + r * n_pad, sub.n, *epilogue, out, pre);
      } else {
        cast_span(DType::Float32, acc + r * n_pad, DType::BFloat16, out, sub.n);
      }
    }
  }
#endif
}

}  // namespace tessera::cpu
