// CUDA kernels of the attention primitives (ir/primitives/nn.h): "attention" (inputs q,
// k, v, [mask], [segments]; outputs out, lse) and "attention_grad" (inputs q, k, v,
// [mask], [segments], out, lse, dout; outputs dq, dk, dv), on the flash kernels of
// backend/cuda/kernels/flash_attention.h. Shapes and attributes are read exactly as the
// CPU evals read them (backend/cpu/eval_nn.cpp): q [B, H, T, D], k/v [B, Hkv, S, D], the
// mask [mb, mh, T, S] Bool with mb in {1, B}, mh in {1, H} (size 1 broadcasts), lse
// [B, H, T] in the accumulation dtype, segment ids int32 [B, T] (T == S) (float32 for every dtype the GPU supports).
#include <string>

#include "backend/cuda/kernel_registry.h"
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
  if (config.has_mask) {
    const DeviceTensor& m = inputs[3];
    if (m.dtype != DType::Bool || m.shape.size() != 4 || (m.shape[0] != 1 && m.shape[0] != s.batch) ||
        (m.shape[1] != 1 && m.shape[1] != s.heads) || m.shape[2] != s.q_len || m.shape[3] != s.kv_len)
      fail<ShapeError>("{}: mask is {} (expected bool [1 or {}, 1 or {}, {}, {}])", op, type_of(m), s.batch, s.heads,
                       s.q_len, s.kv_len);
    const int64_t plane = s.q_len * s.kv_len;
    s.mask = m.data;
    s.mask_h_stride = m.shape[1] == 1 ? 0 : plane;
    s.mask_b_stride = m.shape[0] == 1 ? 0 : m.shape[1] * plane;
  }
  if (config.has_segments) {
    const DeviceTensor& seg = inputs[config.segments_index()];
    if (seg.dtype != DType::Int32 || seg.shape != Shape{s.batch, s.q_len} || s.q_len != s.kv_len)
      fail<ShapeError>("{}: segment ids are {} with q {} and k {} (expected int32 [{}, {}] and T == S)", op,
                       type_of(seg), type_of(q), type_of(k), s.batch, s.q_len);
    s.segments = seg.as<int32_t>();
  }
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
  const size_t scratch_bytes = flash_attention_backward_scratch_bytes(s);
  void* scratch = scratch_bytes > 0 ? ctx.scratch(scratch_bytes) : nullptr;
  flash_attention_backward(dtype, s, inputs[0].data, inputs[1].data, inputs[2].data, out.data, lse.as<float>(),
                           dout.data, outputs[0].data, outputs[1].data, outputs[2].data, scratch, ctx.stream);
}

}  // namespace

void register_attention_kernels() {
  register_kernel("attention", attention_kernel);
  register_kernel("attention_grad", attention_grad_kernel);
}

}  // namespace tessera::cuda
