// The array operations users call. Every op validates its arguments (errors name
// the op, the shapes and what was expected), promotes dtypes (docs/dtypes.md),
// broadcasts numpy-style, and returns lazy Arrays; nothing runs until eval().
#pragma once

#include <optional>
#include <vector>

#include "tessera/core/array.h"
#include "tessera/ir/primitives/optim.h"

namespace tessera {

// ---- creation ----
Array zeros(const Shape& shape, DType dtype = DType::Float32);
Array ones(const Shape& shape, DType dtype = DType::Float32);
Array full(const Shape& shape, double value, DType dtype = DType::Float32);
Array zeros_like(const Array& a);
Array ones_like(const Array& a);
// [start, stop) in steps of `step` (numpy semantics).
Array arange(double start, double stop, double step = 1, DType dtype = DType::Int64);
Array arange(int64_t stop, DType dtype = DType::Int64);

// ---- elementwise (broadcasting) ----
Array add(const Array& a, const Array& b);
Array subtract(const Array& a, const Array& b);
Array multiply(const Array& a, const Array& b);
Array divide(const Array& a, const Array& b);
Array power(const Array& a, const Array& b);
Array maximum(const Array& a, const Array& b);
Array minimum(const Array& a, const Array& b);
Array equal(const Array& a, const Array& b);
Array not_equal(const Array& a, const Array& b);
Array less(const Array& a, const Array& b);
Array less_equal(const Array& a, const Array& b);
Array greater(const Array& a, const Array& b);
Array greater_equal(const Array& a, const Array& b);
Array logical_and(const Array& a, const Array& b);
Array logical_or(const Array& a, const Array& b);
Array logical_not(const Array& a);
// cond ? a : b; cond is cast to bool.
Array where(const Array& cond, const Array& a, const Array& b);

Array negative(const Array& a);
Array abs(const Array& a);
Array sign(const Array& a);
Array square(const Array& a);
// Transcendental ops on integer inputs compute in float32 (like jax.numpy).
Array exp(const Array& a);
Array log(const Array& a);
Array log1p(const Array& a);
Array sqrt(const Array& a);
Array rsqrt(const Array& a);
Array tanh(const Array& a);
Array erf(const Array& a);
Array sin(const Array& a);
Array cos(const Array& a);
Array sigmoid(const Array& a);
Array relu(const Array& a);
Array silu(const Array& a);
// approximate = true: the tanh form (GPT-2); false: the exact erf form.
Array gelu(const Array& a, bool approximate = true);
Array astype(const Array& a, DType dtype);
// Identity whose gradient is zero.
Array stop_gradient(const Array& a);

// Scalars adopt the array's dtype (weak typing, like JAX): x * 2.0 stays bfloat16.
Array operator+(const Array& a, const Array& b);
Array operator-(const Array& a, const Array& b);
Array operator*(const Array& a, const Array& b);
Array operator/(const Array& a, const Array& b);
Array operator-(const Array& a);
Array operator+(const Array& a, double b);
Array operator-(const Array& a, double b);
Array operator*(const Array& a, double b);
Array operator/(const Array& a, double b);
Array operator+(double a, const Array& b);
Array operator-(double a, const Array& b);
Array operator*(double a, const Array& b);
Array operator/(double a, const Array& b);
// A scalar Array of `like`'s dtype (or float32 if `like` is integral and value is not).
Array scalar_like(double value, const Array& like);

// ---- reductions (axes may be negative; empty = all axes) ----
Array sum(const Array& a, const std::vector<int>& axes = {}, bool keepdims = false);
Array mean(const Array& a, const std::vector<int>& axes = {}, bool keepdims = false);
Array max(const Array& a, const std::vector<int>& axes = {}, bool keepdims = false);
Array min(const Array& a, const std::vector<int>& axes = {}, bool keepdims = false);
Array prod(const Array& a, const std::vector<int>& axes = {}, bool keepdims = false);
Array argmax(const Array& a, int axis, bool keepdims = false);
Array argmin(const Array& a, int axis, bool keepdims = false);
Array logsumexp(const Array& a, const std::vector<int>& axes = {}, bool keepdims = false);
Array var(const Array& a, const std::vector<int>& axes = {}, bool keepdims = false);

// ---- linear algebra ----
// numpy matmul: [..., M, K] @ [..., K, N] with broadcast batch dims; 1-D operands
// are promoted to matrices and the added dim removed.
Array matmul(const Array& a, const Array& b);
// Grouped GEMM (ir/primitives/grouped_matmul.h): a [G, N, K] whose rows come sorted by
// group, w [E, K, M] (or [E, M, K] with trans_w), sizes [G, E] integer rows per group:
// each group's rows times its own matrix, [G, N, M]; rows past the groups are zeros.
Array grouped_matmul(const Array& a, const Array& w, const Array& sizes, bool trans_w = false);
// x [..., K] @ w [K, N] as an int8 GEMM, AQT-style (ir/primitives/quantized.h): x's
// rows (per token) and w's columns (per output channel) get dynamic symmetric int8
// scales; x's leading dims fold into the GEMM's rows. Operands are promoted to one
// floating dtype (float32 or bfloat16). With int8_backward the two backward GEMMs are
// int8 too, rounding the incoming gradient stochastically when a key (uint32 [2]) is
// given; `salt` tells apart the noise of different matmul sites sharing a key.
struct QuantizedMatmulOptions {
  bool transpose_w = false;  // w is stored [N, K]
  bool int8_backward = true;
  uint32_t salt = 0;
  std::optional<Array> key;
};
Array quantized_matmul(const Array& x, const Array& w, const QuantizedMatmulOptions& options = {});
// Contract `a_contract` dims of a with `b_contract` dims of b, batching over
// `a_batch`/`b_batch` (XLA DotGeneral). Result: batch dims, a's free dims, b's free dims.
Array dot_general(const Array& a, const Array& b, const std::vector<int>& a_contract,
                  const std::vector<int>& b_contract, const std::vector<int>& a_batch = {},
                  const std::vector<int>& b_batch = {});

// ---- layout ----
Array reshape(const Array& a, Shape shape);                   // one dim may be -1
Array transpose(const Array& a, std::vector<int> perm = {});  // default: reverse
Array swapaxes(const Array& a, int axis1, int axis2);
Array moveaxis(const Array& a, int source, int destination);
Array expand_dims(const Array& a, int axis);
Array squeeze(const Array& a, std::vector<int> axes = {});
Array broadcast_to(const Array& a, const Shape& shape);
// a[start:stop:step] along each axis (lists as long as a.ndim(); step > 0).
Array slice(const Array& a, std::vector<int64_t> start, std::vector<int64_t> stop, std::vector<int64_t> step = {});
// Slice along one axis.
Array slice_axis(const Array& a, int axis, int64_t start, int64_t stop, int64_t step = 1);
Array concatenate(const std::vector<Array>& arrays, int axis = 0);
Array stack(const std::vector<Array>& arrays, int axis = 0);
Array flatten(const Array& a);

// ---- indexing ----
// numpy.take: result shape a.shape[:axis] + indices.shape + a.shape[axis+1:].
// Embedding lookup is take(table, token_ids, 0).
Array take(const Array& a, const Array& indices, int axis);
// numpy.take_along_axis: indices has a's rank; result has indices' shape.
Array take_along_axis(const Array& a, const Array& indices, int axis);
// [..., num_classes] with 1 where index matches.
Array one_hot(const Array& indices, int64_t num_classes, DType dtype = DType::Float32);

// ---- neural-network ops (fused kernels) ----
Array softmax(const Array& a, int axis = -1);
Array log_softmax(const Array& a, int axis = -1);
// Normalizes over the last axis; weight/bias of shape [D] are optional.
Array layer_norm(const Array& x, const std::optional<Array>& weight = std::nullopt,
                 const std::optional<Array>& bias = std::nullopt, double eps = 1e-5);
Array rms_norm(const Array& x, const std::optional<Array>& weight = std::nullopt, double eps = 1e-6);
// q: [B, H, T, D], k/v: [B, Hkv, S, D] (H a multiple of Hkv: grouped-query attention).
// mask: bool, broadcastable to [B, H, T, S], true = attend. scale default 1/sqrt(D).
// segment_ids: integer [B, T] (self-attention: T == S), documents packed in one row;
// query t sees key s only when segment_ids[b, s] == segment_ids[b, t] (and causality and
// the mask allow it). Ids need not be sorted; sorted ids let the kernels skip the
// (query block, key block) tiles of different documents.
// Tiled flash-style kernel: O(T) memory, causal blocks skipped.
Array scaled_dot_product_attention(const Array& q, const Array& k, const Array& v, bool causal = true,
                                   const std::optional<Array>& mask = std::nullopt,
                                   std::optional<double> scale = std::nullopt,
                                   const std::optional<Array>& segment_ids = std::nullopt);
enum class Reduction { Mean, Sum, None };
// logits [..., V], integer targets [...]; targets == ignore_index contribute 0 and
// are excluded from the mean. Never materializes the probability tensor. `classes`
// (0: V) counts the real classes when the vocabulary is padded: the logits' last
// V - classes columns never enter the softmax and get a zero gradient.
Array cross_entropy(const Array& logits, const Array& targets, int64_t ignore_index = -100,
                    Reduction reduction = Reduction::Mean, int64_t classes = 0);

// ---- optimizer updates (fused kernels) ----
// One AdamW step with decoupled weight decay (Loshchilov & Hutter):
//   m' = b1 m + (1-b1) g;  v' = b2 v + (1-b2) g^2
//   p' = p - lr * ((m' / (1-b1^t)) / (sqrt(v' / (1-b2^t)) + eps) + wd p)
// Returns {p', m', v'}. grad has param's shape and dtype; m and v are float32 for
// float32/bf16/f16 params (float64 for float64), so low-precision params keep
// full-precision state.
std::vector<Array> adamw_update(const Array& param, const Array& grad, const Array& m, const Array& v,
                                const AdamWConfig& config);
// The same with the learning rate and the step count as arrays (floating and integer
// scalars; config.lr and config.step are ignored): a jitted training step then
// compiles once for every step and learning-rate schedule.
std::vector<Array> adamw_update(const Array& param, const Array& grad, const Array& m, const Array& v, const Array& lr,
                                const Array& step, const AdamWConfig& config);
// The same with the gradient scaled first: the update of multiply(grad, grad_scale)
// (grad_scale a scalar of param's dtype, e.g. the global-norm clip factor), bitwise, in
// one pass: the scaled gradients are never stored.
std::vector<Array> adamw_update(const Array& param, const Array& grad, const Array& m, const Array& v, const Array& lr,
                                const Array& step, const Array& grad_scale, const AdamWConfig& config);
// One Lion step (Chen et al. 2023):
//   c = b1 m + (1-b1) g;  p' = p - lr (sign(c) + wd p);  m' = b2 m + (1-b2) g
// Returns {p', m'}. grad has param's shape and dtype; m is float32 for
// float32/bf16/f16 params (float64 for float64). sign(0) = 0, as the sign op.
std::vector<Array> lion_update(const Array& param, const Array& grad, const Array& m, const LionConfig& config);
// The same with the learning rate as an array (a floating scalar; config.lr is ignored).
std::vector<Array> lion_update(const Array& param, const Array& grad, const Array& m, const Array& lr,
                               const LionConfig& config);

}  // namespace tessera
