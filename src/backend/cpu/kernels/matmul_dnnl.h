// bfloat16 GEMM tiles on the CPU's bf16 matrix units (AMX tiles, or AVX512-BF16 dot
// products) through oneDNN's matmul primitive: bf16 operands, float32 accumulation,
// one rounding to bf16 when C is stored. matmul.cpp calls it per C tile on one thread,
// so results stay bitwise identical for any thread count (the tile shapes depend on the
// problem only and oneDNN's kernel for a given tile shape is fixed on a machine).
#pragma once

#include <string>

#include "backend/cpu/kernels/matmul.h"
#include "tessera/base/dtype.h"

namespace tessera::cpu {

// Which path bfloat16 GEMMs take on this machine, decided once: "native" when oneDNN
// runs a bf16 tile on hardware bf16 units (its implementation name says AMX or
// AVX512-BF16) and TESSERA_CPU_BF16_GEMM is "auto"; otherwise operands are widened to
// float32 and multiplied with sgemm (matmul.cpp), e.g. on AVX2-only CPUs.
struct Bf16GemmPath {
  bool native = false;
  std::string description;  // for `tessera info`: the oneDNN implementation, or why not
};
const Bf16GemmPath& bf16_gemm_path();

// C tile = op(A) op(B) for the sub-problem `sub` of `full` (A's and B's leading
// dimensions from `full`, as matmul.cpp's gemm_one), on the calling thread; C has
// leading dimension ldc and is bfloat16 (rounded once) or, with `float32_c`, the float32
// accumulators themselves (for an epilogue that rounds as the unfused ops would).
// Needs bf16_gemm_path().native.
void bf16_gemm_tile(const bfloat16* a, const bfloat16* b, void* c, int64_t ldc, bool float32_c, const MatmulShape& sub,
                    const MatmulShape& full);

}  // namespace tessera::cpu
