// CUDA kernels of the linear-algebra primitives: matmul and matmul_epilogue (and its
// activation_grad form: cuBLASLt's DGELU; its int8 form and quantized_matmul through
// quantized_gemm.h, bitwise the CPU's int8 products), both
// through gemm() (backend/cuda/kernels/gemm.h: cuBLASLt with a fused bias / activation
// epilogue), and the grouped matmuls (backend/cuda/kernels/grouped_gemm.h). Shapes and attributes are read exactly as
// the CPU evals read them (backend/cpu/eval_linalg.cpp, eval_linalg_epilogue.cpp).
#include <string>

#include "backend/cuda/kernel_registry.h"
#include "backend/cuda/kernels/gemm.h"
#include "backend/cuda/kernels/grouped_gemm.h"
#include "backend/cuda/kernels/quantized_gemm.h"
#include "tessera/base/error.h"
#include "tessera/ir/primitives/elementwise.h"
#include "tessera/ir/primitives/grouped_matmul.h"
#include "tessera/ir/primitives/linalg.h"
#include "tessera/ir/primitives/matmul_epilogue.h"
#include "tessera/ir/primitives/quantized.h"

namespace tessera::cuda {

namespace {

std::string type_of(const DeviceTensor& t) { return fmt::format("{}{}", short_name(t.dtype), to_string(t.shape)); }

int64_t dim(const DeviceTensor& t, int axis) {
  return t.shape[static_cast<size_t>(static_cast<int>(t.shape.size()) + axis)];
}

// The workspace and, after it, the staging for misaligned rows (gemm.h), in one scratch.
GemmContext gemm_context(KernelContext& ctx, DType dtype, const GemmShape& shape) {
  GemmContext g;
  g.handle = ctx.cublaslt;
  g.stream = ctx.stream;
  g.sm_major = ctx.sm_major;
  g.sm_minor = ctx.sm_minor;
  if (shape.k > 0 && is_floating(dtype) && ctx.scratch) {
    const size_t staging = gemm_staging_bytes(dtype, shape);
    unsigned char* base = static_cast<unsigned char*>(ctx.scratch(kGemmWorkspaceBytes + staging));
    if (base != nullptr) {
      g.workspace = base;
      g.workspace_bytes = kGemmWorkspaceBytes;
      g.staging = staging > 0 ? base + kGemmWorkspaceBytes : nullptr;
      g.staging_bytes = staging;
    }
  }
  return g;
}

// The GEMM shape of `out` = op(a) op(b), with the CPU eval's batch rule: a rank > 2
// operand has the output's batch dims (stride m*k or k*n), a rank-2 one is shared.
GemmShape gemm_shape(const char* op, const DeviceTensor& a, const DeviceTensor& b, const DeviceTensor& out,
                     bool trans_a, bool trans_b) {
  if (a.shape.size() < 2 || b.shape.size() < 2 || out.shape.size() < 2)
    fail<ShapeError>("{}: operands and output must have rank >= 2 (got {}, {} -> {})", op, type_of(a), type_of(b),
                     type_of(out));
  GemmShape s;
  s.m = dim(out, -2);
  s.n = dim(out, -1);
  s.k = dim(a, trans_a ? -2 : -1);
  s.trans_a = trans_a;
  s.trans_b = trans_b;
  if (dim(a, trans_a ? -1 : -2) != s.m || dim(b, trans_b ? -1 : -2) != s.k || dim(b, trans_b ? -2 : -1) != s.n ||
      a.dtype != out.dtype || b.dtype != out.dtype)
    fail<ShapeError>("{}: operands {} and {} do not give {}", op, type_of(a), type_of(b), type_of(out));
  const int64_t total = out.numel();
  s.batch = total == 0 ? 0 : total / (s.m * s.n);
  s.a_batch_stride = a.shape.size() > 2 ? s.m * s.k : 0;
  s.b_batch_stride = b.shape.size() > 2 ? s.k * s.n : 0;
  if ((a.shape.size() > 2 && a.numel() != s.batch * s.m * s.k) ||
      (b.shape.size() > 2 && b.numel() != s.batch * s.k * s.n))
    fail<ShapeError>("{}: batch dims of {} and {} do not match the output {}", op, type_of(a), type_of(b),
                     type_of(out));
  return s;
}

void matmul_kernel(const Primitive& primitive, const std::vector<DeviceTensor>& inputs,
                   const std::vector<DeviceTensor>& outputs, KernelContext& ctx) {
  const auto& mm = dynamic_cast<const Matmul&>(primitive);
  if (inputs.size() != 2 || outputs.size() != 1)
    fail<ValueError>("matmul: called with {} inputs and {} outputs (expected 2 and 1)", inputs.size(), outputs.size());
  const DeviceTensor& a = inputs[0];
  const DeviceTensor& b = inputs[1];
  const DeviceTensor& out = outputs[0];
  const GemmShape s = gemm_shape("matmul", a, b, out, mm.trans_a(), mm.trans_b());
  if (out.numel() == 0) return;
  gemm(out.dtype, s, a.data, b.data, out.data, GemmEpilogue{}, gemm_context(ctx, out.dtype, s));
}

GemmActivation gemm_activation(UnaryKind kind) {
  switch (kind) {
    case UnaryKind::GeluTanh:
      return GemmActivation::GeluTanh;
    case UnaryKind::GeluErf:
      return GemmActivation::GeluErf;
    case UnaryKind::Relu:
      return GemmActivation::Relu;
    case UnaryKind::Silu:
      return GemmActivation::Silu;
    case UnaryKind::Tanh:
      return GemmActivation::Tanh;
    case UnaryKind::Sigmoid:
      return GemmActivation::Sigmoid;
    default:
      fail<ValueError>(
          "matmul_epilogue: activation '{}' is not supported (expected gelu_tanh, gelu_erf, relu, silu, tanh or "
          "sigmoid)",
          unary_name(kind));
  }
}

// activation_grad=gelu_tanh: out = gelu_tanh_grad(x, a b). cuBLASLt's DGELU epilogue where
// it applies, else the product and then the gelu_tanh_grad kernel (the unfused pair).
void activation_grad(const std::vector<DeviceTensor>& inputs, const DeviceTensor& out, const GemmShape& s,
                     KernelContext& ctx) {
  const DeviceTensor& x = inputs[2];
  if (x.shape != out.shape || x.dtype != out.dtype)
    fail<ShapeError>("matmul_epilogue: the activation's input is {} (expected {})", type_of(x), type_of(out));
  if (out.numel() == 0) return;
  const GemmContext gc = gemm_context(ctx, out.dtype, s);
  if (gemm_dgelu(out.dtype, s, inputs[0].data, inputs[1].data, out.data, x.data, gc)) return;
  gemm(out.dtype, s, inputs[0].data, inputs[1].data, out.data, GemmEpilogue{}, gc);
  static const Binary grad_op(BinaryKind::GeluTanhGrad);
  const KernelFn* grad = find_kernel("gelu_tanh_grad");
  if (grad == nullptr) fail<Error>("matmul_epilogue: no CUDA kernel for gelu_tanh_grad");
  (*grad)(grad_op, {x, out}, {out}, ctx);  // elementwise: each element read before it is written
}

// A matmul_epilogue's bias: out's dtype, [n] or [1, ..., 1, n].
const void* checked_bias(const DeviceTensor& bias, const DeviceTensor& out, int64_t n) {
  bool row_vector = !bias.shape.empty() && bias.shape.size() <= out.shape.size() && dim(bias, -1) == n;
  for (size_t d = 0; d + 1 < bias.shape.size(); ++d) row_vector = row_vector && bias.shape[d] == 1;
  if (!row_vector || bias.dtype != out.dtype)
    fail<ShapeError>("matmul_epilogue: bias must be {}[{}] or [1, ..., {}] (got {})", name(out.dtype), n, n,
                     type_of(bias));
  return bias.data;
}

// ---- int8 (AQT): quantized_matmul and the fused matmul_epilogue int8=true ----

// The shape as the CPU evals read it: a [..., m, k] (every leading dim is rows) or a
// transposed [k, m], b [k, n] or [n, k].
QuantizedGemmShape quantized_shape(const char* op, const DeviceTensor& a, const DeviceTensor& b,
                                   const DeviceTensor& out, bool trans_a, bool trans_b) {
  QuantizedGemmShape s;
  s.trans_a = trans_a;
  s.trans_b = trans_b;
  const bool ranks =
      a.shape.size() >= 2 && b.shape.size() == 2 && !out.shape.empty() && (!trans_a || a.shape.size() == 2);
  if (ranks) {
    s.n = dim(out, -1);
    s.m = s.n == 0 ? 0 : out.numel() / s.n;
    s.k = trans_a ? a.shape[0] : dim(a, -1);
  }
  const int64_t a_rows = !ranks ? -1 : trans_a ? a.shape[1] : (s.k == 0 ? 0 : a.numel() / s.k);
  if (!ranks || a_rows != s.m || b.shape[trans_b ? 1 : 0] != s.k || b.shape[trans_b ? 0 : 1] != s.n ||
      a.dtype != out.dtype || b.dtype != out.dtype)
    fail<ShapeError>("{}: operands {} and {} do not give {}", op, type_of(a), type_of(b), type_of(out));
  return s;
}

// The product into `out` (and the bias of a fused epilogue), the scratch from ctx.
void run_quantized(const QuantizedGemmShape& s, const DeviceTensor& a, const DeviceTensor& b, const DeviceTensor& out,
                   const DeviceRounding& round_a, const DeviceRounding& round_b, const QuantizedEpilogue& epilogue,
                   KernelContext& ctx) {
  if (out.numel() == 0) return;
  GemmContext g;
  g.handle = ctx.cublaslt;
  g.stream = ctx.stream;
  g.sm_major = ctx.sm_major;
  g.sm_minor = ctx.sm_minor;
  void* scratch = ctx.scratch ? ctx.scratch(quantized_gemm_scratch_bytes(s)) : nullptr;
  quantized_gemm(out.dtype, s, a.data, b.data, out.data, round_a, round_b, epilogue, g, scratch);
}

void quantized_matmul_kernel(const Primitive& primitive, const std::vector<DeviceTensor>& inputs,
                             const std::vector<DeviceTensor>& outputs, KernelContext& ctx) {
  const QuantizedMatmulConfig& c = dynamic_cast<const QuantizedMatmul&>(primitive).config();
  if (inputs.size() < 2 || inputs.size() > 3 || outputs.size() != 1)
    fail<ValueError>("quantized_matmul: called with {} inputs and {} outputs (expected 2 or 3 and 1)", inputs.size(),
                     outputs.size());
  const QuantizedGemmShape s =
      quantized_shape("quantized_matmul", inputs[0], inputs[1], outputs[0], c.trans_a, c.trans_b);
  const uint32_t* key = nullptr;
  if (inputs.size() == 3) {
    if (inputs[2].dtype != DType::UInt32 || inputs[2].numel() != 2)
      fail<ShapeError>("quantized_matmul: key must be u32[2] (got {})", type_of(inputs[2]));
    key = inputs[2].as<const uint32_t>();
  }
  const DeviceRounding round_a{c.stochastic_a, key, c.salt, 0}, round_b{c.stochastic_b, key, c.salt, 1};
  run_quantized(s, inputs[0], inputs[1], outputs[0], round_a, round_b, QuantizedEpilogue{}, ctx);
}

// matmul_epilogue int8=true: the product and bias in the dequantizing pass, then the
// activation kernel (the unfused op's) from the pre-activation into the output.
void quantized_epilogue(const MatmulEpilogue::Options& o, const std::vector<DeviceTensor>& inputs,
                        const std::vector<DeviceTensor>& outputs, KernelContext& ctx) {
  const DeviceTensor& out = outputs[0];
  const QuantizedGemmShape s =
      quantized_shape("matmul_epilogue (int8)", inputs[0], inputs[1], out, o.trans_a, o.trans_b);
  QuantizedEpilogue e;
  if (o.bias) {
    e.bias = checked_bias(inputs[2], out, s.n);
    e.bias_first = o.bias_first;
  }
  if (o.pre_activation) {
    if (outputs[1].shape != out.shape || outputs[1].dtype != out.dtype)
      fail<ShapeError>("matmul_epilogue: pre-activation output is {} (expected {})", type_of(outputs[1]), type_of(out));
    e.pre_activation = outputs[1].data;
  }
  run_quantized(s, inputs[0], inputs[1], out, DeviceRounding{}, DeviceRounding{}, e, ctx);
  if (!o.activation || out.numel() == 0) return;
  const Unary activation(*o.activation);
  const KernelFn* kernel = find_kernel(activation.name());
  if (kernel == nullptr) fail<Error>("matmul_epilogue: no CUDA kernel for {}", activation.name());
  (*kernel)(activation, {o.pre_activation ? outputs[1] : out}, {out}, ctx);
}

void matmul_epilogue_kernel(const Primitive& primitive, const std::vector<DeviceTensor>& inputs,
                            const std::vector<DeviceTensor>& outputs, KernelContext& ctx) {
  const auto& me = dynamic_cast<const MatmulEpilogue&>(primitive);
  const MatmulEpilogue::Options& o = me.options();
  const size_t want_inputs = o.bias || o.activation_grad ? 3 : 2, want_outputs = o.pre_activation ? 2 : 1;
  if (inputs.size() != want_inputs || outputs.size() != want_outputs)
    fail<ValueError>("matmul_epilogue: called with {} inputs and {} outputs (expected {} and {})", inputs.size(),
                     outputs.size(), want_inputs, want_outputs);
  const DeviceTensor& a = inputs[0];
  const DeviceTensor& b = inputs[1];
  if (o.int8) {
    if (o.activation_grad) fail<ValueError>("matmul_epilogue: int8=true takes no activation_grad");
    quantized_epilogue(o, inputs, outputs, ctx);
    return;
  }
  const DeviceTensor& out = outputs[0];
  const GemmShape s = gemm_shape("matmul_epilogue", a, b, out, o.trans_a, o.trans_b);
  if (o.activation_grad) {
    activation_grad(inputs, out, s, ctx);
    return;
  }
  GemmEpilogue e;
  if (o.bias) {
    e.bias = checked_bias(inputs[2], out, s.n);
  }
  if (o.activation) e.activation = gemm_activation(*o.activation);
  if (o.pre_activation) {
    if (outputs[1].shape != out.shape || outputs[1].dtype != out.dtype)
      fail<ShapeError>("matmul_epilogue: pre-activation output is {} (expected {})", type_of(outputs[1]), type_of(out));
    e.pre_activation = outputs[1].data;
  }
  if (out.numel() == 0) return;
  gemm(out.dtype, s, a.data, b.data, out.data, e, gemm_context(ctx, out.dtype, s));
}

// The leading shard dim of a grouped operand (1 at rank 3; see grouped_matmul.h) and
// the byte strides of one shard's slice.
int64_t shards_of(const DeviceTensor& t, size_t rank3) { return t.shape.size() == rank3 + 1 ? t.shape[0] : 1; }
char* shard_at(void* base, int64_t s, int64_t elements, DType dtype) {
  return static_cast<char*>(base) + static_cast<size_t>(s * elements) * itemsize(dtype);
}

// a [G, N, K], w [E, K, M] (or [E, M, K]), sizes [G, E] -> [G, N, M]; or each with a
// leading shard dim S, shard s on its own matrices (one grouped GEMM per shard).
void grouped_matmul_kernel(const Primitive& primitive, const std::vector<DeviceTensor>& inputs,
                           const std::vector<DeviceTensor>& outputs, KernelContext& ctx) {
  const auto& p = dynamic_cast<const GroupedMatmul&>(primitive);
  if (inputs.size() != 3 || outputs.size() != 1)
    fail<ValueError>("grouped_matmul: called with {} inputs and {} outputs (expected 3 and 1)", inputs.size(),
                     outputs.size());
  const DeviceTensor& a = inputs[0];
  const DeviceTensor& w = inputs[1];
  const DeviceTensor& sizes = inputs[2];
  const DeviceTensor& out = outputs[0];
  const size_t r = a.shape.size();
  if ((r != 3 && r != 4) || w.shape.size() != r || out.shape.size() != r || sizes.shape.size() != r - 1)
    fail<ShapeError>("grouped_matmul: operands {}, {}, {} -> {} (expected ranks 3, 3, 2 -> 3 or 4, 4, 3 -> 4)",
                     to_string(a.shape), to_string(w.shape), to_string(sizes.shape), to_string(out.shape));
  const int64_t shards = shards_of(a, 3), batches = dim(a, -3), rows = dim(a, -2), k = dim(a, -1), m = dim(out, -1);
  const int64_t groups = dim(w, -3);
  for (int64_t s = 0; s < shards; ++s)
    grouped_gemm(out.dtype, shard_at(a.data, s, batches * rows * k, a.dtype),
                 shard_at(w.data, s, groups * k * m, w.dtype), shard_at(sizes.data, s, batches * groups, sizes.dtype),
                 sizes.dtype, batches, rows, k, m, groups, p.trans_w(),
                 shard_at(out.data, s, batches * rows * m, out.dtype), ctx.stream);
}

// x [G, N, K], y [G, N, M], sizes [G, E] -> [E, K, M] (or [E, M, K]); or each with a
// leading shard dim.
void grouped_matmul_weight_grad_kernel(const Primitive& primitive, const std::vector<DeviceTensor>& inputs,
                                       const std::vector<DeviceTensor>& outputs, KernelContext& ctx) {
  const auto& p = dynamic_cast<const GroupedMatmulWeightGrad&>(primitive);
  if (inputs.size() != 3 || outputs.size() != 1)
    fail<ValueError>("grouped_matmul_weight_grad: called with {} inputs and {} outputs (expected 3 and 1)",
                     inputs.size(), outputs.size());
  const DeviceTensor& x = inputs[0];
  const DeviceTensor& y = inputs[1];
  const DeviceTensor& sizes = inputs[2];
  const DeviceTensor& out = outputs[0];
  const size_t r = x.shape.size();
  if ((r != 3 && r != 4) || y.shape.size() != r || sizes.shape.size() != r - 1)
    fail<ShapeError>("grouped_matmul_weight_grad: operands {}, {}, {} (expected ranks 3, 3, 2 or 4, 4, 3)",
                     to_string(x.shape), to_string(y.shape), to_string(sizes.shape));
  const int64_t shards = shards_of(x, 3), batches = dim(x, -3), rows = dim(x, -2), k = dim(x, -1), m = dim(y, -1);
  const int64_t groups = p.groups();
  for (int64_t s = 0; s < shards; ++s)
    grouped_gemm_weight_grad(out.dtype, shard_at(x.data, s, batches * rows * k, x.dtype),
                             shard_at(y.data, s, batches * rows * m, y.dtype),
                             shard_at(sizes.data, s, batches * groups, sizes.dtype), sizes.dtype, batches, rows, k, m,
                             groups, p.trans_out(), shard_at(out.data, s, groups * k * m, out.dtype), ctx.stream);
}

}  // namespace

void register_linalg_kernels() {
  register_kernel("matmul", matmul_kernel);
  register_kernel("matmul_epilogue", matmul_epilogue_kernel);
  register_kernel("quantized_matmul", quantized_matmul_kernel);
  register_kernel("grouped_matmul", grouped_matmul_kernel);
  register_kernel("grouped_matmul_weight_grad", grouped_matmul_weight_grad_kernel);
}

}  // namespace tessera::cuda
