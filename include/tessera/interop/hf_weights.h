// Hugging Face tensor names and layouts <-> tessera's parameter Tree (models/model.h).
//
//   GPT-2 (Conv1D weights are [in, out] like tessera's: no transpose)
//     [transformer.]wte.weight [V, d] = wte, wpe.weight = wpe, ln_f = lnf,
//     h.{i}.ln_1/ln_2.{weight,bias} = ln1/ln2.{scale,bias},
//     h.{i}.attn.c_attn.{weight [d, 3d], bias [3d]}: columns [q | k | v] (heads in order)
//       -> wqkv/bqkv, columns regrouped per head [H, 3, Dh] (tessera's layout, G = 1),
//     h.{i}.attn.c_proj = wo/bo, h.{i}.mlp.c_fc = mlp.fc, h.{i}.mlp.c_proj = mlp.proj,
//     lm_head.weight [V, d]: the tied wte (absent, or equal to it); untied: head = its transpose.
//     The non-persistent buffers h.{i}.attn.bias / attn.masked_bias are ignored.
//   Llama (nn.Linear weights are [out, in]: transposed)
//     model.embed_tokens.weight = wte, model.norm.weight = lnf.scale,
//     model.layers.{i}.input_layernorm / post_attention_layernorm.weight = ln1 / ln2.scale,
//     self_attn.{q,k,v}_proj.weight -> wqkv, columns [Hkv, G + 2, Dh]: per kv head its
//       G query heads (query head h uses kv head h / G, as in transformers' repeat_kv), k, v,
//     self_attn.o_proj = wo, mlp.{gate,up,down}_proj = mlp.{gate,up,down}.w,
//     lm_head.weight [V, d] = head transposed (untied) or absent / equal to wte (tied).
//   Both use rotate-half RoPE on the same q/k rows, so no permutation of q/k is needed.
//
// Import reads F32, BF16 and F16 tensors into float32 (exact); every expected tensor
// must be there with its shape, and no other tensor may be (errors name the tensor,
// its file and both shapes).
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tessera/core/tree.h"
#include "tessera/models/model.h"

namespace tessera::interop {

struct HfTensor {
  Array array;       // evaluated
  std::string file;  // the file it was read from (for errors)
};
using HfTensors = std::map<std::string, HfTensor>;

// The parameters of `config` from a model directory's tensors; `origin` (the directory)
// names where a missing tensor was looked for.
Tree params_from_hf(const models::ModelConfig& config, const HfTensors& tensors, const std::string& origin);

// The Hugging Face tensors of `params` in the order transformers lists them (embedding,
// layers, final norm, head), cast to `dtype` (Float32 or BFloat16). Tied models have no
// lm_head.weight (as save_pretrained writes them). GPT-2 names carry "transformer.".
std::vector<std::pair<std::string, Array>> hf_tensors_from_params(const models::ModelConfig& config, const Tree& params,
                                                                  DType dtype);

}  // namespace tessera::interop
