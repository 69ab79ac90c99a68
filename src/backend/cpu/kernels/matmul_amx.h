// bfloat16 GEMM tiles on Intel AMX (Sapphire Rapids and later): TDPBF16PS on 16x32 bf16
// tiles, float32 accumulation, one rounding to bf16 (RNE) per result. Our own kernel
// rather than oneDNN's matmul primitive, whose every execution allocates its argument
// map (a compiled step must run allocation-free, tests/compiler/test_jit.cpp).
// Each result element sums its K products in the same order (32-wide K blocks in
// sequence) whatever the tiling, so results are bitwise identical for any thread count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "backend/cpu/kernels/matmul.h"
#include "tessera/base/dtype.h"

namespace tessera::cpu {

// Which path bfloat16 GEMMs take on this machine, decided once: "native" (this AMX
// kernel) when the CPU has AMX-BF16, the OS grants the tile state and
// TESSERA_CPU_BF16_GEMM is "auto"; otherwise operands are widened to float32 and
// multiplied with sgemm (matmul.cpp), e.g. on AVX2-only or AVX512-BF16-only CPUs.
struct Bf16GemmPath {
  bool native = false;
  std::string description;  // for `tessera info`: the path, or why not the matrix units
};
const Bf16GemmPath& bf16_gemm_path();

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
