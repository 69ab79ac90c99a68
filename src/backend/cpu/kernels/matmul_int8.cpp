// int8 GEMMs with dynamic symmetric quantization (matmul_int8.h): the paths, the float64
// reference, the AVX-512 quantizer and the AMX kernel (the AVX512-VNNI kernel is
// matmul_int8_vnni.cpp). Compiled with -mamx-tile -mamx-int8 -ffp-contract=off (no fused
// multiply-adds: the quantization's x * inv + u must round twice on every path); the
// AVX-512 code is in functions with a target attribute and runs only after
// int8_kernel_usable() found AMX-INT8 or AVX512-VNNI (each with AVX-512 F/BW/DQ/VL).
//
// AMX layout: C blocks of 32x32 as 2x2 tiles of 16x16 int32; A tiles are 16 rows x 64
// int8 (K), B tiles 16 quads of K x 16 columns x 4 (the VNNI layout TDPBSSD reads).
// Both operands are quantized once per call, straight into their packed layouts
// (matmul_int8_packed.h):
//   A: [32-row block][64-K block][32 rows][64]   B: [64-K block][16-column block][16][16][4]
// then the GEMM runs over (32-row block, up to 256 columns) tasks.
#include "backend/cpu/kernels/matmul_int8.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/kernels/bf16_rows_avx512.h"
#include "backend/cpu/kernels/cpu_isa.h"
#include "backend/cpu/kernels/elementwise.h"
#include "backend/cpu/kernels/matmul_int8_packed.h"
#include "backend/cpu/kernels/scratch.h"
#include "tessera/base/error.h"
#include "tessera/base/flags.h"
#include "tessera/base/thread_pool.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

// The quantizer: AVX-512 in functions with a target attribute, where the compiler takes
// them (TESSERA_HAS_AVX512_KERNELS: CMakeLists.txt checks it; the build compiles this file
// once more with it off, cmake/feature_variants.cmake). GCC spells the AMX macro
// __AMX_INT8__, clang __AMXINT8__.
#if defined(__x86_64__) && TESSERA_HAS_AVX512_KERNELS
#define TESSERA_INT8_AVX512 1
#define TESSERA_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#else
#define TESSERA_INT8_AVX512 0
#endif
#if TESSERA_INT8_AVX512 && (defined(__AMX_INT8__) || defined(__AMXINT8__))
#define TESSERA_AMX_INT8 1
#else
#define TESSERA_AMX_INT8 0
#endif

// GCC 12's AVX-512 headers start some intrinsics from an intentionally undefined vector
// (_mm512_undefined_*), which -Wmaybe-uninitialized reports once they are inlined here.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace tessera::cpu {
namespace {

constexpr float kLevels = 127.0f;
size_t aligned(size_t bytes) { return (bytes + 63) / 64 * 64; }

float load_value(DType dtype, const void* base, int64_t index) {
  if (dtype == DType::Float32) return static_cast<const float*>(base)[index];
  const uint16_t bits = static_cast<const uint16_t*>(base)[index];
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

// The scale and its inverse of a row/column with largest magnitude `amax`; a non-finite
// value makes the scale NaN (every result of that row or column is then NaN) and the
// inverse 0.
struct Scale {
  float scale, inv;
};
Scale scale_of(float amax, bool finite) {
  if (!finite) return {std::numeric_limits<float>::quiet_NaN(), 0.0f};
  if (amax == 0.0f) return {0.0f, 0.0f};
  return {amax / kLevels, kLevels / amax};
}

int8_t quantize_one(float x, float inv, const Int8Rounding& r, uint32_t p) {
  float t = x * inv;
  if (r.stochastic) {
    t = t + int8_rounding_noise(r.seed, p, std::bit_cast<uint32_t>(x));
    t = std::floor(t);
  } else {
    t = std::nearbyint(t);
  }
  // As the vector code's max/min: NaN (a non-finite row, whose scale is NaN) -> -127.
  if (!(t >= -kLevels)) t = -kLevels;
  if (t > kLevels) t = kLevels;
  return static_cast<int8_t>(t);
}

// Writes C's row `i`, columns [j0, j0 + cols) (leading dimension n), from its dequantized
// float32 values in `row`, with the epilogue when there is one: bitwise what the unfused
// add and activation ops give (float32: each op's per-element code; bf16: the product
// rounded, then each op in float32 rounded again, as matmul.cpp's bf16 epilogue).
// `bias_row` is scratch for `cols` floats.
void finish_row(DType dtype, const GemmEpilogue* e, float* row, float* bias_row, void* c, int64_t n, int64_t i,
                int64_t j0, int64_t cols) {
  const int64_t at = i * n + j0;
  if (dtype == DType::Float32) {
    float* out = static_cast<float*>(c) + at;
    if (!e) {
      std::memcpy(out, row, sizeof(float) * static_cast<size_t>(cols));
      return;
    }
    float* sum = e->pre_activation ? static_cast<float*>(e->pre_activation) + at : out;
    if (e->bias) {
      const float* bias = static_cast<const float*>(e->bias) + j0;
      if (e->bias_first)
        binary_span(BinaryOp::Add, DType::Float32, bias, 1, row, 1, sum, cols);
      else
        binary_span(BinaryOp::Add, DType::Float32, row, 1, bias, 1, sum, cols);
    } else {
      std::memcpy(sum, row, sizeof(float) * static_cast<size_t>(cols));
    }
    if (e->has_activation) unary_span(e->activation, DType::Float32, sum, out, cols);
    return;
  }
  auto* out = static_cast<bfloat16*>(c) + at;
  cast_span(DType::Float32, row, DType::BFloat16, out, cols);
  if (!e) return;
  cast_span(DType::BFloat16, out, DType::Float32, row, cols);
  if (e->bias) {
    cast_span(DType::BFloat16, static_cast<const bfloat16*>(e->bias) + j0, DType::Float32, bias_row, cols);
    if (e->bias_first)
      binary_span(BinaryOp::Add, DType::Float32, bias_row, 1, row, 1, row, cols);
    else
      binary_span(BinaryOp::Add, DType::Float32, row, 1, bias_row, 1, row, cols);
  }
  if (e->has_activation) {
    bfloat16* sum = e->pre_activation ? static_cast<bfloat16*>(e->pre_activation) + at : out;
    cast_span(DType::Float32, row, DType::BFloat16, sum, cols);
    cast_span(DType::BFloat16, sum, DType::Float32, row, cols);
    unary_span(e->activation, DType::Float32, row, row, cols);
  }
  cast_span(DType::Float32, row, DType::BFloat16, out, cols);
}

// ---- float64 reference path: the same quantized values, exact products in dgemm ----

// Scales of the `rows` rows of op(X) (contraction length k): op(X)[i, p] at
// index(i, p) of the stored operand.
template <typename Index>
void reference_scales(DType dtype, const void* x, int64_t rows, int64_t k, Index index, float* scale, float* inv) {
  parallel_for(rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float amax = 0.0f;
      bool finite = true;
      for (int64_t p = 0; p < k; ++p) {
        const float a = std::fabs(load_value(dtype, x, index(i, p)));
        if (!(a <= std::numeric_limits<float>::max())) finite = false;
        amax = std::max(amax, a);
      }
      const Scale s = scale_of(amax, finite);
      scale[i] = s.scale;
      inv[i] = s.inv;
    }
  });
}

void reference_path(DType dtype, const MatmulShape& s, const void* a, const void* b, void* c,
                    const Int8Rounding& round_a, const Int8Rounding& round_b, const GemmEpilogue* epilogue) {
  const int64_t m = s.m, n = s.n, k = s.k;
  // Scratch: op(A) as [m, k] doubles, op(B) as [k, n] doubles, C as [m, n] doubles, scales.
  const size_t qa_bytes = aligned(sizeof(double) * static_cast<size_t>(m * k));
  const size_t qb_bytes = aligned(sizeof(double) * static_cast<size_t>(k * n));
  const size_t qc_bytes = aligned(sizeof(double) * static_cast<size_t>(m * n));
  const size_t scale_bytes = aligned(sizeof(float) * static_cast<size_t>(2 * (m + n)));
  auto* base = thread_scratch<unsigned char>(qa_bytes + qb_bytes + qc_bytes + scale_bytes, Scratch::MatmulInt8);
  auto* qa = reinterpret_cast<double*>(base);
  auto* qb = reinterpret_cast<double*>(base + qa_bytes);
  auto* qc = reinterpret_cast<double*>(base + qa_bytes + qb_bytes);
  auto* scales = reinterpret_cast<float*>(base + qa_bytes + qb_bytes + qc_bytes);
  float *sa = scales, *ia = scales + m, *sb = scales + 2 * m, *ib = scales + 2 * m + n;
  auto a_index = [&](int64_t i, int64_t p) { return s.trans_a ? p * m + i : i * k + p; };
  auto b_index = [&](int64_t j, int64_t p) { return s.trans_b ? j * k + p : p * n + j; };
  reference_scales(dtype, a, m, k, a_index, sa, ia);
  reference_scales(dtype, b, n, k, b_index, sb, ib);
  parallel_for(m, 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      for (int64_t p = 0; p < k; ++p)
        qa[i * k + p] = quantize_one(load_value(dtype, a, a_index(i, p)), ia[i], round_a, static_cast<uint32_t>(p));
  });
  parallel_for(k, 16, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p)
      for (int64_t j = 0; j < n; ++j)
        qb[p * n + j] = quantize_one(load_value(dtype, b, b_index(j, p)), ib[j], round_b, static_cast<uint32_t>(p));
  });
  MatmulShape plain;
  plain.m = m;
  plain.n = n;
  plain.k = k;
  matmul(DType::Float64, plain, qa, qb, qc);
  const ChunkScratch rows(2 * sizeof(float) * static_cast<size_t>(n), Scratch::MatmulInt8Chunks);
  parallel_for(m, 16, [&](int64_t begin, int64_t end) {
    const ChunkScratch::Lease lease(rows);
    auto* row = lease.as<float>();
    for (int64_t i = begin; i < end; ++i) {
      for (int64_t j = 0; j < n; ++j) row[j] = (static_cast<float>(qc[i * n + j]) * sa[i]) * sb[j];
      finish_row(dtype, epilogue, row, row + n, c, n, i, 0, n);
    }
  });
}

// ---- quantization into the packed layouts (matmul_int8_packed.h), AVX-512 ----

#if TESSERA_INT8_AVX512

using int8_detail::kBlock;
using int8_detail::kBlockK;
using int8_detail::kTaskCols;
using int8_detail::Packed;

// 16 values from `x` (float32 or bf16) at element `at`, as float32; lanes past `mask` 0.
TESSERA_AVX512 __m512 load16(DType dtype, const void* x, int64_t at, __mmask16 mask) {
  if (dtype == DType::Float32) return _mm512_maskz_loadu_ps(mask, static_cast<const float*>(x) + at);
  const __m256i h = _mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(x) + at);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

TESSERA_AVX512 __m512i fmix16(__m512i h) {
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
  h = _mm512_mullo_epi32(h, _mm512_set1_epi32(static_cast<int>(0x85ebca6bu)));
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 13));
  h = _mm512_mullo_epi32(h, _mm512_set1_epi32(static_cast<int>(0xc2b2ae35u)));
  return _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
}

constexpr uint32_t kGolden = 0x9e3779b1u;

// p * kGolden (mod 2^32) for the contraction indices p0 .. p0 + 15 (one per lane).
TESSERA_AVX512 __m512i golden_lanes(int64_t p0) {
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i lane_golden = _mm512_mullo_epi32(lane, _mm512_set1_epi32(static_cast<int>(kGolden)));
  return _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(p0) * kGolden)), lane_golden);
}
TESSERA_AVX512 __m512i golden_all(int64_t p) {
  return _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(p) * kGolden));
}

// 16 quantized values (int8 in the low byte of each int32 lane's result) of x * inv, as
// quantize_one; p_golden: each lane's contraction index times kGolden.
TESSERA_AVX512 __m128i quantize16(__m512 x, __m512 inv, const Int8Rounding& r, __m512i p_golden) {
  __m512 t = _mm512_mul_ps(x, inv);
  if (r.stochastic) {
    __m512i h = _mm512_xor_si512(_mm512_castps_si512(x), _mm512_set1_epi32(static_cast<int>(r.seed & 0xffffffffu)));
    h = _mm512_add_epi32(_mm512_xor_si512(h, p_golden), _mm512_set1_epi32(static_cast<int>(r.seed >> 32)));
    h = fmix16(h);
    const __m512 u = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(h, 8)), _mm512_set1_ps(1.0f / 16777216.0f));
    t = _mm512_add_ps(t, u);
  }
  // The clamps of quantize_one, in two instructions: the float min caps at 127 (+inf
  // included; MINPS returns its second operand, a NaN t, when either is NaN); the
  // rounding conversion then gives INT_MIN for NaN and for anything below the int32
  // range, and the integer max lifts everything below -127 (those included) to -127.
  t = _mm512_min_ps(_mm512_set1_ps(kLevels), t);
  const __m512i q = r.stochastic ? _mm512_cvt_roundps_epi32(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)
                                 : _mm512_cvt_roundps_epi32(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm512_cvtepi32_epi8(_mm512_max_epi32(q, _mm512_set1_epi32(-static_cast<int>(kLevels))));
}

TESSERA_AVX512 __mmask16 lanes(int64_t count) {
  return count >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << count) - 1u);
}

// Largest |x| (and whether all are finite) of `count` contiguous values from `at`.
TESSERA_AVX512 Scale contiguous_scale(DType dtype, const void* x, int64_t at, int64_t count) {
  __m512 amax = _mm512_setzero_ps();
  __mmask16 bad = 0;
  const __m512 big = _mm512_set1_ps(std::numeric_limits<float>::max());
  for (int64_t p = 0; p < count; p += 16) {
    const __mmask16 mask = lanes(count - p);
    const __m512 a = _mm512_abs_ps(load16(dtype, x, at + p, mask));
    bad |= _mm512_mask_cmp_ps_mask(mask, a, big, _CMP_NLE_UQ);
    amax = _mm512_max_ps(amax, a);
  }
  return scale_of(_mm512_reduce_max_ps(amax), bad == 0);
}

// Rows stored contiguously (op(A) without transpose, op(B) transposed): `rows` rows of
// length k from `x` (leading dimension k), quantized into A's packed rows (to_a) or B's
// packed columns.
TESSERA_AVX512 void quantize_rows(DType dtype, const void* x, int64_t begin, int64_t end, const Packed& packed,
                                  const Int8Rounding& r, bool to_a, float* scale, float* inv) {
  // A local copy: the int8 stores may alias anything, so fields read through the
  // reference would be loaded again after every store.
  const Packed pk = packed;
  const int64_t k = pk.k;
  for (int64_t i = begin; i < end; ++i) {
    const Scale s = contiguous_scale(dtype, x, i * k, k);
    scale[i] = s.scale;
    inv[i] = s.inv;
    const __m512 vinv = _mm512_set1_ps(s.inv);
    for (int64_t p = 0; p < pk.k_pad; p += 16) {
      __m128i q = _mm_setzero_si128();
      if (p < k) {
        q = quantize16(load16(dtype, x, i * k + p, lanes(k - p)), vinv, r, golden_lanes(p));
        q = _mm_maskz_mov_epi8(lanes(k - p), q);
      }
      if (to_a) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(pk.a_row(i, p / kBlockK) + p % kBlockK), q);
      } else {  // 4 quads of B's column i: 4 bytes each, 64 bytes apart
        for (int quad = 0; quad < 4; ++quad) {
          const auto word = static_cast<uint32_t>(_mm_extract_epi32(q, 0));
          std::memcpy(pk.b_quad(p + 4 * quad, i), &word, 4);
          q = _mm_srli_si128(q, 4);
        }
      }
    }
  }
}

// Transposes a 16x16 byte matrix held as 16 rows: unpacks of 8-, 16-, 32- and 64-bit
// lanes interleave rows pairwise, doubling the run of each column every stage.
TESSERA_AVX512 void transpose16x16(__m128i (&x)[16]) {
  __m128i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm_unpacklo_epi8(x[2 * i], x[2 * i + 1]);
    t[2 * i + 1] = _mm_unpackhi_epi8(x[2 * i], x[2 * i + 1]);
  }
  // t[2i] / t[2i+1]: columns 0-7 / 8-15 of rows 2i, 2i+1, two bytes per column.
  for (int g = 0; g < 4; ++g) {  // rows 4g .. 4g+3
    const __m128i* in = t + 4 * g;
    x[4 * g] = _mm_unpacklo_epi16(in[0], in[2]);      // columns 0-3
    x[4 * g + 1] = _mm_unpackhi_epi16(in[0], in[2]);  // 4-7
    x[4 * g + 2] = _mm_unpacklo_epi16(in[1], in[3]);  // 8-11
    x[4 * g + 3] = _mm_unpackhi_epi16(in[1], in[3]);  // 12-15
  }
  // x[4g + j]: columns 4j .. 4j+3 of rows 4g .. 4g+3, four bytes per column.
  for (int h = 0; h < 2; ++h) {  // rows 8h .. 8h+7
    for (int j = 0; j < 4; ++j) {
      const __m128i lo = x[8 * h + j], hi = x[8 * h + 4 + j];
      t[8 * h + 2 * j] = _mm_unpacklo_epi32(lo, hi);      // columns 4j, 4j+1
      t[8 * h + 2 * j + 1] = _mm_unpackhi_epi32(lo, hi);  // columns 4j+2, 4j+3
    }
  }
  // t[8h + m]: columns 2m, 2m+1 of rows 8h .. 8h+7, eight bytes per column.
  for (int m = 0; m < 8; ++m) {
    x[2 * m] = _mm_unpacklo_epi64(t[m], t[8 + m]);
    x[2 * m + 1] = _mm_unpackhi_epi64(t[m], t[8 + m]);
  }
}

// The stored operand is a row-major [k, n] matrix whose columns are quantized over its k
// rows (op(A) transposed: dW's activations; op(B) without transpose: weights, dW's
// gradient). Reading it column strip by column strip strides through memory, so every
// pass streams whole rows instead: one for the columns' largest magnitudes, one that
// quantizes.

// Largest |x| of each column over rows [p0, p1) into amax[0, n): +inf for a column with
// a non-finite value (so the scale becomes NaN, as scale_of's `finite`).
TESSERA_AVX512 void column_amax(DType dtype, const void* x, int64_t n, int64_t p0, int64_t p1, float* amax) {
  const __m512 big = _mm512_set1_ps(std::numeric_limits<float>::max());
  const __m512 inf = _mm512_set1_ps(std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < n; j += 16) _mm512_mask_storeu_ps(amax + j, lanes(n - j), _mm512_setzero_ps());
  for (int64_t p = p0; p < p1; ++p) {
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 mask = lanes(n - j);
      __m512 a = _mm512_abs_ps(load16(dtype, x, p * n + j, mask));
      a = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, big, _CMP_NLE_UQ), a, inf);
      _mm512_mask_storeu_ps(amax + j, mask, _mm512_max_ps(a, _mm512_maskz_loadu_ps(mask, amax + j)));
    }
  }
}

// The scales of the n columns: row ranges in parallel into `partials` (one n-float row
// per range), then the maximum over the ranges (exact, so any split gives the same).
void column_scales(DType dtype, const void* x, int64_t k, int64_t n, float* partials, float* scale, float* inv) {
  const int64_t ranges = std::max<int64_t>(1, std::min<int64_t>(num_threads(), k));
  const int64_t stride = (n + 15) / 16 * 16;
  parallel_for(ranges, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      column_amax(dtype, x, n, k * r / ranges, k * (r + 1) / ranges, partials + r * stride);
  });
  for (int64_t j = 0; j < n; ++j) {
    float amax = 0.0f;
    for (int64_t r = 0; r < ranges; ++r) amax = std::max(amax, partials[r * stride + j]);
    const Scale sc = scale_of(amax, amax <= std::numeric_limits<float>::max());
    scale[j] = sc.scale;
    inv[j] = sc.inv;
  }
}

// 16 columns [j, j + 16) of row p quantized (zeros past the k rows or the n columns).
TESSERA_AVX512 __m128i column_row16(DType dtype, const void* x, int64_t n, int64_t k, int64_t p, int64_t j, __m512 inv,
                                    const Int8Rounding& r) {
  if (p >= k) return _mm_setzero_si128();
  const __mmask16 mask = lanes(n - j);
  return _mm_maskz_mov_epi8(mask, quantize16(load16(dtype, x, p * n + j, mask), inv, r, golden_all(p)));
}

// op(B) without transpose: rows 4 * quad .. + 3 (quads [q0, q1)) into B's packed quads,
// 16 columns at a time (4 rows' 16 bytes interleave into the columns' 4-byte quads).
TESSERA_AVX512 void quantize_b_quads(DType dtype, const void* x, int64_t q0, int64_t q1, const Packed& packed,
                                     const Int8Rounding& r) {
  const Packed pk = packed;  // (as quantize_rows)
  for (int64_t quad = q0; quad < q1; ++quad) {
    const int64_t p = 4 * quad;
    for (int64_t j = 0; j < pk.n; j += 16) {
      const __m512 inv = _mm512_maskz_loadu_ps(lanes(pk.n - j), pk.ib + j);
      const __m128i v0 = column_row16(dtype, x, pk.n, pk.k, p, j, inv, r);
      const __m128i v1 = column_row16(dtype, x, pk.n, pk.k, p + 1, j, inv, r);
      const __m128i v2 = column_row16(dtype, x, pk.n, pk.k, p + 2, j, inv, r);
      const __m128i v3 = column_row16(dtype, x, pk.n, pk.k, p + 3, j, inv, r);
      const __m128i t0 = _mm_unpacklo_epi8(v0, v1), t1 = _mm_unpackhi_epi8(v0, v1);
      const __m128i t2 = _mm_unpacklo_epi8(v2, v3), t3 = _mm_unpackhi_epi8(v2, v3);
      auto* out = reinterpret_cast<__m128i*>(pk.b_quad(p, j));
      _mm_storeu_si128(out, _mm_unpacklo_epi16(t0, t2));
      _mm_storeu_si128(out + 1, _mm_unpackhi_epi16(t0, t2));
      _mm_storeu_si128(out + 2, _mm_unpacklo_epi16(t1, t3));
      _mm_storeu_si128(out + 3, _mm_unpackhi_epi16(t1, t3));
    }
  }
}

// op(A) transposed (A stored [k, m]): rows 16 * g .. + 15 (groups [g0, g1)) into A's
// packed rows, 16 columns at a time (a 16x16 byte transpose).
TESSERA_AVX512 void quantize_a_groups(DType dtype, const void* x, int64_t g0, int64_t g1, const Packed& packed,
                                      const Int8Rounding& r) {
  const Packed pk = packed;  // (as quantize_rows)
  for (int64_t g = g0; g < g1; ++g) {
    const int64_t p = 16 * g;
    for (int64_t c = 0; c < pk.m; c += 16) {
      const __m512 inv = _mm512_maskz_loadu_ps(lanes(pk.m - c), pk.ia + c);
      __m128i q[16];
      for (int i = 0; i < 16; ++i) q[i] = column_row16(dtype, x, pk.m, pk.k, p + i, c, inv, r);
      transpose16x16(q);
      for (int i = 0; i < 16; ++i)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(pk.a_row(c + i, p / kBlockK) + p % kBlockK), q[i]);
    }
  }
}

// Quantizes op(A) into pk.a (rows past m are zero) and op(B) into pk.b; `partials` holds
// num_threads() x (max(m, n) rounded up to 16) floats.
void quantize_operands(DType dtype, const MatmulShape& s, const void* a, const void* b, const Packed& pk,
                       const Int8Rounding& round_a, const Int8Rounding& round_b, float* partials) {
  // Padding rows / columns (past m or n) must multiply as zeros.
  if (pk.m_pad > pk.m)
    for (int64_t i = pk.m; i < pk.m_pad; ++i)
      for (int64_t kb = 0; kb < pk.kb_count; ++kb) std::memset(pk.a_row(i, kb), 0, kBlockK);
  if (pk.n_pad > pk.n)
    for (int64_t p = 0; p < pk.k_pad; p += 4)
      for (int64_t j = pk.n; j < pk.n_pad; ++j) std::memset(pk.b_quad(p, j), 0, 4);
  if (!s.trans_a) {
    parallel_for(pk.m, 8, [&](int64_t begin, int64_t end) {
      quantize_rows(dtype, a, begin, end, pk, round_a, true, pk.sa, pk.ia);
    });
  } else {
    column_scales(dtype, a, pk.k, pk.m, partials, pk.sa, pk.ia);
    parallel_for(pk.k_pad / 16, 4,
                 [&](int64_t begin, int64_t end) { quantize_a_groups(dtype, a, begin, end, pk, round_a); });
  }
  if (s.trans_b) {
    parallel_for(pk.n, 8, [&](int64_t begin, int64_t end) {
      quantize_rows(dtype, b, begin, end, pk, round_b, false, pk.sb, pk.ib);
    });
  } else {
    column_scales(dtype, b, pk.k, pk.n, partials, pk.sb, pk.ib);
    parallel_for(pk.k_pad / 4, 16,
                 [&](int64_t begin, int64_t end) { quantize_b_quads(dtype, b, begin, end, pk, round_b); });
  }
}

// 16 dequantized values: (float(sum) * scale_a) * scale_b of each lane (lanes past `mask`
// read the scales as 0).
TESSERA_AVX512 inline __m512 dequantized16(const int32_t* sums, __m512 scale_a, const float* scale_b, __mmask16 mask) {
  const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512(sums)), scale_a);
  return _mm512_mul_ps(v, _mm512_maskz_loadu_ps(mask, scale_b));
}

// int8_detail::dequantize_block (matmul_int8_packed.h); a target attribute on the
// declared function itself would make GCC treat it as one version of a multiversioned one.
TESSERA_AVX512 void dequantize_rows(DType dtype, const Packed& pk, int64_t r0, int64_t j0, int64_t j1, void* c,
                                    const GemmEpilogue* epilogue, const int32_t* acc, float* row) {
  const int64_t rows = std::min(kBlock, pk.m - r0);
  const int64_t cols = std::min(j1, pk.n) - j0;
  // bf16 results: stored through the fused epilogue (bf16_rows_avx512.h), the bias
  // widened once for all rows.
  float* bias_row = row + kTaskCols;
  const bool fused = dtype == DType::BFloat16;
  bf16_rows::Epilogue fused_epilogue;
  if (fused && epilogue) {
    if (epilogue->bias)
      cast_span(DType::BFloat16, static_cast<const bfloat16*>(epilogue->bias) + j0, DType::Float32, bias_row, cols);
    fused_epilogue = {epilogue->bias ? bias_row : nullptr, epilogue->bias_first, epilogue->has_activation,
                      epilogue->activation, row};
  }
  for (int64_t r = 0; r < rows; ++r) {
    const __m512 sa = _mm512_set1_ps(pk.sa[r0 + r]);
    const int32_t* sums = acc + r * kTaskCols;
    const float* sb = pk.sb + j0;
    if (!fused) {
      for (int64_t h = 0; h < cols; h += 16)
        _mm512_mask_storeu_ps(row + h, lanes(cols - h), dequantized16(sums + h, sa, sb + h, lanes(cols - h)));
      finish_row(dtype, epilogue, row, bias_row, c, pk.n, r0 + r, j0, cols);
      continue;
    }
    // bf16: each chunk straight from the int32 sums through the epilogue (no float32 row
    // to store and load back).
    const int64_t at = (r0 + r) * pk.n + j0;
    bfloat16* out = static_cast<bfloat16*>(c) + at;
    bfloat16* pre =
        epilogue && epilogue->pre_activation ? static_cast<bfloat16*>(epilogue->pre_activation) + at : nullptr;
    for (int64_t h = 0; h < cols; h += 16) {
      const __mmask16 mask = lanes(cols - h);
      bf16_rows::store_chunk(dequantized16(sums + h, sa, sb + h, mask), h, mask, fused_epilogue, out, pre);
    }
    bf16_rows::finish_row(cols, fused_epilogue, out);
  }
}

#endif  // TESSERA_INT8_AVX512

// ---- AMX-INT8 path ----

#if TESSERA_AMX_INT8

bool probe(const char** why) {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0 || (edx & (1u << 24)) == 0 || (edx & (1u << 25)) == 0) {
    *why = "the CPU has no AMX-INT8";
    return false;
  }
  if (!x86_isa().avx512) {  // the quantizer's (every AMX CPU has AVX-512)
    *why = x86_isa().why_no_avx512;
    return false;
  }
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) {
    *why = "the kernel refused the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM)";
    return false;
  }
  *why = "";
  return true;
}

struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// C rows [r0, r0 + 32) x columns [j0, j1) (at most kTaskCols; multiples of 32 but the
// ends) from the packed operands. acc: 32 x kTaskCols int32, row: 2 x kTaskCols float32
// (this chunk's scratch): all the blocks' sums first, then one dequantizing pass per row.
void gemm_block_row(DType dtype, const Packed& pk, int64_t r0, int64_t j0, int64_t j1, void* c,
                    const GemmEpilogue* epilogue, int32_t* acc, float* row) {
  const int64_t nb16 = pk.n_pad / 16;
  constexpr size_t stride = kTaskCols * sizeof(int32_t);
  for (int64_t jb = j0; jb < j1; jb += kBlock) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t kb = 0; kb < pk.kb_count; ++kb) {
      const int8_t* at = pk.a_row(r0, kb);
      const int8_t* bt = pk.b + (kb * nb16 + jb / 16) * 1024;
      _tile_loadd(4, at, 64);
      _tile_loadd(5, at + 16 * kBlockK, 64);
      _tile_loadd(6, bt, 64);
      _tile_loadd(7, bt + 1024, 64);
      _tile_dpbssd(0, 4, 6);
      _tile_dpbssd(1, 4, 7);
      _tile_dpbssd(2, 5, 6);
      _tile_dpbssd(3, 5, 7);
    }
    int32_t* block = acc + (jb - j0);
    _tile_stored(0, block, stride);
    _tile_stored(1, block + 16, stride);
    _tile_stored(2, block + 16 * kTaskCols, stride);
    _tile_stored(3, block + 16 * kTaskCols + 16, stride);
  }
  int8_detail::dequantize_block(dtype, pk, r0, j0, j1, c, epilogue, acc, row);
}

void amx_path(DType dtype, const MatmulShape& s, const void* a, const void* b, void* c, const Int8Rounding& round_a,
              const Int8Rounding& round_b, const GemmEpilogue* epilogue) {
  const Packed pk = int8_detail::quantize_packed(dtype, s, a, b, round_a, round_b);
  // Tasks: a 32-row block times up to kTaskCols columns.
  const int64_t row_blocks = pk.m_pad / kBlock, col_tasks = num_chunks(pk.n_pad, kTaskCols);
  const ChunkScratch scratch(sizeof(int32_t) * kBlock * kTaskCols + 2 * sizeof(float) * kTaskCols,
                             Scratch::MatmulInt8Chunks);
  parallel_for(row_blocks * col_tasks, 1, [&](int64_t begin, int64_t end) {
    const ChunkScratch::Lease lease(scratch);
    auto* acc = lease.as<int32_t>();
    auto* row = lease.as<float>(sizeof(int32_t) * kBlock * kTaskCols);
    TileConfig config;
    for (int t = 0; t < 8; ++t) {
      config.rows[t] = 16;
      config.colsb[t] = 64;
    }
    _tile_loadconfig(&config);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t rb = t / col_tasks, ct = t % col_tasks;
      const int64_t j0 = ct * kTaskCols, j1 = std::min(pk.n_pad, j0 + kTaskCols);
      gemm_block_row(dtype, pk, rb * kBlock, j0, j1, c, epilogue, acc, row);
    }
    _tile_release();
  });
}

#endif  // TESSERA_AMX_INT8

bool amx_int8_usable(const char** why_not) {
#if TESSERA_AMX_INT8
  static const char* why = "";
  static const bool usable = probe(&why);
  *why_not = why;
  return usable;
#else
  *why_not = "built without AMX-INT8 (not x86-64, or the compiler lacks it)";
  return false;
#endif
}

bool vnni_usable(const char** why_not) {
  const X86Isa& isa = x86_isa();
  *why_not = "";
  if (!TESSERA_INT8_AVX512) {
    *why_not = "built without AVX-512 kernels (not x86-64, or the compiler lacks the target)";
  } else if (!isa.avx512) {
    *why_not = isa.why_no_avx512;
  } else if (!isa.avx512_vnni) {
    *why_not = "the CPU has no AVX512-VNNI";
  }
  return **why_not == '\0';
}

}  // namespace

namespace int8_detail {

#if TESSERA_INT8_AVX512

Packed quantize_packed(DType dtype, const MatmulShape& s, const void* a, const void* b, const Int8Rounding& round_a,
                       const Int8Rounding& round_b) {
  auto round_up = [](int64_t x, int64_t to) { return (x + to - 1) / to * to; };
  Packed pk{};
  pk.m = s.m;
  pk.n = s.n;
  pk.k = s.k;
  pk.m_pad = round_up(s.m, kBlock);
  pk.n_pad = round_up(s.n, kBlock);
  pk.k_pad = round_up(s.k, kBlockK);
  pk.kb_count = pk.k_pad / kBlockK;
  const size_t a_bytes = aligned(static_cast<size_t>(pk.m_pad * pk.k_pad));
  const size_t b_bytes = aligned(static_cast<size_t>(pk.k_pad * pk.n_pad));
  const size_t scale_bytes = aligned(sizeof(float) * static_cast<size_t>(2 * (pk.m_pad + pk.n_pad)));
  const size_t sum_bytes = aligned(sizeof(int32_t) * static_cast<size_t>(pk.m_pad));
  const size_t partial_bytes =
      aligned(sizeof(float) * static_cast<size_t>(std::max(1, num_threads()) * std::max(pk.m_pad, pk.n_pad)));
  auto* base =
      thread_scratch<unsigned char>(a_bytes + b_bytes + scale_bytes + sum_bytes + partial_bytes, Scratch::MatmulInt8);
  pk.a = reinterpret_cast<int8_t*>(base);
  pk.b = reinterpret_cast<int8_t*>(base + a_bytes);
  auto* scales = reinterpret_cast<float*>(base + a_bytes + b_bytes);
  pk.sa = scales;
  pk.ia = scales + pk.m_pad;
  pk.sb = scales + 2 * pk.m_pad;
  pk.ib = scales + 2 * pk.m_pad + pk.n_pad;
  pk.a_sums = reinterpret_cast<int32_t*>(base + a_bytes + b_bytes + scale_bytes);
  quantize_operands(dtype, s, a, b, pk, round_a, round_b,
                    reinterpret_cast<float*>(base + a_bytes + b_bytes + scale_bytes + sum_bytes));
  return pk;
}

void dequantize_block(DType dtype, const Packed& pk, int64_t r0, int64_t j0, int64_t j1, void* c,
                      const GemmEpilogue* epilogue, const int32_t* acc, float* row) {
  dequantize_rows(dtype, pk, r0, j0, j1, c, epilogue, acc, row);
}

#else  // Never called: no kernel that packs is usable in this build.

Packed quantize_packed(DType, const MatmulShape&, const void*, const void*, const Int8Rounding&, const Int8Rounding&) {
  fail<Error>("quantized_matmul: built without the AVX-512 quantizer");
}
void dequantize_block(DType, const Packed&, int64_t, int64_t, int64_t, void*, const GemmEpilogue*, const int32_t*,
                      float*) {
  fail<Error>("quantized_matmul: built without the AVX-512 quantizer");
}

#endif  // TESSERA_INT8_AVX512

}  // namespace int8_detail

const char* int8_kernel_name(Int8Kernel kernel) {
  switch (kernel) {
    case Int8Kernel::Amx:
      return "amx";
    case Int8Kernel::Avx512Vnni:
      return "avx512vnni";
    case Int8Kernel::Reference:
      break;
  }
  return "reference";
}

bool int8_kernel_usable(Int8Kernel kernel, const char** why_not) {
  const char* why = "";
  bool usable = true;
  if (kernel == Int8Kernel::Amx) usable = amx_int8_usable(&why);
  if (kernel == Int8Kernel::Avx512Vnni) usable = vnni_usable(&why);
  if (why_not) *why_not = why;
  return usable;
}

const Int8GemmPath& int8_gemm_path() {
  static const Int8GemmPath path = [] {
    const char* setting = flags::env("TESSERA_CPU_INT8_GEMM");
    const std::string mode = setting && *setting ? setting : "auto";
    if (mode != "auto" && mode != "reference" && mode != "amx" && mode != "avx512vnni")
      fail<ValueError>("TESSERA_CPU_INT8_GEMM={} (expected auto, reference, amx or avx512vnni)", mode);
    const std::string reference = "int8 values multiplied exactly in float64 (dgemm)";
    if (mode == "reference")
      return Int8GemmPath{Int8Kernel::Reference, false, reference + " (TESSERA_CPU_INT8_GEMM=reference)"};
    auto described = [](Int8Kernel kernel, const std::string& note) {
      const std::string what = kernel == Int8Kernel::Amx ? "AMX tiles (TDPBSSD: int8 products, int32 accumulation)"
                                                         : "AVX512-VNNI (VPDPBUSD: int8 products, int32 accumulation)";
      return Int8GemmPath{kernel, true, what + note};
    };
    if (mode != "auto") {
      const Int8Kernel kernel = mode == "amx" ? Int8Kernel::Amx : Int8Kernel::Avx512Vnni;
      const char* why = "";
      if (int8_kernel_usable(kernel, &why)) return described(kernel, fmt::format(" (TESSERA_CPU_INT8_GEMM={})", mode));
      return Int8GemmPath{Int8Kernel::Reference, false,
                          fmt::format("{} (TESSERA_CPU_INT8_GEMM={}, but {})", reference, mode, why)};
    }
    const char *why_amx = "", *why_vnni = "";
    if (int8_kernel_usable(Int8Kernel::Amx, &why_amx)) return described(Int8Kernel::Amx, "");
    if (int8_kernel_usable(Int8Kernel::Avx512Vnni, &why_vnni)) return described(Int8Kernel::Avx512Vnni, "");
    return Int8GemmPath{Int8Kernel::Reference, false, fmt::format("{} ({}; {})", reference, why_amx, why_vnni)};
  }();
  return path;
}

namespace {
void check_problem(DType dtype, const MatmulShape& shape, const GemmEpilogue* epilogue) {
  if (dtype != DType::Float32 && dtype != DType::BFloat16)
    fail<DTypeError>("quantized_matmul: dtype {} (expected float32 or bfloat16)", name(dtype));
  if (shape.batch != 1) fail<ShapeError>("quantized_matmul: batch {} (expected 1)", shape.batch);
  if (epilogue && epilogue->pre_activation && !epilogue->has_activation)
    fail<ValueError>("quantized_matmul: a pre-activation output needs an activation");
}

// An empty C, or one of zeros (K = 0); false when there is a product to compute.
bool trivial(DType dtype, const MatmulShape& shape, void* c, const GemmEpilogue* epilogue) {
  if (shape.m == 0 || shape.n == 0) return true;
  if (shape.k > 0) return false;
  // K = 0: a product of zeros (then the epilogue; rare, so its rows may allocate).
  std::vector<float> row(static_cast<size_t>(2 * shape.n));
  for (int64_t i = 0; i < shape.m; ++i) {
    std::fill(row.begin(), row.begin() + shape.n, 0.0f);
    finish_row(dtype, epilogue, row.data(), row.data() + shape.n, c, shape.n, i, 0, shape.n);
  }
  return true;
}
}  // namespace

void quantized_matmul(Int8Kernel kernel, DType dtype, const MatmulShape& shape, const void* a, const void* b, void* c,
                      const Int8Rounding& round_a, const Int8Rounding& round_b, const GemmEpilogue* epilogue) {
  const char* why = "";
  if (!int8_kernel_usable(kernel, &why))
    fail<ValueError>("quantized_matmul: the {} kernel cannot run here ({})", int8_kernel_name(kernel), why);
  check_problem(dtype, shape, epilogue);
  if (trivial(dtype, shape, c, epilogue)) return;
  switch (kernel) {
#if TESSERA_AMX_INT8
    case Int8Kernel::Amx:
      amx_path(dtype, shape, a, b, c, round_a, round_b, epilogue);
      return;
#endif
    case Int8Kernel::Avx512Vnni:
      int8_detail::vnni_gemm(dtype, int8_detail::quantize_packed(dtype, shape, a, b, round_a, round_b), c, epilogue);
      return;
    default:
      reference_path(dtype, shape, a, b, c, round_a, round_b, epilogue);
  }
}

void quantized_matmul_reference(DType dtype, const MatmulShape& shape, const void* a, const void* b, void* c,
                                const Int8Rounding& round_a, const Int8Rounding& round_b,
                                const GemmEpilogue* epilogue) {
  quantized_matmul(Int8Kernel::Reference, dtype, shape, a, b, c, round_a, round_b, epilogue);
}

void quantized_matmul(DType dtype, const MatmulShape& shape, const void* a, const void* b, void* c,
                      const Int8Rounding& round_a, const Int8Rounding& round_b, const GemmEpilogue* epilogue) {
  quantized_matmul(int8_gemm_path().kernel, dtype, shape, a, b, c, round_a, round_b, epilogue);
}

}  // namespace tessera::cpu
