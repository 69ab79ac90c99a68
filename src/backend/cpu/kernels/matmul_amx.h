// bfloat16 GEMM tiles on Intel AMX (Sapphire Rapids and later): TDPBF16PS on 16x32 bf16
// tiles, float32 accumulation, one rounding to bf16 (RNE) per result. The operands are
// packed as matmul_bf16_pack.h says; matmul.h's bf16_gemm_path() picks this kernel or
// the AVX512-BF16 one (matmul_avx512bf16.h). Our own kernel rather than oneDNN's
// matmul primitive, whose every execution allocates its argument map (a compiled step
// must run allocation-free, tests/compiler/test_jit.cpp).
// Each result element sums its K products in the same order (32-wide K blocks in
// sequence) whatever the tiling, so results are bitwise identical for any thread count.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/cpu/kernels/matmul.h"
#include "tessera/base/dtype.h"

namespace tessera::cpu {

// Whether this CPU has AMX-BF16 and the kernel allowed this process to use the tile
// state (arch_prctl ARCH_REQ_XCOMP_PERM); decided once. `why_not` says why not.
bool amx_bf16_usable(const char** why_not = nullptr);

// Scratch bytes amx_bf16_gemm_tile needs for the sub-problem `sub` (packed A block,
// packed B panel, float32 accumulators; 64-byte aligned pieces).
size_t amx_bf16_scratch_bytes(const MatmulShape& sub);

// C tile (bf16, leading dimension ldc) = op(A) op(B) for the sub-problem `sub` of `full`
// (A's and B's leading dimensions from `full`, as matmul.cpp's gemm_one), on the calling
// thread, with `scratch` of amx_bf16_scratch_bytes(sub) 64-byte aligned bytes.
// Needs amx_bf16_usable().
void amx_bf16_gemm_tile(const bfloat16* a, const bfloat16* b, bfloat16* c, int64_t ldc, const MatmulShape& sub,
                        const MatmulShape& full, void* scratch);

}  // namespace tessera::cpu
