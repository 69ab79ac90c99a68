// bfloat16 attention on the CPU's bf16 dot-product units (AVX512-BF16): the same
// FlashAttention-2 tiling, online softmax, masking and task split as the float32
// kernels (attention_forward.cpp, attention_backward.cpp), with every tile GEMM on
// VDPBF16PS (bf16 pairs, float32 accumulation) instead of widening the operands to
// float32 first. The GEMM operands are the bf16 inputs themselves (Q, K, V, dO), and
// the probabilities P and the score gradients dS, rounded to bf16 (nearest even) after
// the float32 softmax, as PyTorch's CPU flash attention and the GPU kernels round them.
// The softmax statistics (running max, sum, lse), Delta and every accumulator stay
// float32. Results are bitwise identical for any thread count.
#pragma once

#include "backend/cpu/kernels/attention.h"
#include "tessera/base/dtype.h"

namespace tessera::cpu {

// Whether bfloat16 attention takes these kernels: the CPU's bf16 GEMMs run on its bf16
// units (bf16_gemm_path().native, so TESSERA_CPU_BF16_GEMM=float32 turns both off) and
// it has AVX512-BF16 (avx512bf16_usable()). Decided once.
bool attention_bf16_native();

// The kernels themselves (attention_forward / attention_backward check the arguments
// and call them when attention_bf16_native()). Need avx512bf16_usable(); ValueError
// otherwise.
void attention_forward_avx512bf16(const AttentionShape& shape, const bfloat16* q, const bfloat16* k, const bfloat16* v,
                                  bfloat16* out, float* lse);
void attention_backward_avx512bf16(const AttentionShape& shape, const bfloat16* q, const bfloat16* k, const bfloat16* v,
                                   const bfloat16* out, const float* lse, const bfloat16* dout, bfloat16* dq,
                                   bfloat16* dk, bfloat16* dv);

}  // namespace tessera::cpu
