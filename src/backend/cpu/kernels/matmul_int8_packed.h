// The quantized, packed operands the int8 GEMM kernels share (matmul_int8.h): matmul_int8.cpp
// quantizes op(A) and op(B) once per call straight into these layouts; the AMX kernel
// (matmul_int8.cpp) loads them as tiles, the AVX512-VNNI kernel (matmul_int8_vnni.cpp)
// as zmm registers (a 16-column strip of one K quad is 64 bytes: a tile row, a zmm).
//   A: [32-row block][64-K block][32 rows][64]   B: [64-K block][16-column block][16][16][4]
// Zero past m, n and K, so padding multiplies as zeros.
#pragma once

#include <cstdint>

#include "backend/cpu/kernels/matmul.h"
#include "backend/cpu/kernels/matmul_int8.h"
#include "tessera/base/dtype.h"

namespace tessera::cpu::int8_detail {

constexpr int64_t kBlockK = 64;     // int8 K values in one tile row (64 bytes)
constexpr int64_t kBlock = 32;      // C block: 2x2 AMX tiles of 16x16; A's row block
constexpr int64_t kTaskCols = 256;  // C columns of one task (its int32 sums: 32 x 256)

struct Packed {
  int64_t m, n, k, m_pad, n_pad, k_pad, kb_count;
  int8_t* a;                 // [m_pad / 32][kb_count][32][64]
  int8_t* b;                 // [kb_count][n_pad / 16][16][16][4]
  float *sa, *ia, *sb, *ib;  // scales and their inverses: m_pad of A's rows, n_pad of B's columns
  int32_t* a_sums;           // m_pad ints of scratch for a kernel (the VNNI kernel's row sums)
  int8_t* a_row(int64_t i, int64_t kb) const {
    return a + ((i / kBlock * kb_count + kb) * kBlock + i % kBlock) * kBlockK;
  }
  int8_t* b_quad(int64_t p, int64_t j) const {
    return b + (((p / kBlockK) * (n_pad / 16) + j / 16) * 16 + (p % kBlockK) / 4) * 64 + (j % 16) * 4;
  }
};

// op(A) and op(B) of one problem quantized into this thread's scratch (Scratch::MatmulInt8)
// with AVX-512 (needs x86_isa().avx512): the scales, then the packed values.
Packed quantize_packed(DType dtype, const MatmulShape& s, const void* a, const void* b, const Int8Rounding& round_a,
                       const Int8Rounding& round_b);

// Writes C's rows [r0, min(r0 + 32, m)) x columns [j0, min(j1, n)) (j1 - j0 <= kTaskCols)
// from their exact int32 sums acc[row - r0][col - j0] (row stride kTaskCols):
// (float(acc) * scale_a) * scale_b, then the epilogue (bitwise the unfused ops). `row` is
// scratch for 2 * kTaskCols floats.
void dequantize_block(DType dtype, const Packed& pk, int64_t r0, int64_t j0, int64_t j1, void* c,
                      const GemmEpilogue* epilogue, const int32_t* acc, float* row);

// The product of the packed operands into C on AVX512-VNNI (matmul_int8_vnni.cpp; needs
// x86_isa().avx512_vnni).
void vnni_gemm(DType dtype, const Packed& pk, void* c, const GemmEpilogue* epilogue);

}  // namespace tessera::cpu::int8_detail
