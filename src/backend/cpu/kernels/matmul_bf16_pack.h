// The packed operands of the bf16 GEMM tile kernels (AMX, matmul_amx.h; AVX512-BF16,
// matmul_avx512bf16.h). Both multiply pairs of consecutive K values (k, k + 1) of A's
// rows with the same pairs of B's columns, so both read one layout:
//   A, per block of 32 rows:  [K block of 32][32 rows][32 k]   (a row's pairs contiguous)
//   B, per C tile:            [K block of 32][16-column block][16 pairs][16 columns][2]
// (a 16-column strip of one pair is 64 bytes: one AMX tile row, one zmm register),
// zero past the ends of rows, columns and K, so padding multiplies as zeros.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tessera/base/dtype.h"

namespace tessera::cpu::bf16_pack {

constexpr int64_t kBlockM = 32, kBlockK = 32;

inline int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// Rows [r0, r0 + rows) of op(A) (k columns; A stored [k, m] when `trans`) into `out`:
// round_up(k, 32) * 32 elements.
void pack_a(const bfloat16* a, int64_t lda, bool trans, int64_t r0, int64_t rows, int64_t k, bfloat16* out);

// op(B) (k x n; B stored [n, k] when `trans`) into `out`: round_up(k, 32) * n_pad
// elements, n_pad a multiple of 16 and >= n.
void pack_b(const bfloat16* b, int64_t ldb, bool trans, int64_t k, int64_t n, int64_t n_pad, bfloat16* out);

// A tile kernel's scratch for a sub-problem of k_pad x n_pad: the packed A block
// (kBlockM rows), the packed B panel and kBlockM x n_pad float32 accumulators, each
// 64-byte aligned, in that order.
struct TileScratch {
  bfloat16* a_packed;
  bfloat16* b_packed;
  float* acc;

  static size_t piece(size_t bytes) { return (bytes + 63) / 64 * 64; }
  static size_t bytes(int64_t k_pad, int64_t n_pad) {
    return piece(static_cast<size_t>(kBlockM * k_pad) * sizeof(bfloat16)) +
           piece(static_cast<size_t>(k_pad * n_pad) * sizeof(bfloat16)) +
           piece(static_cast<size_t>(kBlockM * n_pad) * sizeof(float));
  }
  static TileScratch carve(void* scratch, int64_t k_pad, int64_t n_pad) {
    auto* base = static_cast<unsigned char*>(scratch);
    TileScratch t{};
    t.a_packed = reinterpret_cast<bfloat16*>(base);
    base += piece(static_cast<size_t>(kBlockM * k_pad) * sizeof(bfloat16));
    t.b_packed = reinterpret_cast<bfloat16*>(base);
    base += piece(static_cast<size_t>(k_pad * n_pad) * sizeof(bfloat16));
    t.acc = reinterpret_cast<float*>(base);
    return t;
  }
};

}  // namespace tessera::cpu::bf16_pack
