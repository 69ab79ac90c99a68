// The int8 GEMM on AVX512-VNNI (matmul_int8.h's Avx512Vnni kernel) over the packed
// operands of matmul_int8_packed.h, for CPUs without AMX (AMD Zen 4, Intel Ice Lake and
// Cooper Lake). The vector code is in functions with a target attribute and runs only
// after int8_kernel_usable(Avx512Vnni).
//
// VPDPBUSD multiplies unsigned bytes by signed bytes, four per int32 lane, and adds the
// four products to the lane (wrapping, no saturation). Both quantized operands are signed
// (-127..127), so B enters offset by 128 (b' = b XOR 0x80 = b + 128, in 1..255):
//   sum_p a_ip b'_pj = sum_p a_ip b_pj + 128 sum_p a_ip
// and each accumulator starts at -128 sum_p a_ip (row i's sum, computed once per call
// with the same instruction). Everything is int32 arithmetic mod 2^32 and the true sum
// fits in int32 (|sum| <= K 127^2), so the result is the exact sum: bitwise the AMX and
// float64 paths' C. VPDPWSSD on int16 pairs needs no offset but does half the products
// per instruction.
//
// Micro-kernel: 8 rows x 48 columns as 8 x 3 zmm int32 sums over the whole K. Per K quad:
// 3 loads of B (16 columns x 4 bytes), 3 XORs, 8 broadcasts of an A quad, 24 VPDPBUSD
// (64 multiply-adds each). Tasks are (32-row block, 192 columns), column groups outside
// row groups, so a group's B strip (48 columns x K bytes) is read from L1 four times.
#include <algorithm>
#include <cstring>

#include "backend/cpu/kernels/matmul_int8_packed.h"
#include "backend/cpu/kernels/scratch.h"
#include "tessera/base/error.h"
#include "tessera/base/thread_pool.h"

#if defined(__x86_64__) && TESSERA_HAS_AVX512_KERNELS
#include <immintrin.h>
#define TESSERA_INT8_VNNI 1
#define TESSERA_TARGET_VNNI __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")))
#else
#define TESSERA_INT8_VNNI 0
#endif

namespace tessera::cpu::int8_detail {
namespace {

#if TESSERA_INT8_VNNI

constexpr int kRows = 8;                // rows of the micro-tile
constexpr int64_t kVnniTaskCols = 192;  // 4 micro-tiles of 48 columns; <= kTaskCols
constexpr int64_t kQuads = kBlockK / 4;

TESSERA_TARGET_VNNI inline __m512i broadcast_quad(const int8_t* p) {
  int32_t quad;
  std::memcpy(&quad, p, sizeof(quad));
  return _mm512_set1_epi32(quad);
}

// a_sums[i] = 128 * (sum of row i of packed A) for the rows of 32-row blocks [b0, b1).
TESSERA_TARGET_VNNI void row_sums(const Packed& pk, int64_t b0, int64_t b1) {
  const __m512i offset = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t i = b0 * kBlock; i < b1 * kBlock; ++i) {
    __m512i sum = _mm512_setzero_si512();
    for (int64_t kb = 0; kb < pk.kb_count; ++kb)
      sum = _mm512_dpbusd_epi32(sum, offset, _mm512_loadu_si512(pk.a_row(i, kb)));
    // (Not _mm512_reduce_add_epi32: GCC 12's starts from an undefined vector, which
    // -Wmaybe-uninitialized reports.)
    alignas(64) int32_t lane[16];
    _mm512_store_si512(lane, sum);
    int32_t total = 0;
    for (int32_t v : lane) total += v;
    pk.a_sums[i] = total;
  }
}

// Sums of rows [i0, i0 + 8) (within one 32-row block) times the kVecs 16-column blocks
// from column j (a multiple of 16) into out (row stride kTaskCols).
template <int kVecs>
TESSERA_TARGET_VNNI void micro_tile(const Packed& pk, int64_t i0, int64_t j, int32_t* out) {
  __m512i acc[kRows][kVecs];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 3
    for (int v = 0; v < kVecs; ++v) acc[r][v] = _mm512_set1_epi32(-pk.a_sums[i0 + r]);
  const __m512i offset = _mm512_set1_epi8(static_cast<char>(0x80));
  const int64_t nb16 = pk.n_pad / 16;
  for (int64_t kb = 0; kb < pk.kb_count; ++kb) {
    const int8_t* pa = pk.a_row(i0, kb);
    const int8_t* pb = pk.b + (kb * nb16 + j / 16) * 1024;
    for (int64_t q = 0; q < kQuads; ++q) {
      __m512i bv[kVecs];
#pragma GCC unroll 3
      for (int v = 0; v < kVecs; ++v) bv[v] = _mm512_xor_si512(_mm512_loadu_si512(pb + v * 1024 + q * 64), offset);
#pragma GCC unroll 8
      for (int r = 0; r < kRows; ++r) {
        const __m512i av = broadcast_quad(pa + r * kBlockK + 4 * q);
#pragma GCC unroll 3
        for (int v = 0; v < kVecs; ++v) acc[r][v] = _mm512_dpbusd_epi32(acc[r][v], bv[v], av);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 3
    for (int v = 0; v < kVecs; ++v) _mm512_storeu_si512(out + r * kTaskCols + 16 * v, acc[r][v]);
}

// The int32 sums of C rows [r0, r0 + 32) x columns [j0, j1) into acc (row stride kTaskCols).
TESSERA_TARGET_VNNI void block_sums(const Packed& pk, int64_t r0, int64_t j0, int64_t j1, int32_t* acc) {
  const int64_t rows = std::min(kBlock, pk.m - r0);
  for (int64_t j = j0; j < j1; j += 48) {
    const int64_t vecs = std::min<int64_t>(3, (j1 - j) / 16);
    for (int64_t g = 0; g < rows; g += kRows) {
      int32_t* out = acc + g * kTaskCols + (j - j0);
      if (vecs == 3)
        micro_tile<3>(pk, r0 + g, j, out);
      else if (vecs == 2)
        micro_tile<2>(pk, r0 + g, j, out);
      else
        micro_tile<1>(pk, r0 + g, j, out);
    }
  }
}

#endif  // TESSERA_INT8_VNNI

}  // namespace

void vnni_gemm(DType dtype, const Packed& pk, void* c, const GemmEpilogue* epilogue) {
#if !TESSERA_INT8_VNNI
  fail<Error>("quantized_matmul: the AVX512-VNNI kernel was not built (int8_kernel_usable() is false here)");
#else
  const int64_t row_blocks = pk.m_pad / kBlock, col_tasks = num_chunks(pk.n_pad, kVnniTaskCols);
  parallel_for(row_blocks, 4, [&](int64_t begin, int64_t end) { row_sums(pk, begin, end); });
  const ChunkScratch scratch(sizeof(int32_t) * kBlock * kTaskCols + 2 * sizeof(float) * kTaskCols,
                             Scratch::MatmulInt8Chunks);
  parallel_for(row_blocks * col_tasks, 1, [&](int64_t begin, int64_t end) {
    const ChunkScratch::Lease lease(scratch);
    auto* acc = lease.as<int32_t>();
    auto* row = lease.as<float>(sizeof(int32_t) * kBlock * kTaskCols);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t r0 = t / col_tasks * kBlock, j0 = t % col_tasks * kVnniTaskCols;
      const int64_t j1 = std::min(pk.n_pad, j0 + kVnniTaskCols);
      block_sums(pk, r0, j0, j1, acc);
      dequantize_block(dtype, pk, r0, j0, j1, c, epilogue, acc, row);
    }
  });
#endif
}

}  // namespace tessera::cpu::int8_detail
