// CUDA kernels of the attention primitives (ir/primitives/nn.h): "attention" (inputs q,
// k, v, [mask], [segments]; outputs out, lse) and "attention_grad" (inputs q, k, v,
// [mask], [segments], out, lse, dout; outputs dq, dk, dv), on the flash kernels of
// backend/cuda/kernels/flash_attention.h. Shapes and attributes are read exactly as the
// CPU evals read them (backend/cpu/eval_nn.cpp): q [B, H, T, D], k/v [B, Hkv, S, D], the
// mask [mb, mh, T, S] Bool with mb in {1, B}, mh in {1, H} (size 1 broadcasts), lse
// [B, H, T] in the accumulation dtype, segment ids int32 [B, T] (T == S) (float32 for every dtype the GPU supports).
// The packed primitives ("attention_packed", "attention_packed_grad", made by the
// attention-layout pass) run the v2 kernels on qkv [B, T, Hkv, G + 2, D] and out / dout
// [B, T, H, D] in place; where v2 does not apply (other dtypes or D, a mask, TESSERA_
// ATTENTION_KERNEL=v1, an older GPU) they copy to the contiguous layout and back. Where
// cuDNN loaded (TESSERA_ATTENTION_KERNEL auto, the default, or cudnn), each runs cuDNN's
// fused attention first where it applies (backend/cuda/kernels/cudnn_attention.h), in the
// same layouts.
#include <string>

#include "backend/cuda/kernel_registry.h"
#include "backend/cuda/kernels/cudnn_attention.h"
#include "backend/cuda/kernels/flash_attention.h"
#include "tessera/base/error.h"
#include "tessera/ir/primitives/nn.h"

namespace tessera::cuda {

namespace {

std::string type_of(const DeviceTensor& t) { return fmt::format("{}{}", short_name(t.dtype), to_string(t.shape)); }

void check_counts(const char* op, const std::vector<DeviceTensor>& inputs, const std::vector<DeviceTensor>& outputs,
                  size_t want_in, size_t want_out) {
  if (inputs.size() != want_in || outputs.size() != want_out)
    fail<ValueError>("{}: called with {} inputs and {} outputs (expected {} and {})", op, inputs.size(), outputs.size(),
                     want_in, want_out);
}

void check_type(const char* op, const char* what, const DeviceTensor& t, const Shape& shape, DType dtype) {
  if (t.shape != shape || t.dtype != dtype)
    fail<ShapeError>("{}: {} is {} (expected {}{})", op, what, type_of(t), short_name(dtype), to_string(shape));
}

// The optional inputs of an attention primitive, from inputs[first]: the mask (bool
// [1 or B, 1 or H, T, S], broadcast by zero strides) and the segment ids (int32 [B, T]),
// checked against s's sizes and set on s.
void set_mask_and_segments(const char* op, const AttentionConfig& config, const std::vector<DeviceTensor>& inputs,
                           size_t first, FlashAttentionShape* s) {
  size_t next = first;
  if (config.has_mask) {
    const DeviceTensor& m = inputs[next++];
    if (m.dtype != DType::Bool || m.shape.size() != 4 || (m.shape[0] != 1 && m.shape[0] != s->batch) ||
        (m.shape[1] != 1 && m.shape[1] != s->heads) || m.shape[2] != s->q_len || m.shape[3] != s->kv_len)
      fail<ShapeError>("{}: mask is {} (expected bool [1 or {}, 1 or {}, {}, {}])", op, type_of(m), s->batch, s->heads,
                       s->q_len, s->kv_len);
    const int64_t plane = s->q_len * s->kv_len;
    s->mask = m.data;
    s->mask_h_stride = m.shape[1] == 1 ? 0 : plane;
    s->mask_b_stride = m.shape[0] == 1 ? 0 : m.shape[1] * plane;
  }
  if (config.has_segments) {
    const DeviceTensor& seg = inputs[next];
    if (seg.dtype != DType::Int32 || seg.shape != Shape{s->batch, s->q_len})
      fail<ShapeError>("{}: segment ids are {} (expected int32 [{}, {}])", op, type_of(seg), s->batch, s->q_len);
    s->segments = seg.as<int32_t>();
  }
}

// The kernel shape from q, k, v (and the mask), checking what the kernels rely on.
FlashAttentionShape attention_shape(const char* op, const AttentionConfig& config,
                                    const std::vector<DeviceTensor>& inputs) {
  const DeviceTensor &q = inputs[0], &k = inputs[1], &v = inputs[2];
  if (q.shape.size() != 4 || k.shape.size() != 4 || k.shape != v.shape || k.shape[0] != q.shape[0] ||
      k.shape[3] != q.shape[3] || k.dtype != q.dtype || v.dtype != q.dtype)
    fail<ShapeError>("{}: incompatible q {}, k {}, v {} (expected q [B, H, T, D], k == v [B, Hkv, S, D])", op,
                     type_of(q), type_of(k), type_of(v));
  FlashAttentionShape s;
  s.batch = q.shape[0];
  s.heads = q.shape[1];
  s.q_len = q.shape[2];
  s.head_dim = q.shape[3];
  s.kv_heads = k.shape[1];
  s.kv_len = k.shape[2];
  s.causal = config.causal;
  s.scale = config.scale;
  if (config.has_segments && s.q_len != s.kv_len)
    fail<ShapeError>("{}: segment ids with q {} and k {} (expected T == S)", op, type_of(q), type_of(k));
  set_mask_and_segments(op, config, inputs, 3, &s);
  return s;
}

void attention_kernel(const Primitive& p, const std::vector<DeviceTensor>& inputs,
                      const std::vector<DeviceTensor>& outputs, KernelContext& ctx) {
  const auto& config = dynamic_cast<const Attention&>(p).config();
  check_counts("attention", inputs, outputs, 3 + config.optional_inputs(), 2);
  const FlashAttentionShape s = attention_shape("attention", config, inputs);
  const DType dtype = inputs[0].dtype;
  check_type("attention", "out", outputs[0], inputs[0].shape, dtype);
  check_type("attention", "lse", outputs[1], Shape{s.batch, s.heads, s.q_len}, accumulation_dtype(dtype));
  if (cudnn_attention_selected() &&
      cudnn_attention_forward(dtype, s, contiguous_attention_layout(s), inputs[0].data, inputs[1].data, inputs[2].data,
                              outputs[0].data, outputs[1].as<float>(), ctx.scratch, ctx.stream))
    return;
  flash_attention_forward(dtype, s, inputs[0].data, inputs[1].data, inputs[2].data, outputs[0].data,
                          outputs[1].as<float>(), ctx.stream);
}

void attention_grad_kernel(const Primitive& p, const std::vector<DeviceTensor>& inputs,
                           const std::vector<DeviceTensor>& outputs, KernelContext& ctx) {
  const auto& config = dynamic_cast<const AttentionGrad&>(p).config();
  const size_t m = config.optional_inputs();
  check_counts("attention_grad", inputs, outputs, 6 + m, 3);
  const FlashAttentionShape s = attention_shape("attention_grad", config, inputs);
  const DType dtype = inputs[0].dtype;
  const DeviceTensor &out = inputs[3 + m], &lse = inputs[4 + m], &dout = inputs[5 + m];
  check_type("attention_grad", "out", out, inputs[0].shape, dtype);
  check_type("attention_grad", "lse", lse, Shape{s.batch, s.heads, s.q_len}, accumulation_dtype(dtype));
  check_type("attention_grad", "dout", dout, inputs[0].shape, dtype);
  for (int i = 0; i < 3; ++i)
    check_type("attention_grad", i == 0 ? "dq" : i == 1 ? "dk" : "dv", outputs[i], inputs[i].shape, dtype);
  if (cudnn_attention_selected() &&
      cudnn_attention_backward(dtype, s, contiguous_attention_layout(s), inputs[0].data, inputs[1].data, inputs[2].data,
                               out.data, lse.as<float>(), dout.data, outputs[0].data, outputs[1].data, outputs[2].data,
                               ctx.scratch, ctx.stream))
    return;
  const size_t scratch_bytes = flash_attention_backward_scratch_bytes(s);
  void* scratch = scratch_bytes > 0 ? ctx.scratch(scratch_bytes) : nullptr;
  flash_attention_backward(dtype, s, inputs[0].data, inputs[1].data, inputs[2].data, out.data, lse.as<float>(),
                           dout.data, outputs[0].data, outputs[1].data, outputs[2].data, scratch, ctx.stream);
}

// ---- packed ----

// The kernel shape of a packed qkv (and the mask and segment ids, inputs 1.. of the
// packed primitives, checked as attention_shape checks them).
FlashAttentionShape packed_shape(const char* op, const AttentionConfig& config,
                                 const std::vector<DeviceTensor>& inputs) {
  const PackedQkvShape p = packed_qkv_shape(op, inputs[0].shape);
  FlashAttentionShape s;
  s.batch = p.batch;
  s.heads = p.heads();
  s.kv_heads = p.kv_heads;
  s.q_len = s.kv_len = p.seq;
  s.head_dim = p.head_dim;
  s.causal = config.causal;
  s.scale = config.scale;
  set_mask_and_segments(op, config, inputs, 1, &s);
  return s;
}

// Pointers to q, k, v inside a packed buffer: k and v follow a kv head's G query heads.
struct PackedPointers {
  char *q, *k, *v;
  PackedPointers(void* qkv, const FlashAttentionShape& s, DType dtype) {
    const int64_t group = s.heads / s.kv_heads;
    const size_t row = static_cast<size_t>(s.head_dim) * itemsize(dtype);
    q = static_cast<char*>(qkv);
    k = q + static_cast<size_t>(group) * row;
    v = k + row;
  }
};

// The fallback's copies: rows of q-like tensors (heads H in groups of G) or of k/v/out
// (one head per group) between the packed and the contiguous layouts.
FlashAttentionStrides per_head(FlashAttentionStrides s) {
  s.group = s.head;  // group size 1: head h at h * group
  return s;
}

// Carves 256-byte aligned pieces out of one scratch allocation.
class ScratchCarver {
 public:
  explicit ScratchCarver(const std::vector<size_t>& sizes) : sizes_(sizes) {}
  size_t total() const {
    size_t t = 0;
    for (size_t s : sizes_) t += round_up(s);
    return t;
  }
  std::vector<char*> carve(void* base) const {
    std::vector<char*> out;
    char* at = static_cast<char*>(base);
    for (size_t s : sizes_) {
      out.push_back(at);
      at += round_up(s);
    }
    return out;
  }

 private:
  static size_t round_up(size_t n) { return (n + 255) / 256 * 256; }
  std::vector<size_t> sizes_;
};

void attention_packed_kernel(const Primitive& p, const std::vector<DeviceTensor>& inputs,
                             const std::vector<DeviceTensor>& outputs, KernelContext& ctx) {
  const auto& config = dynamic_cast<const AttentionPacked&>(p).config();
  check_counts("attention_packed", inputs, outputs, 1 + config.optional_inputs(), 2);
  const FlashAttentionShape s = packed_shape("attention_packed", config, inputs);
  const DType dtype = inputs[0].dtype;
  check_type("attention_packed", "out", outputs[0], Shape{s.batch, s.q_len, s.heads, s.head_dim}, dtype);
  check_type("attention_packed", "lse", outputs[1], Shape{s.batch, s.heads, s.q_len}, accumulation_dtype(dtype));
  const PackedPointers qkv(inputs[0].data, s, dtype);
  const FlashAttentionLayout packed = packed_qkv_attention_layout(s);
  float* lse = outputs[1].as<float>();
  if (cudnn_attention_selected() &&
      cudnn_attention_forward(dtype, s, packed, qkv.q, qkv.k, qkv.v, outputs[0].data, lse, ctx.scratch, ctx.stream))
    return;
  if (flash_attention_forward_strided(dtype, s, packed, qkv.q, qkv.k, qkv.v, outputs[0].data, lse, ctx.stream)) return;
  const FlashAttentionLayout dense = contiguous_attention_layout(s);
  const size_t item = itemsize(dtype), q_bytes = static_cast<size_t>(s.batch * s.heads * s.q_len * s.head_dim) * item,
               kv_bytes = static_cast<size_t>(s.batch * s.kv_heads * s.kv_len * s.head_dim) * item;
  const ScratchCarver carver({q_bytes, kv_bytes, kv_bytes, q_bytes});
  const std::vector<char*> buf = carver.carve(ctx.scratch(carver.total()));
  const int64_t group = s.heads / s.kv_heads;
  flash_attention_copy_rows(dtype, s.batch, s.heads, group, s.q_len, s.head_dim, qkv.q, packed.q, buf[0], dense.q,
                            ctx.stream);
  flash_attention_copy_rows(dtype, s.batch, s.kv_heads, 1, s.kv_len, s.head_dim, qkv.k, per_head(packed.kv), buf[1],
                            per_head(dense.kv), ctx.stream);
  flash_attention_copy_rows(dtype, s.batch, s.kv_heads, 1, s.kv_len, s.head_dim, qkv.v, per_head(packed.kv), buf[2],
                            per_head(dense.kv), ctx.stream);
  flash_attention_forward(dtype, s, buf[0], buf[1], buf[2], buf[3], lse, ctx.stream);
  flash_attention_copy_rows(dtype, s.batch, s.heads, 1, s.q_len, s.head_dim, buf[3], per_head(dense.o), outputs[0].data,
                            per_head(packed.o), ctx.stream);
}

void attention_packed_grad_kernel(const Primitive& p, const std::vector<DeviceTensor>& inputs,
                                  const std::vector<DeviceTensor>& outputs, KernelContext& ctx) {
  const auto& config = dynamic_cast<const AttentionPackedGrad&>(p).config();
  const size_t m = config.optional_inputs();
  check_counts("attention_packed_grad", inputs, outputs, 4 + m, 1);
  const FlashAttentionShape s = packed_shape("attention_packed_grad", config, inputs);
  const DType dtype = inputs[0].dtype;
  const DeviceTensor &out = inputs[1 + m], &lse = inputs[2 + m], &dout = inputs[3 + m];
  const Shape out_shape{s.batch, s.q_len, s.heads, s.head_dim};
  check_type("attention_packed_grad", "out", out, out_shape, dtype);
  check_type("attention_packed_grad", "lse", lse, Shape{s.batch, s.heads, s.q_len}, accumulation_dtype(dtype));
  check_type("attention_packed_grad", "dout", dout, out_shape, dtype);
  check_type("attention_packed_grad", "dqkv", outputs[0], inputs[0].shape, dtype);
  const PackedPointers qkv(inputs[0].data, s, dtype), dqkv(outputs[0].data, s, dtype);
  const FlashAttentionLayout packed = packed_qkv_attention_layout(s);
  const size_t delta_bytes = flash_attention_backward_scratch_bytes(s);
  const size_t item = itemsize(dtype), q_bytes = static_cast<size_t>(s.batch * s.heads * s.q_len * s.head_dim) * item,
               kv_bytes = static_cast<size_t>(s.batch * s.kv_heads * s.kv_len * s.head_dim) * item;
  if (cudnn_attention_selected() &&
      cudnn_attention_backward(dtype, s, packed, qkv.q, qkv.k, qkv.v, out.data, lse.as<float>(), dout.data, dqkv.q,
                               dqkv.k, dqkv.v, ctx.scratch, ctx.stream))
    return;
  if (flash_attention_backward_strided(dtype, s, packed, qkv.q, qkv.k, qkv.v, out.data, lse.as<float>(), dout.data,
                                       dqkv.q, dqkv.k, dqkv.v, ctx.scratch(delta_bytes), ctx.stream))
    return;
  // q, k, v, out, dout, dq, dk, dv in the contiguous layout, then delta.
  const ScratchCarver carver({q_bytes, kv_bytes, kv_bytes, q_bytes, q_bytes, q_bytes, kv_bytes, kv_bytes, delta_bytes});
  const std::vector<char*> buf = carver.carve(ctx.scratch(carver.total()));
  const FlashAttentionLayout dense = contiguous_attention_layout(s);
  const int64_t group = s.heads / s.kv_heads;
  auto copy_q = [&](const void* src, const FlashAttentionStrides& from, void* dst, const FlashAttentionStrides& to) {
    flash_attention_copy_rows(dtype, s.batch, s.heads, group, s.q_len, s.head_dim, src, from, dst, to, ctx.stream);
  };
  auto copy_kv = [&](const void* src, const FlashAttentionStrides& from, void* dst, const FlashAttentionStrides& to) {
    flash_attention_copy_rows(dtype, s.batch, s.kv_heads, 1, s.kv_len, s.head_dim, src, per_head(from), dst,
                              per_head(to), ctx.stream);
  };
  auto copy_o = [&](const void* src, const FlashAttentionStrides& from, void* dst, const FlashAttentionStrides& to) {
    flash_attention_copy_rows(dtype, s.batch, s.heads, 1, s.q_len, s.head_dim, src, per_head(from), dst, per_head(to),
                              ctx.stream);
  };
  copy_q(qkv.q, packed.q, buf[0], dense.q);
  copy_kv(qkv.k, packed.kv, buf[1], dense.kv);
  copy_kv(qkv.v, packed.kv, buf[2], dense.kv);
  copy_o(out.data, packed.o, buf[3], dense.o);
  copy_o(dout.data, packed.o, buf[4], dense.o);
  flash_attention_backward(dtype, s, buf[0], buf[1], buf[2], buf[3], lse.as<float>(), buf[4], buf[5], buf[6], buf[7],
                           buf[8], ctx.stream);
  copy_q(buf[5], dense.q, dqkv.q, packed.q);
  copy_kv(buf[6], dense.kv, dqkv.k, packed.kv);
  copy_kv(buf[7], dense.kv, dqkv.v, packed.kv);
}

}  // namespace

void register_attention_kernels() {
  register_kernel("attention", attention_kernel);
  register_kernel("attention_grad", attention_grad_kernel);
  register_kernel("attention_packed", attention_packed_kernel);
  register_kernel("attention_packed_grad", attention_packed_grad_kernel);
}

}  // namespace tessera::cuda
