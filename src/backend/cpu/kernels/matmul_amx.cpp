// AMX bf16 GEMM tiles (matmul_amx.h). Compiled with -mamx-tile -mamx-bf16; the code
// runs only after amx_bf16_usable() said the CPU and the OS allow it.
//
// Layout: 8 tile registers, C as 2x2 tiles of 16x16 float32 (a 32x32 block), A as two
// 16-row x 32-k tiles, B as two 32-k x 16-column tiles in the VNNI pair layout. A is
// packed per 32-row block ([k block][32 rows][32 k], zero padded), B once per C tile
// ([k block][16-column block][16 k pairs][16 columns][2]; matmul_bf16_pack.h); the float32 results of a
// 32-row block go to scratch and are rounded to bf16 row by row (the vectorized cast).
// 0.43-1.55 TFLOP/s on 2 cores of an AMX Xeon by shape: bench/results/2026-11-27-bf16-cpu.md.
#include "backend/cpu/kernels/matmul_amx.h"

#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

#include "backend/cpu/kernels/elementwise.h"
#include "backend/cpu/kernels/matmul_bf16_pack.h"
#include "tessera/base/error.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

// GCC spells the macro __AMX_BF16__, clang __AMXBF16__.
#if defined(__x86_64__) && (defined(__AMX_BF16__) || defined(__AMXBF16__))
#define TESSERA_AMX_BF16 1
#else
#define TESSERA_AMX_BF16 0
#endif

namespace tessera::cpu {
namespace {

using bf16_pack::kBlockK;
using bf16_pack::kBlockM;
using bf16_pack::round_up;
constexpr int64_t kBlockN = 32;

struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

bool probe(const char** why) {
#if TESSERA_AMX_BF16
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0 || (edx & (1u << 22)) == 0 || (edx & (1u << 24)) == 0) {
    *why = "the CPU has no AMX-BF16";
    return false;
  }
  // Linux gives a process the AMX tile state only on request (XFEATURE_XTILEDATA = 18).
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) {
    *why = "the kernel refused the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM)";
    return false;
  }
  *why = "";
  return true;
#else
  *why = "built without AMX (not x86-64)";
  return false;
#endif
}

}  // namespace

bool amx_bf16_usable(const char** why_not) {
  static const char* why = "";
  static const bool usable = probe(&why);
  if (why_not) *why_not = why;
  return usable;
}

size_t amx_bf16_scratch_bytes(const MatmulShape& sub) {
  const int64_t k_pad = round_up(sub.k, kBlockK), n_pad = round_up(sub.n, kBlockN);
  return bf16_pack::TileScratch::bytes(k_pad, n_pad);
}

void amx_bf16_gemm_tile(const bfloat16* a, const bfloat16* b, bfloat16* c, int64_t ldc, const MatmulShape& sub,
                        const MatmulShape& full, void* scratch) {
#if !TESSERA_AMX_BF16
  fail<Error>("matmul: the AMX bf16 kernel was not built (amx_bf16_usable() is false here)");
#else
  const int64_t k_pad = round_up(sub.k, kBlockK), n_pad = round_up(sub.n, kBlockN);
  const int64_t kb_count = k_pad / kBlockK, nb_count = n_pad / 16;
  const auto [a_packed, b_packed, acc] = bf16_pack::TileScratch::carve(scratch, k_pad, n_pad);
  const int64_t lda = sub.trans_a ? full.m : sub.k, ldb = sub.trans_b ? sub.k : full.n;
  bf16_pack::pack_b(b, ldb, sub.trans_b, sub.k, sub.n, n_pad, b_packed);

  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = 16;
    config.colsb[t] = 64;
  }
  _tile_loadconfig(&config);
  const size_t acc_stride = static_cast<size_t>(n_pad) * sizeof(float);
  for (int64_t r0 = 0; r0 < sub.m; r0 += kBlockM) {
    const int64_t rows = std::min(kBlockM, sub.m - r0);
    bf16_pack::pack_a(a, lda, sub.trans_a, r0, rows, sub.k, a_packed);
    for (int64_t j0 = 0; j0 < n_pad; j0 += kBlockN) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t kb = 0; kb < kb_count; ++kb) {
        const bfloat16* at = a_packed + kb * kBlockM * kBlockK;
        const bfloat16* bt = b_packed + (kb * nb_count + j0 / 16) * 16 * 32;
        _tile_loadd(4, at, 64);
        _tile_loadd(5, at + 16 * kBlockK, 64);
        _tile_loadd(6, bt, 64);
        _tile_loadd(7, bt + 16 * 32, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, acc + j0, acc_stride);
      _tile_stored(1, acc + j0 + 16, acc_stride);
      _tile_stored(2, acc + 16 * n_pad + j0, acc_stride);
      _tile_stored(3, acc + 16 * n_pad + j0 + 16, acc_stride);
    }
    for (int64_t r = 0; r < rows; ++r)
      cast_span(DType::Float32, acc + r * n_pad, DType::BFloat16, c + (r0 + r) * ldc, sub.n);
  }
  _tile_release();
#endif
}

}  // namespace tessera::cpu
