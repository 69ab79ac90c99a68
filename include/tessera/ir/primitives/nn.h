// Fused neural-network primitives. Each forward has a fused kernel and a fused
// backward primitive for the first-order gradient; both have a composite() written
// with basic ops, which gives higher-order gradients and the rare cotangent cases
// (e.g. a gradient flowing into the saved statistics) exactly.
#pragma once

#include <optional>

#include "tessera/base/shape.h"
#include "tessera/ir/primitive.h"

namespace tessera {

// Softmax or log-softmax over the last axis.
class Softmax : public Primitive {
 public:
  explicit Softmax(bool log) : log_(log) {}
  std::string name() const override { return log_ ? "log_softmax" : "softmax"; }
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_VJP
  TESSERA_PRIMITIVE_VMAP
  TESSERA_PRIMITIVE_COMPOSITE
  TESSERA_PRIMITIVE_COST

 private:
  bool log_;
};

// (y, dy) -> dx for Softmax.
class SoftmaxGrad : public Primitive {
 public:
  explicit SoftmaxGrad(bool log) : log_(log) {}
  std::string name() const override { return log_ ? "log_softmax_grad" : "softmax_grad"; }
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_VMAP
  TESSERA_PRIMITIVE_COMPOSITE

 private:
  bool log_;
};

// Layer norm (rms = false) or RMS norm (rms = true) over the last axis.
// Inputs: x, [weight], [bias (layer norm only)]. Outputs: y, mean (layer norm only), rstd;
// the statistics have x's leading shape and the accumulation dtype.
class Norm : public Primitive {
 public:
  Norm(bool rms, bool has_weight, bool has_bias, double eps)
      : rms_(rms), has_weight_(has_weight), has_bias_(has_bias), eps_(eps) {}
  bool rms() const { return rms_; }
  bool has_weight() const { return has_weight_; }
  bool has_bias() const { return has_bias_; }
  std::string name() const override { return rms_ ? "rms_norm" : "layer_norm"; }
  std::string attributes() const override;
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_VJP
  TESSERA_PRIMITIVE_VMAP
  TESSERA_PRIMITIVE_COMPOSITE
  TESSERA_PRIMITIVE_COST

 private:
  bool rms_, has_weight_, has_bias_;
  double eps_;
};

// Inputs: x, [weight], [mean], rstd, dy. Outputs: dx, [dweight], [dbias].
class NormGrad : public Primitive {
 public:
  NormGrad(bool rms, bool has_weight, bool has_bias) : rms_(rms), has_weight_(has_weight), has_bias_(has_bias) {}
  bool rms() const { return rms_; }
  bool has_weight() const { return has_weight_; }
  bool has_bias() const { return has_bias_; }
  std::string name() const override { return rms_ ? "rms_norm_grad" : "layer_norm_grad"; }
  std::string attributes() const override;
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_COMPOSITE

 private:
  bool rms_, has_weight_, has_bias_;
};

struct AttentionConfig {
  bool causal = true;
  double scale = 1.0;
  bool has_mask = false;
  bool has_segments = false;
  // Inputs between v and the rest: the mask, then the segment ids.
  size_t optional_inputs() const { return (has_mask ? 1 : 0) + (has_segments ? 1 : 0); }
  size_t mask_index() const { return 3; }
  size_t segments_index() const { return has_mask ? 4 : 3; }
};

// Inputs: q [B,H,T,D], k, v [B,Hkv,S,D], [mask bool broadcastable to [B,H,T,S]],
// [segment ids int32 [B, T], T == S: key s is visible to query t only when
// segments[b, s] == segments[b, t] (documents packed in one row)].
// Outputs: out [B,H,T,D], lse [B,H,T] (accumulation dtype).
class Attention : public Primitive {
 public:
  explicit Attention(AttentionConfig config) : config_(config) {}
  std::string name() const override { return "attention"; }
  std::string attributes() const override;
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_VJP
  TESSERA_PRIMITIVE_VMAP
  TESSERA_PRIMITIVE_COMPOSITE
  TESSERA_PRIMITIVE_COST
  const AttentionConfig& config() const { return config_; }

 private:
  AttentionConfig config_;
};

// Inputs: q, k, v, [mask], [segments], out, lse, dout. Outputs: dq, dk, dv.
class AttentionGrad : public Primitive {
 public:
  explicit AttentionGrad(AttentionConfig config) : config_(config) {}
  const AttentionConfig& config() const { return config_; }
  std::string name() const override { return "attention_grad"; }
  std::string attributes() const override;
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_VMAP
  TESSERA_PRIMITIVE_COMPOSITE
  TESSERA_PRIMITIVE_COST

 private:
  AttentionConfig config_;
};

// Attention on the fused projection's layout, made by the attention-layout pass
// (compiler/passes/attention_layout.h, after partitioning) from an attention whose q, k
// and v are the heads-first slices of one qkv [B, T, Hkv, G + 2, D] (per kv head: its G
// query heads, then k, then v; H = Hkv G) and whose out goes back to heads-last: the
// kernels read q, k, v in place and write out [B, T, H, D], so no transpose, slice or
// concatenate copies surround attention (GPT-2 124M on an H100: ~3.6 of 44 ms a step).
// Inputs: qkv, [mask], [segments] (as attention's). Outputs: out [B, T, H, D], lse
// [B, H, T] (accumulation dtype). Values: attention's on q = qkv[:, :, :, :G] as [B, T,
// H, D] transposed to [B, H, T, D], k = qkv[:, :, :, G], v = qkv[:, :, :, G + 1], with
// out transposed to [B, T, H, D].
class AttentionPacked : public Primitive {
 public:
  explicit AttentionPacked(AttentionConfig config) : config_(config) {}
  std::string name() const override { return "attention_packed"; }
  std::string attributes() const override;
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_COMPOSITE
  TESSERA_PRIMITIVE_COST
  const AttentionConfig& config() const { return config_; }

 private:
  AttentionConfig config_;
};

// The gradient of attention_packed. Inputs: qkv, [mask], [segments], out [B, T, H, D],
// lse, dout [B, T, H, D]. Output: dqkv (qkv's shape and dtype): dq, dk, dv in qkv's layout,
// which covers it (the concatenate of the unpacked gradients).
class AttentionPackedGrad : public Primitive {
 public:
  explicit AttentionPackedGrad(AttentionConfig config) : config_(config) {}
  std::string name() const override { return "attention_packed_grad"; }
  std::string attributes() const override;
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_COMPOSITE
  TESSERA_PRIMITIVE_COST
  const AttentionConfig& config() const { return config_; }

 private:
  AttentionConfig config_;
};

// The shapes of a packed qkv [B, T, Hkv, G + 2, D]: heads H = Hkv G. Throws a ShapeError
// naming `op` for any other rank or G + 2 < 3.
struct PackedQkvShape {
  int64_t batch, seq, kv_heads, group, head_dim;
  int64_t heads() const { return kv_heads * group; }
};
PackedQkvShape packed_qkv_shape(const char* op, const Shape& qkv);

// The visible (query, key) pairs of (causal: top-left aligned) attention of t queries
// over s keys: the FLOP count's factor.
double attention_visible_pairs(int64_t t, int64_t s, bool causal);

// Inputs: logits [N, V], targets [N] int64. Outputs: loss [N], lse [N] (accumulation dtype).
// `classes` (0: all V): only the first `classes` columns are classes; the rest are
// vocabulary padding, outside the softmax, with zero gradient.
class CrossEntropy : public Primitive {
 public:
  explicit CrossEntropy(int64_t ignore_index, int64_t classes = 0) : ignore_index_(ignore_index), classes_(classes) {}
  int64_t ignore_index() const { return ignore_index_; }
  int64_t classes() const { return classes_; }
  // The number of classes in rows of `row_length` logits.
  int64_t classes_in(int64_t row_length) const { return classes_ > 0 ? classes_ : row_length; }
  std::string name() const override { return "cross_entropy"; }
  std::string attributes() const override;
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_VJP
  TESSERA_PRIMITIVE_VMAP
  TESSERA_PRIMITIVE_COMPOSITE
  TESSERA_PRIMITIVE_COST

 private:
  int64_t ignore_index_;
  int64_t classes_;
};

// Inputs: logits, targets, lse, dloss. Output: dlogits.
class CrossEntropyGrad : public Primitive {
 public:
  explicit CrossEntropyGrad(int64_t ignore_index, int64_t classes = 0)
      : ignore_index_(ignore_index), classes_(classes) {}
  int64_t ignore_index() const { return ignore_index_; }
  int64_t classes() const { return classes_; }
  int64_t classes_in(int64_t row_length) const { return classes_ > 0 ? classes_ : row_length; }
  std::string name() const override { return "cross_entropy_grad"; }
  std::string attributes() const override;
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_VMAP
  TESSERA_PRIMITIVE_COMPOSITE

 private:
  int64_t ignore_index_;
  int64_t classes_;
};

// The loss and its gradient in one pass over the logits (llm.c's fused classifier),
// made by the classifier-fusion pass (compiler/passes/classifier_fusion.h) from a
// cross_entropy whose cross_entropy_grad's dloss does not depend on it. Inputs: logits
// [N, V], targets [N] int64, dloss [N] (accumulation dtype). Outputs: loss [N], lse [N],
// dlogits [N, V], the values of the two primitives it replaces. dlogits may take the
// logits' buffer: each element is read before it is overwritten.
class CrossEntropyWithGrad : public Primitive {
 public:
  CrossEntropyWithGrad(int64_t ignore_index, int64_t classes) : ignore_index_(ignore_index), classes_(classes) {}
  int64_t ignore_index() const { return ignore_index_; }
  int64_t classes() const { return classes_; }
  int64_t classes_in(int64_t row_length) const { return classes_ > 0 ? classes_ : row_length; }
  std::string name() const override { return "cross_entropy_with_grad"; }
  std::string attributes() const override;
  bool can_write_in_place(int input, int output) const override { return input == 0 && output == 2; }
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_COMPOSITE

 private:
  int64_t ignore_index_;
  int64_t classes_;
};

}  // namespace tessera
