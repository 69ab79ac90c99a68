// CUDA kernels of the fused NN primitives (ir/primitives/nn.h): softmax / log_softmax
// and their gradients, layer / RMS norm and their gradients, cross-entropy and its
// gradient. Attention lives in eval_attention.cpp (register_attention_kernels). The
// activation gradients (gelu/silu/...) are Binary kinds of the elementwise family.
// Inputs and outputs are read exactly as the CPU evals read them
// (backend/cpu/eval_nn.cpp).
#include <cstdlib>
#include <string>

#include "backend/cuda/kernel_registry.h"
#include "backend/cuda/kernels/cross_entropy.h"
#include "backend/cuda/kernels/norm.h"
#include "backend/cuda/kernels/softmax.h"
#include "tessera/base/error.h"
#include "tessera/ir/primitives/nn.h"

namespace tessera::cuda {

namespace {

std::string type_of(const DeviceTensor& t) { return fmt::format("{}{}", short_name(t.dtype), to_string(t.shape)); }

struct Rows {
  int64_t rows = 0, cols = 0;
};
// [..., cols] as rows of the last axis (a scalar is one row of one).
Rows rows_of(const DeviceTensor& x) {
  Rows r;
  r.cols = x.shape.empty() ? 1 : x.shape.back();
  r.rows = r.cols ? x.numel() / r.cols : 0;
  return r;
}

void check_counts(const char* op, const std::vector<DeviceTensor>& inputs, const std::vector<DeviceTensor>& outputs,
                  size_t want_in, size_t want_out) {
  if (inputs.size() != want_in || outputs.size() != want_out)
    fail<ValueError>("{}: called with {} inputs and {} outputs (expected {} and {})", op, inputs.size(), outputs.size(),
                     want_in, want_out);
}

void check_like(const char* op, const char* what, const DeviceTensor& t, const DeviceTensor& like) {
  if (t.shape != like.shape || t.dtype != like.dtype)
    fail<ShapeError>("{}: {} is {} (expected {})", op, what, type_of(t), type_of(like));
}

// A [rows] statistic (mean, rstd, lse, loss, dloss) of the accumulation dtype.
void check_stat(const char* op, const char* what, const DeviceTensor& t, int64_t rows, DType x_dtype) {
  if (t.numel() != rows || t.dtype != accumulation_dtype(x_dtype))
    fail<ShapeError>("{}: {} is {} (expected {} elements of {})", op, what, type_of(t), rows,
                     name(accumulation_dtype(x_dtype)));
}

// A [cols] parameter (weight, bias) of x's dtype.
void check_param(const char* op, const char* what, const DeviceTensor& t, int64_t cols, DType dtype) {
  if (t.numel() != cols || t.dtype != dtype)
    fail<ShapeError>("{}: {} is {} (expected {} elements of {})", op, what, type_of(t), cols, name(dtype));
}

// Norm keeps eps private; its attributes() prints it first ("eps=1e-05, weight=...") with
// fmt's shortest round-trip form, which strtod reads back exactly.
double norm_eps(const Norm& norm) {
  const std::string attrs = norm.attributes();
  const size_t at = attrs.find("eps=");
  if (at == std::string::npos) fail<ValueError>("{}: no eps in its attributes '{}'", norm.name(), attrs);
  const char* begin = attrs.c_str() + at + 4;
  char* end = nullptr;
  const double eps = std::strtod(begin, &end);
  if (end == begin) fail<ValueError>("{}: cannot read eps from its attributes '{}'", norm.name(), attrs);
  return eps;
}

// ---- softmax ----

KernelFn softmax_kernel(bool log) {
  return [log](const Primitive& p, const std::vector<DeviceTensor>& inputs, const std::vector<DeviceTensor>& outputs,
               KernelContext& ctx) {
    const std::string op = p.name();
    check_counts(op.c_str(), inputs, outputs, 1, 1);
    const DeviceTensor& x = inputs[0];
    check_like(op.c_str(), "output", outputs[0], x);
    const Rows r = rows_of(x);
    softmax_forward(x.dtype, x.data, outputs[0].data, r.rows, r.cols, log, ctx.stream);
  };
}

KernelFn softmax_grad_kernel(bool log) {
  return [log](const Primitive& p, const std::vector<DeviceTensor>& inputs, const std::vector<DeviceTensor>& outputs,
               KernelContext& ctx) {
    const std::string op = p.name();
    check_counts(op.c_str(), inputs, outputs, 2, 1);
    const DeviceTensor& y = inputs[0];
    check_like(op.c_str(), "dy", inputs[1], y);
    check_like(op.c_str(), "dx", outputs[0], y);
    const Rows r = rows_of(y);
    softmax_backward(y.dtype, y.data, inputs[1].data, outputs[0].data, r.rows, r.cols, log, ctx.stream);
  };
}

// ---- norms ----

void norm_kernel(const Primitive& p, const std::vector<DeviceTensor>& inputs, const std::vector<DeviceTensor>& outputs,
                 KernelContext& ctx) {
  const auto& norm = dynamic_cast<const Norm&>(p);
  const std::string op = norm.name();
  const bool rms = norm.rms();
  const size_t want_in = 1 + (norm.has_weight() ? 1 : 0) + (norm.has_bias() ? 1 : 0);
  check_counts(op.c_str(), inputs, outputs, want_in, rms ? 2 : 3);
  if (rms && norm.has_bias()) fail<ValueError>("rms_norm: has no bias");
  const DeviceTensor& x = inputs[0];
  const Rows r = rows_of(x);
  size_t next = 1;
  const DeviceTensor* w = norm.has_weight() ? &inputs[next++] : nullptr;
  const DeviceTensor* b = norm.has_bias() ? &inputs[next++] : nullptr;
  if (w) check_param(op.c_str(), "weight", *w, r.cols, x.dtype);
  if (b) check_param(op.c_str(), "bias", *b, r.cols, x.dtype);
  check_like(op.c_str(), "y", outputs[0], x);
  for (size_t i = 1; i < outputs.size(); ++i) check_stat(op.c_str(), "statistic", outputs[i], r.rows, x.dtype);
  const double eps = norm_eps(norm);
  if (rms) {
    rms_norm_forward(x.dtype, x.data, w ? w->data : nullptr, outputs[0].data, outputs[1].data, r.rows, r.cols, eps,
                     ctx.stream);
  } else {
    layer_norm_forward(x.dtype, x.data, w ? w->data : nullptr, b ? b->data : nullptr, outputs[0].data, outputs[1].data,
                       outputs[2].data, r.rows, r.cols, eps, ctx.stream);
  }
}

void norm_grad_kernel(const Primitive& p, const std::vector<DeviceTensor>& inputs,
                      const std::vector<DeviceTensor>& outputs, KernelContext& ctx) {
  const auto& ng = dynamic_cast<const NormGrad&>(p);
  const std::string op = ng.name();
  const bool rms = ng.rms();
  const bool want_db = ng.has_bias() && !rms;
  const size_t want_in = 3 + (ng.has_weight() ? 1 : 0) + (rms ? 0 : 1);
  const size_t want_out = 1 + (ng.has_weight() ? 1 : 0) + (ng.has_bias() ? 1 : 0);
  check_counts(op.c_str(), inputs, outputs, want_in, want_out);
  size_t next = 0;
  const DeviceTensor& x = inputs[next++];
  const DeviceTensor* w = ng.has_weight() ? &inputs[next++] : nullptr;
  const DeviceTensor* mu = rms ? nullptr : &inputs[next++];
  const DeviceTensor& rstd = inputs[next++];
  const DeviceTensor& dy = inputs[next++];
  const Rows r = rows_of(x);
  if (w) check_param(op.c_str(), "weight", *w, r.cols, x.dtype);
  if (mu) check_stat(op.c_str(), "mean", *mu, r.rows, x.dtype);
  check_stat(op.c_str(), "rstd", rstd, r.rows, x.dtype);
  check_like(op.c_str(), "dy", dy, x);
  check_like(op.c_str(), "dx", outputs[0], x);
  void* dw = nullptr;
  void* db = nullptr;
  if (ng.has_weight()) {
    check_param(op.c_str(), "dweight", outputs[1], r.cols, x.dtype);
    dw = outputs[1].data;
  }
  if (ng.has_bias()) {
    const DeviceTensor& dbt = outputs[ng.has_weight() ? 2 : 1];
    check_param(op.c_str(), "dbias", dbt, r.cols, x.dtype);
    db = dbt.data;
  }
  const size_t bytes = norm_backward_scratch_bytes(x.dtype, r.rows, r.cols, dw != nullptr, want_db);
  void* scratch = nullptr;
  if (bytes > 0) {
    if (!ctx.scratch) fail<ValueError>("{}: the kernel context has no scratch allocator", op);
    scratch = ctx.scratch(bytes);
  }
  if (rms) {
    rms_norm_backward(x.dtype, x.data, w ? w->data : nullptr, rstd.data, dy.data, outputs[0].data, dw, r.rows, r.cols,
                      scratch, bytes, ctx.stream);
  } else {
    layer_norm_backward(x.dtype, x.data, w ? w->data : nullptr, mu->data, rstd.data, dy.data, outputs[0].data, dw, db,
                        r.rows, r.cols, scratch, bytes, ctx.stream);
  }
}

// ---- cross-entropy ----

void check_logits(const char* op, const DeviceTensor& logits, const DeviceTensor& targets) {
  if (logits.shape.size() != 2 || targets.shape.size() != 1 || targets.shape[0] != logits.shape[0] ||
      targets.dtype != DType::Int64)
    fail<ShapeError>("{}: expected logits [N, V] and int64 targets [N] (got {} and {})", op, type_of(logits),
                     type_of(targets));
}

void cross_entropy_kernel(const Primitive& p, const std::vector<DeviceTensor>& inputs,
                          const std::vector<DeviceTensor>& outputs, KernelContext& ctx) {
  const auto& ce = dynamic_cast<const CrossEntropy&>(p);
  check_counts("cross_entropy", inputs, outputs, 2, 2);
  const DeviceTensor& logits = inputs[0];
  check_logits("cross_entropy", logits, inputs[1]);
  const int64_t rows = logits.shape[0], vocab = logits.shape[1];
  check_stat("cross_entropy", "loss", outputs[0], rows, logits.dtype);
  check_stat("cross_entropy", "lse", outputs[1], rows, logits.dtype);
  cross_entropy_forward(logits.dtype, logits.data, inputs[1].as<int64_t>(), rows, vocab, ce.classes_in(vocab),
                        ce.ignore_index(), outputs[0].data, outputs[1].data, ctx.stream);
}

void cross_entropy_grad_kernel(const Primitive& p, const std::vector<DeviceTensor>& inputs,
                               const std::vector<DeviceTensor>& outputs, KernelContext& ctx) {
  const auto& ce = dynamic_cast<const CrossEntropyGrad&>(p);
  check_counts("cross_entropy_grad", inputs, outputs, 4, 1);
  const DeviceTensor& logits = inputs[0];
  check_logits("cross_entropy_grad", logits, inputs[1]);
  const int64_t rows = logits.shape[0], vocab = logits.shape[1];
  check_stat("cross_entropy_grad", "lse", inputs[2], rows, logits.dtype);
  check_stat("cross_entropy_grad", "dloss", inputs[3], rows, logits.dtype);
  check_like("cross_entropy_grad", "dlogits", outputs[0], logits);
  cross_entropy_backward(logits.dtype, logits.data, inputs[1].as<int64_t>(), inputs[2].data, inputs[3].data,
                         outputs[0].data, rows, vocab, ce.classes_in(vocab), ce.ignore_index(), ctx.stream);
}

void cross_entropy_with_grad_kernel(const Primitive& p, const std::vector<DeviceTensor>& inputs,
                                    const std::vector<DeviceTensor>& outputs, KernelContext& ctx) {
  const auto& ce = dynamic_cast<const CrossEntropyWithGrad&>(p);
  check_counts("cross_entropy_with_grad", inputs, outputs, 3, 3);
  const DeviceTensor& logits = inputs[0];
  check_logits("cross_entropy_with_grad", logits, inputs[1]);
  const int64_t rows = logits.shape[0], vocab = logits.shape[1];
  check_stat("cross_entropy_with_grad", "dloss", inputs[2], rows, logits.dtype);
  check_stat("cross_entropy_with_grad", "loss", outputs[0], rows, logits.dtype);
  check_stat("cross_entropy_with_grad", "lse", outputs[1], rows, logits.dtype);
  check_like("cross_entropy_with_grad", "dlogits", outputs[2], logits);
  cross_entropy_with_grad(logits.dtype, logits.data, inputs[1].as<int64_t>(), inputs[2].data, rows, vocab,
                          ce.classes_in(vocab), ce.ignore_index(), outputs[0].data, outputs[1].data, outputs[2].data,
                          ctx.stream);
}

}  // namespace

void register_nn_kernels() {
  register_kernel("softmax", softmax_kernel(false));
  register_kernel("log_softmax", softmax_kernel(true));
  register_kernel("softmax_grad", softmax_grad_kernel(false));
  register_kernel("log_softmax_grad", softmax_grad_kernel(true));
  register_kernel("layer_norm", norm_kernel);
  register_kernel("rms_norm", norm_kernel);
  register_kernel("layer_norm_grad", norm_grad_kernel);
  register_kernel("rms_norm_grad", norm_grad_kernel);
  register_kernel("cross_entropy", cross_entropy_kernel);
  register_kernel("cross_entropy_grad", cross_entropy_grad_kernel);
  register_kernel("cross_entropy_with_grad", cross_entropy_with_grad_kernel);
}

}  // namespace tessera::cuda
