// bfloat16 GEMM tiles on AVX512-BF16, for CPUs that have it without AMX (AMD Zen 4 and
// later, Intel Cooper Lake): VDPBF16PS multiplies the bf16 pairs (k, k + 1) of 16 lanes
// and adds both products to float32 accumulators (c += a_k b_k + a_k+1 b_k+1, inputs and
// outputs with denormals flushed, as AMX's TDPBF16PS); each result is rounded to bf16
// (RNE) once. A register-blocked micro-kernel keeps 8 rows x 48 columns of float32 sums
// in 24 zmm registers over the whole K, reading B from the packed pair layout of
// matmul_bf16_pack.h (one zmm per 16 columns and pair) and broadcasting A's pairs.
// Each result element adds its K pairs in sequence from zero whatever the tiling, so
// results are bitwise identical for any thread count (they differ from AMX's and from
// float32 sgemm's in the last bits: another order of float32 additions).
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/cpu/kernels/bf16_rows_avx512.h"
#include "backend/cpu/kernels/matmul.h"
#include "tessera/base/dtype.h"

namespace tessera::cpu {

// Whether this CPU has AVX512-BF16 (with AVX-512 F/BW/DQ/VL) and the OS saves the zmm
// state (cpu_isa.h); decided once. `why_not` says why not.
bool avx512bf16_usable(const char** why_not = nullptr);

// Scratch bytes avx512bf16_gemm_tile needs for the sub-problem `sub` (packed A block,
// packed B panel, float32 sums of 32 rows; 64-byte aligned pieces).
size_t avx512bf16_scratch_bytes(const MatmulShape& sub);

// C tile (bf16, leading dimension ldc) = op(A) op(B) for the sub-problem `sub` of `full`
// (leading dimensions from `full`, as amx_bf16_gemm_tile), on the calling thread, with
// `scratch` of avx512bf16_scratch_bytes(sub) 64-byte aligned bytes. `epilogue` (or null)
// is applied to the float32 sums as each row is stored (bf16_rows_avx512.h: its bias the
// tile's sub.n values widened to float32, its row sub.n floats of scratch), keeping the
// pre-activation in `pre_activation` (the tile's first element, leading dimension ldc)
// when that is not null. Needs avx512bf16_usable().
void avx512bf16_gemm_tile(const bfloat16* a, const bfloat16* b, bfloat16* c, int64_t ldc, const MatmulShape& sub,
                          const MatmulShape& full, void* scratch, const bf16_rows::Epilogue* epilogue = nullptr,
                          bfloat16* pre_activation = nullptr);

}  // namespace tessera::cpu
