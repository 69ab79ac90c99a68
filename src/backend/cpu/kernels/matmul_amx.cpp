// AMX bf16 GEMM tiles (matmul_amx.h). Compiled with -mamx-tile -mamx-bf16; the code
// runs only after amx_bf16_usable() said the CPU and the OS allow it.
//
// Layout: 8 tile registers, C as 2x2 tiles of 16x16 float32 (a 32x32 block), A as two
// 16-row x 32-k tiles, B as two 32-k x 16-column tiles in the VNNI pair layout. A is
// packed per 32-row block ([k block][32 rows][32 k], zero padded), B once per C tile
// ([k block][16-column block][16 k pairs][16 columns][2]); the float32 results of a
// 32-row block go to scratch and are rounded to bf16 row by row (the vectorized cast).
// 0.43-1.55 TFLOP/s on 2 cores of an AMX Xeon by shape: bench/results/2026-11-27-bf16-cpu.md.
#include "backend/cpu/kernels/matmul_amx.h"

#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "backend/cpu/kernels/elementwise.h"
#include "tessera/base/error.h"
#include "tessera/base/flags.h"

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

constexpr int64_t kBlockM = 32, kBlockN = 32, kBlockK = 32;

int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }
size_t aligned(size_t bytes) { return (bytes + 63) / 64 * 64; }

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

// (Unused where the file is built without AMX: the tile kernel is compiled out.)
// A rows [r0, r0 + rows) of op(A) (k columns) into [k block][32 rows][32], zeros past the ends.
[[maybe_unused]] void pack_a(const bfloat16* a, int64_t lda, bool trans, int64_t r0, int64_t rows, int64_t k,
                             bfloat16* out) {
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

// op(B) (k x n) into [k block][16-column block][16 pairs][16 columns][2], zeros past the ends.
[[maybe_unused]] void pack_b(const bfloat16* b, int64_t ldb, bool trans, int64_t k, int64_t n, int64_t n_pad,
                             bfloat16* out) {
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
  } else {
    // Rows p and p + 1 interleave into pairs: 8 columns at a time with unpacklo/hi.
    for (int64_t p = 0; p < k; p += 2) {
      const bfloat16* even = b + p * ldb;
      const bfloat16* odd = p + 1 < k ? b + (p + 1) * ldb : nullptr;
      int64_t j = 0;
      for (; j + 8 <= n; j += 8) {
        const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(even + j));
        const __m128i o = odd ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(odd + j)) : _mm_setzero_si128();
        auto* dst = reinterpret_cast<__m128i*>(&at(p, j));
        _mm_storeu_si128(dst, _mm_unpacklo_epi16(e, o));
        _mm_storeu_si128(dst + 1, _mm_unpackhi_epi16(e, o));
      }
      for (; j < n; ++j) {
        at(p, j) = even[j];
        if (odd) at(p + 1, j) = odd[j];
      }
    }
  }
}

}  // namespace

bool amx_bf16_usable(const char** why_not) {
  static const char* why = "";
  static const bool usable = probe(&why);
  if (why_not) *why_not = why;
  return usable;
}

const Bf16GemmPath& bf16_gemm_path() {
  static const Bf16GemmPath path = [] {
    const char* setting = flags::env("TESSERA_CPU_BF16_GEMM");
    const std::string mode = setting && *setting ? setting : "auto";
    if (mode != "auto" && mode != "float32")
      fail<ValueError>("TESSERA_CPU_BF16_GEMM={} (expected auto or float32)", mode);
    if (mode == "float32")
      return Bf16GemmPath{false, "float32 sgemm on widened operands (TESSERA_CPU_BF16_GEMM=float32)"};
    const char* why = "";
    if (amx_bf16_usable(&why)) return Bf16GemmPath{true, "AMX tiles (TDPBF16PS: bf16 products, float32 accumulation)"};
    return Bf16GemmPath{false, fmt::format("float32 sgemm on widened operands ({})", why)};
  }();
  return path;
}

size_t amx_bf16_scratch_bytes(const MatmulShape& sub) {
  const int64_t k_pad = round_up(sub.k, kBlockK), n_pad = round_up(sub.n, kBlockN);
  return aligned(static_cast<size_t>(kBlockM * k_pad) * sizeof(bfloat16)) +
         aligned(static_cast<size_t>(k_pad * n_pad) * sizeof(bfloat16)) +
         aligned(static_cast<size_t>(kBlockM * n_pad) * sizeof(float));
}

void amx_bf16_gemm_tile(const bfloat16* a, const bfloat16* b, bfloat16* c, int64_t ldc, const MatmulShape& sub,
                        const MatmulShape& full, void* scratch) {
#if !TESSERA_AMX_BF16
  fail<Error>("matmul: the AMX bf16 kernel was not built (amx_bf16_usable() is false here)");
#else
  const int64_t k_pad = round_up(sub.k, kBlockK), n_pad = round_up(sub.n, kBlockN);
  const int64_t kb_count = k_pad / kBlockK, nb_count = n_pad / 16;
  auto* base = static_cast<unsigned char*>(scratch);
  auto* a_packed = reinterpret_cast<bfloat16*>(base);
  base += aligned(static_cast<size_t>(kBlockM * k_pad) * sizeof(bfloat16));
  auto* b_packed = reinterpret_cast<bfloat16*>(base);
  base += aligned(static_cast<size_t>(k_pad * n_pad) * sizeof(bfloat16));
  auto* acc = reinterpret_cast<float*>(base);
  const int64_t lda = sub.trans_a ? full.m : sub.k, ldb = sub.trans_b ? sub.k : full.n;
  pack_b(b, ldb, sub.trans_b, sub.k, sub.n, n_pad, b_packed);

  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = 16;
    config.colsb[t] = 64;
  }
  _tile_loadconfig(&config);
  const size_t acc_stride = static_cast<size_t>(n_pad) * sizeof(float);
  for (int64_t r0 = 0; r0 < sub.m; r0 += kBlockM) {
    const int64_t rows = std::min(kBlockM, sub.m - r0);
    pack_a(a, lda, sub.trans_a, r0, rows, sub.k, a_packed);
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
