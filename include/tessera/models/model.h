// Decoder-only language models built from nn/ modules: `gpt2` (learned positions,
// pre-LayerNorm, GELU MLP, tied embeddings) and `llama` (RoPE, RMSNorm, SwiGLU,
// grouped-query attention, untied head). One Model class serves both; the family
// picks the blocks. Parameters live in a Tree, so the same code runs eagerly, under
// grad and under jit.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tessera/core/tree.h"
#include "tessera/nn/attention.h"
#include "tessera/nn/param.h"
#include "tessera/nn/rotary.h"

namespace tessera::models {

struct ModelConfig {
  std::string family = "gpt2";  // "gpt2" | "llama"
  int64_t vocab = 256;
  // The embedding table (and an untied head) get zero rows up to a multiple of this:
  // GPT-2's 50257 -> 50304 at 128, as llm.c does. The vocabulary is a GEMM dimension
  // of the logits, and tensor-core GEMMs need it a multiple of 8 16-bit elements to run
  // at speed (an H100: the three logits GEMMs of GPT-2 124M take 4.9 ms per step at
  // 50304 against 10.6 at 50257). The padding columns never enter the loss
  // (cross_entropy's `classes`), get no gradient, so their rows stay 0; logits() returns
  // [.., vocab]; parameter counts, FLOPs and Hugging Face files count `vocab` only.
  // 1: no padding.
  int64_t vocab_pad_to = 128;
  int64_t dim = 256;
  int64_t layers = 4;
  int64_t heads = 4;
  int64_t kv_heads = 0;   // 0: = heads (multi-head); fewer: grouped-query attention
  int64_t mlp_dim = 0;    // 0: gpt2 4*dim; llama 2/3 * 4*dim rounded up to a multiple of 256
  int64_t context = 256;  // longest sequence (the gpt2 position table's size)
  double dropout = 0.0;   // residual/attention-output/embedding dropout while training
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  // RoPE scaling (llama): "none" or "llama3" (Llama 3.1/3.2's per-band scaling of the
  // inverse frequencies, nn/rotary.h) with its factor, low/high frequency factors and
  // the pretraining context it extends (defaults: Llama 3.1's values).
  std::string rope_scaling = "none";
  double rope_factor = 8.0;
  double rope_low_freq_factor = 1.0;
  double rope_high_freq_factor = 4.0;
  int64_t rope_original_context = 8192;
  std::optional<bool> tied_embeddings = std::nullopt;  // unset: gpt2 true, llama false
  double init_std = 0.02;
  // Mixed precision: the dtype activations flow in, "float32" | "bfloat16" | "float16".
  // Parameters stay float32 (the master weights the optimizer updates); with bfloat16
  // or float16 the forward pass casts them to that dtype where they are used (matmul
  // weights, biases, norm scales, the gathered embedding rows), like MaxText's dtype
  // vs weight_dtype or PyTorch autocast. Norm statistics, softmax/attention statistics
  // and the cross-entropy loss accumulate in float32 (the fused kernels), so the loss
  // is float32 and gradients reach the float32 parameters through the casts' vjps (as
  // float32). "float32" casts nothing: activations take the parameters' dtype.
  std::string compute_dtype = "float32";
  // int8 training, AQT-style ([quant] in configs; ir/primitives/quantized.h): the
  // matmuls named in quant_targets run as int8 GEMMs with dynamic per-token / per-
  // channel scales: "attention" (the qkv and output projections), "mlp" (the feed-
  // forward projections), "head" (the logits). quant_backward "int8": both backward
  // GEMMs in int8 too, the incoming gradient rounded stochastically, seeded by the
  // step's random key (so runs stay reproducible); "float": the forward only, the
  // backward in the compute dtype (straight-through). Empty targets: no int8.
  std::vector<std::string> quant_targets = {};
  std::string quant_backward = "int8";
  // Rematerialization of the transformer blocks while training (core/checkpoint.h):
  //   "none"    - keep every activation for the backward pass;
  //   "full"    - each block is a checkpoint region: only its input is kept (on the
  //               device), the rest is recomputed before the block's backward pass;
  //   "offload" - as full, but each block's input (named kBlockInput) waits for the
  //               backward pass in host memory (the offload policy): the device keeps
  //               no per-layer activation across the forward -> backward turn.
  // Values are the same under all three; memory and FLOPs are not. Inference (the KV
  // cache path) never recomputes.
  std::string remat = "none";
  static constexpr const char* kBlockInput = "block_input";
  // Mixture of experts (llama family; nn/moe.h, Mixtral's block): with moe_experts > 0
  // every layer's feed-forward is moe_experts SwiGLU experts of width mlp_dim, each token
  // routed to moe_top_k of them. moe_capacity_factor 0: dropless; > 0: each expert takes
  // ceil(factor * tokens * k / experts) assignments and drops the rest. The training
  // loss adds moe_aux_loss_coef times the load-balancing loss (transformers' Mixtral:
  // router_aux_loss_coef 0.02).
  int64_t moe_experts = 0;
  int64_t moe_top_k = 2;
  double moe_capacity_factor = 0;
  double moe_aux_loss_coef = 0.02;
  // Routing groups (nn::MoE::groups): 0 = one per batch device on a mesh, 1 alone.
  int64_t moe_groups = 0;

  // Checks every field (positive sizes, dim % heads, heads % kv_heads, known family);
  // a ConfigError-style ValueError names the field and the value.
  void validate() const;
  int64_t resolved_kv_heads() const;
  int64_t resolved_mlp_dim() const;
  bool resolved_tied() const;
  // The llama3 scaling parameters when rope_scaling is "llama3", else nullopt.
  std::optional<nn::Llama3RopeScaling> rope_llama3() const;
  int64_t head_dim() const { return dim / heads; }
  // vocab rounded up to a multiple of vocab_pad_to: the rows of the embedding table.
  int64_t padded_vocab() const;
  // compute_dtype as a DType (ValueError naming the allowed values when unknown).
  DType compute() const;
  // Whether the matmuls of `target` ("attention", "mlp", "head") run in int8.
  bool quantized(const std::string& target) const;
  // Whether a training forward pass takes a random key: dropout, or int8 backward
  // GEMMs (stochastic rounding).
  bool needs_step_key() const;
  bool moe() const { return moe_experts > 0; }
  // Whether the loss has a load-balancing term (experts, and a coefficient above 0).
  bool balances_load() const { return moe() && moe_aux_loss_coef > 0; }
};

// Named shapes: "tiny" (gpt2 V256 L4 H4 d256 T256), "small" (gpt2 V4096 L6 H6 d384
// T256), "gpt2-124m", "gpt2-350m", "llama-tiny" (V256 L4 H4 kv2 d256 T256),
// "llama-1b" (V32000 L16 H32 kv8 d2048 T2048, mlp 8192). Unknown names: ValueError
// listing the known ones.
ModelConfig preset(const std::string& name);
std::vector<std::string> preset_names();

// The parameters with the vocabulary padding added (zero rows of "wte", zero columns
// of "head") or removed: for files that hold `vocab` rows (Hugging Face). Leaves that
// already have the wanted size pass through; another size is a ShapeError.
Tree pad_vocabulary(const ModelConfig& config, const Tree& params);
Tree strip_vocabulary(const ModelConfig& config, const Tree& params);

// Per-layer attention keys and values of the tokens seen so far, for incremental
// decoding: k[l], v[l] are [B, kv_heads, length, head_dim].
struct KVCache {
  std::vector<Array> k, v;
  int64_t length = 0;
};

// Documents packed in one row (data::Batch's segments and positions): int32 [B, T]
// each; see nn::Packing.
using Packing = nn::Packing;

class Model {
 public:
  explicit Model(ModelConfig config);  // validates
  const ModelConfig& config() const { return config_; }

  // Parameters, deterministic in `seed` (GPT-2 / Llama initializers: normal(init_std),
  // residual output projections scaled by 1/sqrt(2*layers), zero biases, unit norms).
  Tree init(uint64_t seed) const;
  // The same values for the parameters `materialize` accepts (by path, "layers.3.attn.wq");
  // the others are placeholders with no data and no random draws (a pipeline process
  // builds only the parameters its stages read).
  Tree init(uint64_t seed, const std::function<bool(const std::string& path)>& materialize) const;
  // Shapes, logical axes, initializers and kinds of every parameter (no values); the
  // vocabulary dimensions are padded_vocab().
  const nn::ParamSpecs& specs() const { return specs_; }
  // The parameter tree of placeholders (types only, no memory): what the planner traces.
  Tree placeholders() const;
  // Parameters without the vocabulary padding (GPT-2 124M: 124,439,808).
  int64_t parameter_count() const;

  // Logits [B, T, vocab] (the padding columns left out) of int32 tokens [B, T] (T <= context), in the compute dtype
  // (float32 unless config.compute_dtype says otherwise). With a dropout key (the
  // step's random key), dropout (config.dropout) is applied as in training and int8
  // backward GEMMs round stochastically; without, it is inference.
  // With `packing`, the row holds several documents: a token attends only to earlier
  // tokens of its own document, and is embedded (GPT-2's position table, llama's RoPE)
  // at its position inside the document, so each document's logits are those it would
  // get alone. packing.positions must lie in [0, T).
  Array logits(const Tree& params, const Array& tokens, const std::optional<Array>& dropout_key = std::nullopt,
               const std::optional<Packing>& packing = std::nullopt) const;
  // Mean next-token cross-entropy of logits(tokens) against int32 targets [B, T]:
  // a float32 scalar whatever the compute dtype (the kernel reads low-precision logits
  // and accumulates the log-sum-exp and the loss in float32).
  // Targets of -100 do not count (the last token of each packed document).
  Array loss(const Tree& params, const Array& tokens, const Array& targets,
             const std::optional<Array>& dropout_key = std::nullopt,
             const std::optional<Packing>& packing = std::nullopt) const;

  // One pipeline stage's part of the training forward pass (train/pipeline.h). `params`
  // holds what the part reads: "layers", the list of its layers (model layers
  // first_layer, first_layer + 1, ...), plus "wte" (and GPT-2's "wpe") when it embeds,
  // plus "lnf" and "head" (or "wte" when tied) when it ends with the loss. With `embed`,
  // `input` is int32 tokens [B, T]; else the residual stream [B, T, dim] the previous
  // part returned. With targets, the part ends with the loss as a float32 *sum* over the
  // targets that count (micro-batches add up to the batch's sum); without, it returns
  // the residual stream. The parts compose to loss() times the number of counted
  // targets. With packed documents every part takes the batch's segment ids and
  // positions (attention and RoPE need them in every layer). With the step's dropout key
  // (model.dropout > 0, or int8 backward GEMMs) the part applies its layers' dropout and
  // stochastic rounding as the whole model does with that key: each layer draws from its
  // own key (by the model's layer index), so the parts compose to loss() with that key.
  //
  // Mixture of experts: the load-balancing loss averages every layer's routing figures
  // (nn/moe.h), so the parts hand them on. `routing` (none into the first part) and
  // StageOutput::routing are [top_k + 1, experts] float32: rows 0 .. top_k-1 the choice
  // shares f, row top_k the router probabilities P, each summed over the layers so far
  // (in layer order, as loss() sums them). The last part adds moe_aux_loss_coef x the
  // load-balancing loss of the summed figures x its counted targets to its loss sum, so
  // the parts still compose to loss() times the counted targets.
  struct StageOutput {
    Array out;            // the residual stream, or with targets the loss sum
    Array routing;        // with experts: the summed routing figures (invalid without)
    Array cross_entropy;  // with targets: the loss sum without the load-balancing term
  };
  StageOutput stage_forward(const Tree& params, const Array& input, int64_t first_layer, bool embed,
                            const std::optional<Array>& targets, const std::optional<Packing>& packing = std::nullopt,
                            const std::optional<Array>& dropout_key = std::nullopt,
                            const std::optional<Array>& routing = std::nullopt) const;
  // The load-balancing term loss() adds, from routing figures summed over `parts` equal
  // parts of a batch (each summed over the layers): moe_aux_loss_coef x experts x
  // sum over (choice, expert) of the mean f times the mean P. 0 without experts.
  double load_balancing_term(const std::vector<double>& routing_sum, int64_t parts) const;

  // An empty cache for `batch` sequences (float32 keys and values, or the compute
  // dtype when it is bfloat16/float16).
  KVCache empty_cache(int64_t batch) const;
  // Logits [B, T_new, vocab] of tokens [B, T_new] that follow the cache's tokens;
  // appends their keys and values to the cache. cache.length + T_new must be
  // <= context (else ValueError naming both). Inference only (no dropout).
  Array logits_with_cache(const Tree& params, const Array& tokens, KVCache& cache) const;

  // Training FLOPs per token, PaLM/nanoGPT convention (the peers use it):
  // 6 * N + 12 * layers * T * dim, N = parameters without the position table
  // (a tied embedding counted once; with experts, only the top_k a token runs through).
  // `seq` is the trained sequence length T.
  double flops_per_token(int64_t seq) const;

 private:
  ModelConfig config_;
  nn::ParamSpecs specs_;
};

}  // namespace tessera::models
