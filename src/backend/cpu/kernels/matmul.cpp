// Batched GEMM: C[b] = op(A[b]) op(B[b]).
//
// Large float32 tiles go to oneDNN's sgemm, the rest to OpenBLAS (see gemm_one).
//
// Threading policy: one pool on the cores (ARCHITECTURE.md: two pools fighting halve
// the speed). OpenBLAS is always called single-threaded (openblas_set_num_threads(1))
// and our pool runs the calls: C is cut into shape-dependent tiles (choose_tiles) for every
// batch entry, and parallel_for hands out the (batch, tile) tasks. So
//  * many small GEMMs (attention: 96 x 256x64x256) are one task each;
//  * one big GEMM (2048x768x3072) is 4 row tiles of 512 x 3072 (see choose_tiles), so
//    load balance and B re-packing overheads stay small
//    (bench/results/blas_choice.md measures it against OpenBLAS's own threads).
// Why not hand big GEMMs to OpenBLAS's threads: OpenBLAS 0.3.21 splits some shapes
// differently by thread count (100x100x5000 sgemm, 300x290x310 dgemm differ bitwise
// between 1 and 2 threads), which breaks "bitwise identical for any num_threads()",
// and its workers spin after each call, competing with our next kernel. Tiles depend
// only on the shape, K is never split, so every element's arithmetic is fixed.
// matmul may be called inside a parallel region (nested parallel_for runs inline).
//
// bfloat16 runs on the CPU's bf16 units, tile by tile like float32: AMX tiles
// (matmul_amx.h) or AVX512-BF16 (matmul_avx512bf16.h), bf16 products, float32
// accumulation, one rounding. Where the CPU has neither (bf16_gemm_path()), bfloat16 and
// always float16 are widened to float32 panels, multiplied with sgemm, and rounded once. Integer and bool GEMMs
// accumulate in 64-bit (wrapping) and are rounded into the element type (bool: any nonzero product).
#include "backend/cpu/kernels/matmul.h"

#include <cblas.h>
#include <dnnl.h>
#include <omp.h>

#include <cstring>
#include <mutex>
#include <optional>
#include <type_traits>
#include <vector>

#include "backend/cpu/kernels/cpu_isa.h"
#include "backend/cpu/kernels/matmul_amx.h"
#include "backend/cpu/kernels/matmul_avx512bf16.h"
#include "backend/cpu/kernels/nn_common.h"
#include "backend/cpu/kernels/scratch.h"
#include "tessera/base/error.h"
#include "tessera/base/flags.h"
#include "tessera/base/signal_mask.h"
#include "tessera/base/thread_pool.h"

namespace tessera::cpu {
namespace {

using nn_detail::kIsHalf;

void set_blas_threads(int n) {
  static std::mutex mutex;
  static int current = -1;
  std::lock_guard<std::mutex> lock(mutex);
  if (current != n) {
    openblas_set_num_threads(n);
    current = n;
  }
}

// oneDNN's sgemm runs its OpenMP team on the calling thread; each pool thread asks for
// a team of one (the per-thread nthreads ICV), so every call is single-threaded like
// OpenBLAS's and the tiling above stays the only source of parallelism.
void single_threaded_dnnl() {
  thread_local bool set = false;
  if (!set) {
    omp_set_num_threads(1);
    set = true;
  }
}

// Tiles with at least this many multiply-adds go to oneDNN: on the Zen 4 / AVX-512 and
// AVX2 machines measured (bench/results/blas_choice.md, 2026-11-22-bench_train.md) its
// single-threaded sgemm is 3-17% faster than OpenBLAS's on the transformer tiles
// (512x384x1536: 111 vs 100 GFLOP/s); small products (attention heads) stay on OpenBLAS,
// whose per-call overhead is lower.
constexpr double kDnnlMinMacs = 1 << 22;

// One BLAS call for the sub-problem `s` of the full problem `full` (leading dimensions).
void gemm_one(const float* a, const float* b, float* c, const MatmulShape& s, const MatmulShape& full) {
  if (static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k) >= kDnnlMinMacs) {
    single_threaded_dnnl();
    // No signal frame may land while oneDNN's kernel has rsp in the heap (signal_mask.h).
    const AsyncSignalsBlocked no_signals;
    const dnnl_status_t status = dnnl_sgemm(s.trans_a ? 'T' : 'N', s.trans_b ? 'T' : 'N', s.m, s.n, s.k, 1.0f, a,
                                            s.trans_a ? full.m : s.k, b, s.trans_b ? s.k : full.n, 0.0f, c, full.n);
    if (status != dnnl_success) fail<Error>("matmul: oneDNN sgemm failed (status {})", static_cast<int>(status));
    return;
  }
  cblas_sgemm(CblasRowMajor, s.trans_a ? CblasTrans : CblasNoTrans, s.trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(s.m), static_cast<blasint>(s.n), static_cast<blasint>(s.k), 1.0f, a,
              static_cast<blasint>(s.trans_a ? full.m : s.k), b, static_cast<blasint>(s.trans_b ? s.k : full.n), 0.0f,
              c, static_cast<blasint>(full.n));
}

void gemm_one(const double* a, const double* b, double* c, const MatmulShape& s, const MatmulShape& full) {
  cblas_dgemm(CblasRowMajor, s.trans_a ? CblasTrans : CblasNoTrans, s.trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(s.m), static_cast<blasint>(s.n), static_cast<blasint>(s.k), 1.0, a,
              static_cast<blasint>(s.trans_a ? full.m : s.k), b, static_cast<blasint>(s.trans_b ? s.k : full.n), 0.0, c,
              static_cast<blasint>(full.n));
}

// C tiles handed to single-threaded BLAS calls, chosen from the shape only.
// Each BLAS call re-packs its slice of B (k x tile_n) once per call and its slice of A
// once per internal N block, so few tall tiles are cheapest: M is cut into an even
// number of ~512-row blocks spanning all of N (B is re-packed m/512 times, A once),
// and N is cut only when there are too few row blocks to keep two cores busy, or
// when N is so wide that a tile would be huge. Small GEMMs stay one tile.
struct Tiling {
  int64_t tile_m, tile_n;
};

int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// bfloat16 tiles (AMX, AVX512-BF16) may be narrower (kMinCols 128): the packed B panel of a tile is
// re-made per tile, but its cost is small next to the 5x faster products, and a
// 256-row GEMM (a weight gradient) then splits into 4 tiles instead of 3. Any tiling gives
// the same bits (each element's K order is fixed), so this is speed only.
Tiling choose_tiles(int64_t m, int64_t n, int64_t min_cols = 256) {
  constexpr int64_t kRows = 512, kMaxCols = 4096, kMinTiles = 4;
  const int64_t kMinCols = min_cols;
  int64_t tiles_m = std::max<int64_t>(1, (m + kRows / 2) / kRows);
  if (tiles_m > 1 && tiles_m % 2 == 1) ++tiles_m;  // an even count balances two workers
  const int64_t tile_m = round_up(num_chunks(m, tiles_m), 16);
  tiles_m = num_chunks(m, tile_m);
  int64_t tiles_n = num_chunks(n, kMaxCols);
  if (tiles_m * tiles_n < kMinTiles) tiles_n = std::max(tiles_n, num_chunks(kMinTiles, tiles_m));
  int64_t tile_n = std::max(kMinCols, round_up(num_chunks(n, tiles_n), 64));
  return {std::min(m, tile_m), std::min(n, tile_n)};
}

// The AVX512-BF16 kernel's tiles, re-cut so that every worker gets the same columns: a
// weight gradient (m = 384 rows, one row tile) with 3 tiles of 128 columns, or 4 of
// 320 + 320 + 320 + 192, leaves a core idle for a third or a sixth of the GEMM; equal
// tiles (the last narrower by at most 16 columns per tile) whose count is a multiple of
// the workers' do not. Widths are multiples of 16, the kernel's vector. Each tile
// re-packs its B panel, which costs little next to the products. Unchanged when the
// tiles are balanced already or no such cut exists.
Tiling balance_columns(Tiling t, int64_t m, int64_t n, int64_t workers) {
  const int64_t tiles_m = num_chunks(m, t.tile_m), tiles_n = num_chunks(n, t.tile_n);
  if (workers <= 1 || (n % t.tile_n == 0 && (tiles_m * tiles_n) % workers == 0)) return t;
  for (int64_t count = tiles_n; count <= tiles_n + workers && 16 * count <= n; ++count) {
    const int64_t width = round_up(num_chunks(n, count), 16);
    if (num_chunks(n, width) == count && (tiles_m * count) % workers == 0) return {t.tile_m, width};
  }
  return t;
}

// Applies the epilogue to rows [i0, i0 + rows) x columns [j0, j0 + cols) of C's batch
// entry `bi` (C is [batch, m, n]).
void apply_epilogue(DType dtype, const GemmEpilogue& e, const MatmulShape& s, void* c, int64_t bi, int64_t i0,
                    int64_t rows, int64_t j0, int64_t cols) {
  const size_t item = itemsize(dtype);
  const auto* bias = static_cast<const unsigned char*>(e.bias) + static_cast<size_t>(j0) * item;
  for (int64_t r = 0; r < rows; ++r) {
    const size_t at = static_cast<size_t>(bi * s.m * s.n + (i0 + r) * s.n + j0) * item;
    unsigned char* row = static_cast<unsigned char*>(c) + at;
    unsigned char* sum = e.pre_activation ? static_cast<unsigned char*>(e.pre_activation) + at : row;
    if (e.bias) {
      if (e.bias_first)
        binary_span(BinaryOp::Add, dtype, bias, 1, row, 1, sum, cols);
      else
        binary_span(BinaryOp::Add, dtype, row, 1, bias, 1, sum, cols);
    } else if (sum != row) {
      std::memcpy(sum, row, static_cast<size_t>(cols) * item);
    }
    if (e.has_activation) unary_span(e.activation, dtype, sum, row, cols);
  }
}

// The epilogue of a bfloat16 tile whose product is already in C (rounded to bf16),
// bitwise what the unfused ops give: each op in float32 (the bf16 elementwise kernels
// widen to float32 and run the float32 code) rounded to bf16 again. Row by row through
// a float32 row in L1 (`row`, `bias`: sub.n floats each), with the vectorized casts.
void bf16_epilogue_rows(bfloat16* c, const MatmulShape& sub, const MatmulShape& full, const GemmEpilogue& e, int64_t bi,
                        int64_t i0, int64_t j0, float* row, float* bias) {
  const int64_t offset = bi * full.m * full.n + i0 * full.n + j0;
  if (e.bias) cast_span(DType::BFloat16, static_cast<const bfloat16*>(e.bias) + j0, DType::Float32, bias, sub.n);
  for (int64_t r = 0; r < sub.m; ++r) {
    bfloat16* out = c + offset + r * full.n;
    cast_span(DType::BFloat16, out, DType::Float32, row, sub.n);
    if (e.bias) {
      if (e.bias_first)
        binary_span(BinaryOp::Add, DType::Float32, bias, 1, row, 1, row, sub.n);
      else
        binary_span(BinaryOp::Add, DType::Float32, row, 1, bias, 1, row, sub.n);
    }
    if (e.has_activation) {
      bfloat16* sum = e.pre_activation ? static_cast<bfloat16*>(e.pre_activation) + offset + r * full.n : out;
      cast_span(DType::Float32, row, DType::BFloat16, sum, sub.n);
      cast_span(DType::BFloat16, sum, DType::Float32, row, sub.n);
      unary_span(e.activation, DType::Float32, row, row, sub.n);
    }
    cast_span(DType::Float32, row, DType::BFloat16, out, sub.n);
  }
}

// The epilogue over all of C, one task per few rows (dtypes without a tiled path).
void apply_epilogue_all(DType dtype, const GemmEpilogue& e, const MatmulShape& s, void* c) {
  parallel_for(s.batch * s.m, std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(1, s.n)),
               [&](int64_t begin, int64_t end) {
                 for (int64_t row = begin; row < end; ++row)
                   apply_epilogue(dtype, e, s, c, row / s.m, row % s.m, 1, 0, s.n);
               });
}

// `bf16`: the kernel of bfloat16 tiles (Amx or Avx512Bf16).
template <typename T>
void blas_matmul(const MatmulShape& s, const T* a, const T* b, T* c, const GemmEpilogue* epilogue = nullptr,
                 Bf16Kernel bf16 = Bf16Kernel::Amx) {
  Tiling tiling = choose_tiles(s.m, s.n, std::is_same_v<T, bfloat16> ? 128 : 256);
  if (std::is_same_v<T, bfloat16> && bf16 == Bf16Kernel::Avx512Bf16)
    tiling = balance_columns(tiling, s.m, s.n, num_threads());
  const int64_t tile_m = tiling.tile_m, tile_n = tiling.tile_n;
  const int64_t tiles_m = num_chunks(s.m, tile_m), tiles_n = num_chunks(s.n, tile_n);
  const int64_t per_batch = tiles_m * tiles_n;
  set_blas_threads(1);
  // bfloat16: per running chunk, the kernel's packing and accumulator scratch and the
  // epilogue's float32 row and bias, taken here so a warm call allocates nothing.
  std::optional<ChunkScratch> scratch;
  size_t kernel_bytes = 0;
  [[maybe_unused]] const bool amx = bf16 == Bf16Kernel::Amx;
  if constexpr (std::is_same_v<T, bfloat16>) {
    MatmulShape first = s;
    first.m = tile_m;
    first.n = tile_n;
    kernel_bytes = amx ? amx_bf16_scratch_bytes(first) : avx512bf16_scratch_bytes(first);
    scratch.emplace(kernel_bytes + 2 * sizeof(float) * static_cast<size_t>(tile_n), Scratch::MatmulTile);
  }
  parallel_for(s.batch * per_batch, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t bi = t / per_batch, ti = (t % per_batch) / tiles_n, tj = t % tiles_n;
      const int64_t i0 = ti * tile_m, j0 = tj * tile_n;
      MatmulShape sub = s;
      sub.m = std::min(tile_m, s.m - i0);
      sub.n = std::min(tile_n, s.n - j0);
      const T* at = a + bi * s.a_batch_stride + (s.trans_a ? i0 : i0 * s.k);
      const T* bt = b + bi * s.b_batch_stride + (s.trans_b ? j0 * s.k : j0);
      T* ct = c + bi * s.m * s.n + i0 * s.n + j0;
      if constexpr (std::is_same_v<T, bfloat16>) {
        const ChunkScratch::Lease lease(*scratch);
        float* row = lease.as<float>(kernel_bytes);
        if (amx) {
          amx_bf16_gemm_tile(at, bt, ct, s.n, sub, s, lease.as<unsigned char>());
          if (epilogue) bf16_epilogue_rows(c, sub, s, *epilogue, bi, i0, j0, row, row + tile_n);
        } else if (epilogue) {  // applied to the float32 sums as each row is stored
          float* bias = row + tile_n;
          const auto& e = *epilogue;
          if (e.bias)
            cast_span(DType::BFloat16, static_cast<const bfloat16*>(e.bias) + j0, DType::Float32, bias, sub.n);
          const int64_t offset = bi * s.m * s.n + i0 * s.n + j0;
          const bf16_rows::Epilogue fused{e.bias ? bias : nullptr, e.bias_first, e.has_activation, e.activation, row};
          avx512bf16_gemm_tile(at, bt, ct, s.n, sub, s, lease.as<unsigned char>(), &fused,
                               e.pre_activation ? static_cast<bfloat16*>(e.pre_activation) + offset : nullptr);
        } else {
          avx512bf16_gemm_tile(at, bt, ct, s.n, sub, s, lease.as<unsigned char>());
        }
      } else {
        gemm_one(at, bt, ct, sub, s);
        if (epilogue) apply_epilogue(dtype_v<T>, *epilogue, s, c, bi, i0, sub.m, j0, sub.n);
      }
    }
  });
}

// Copies `count` matrices of `size` elements (`stride` apart) into one contiguous
// float32 buffer (this thread's scratch `slot`).
template <typename T>
float* widen_panels(const T* src, int64_t count, int64_t stride, int64_t size, Scratch slot) {
  float* out = thread_scratch<float>(static_cast<size_t>(count * size), slot);
  parallel_for(count * size, int64_t{1} << 16, [&](int64_t begin, int64_t end) {
    for (int64_t e = begin; e < end; ++e) out[e] = nn_detail::to_float(src[(e / size) * stride + e % size]);
  });
  return out;
}

template <typename T>
void half_matmul(const MatmulShape& s, const T* a, const T* b, T* c) {
  const int64_t na = s.a_batch_stride == 0 ? 1 : s.batch, nb = s.b_batch_stride == 0 ? 1 : s.batch;
  const float* af = widen_panels(a, na, s.a_batch_stride, s.m * s.k, Scratch::MatmulA);
  const float* bf = widen_panels(b, nb, s.b_batch_stride, s.k * s.n, Scratch::MatmulB);
  float* cf = thread_scratch<float>(static_cast<size_t>(s.batch * s.m * s.n), Scratch::MatmulC);
  MatmulShape f = s;
  f.a_batch_stride = na == 1 ? 0 : s.m * s.k;
  f.b_batch_stride = nb == 1 ? 0 : s.k * s.n;
  blas_matmul(f, af, bf, cf);
  parallel_for(s.batch * s.m * s.n, int64_t{1} << 16,
               [&](int64_t begin, int64_t end) { nn_detail::narrow(cf + begin, c + begin, end - begin); });
}

// Integer / bool GEMM: one output row per task, 64-bit wrapping accumulation.
template <typename T>
void int_matmul(const MatmulShape& s, const T* a, const T* b, T* c) {
  auto wide = [](T v) { return static_cast<uint64_t>(static_cast<int64_t>(v)); };
  const ChunkScratch rows(sizeof(uint64_t) * static_cast<size_t>(s.n), Scratch::MatmulChunks);
  parallel_for(s.batch * s.m, std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(1, s.n * s.k)),
               [&](int64_t begin, int64_t end) {
                 ChunkScratch::Lease lease(rows);
                 uint64_t* acc = lease.as<uint64_t>();
                 for (int64_t row = begin; row < end; ++row) {
                   const int64_t bi = row / s.m, i = row % s.m;
                   const T* A = a + bi * s.a_batch_stride;
                   const T* B = b + bi * s.b_batch_stride;
                   auto a_at = [&](int64_t p) { return wide(s.trans_a ? A[p * s.m + i] : A[i * s.k + p]); };
                   std::fill(acc, acc + s.n, 0);
                   if (s.trans_b) {
                     for (int64_t j = 0; j < s.n; ++j) {
                       uint64_t sum = 0;
                       for (int64_t p = 0; p < s.k; ++p) sum += a_at(p) * wide(B[j * s.k + p]);
                       acc[j] = sum;
                     }
                   } else {
                     for (int64_t p = 0; p < s.k; ++p) {
                       const uint64_t av = a_at(p);
                       if (av == 0) continue;
                       const T* brow = B + p * s.n;
                       for (int64_t j = 0; j < s.n; ++j) acc[j] += av * wide(brow[j]);
                     }
                   }
                   T* crow = c + row * s.n;
                   for (int64_t j = 0; j < s.n; ++j) {
                     crow[j] = static_cast<T>(static_cast<int64_t>(acc[j]));
                   }
                 }
               });
}

// A bfloat16 product with K > 0 on `kernel` (usable here), then the epilogue.
void bf16_product(Bf16Kernel kernel, const MatmulShape& s, const bfloat16* a, const bfloat16* b, bfloat16* c,
                  const GemmEpilogue* epilogue) {
  if (kernel != Bf16Kernel::Float32) {
    blas_matmul(s, a, b, c, epilogue, kernel);
    return;
  }
  half_matmul(s, a, b, c);
  if (epilogue) apply_epilogue_all(DType::BFloat16, *epilogue, s, c);
}

Bf16GemmPath choose_bf16_path() {
  const char* setting = flags::env("TESSERA_CPU_BF16_GEMM");
  const std::string mode = setting && *setting ? setting : "auto";
  if (mode != "auto" && mode != "float32" && mode != "amx" && mode != "avx512bf16")
    fail<ValueError>("TESSERA_CPU_BF16_GEMM={} (expected auto, float32, amx or avx512bf16)", mode);
  const std::string widened = "float32 sgemm on widened operands";
  if (mode == "float32") return {Bf16Kernel::Float32, false, false, widened + " (TESSERA_CPU_BF16_GEMM=float32)"};
  // AVX512-BF16 beats sgemm where VDPBF16PS issues at the FMA's rate (AMD Zen 4: 1.8x
  // sgemm on the training shapes), not where it issues at half of it (the Intel Xeon
  // measured: 0.7x); both measured with bench_lowp_gemm (bench/results/).
  auto described = [](Bf16Kernel kernel, const std::string& note) {
    const bool full_rate = kernel == Bf16Kernel::Avx512Bf16 && x86_isa().amd;
    const std::string what =
        kernel == Bf16Kernel::Amx ? "AMX tiles (TDPBF16PS: bf16 products, float32 accumulation)"
        : full_rate ? "AVX512-BF16 (VDPBF16PS: bf16 pair products, float32 accumulation; at the float32 FMA's issue "
                      "rate on AMD, so about twice sgemm and compute_dtype \"auto\" is bfloat16)"
                    : "AVX512-BF16 (VDPBF16PS: bf16 pair products, float32 accumulation; at half the float32 FMA's "
                      "issue rate on Intel, measured slower than sgemm, so compute_dtype \"auto\" is float32)";
    return Bf16GemmPath{kernel, true, kernel == Bf16Kernel::Amx || full_rate, what + note};
  };
  const char *why_amx = "", *why_avx512 = "";
  if (mode != "auto") {
    const Bf16Kernel kernel = mode == "amx" ? Bf16Kernel::Amx : Bf16Kernel::Avx512Bf16;
    const char* why = "";
    if (bf16_kernel_usable(kernel, &why)) return described(kernel, fmt::format(" (TESSERA_CPU_BF16_GEMM={})", mode));
    return {Bf16Kernel::Float32, false, false,
            fmt::format("{} (TESSERA_CPU_BF16_GEMM={}, but {})", widened, mode, why)};
  }
  if (bf16_kernel_usable(Bf16Kernel::Amx, &why_amx)) return described(Bf16Kernel::Amx, "");
  if (bf16_kernel_usable(Bf16Kernel::Avx512Bf16, &why_avx512)) return described(Bf16Kernel::Avx512Bf16, "");
  return {Bf16Kernel::Float32, false, false, fmt::format("{} ({}; {})", widened, why_amx, why_avx512)};
}

void check_shape(const MatmulShape& s) {
  if (s.batch < 0 || s.m < 0 || s.n < 0 || s.k < 0) {
    fail<ValueError>("matmul: negative size (got batch={}, m={}, n={}, k={}; expected >= 0)", s.batch, s.m, s.n, s.k);
  }
  if (s.a_batch_stride < 0 || s.b_batch_stride < 0) {
    fail<ValueError>("matmul: negative batch stride (got a={}, b={}; expected >= 0)", s.a_batch_stride,
                     s.b_batch_stride);
  }
  constexpr int64_t kMaxDim = int64_t{1} << 31;
  if (s.m >= kMaxDim || s.n >= kMaxDim || s.k >= kMaxDim) {
    fail<ValueError>("matmul: dimension too large for BLAS (got m={}, n={}, k={}; expected < 2^31)", s.m, s.n, s.k);
  }
}

}  // namespace

void matmul(DType dtype, const MatmulShape& shape, const void* a, const void* b, void* c) {
  check_shape(shape);
  const int64_t c_size = shape.batch * shape.m * shape.n;
  if (c_size == 0) return;
  if (shape.k == 0) {  // empty sum: C = 0 (all-zero bytes is 0 for every dtype)
    std::memset(c, 0, static_cast<size_t>(c_size) * itemsize(dtype));
    return;
  }
  switch (dtype) {
    case DType::Float32:
      blas_matmul(shape, static_cast<const float*>(a), static_cast<const float*>(b), static_cast<float*>(c));
      break;
    case DType::Float64:
      blas_matmul(shape, static_cast<const double*>(a), static_cast<const double*>(b), static_cast<double*>(c));
      break;
    case DType::BFloat16:
      bf16_product(bf16_gemm_path().kernel, shape, static_cast<const bfloat16*>(a), static_cast<const bfloat16*>(b),
                   static_cast<bfloat16*>(c), nullptr);
      break;
    case DType::Float16:
      half_matmul(shape, static_cast<const float16*>(a), static_cast<const float16*>(b), static_cast<float16*>(c));
      break;
    case DType::Bool:
      int_matmul(shape, static_cast<const bool*>(a), static_cast<const bool*>(b), static_cast<bool*>(c));
      break;
    case DType::UInt8:
      int_matmul(shape, static_cast<const uint8_t*>(a), static_cast<const uint8_t*>(b), static_cast<uint8_t*>(c));
      break;
    case DType::Int8:
      int_matmul(shape, static_cast<const int8_t*>(a), static_cast<const int8_t*>(b), static_cast<int8_t*>(c));
      break;
    case DType::UInt32:
      int_matmul(shape, static_cast<const uint32_t*>(a), static_cast<const uint32_t*>(b), static_cast<uint32_t*>(c));
      break;
    case DType::Int32:
      int_matmul(shape, static_cast<const int32_t*>(a), static_cast<const int32_t*>(b), static_cast<int32_t*>(c));
      break;
    case DType::Int64:
      int_matmul(shape, static_cast<const int64_t*>(a), static_cast<const int64_t*>(b), static_cast<int64_t*>(c));
      break;
    default:
      fail<DTypeError>("matmul: unsupported dtype (got {})", static_cast<int>(dtype));
  }
}

void matmul(DType dtype, const MatmulShape& shape, const void* a, const void* b, void* c,
            const GemmEpilogue& epilogue) {
  if (epilogue.pre_activation && !epilogue.has_activation)
    fail<ValueError>("matmul epilogue: a pre-activation output needs an activation");
  check_shape(shape);
  const int64_t c_size = shape.batch * shape.m * shape.n;
  if (c_size == 0) return;
  if (shape.k != 0 && dtype == DType::Float32) {
    blas_matmul(shape, static_cast<const float*>(a), static_cast<const float*>(b), static_cast<float*>(c), &epilogue);
  } else if (shape.k != 0 && dtype == DType::Float64) {
    blas_matmul(shape, static_cast<const double*>(a), static_cast<const double*>(b), static_cast<double*>(c),
                &epilogue);
  } else if (shape.k != 0 && dtype == DType::BFloat16) {
    bf16_product(bf16_gemm_path().kernel, shape, static_cast<const bfloat16*>(a), static_cast<const bfloat16*>(b),
                 static_cast<bfloat16*>(c), &epilogue);
  } else {
    matmul(dtype, shape, a, b, c);
    apply_epilogue_all(dtype, epilogue, shape, c);
  }
}

const char* bf16_kernel_name(Bf16Kernel kernel) {
  switch (kernel) {
    case Bf16Kernel::Amx:
      return "amx";
    case Bf16Kernel::Avx512Bf16:
      return "avx512bf16";
    case Bf16Kernel::Float32:
      break;
  }
  return "float32";
}

bool bf16_kernel_usable(Bf16Kernel kernel, const char** why_not) {
  if (kernel == Bf16Kernel::Amx) return amx_bf16_usable(why_not);
  if (kernel == Bf16Kernel::Avx512Bf16) return avx512bf16_usable(why_not);
  if (why_not) *why_not = "";
  return true;
}

const Bf16GemmPath& bf16_gemm_path() {
  static const Bf16GemmPath path = choose_bf16_path();
  return path;
}

void matmul_bf16(Bf16Kernel kernel, const MatmulShape& shape, const bfloat16* a, const bfloat16* b, bfloat16* c,
                 const GemmEpilogue* epilogue) {
  const char* why = "";
  if (!bf16_kernel_usable(kernel, &why))
    fail<ValueError>("matmul_bf16: the {} kernel cannot run here ({})", bf16_kernel_name(kernel), why);
  if (epilogue && epilogue->pre_activation && !epilogue->has_activation)
    fail<ValueError>("matmul epilogue: a pre-activation output needs an activation");
  check_shape(shape);
  const int64_t c_size = shape.batch * shape.m * shape.n;
  if (c_size == 0) return;
  if (shape.k == 0) {
    std::memset(static_cast<void*>(c), 0, static_cast<size_t>(c_size) * sizeof(bfloat16));
    if (epilogue) apply_epilogue_all(DType::BFloat16, *epilogue, shape, c);
    return;
  }
  bf16_product(kernel, shape, a, b, c, epilogue);
}

void blas_sgemm(int64_t m, int64_t n, int64_t k, const float* a, const float* b, bool trans_b, float* c) {
  set_blas_threads(num_threads());
  cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), 1.0f, a, static_cast<blasint>(std::max<int64_t>(1, k)),
              b, static_cast<blasint>(std::max<int64_t>(1, trans_b ? k : n)), 0.0f, c,
              static_cast<blasint>(std::max<int64_t>(1, n)));
}

}  // namespace tessera::cpu
