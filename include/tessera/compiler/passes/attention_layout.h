// Attention layout: attention reads q, k, v where the fused projection wrote them and
// writes its output where the output projection reads it. A transformer's attention
// (nn/attention.cpp) slices q, k and v out of qkv [B, T, Hkv, G + 2, D], reshapes and
// transposes each to heads-first [B, H, T, D], and transposes the output back; its
// gradient transposes dout, and dq, dk, dv back, and concatenates them into dqkv. Each
// of those is a copy of a whole activation (on GPT-2 124M on an H100, 3.6 ms of a 44 ms
// step). This pass replaces
//   attention(q, k, v, [mask], [segments])      with attention_packed(qkv, ...)
//   attention_grad(q, k, v, ..., out, lse, dout) with attention_packed_grad(qkv, ...,
//                                                     out [B, T, H, D], lse, dout [B, T, H, D])
// (ir/primitives/nn.h), whose kernels index the packed layout, when q, k, v are
//   transpose(reshape(slice(qkv, axis 3, [0, G) / [G, G + 1) / [G + 1, G + 2))), [0, 2, 1, 3])
// of one qkv. Uses of the old values that do not fit (the output not transposed back,
// gradients not concatenated) read copies made from the packed values, so every program
// stays correct; dead code elimination then drops the copies nothing reads. Nodes named
// with checkpoint_name are left alone (remat's clones are rewritten too). Runs after
// partitioning and remat (compiler/compile.cpp), in GPU programs only
// (CompileOptions::packed_attention, which jit sets for a CUDA device): the CPU kernels
// would copy to their own layout inside the op (bitwise the same values, but the copies
// cost more than the transposes did).
#pragma once

#include <string>

#include "tessera/compiler/pass.h"

namespace tessera::compiler {

class AttentionLayoutPass : public Pass {
 public:
  std::string name() const override { return "attention-layout"; }
  void run(Graph& graph) override;
};

}  // namespace tessera::compiler
