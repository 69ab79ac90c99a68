// MatmulEpilogue: option checks, IR text (print and parse), cost.
#include "tessera/ir/primitives/matmul_epilogue.h"

#include <fmt/format.h>

#include "tessera/base/error.h"
#include "tessera/core/array.h"
#include "tessera/ir/attributes.h"

namespace tessera {

bool MatmulEpilogue::supports_activation(UnaryKind kind) {
  switch (kind) {
    case UnaryKind::GeluTanh:
    case UnaryKind::GeluErf:
    case UnaryKind::Relu:
    case UnaryKind::Silu:
    case UnaryKind::Tanh:
    case UnaryKind::Sigmoid:
      return true;
    default:
      return false;
  }
}

MatmulEpilogue::MatmulEpilogue(Options options) : options_(options) {
  if (options_.activation && !supports_activation(*options_.activation))
    fail<ValueError>(
        "matmul_epilogue: activation '{}' is not supported (expected gelu_tanh, gelu_erf, relu, silu, "
        "tanh or sigmoid)",
        unary_name(*options_.activation));
  if (options_.pre_activation && !options_.activation)
    fail<ValueError>("matmul_epilogue: pre_activation=true needs an activation");
  if (options_.bias_first && !options_.bias) fail<ValueError>("matmul_epilogue: bias_first=true needs a bias");
  if (options_.activation_grad) {
    if (*options_.activation_grad != UnaryKind::GeluTanh)
      fail<ValueError>("matmul_epilogue: activation_grad '{}' is not supported (expected gelu_tanh)",
                       unary_name(*options_.activation_grad));
    if (options_.bias || options_.activation || options_.pre_activation || options_.int8)
      fail<ValueError>(
          "matmul_epilogue: activation_grad takes no bias, activation, pre_activation or int8 (the inputs are a, b "
          "and the activation's input)");
    return;
  }
  if (!options_.bias && !options_.activation)
    fail<ValueError>("matmul_epilogue: an epilogue needs a bias or an activation (got neither)");
}

std::string MatmulEpilogue::attributes() const {
  const Options& o = options_;
  std::string s;
  auto add = [&](const std::string& item) { s += (s.empty() ? "" : ", ") + item; };
  if (o.trans_a || o.trans_b) add(fmt::format("trans_a={}, trans_b={}", o.trans_a, o.trans_b));
  if (!o.bias) add("bias=false");
  if (o.bias_first) add("bias_first=true");
  if (o.activation) add(fmt::format("activation={}", unary_name(*o.activation)));
  if (o.pre_activation) add("pre_activation=true");
  if (o.int8) add("int8=true");
  if (o.activation_grad) add(fmt::format("activation_grad={}", unary_name(*o.activation_grad)));
  return s;
}

PrimitivePtr parse_matmul_epilogue(const AttributeMap& a) {
  MatmulEpilogue::Options o;
  auto flag = [&](const char* key, bool fallback) { return a.has(key) ? a.get_bool(key) : fallback; };
  o.trans_a = flag("trans_a", false);
  o.trans_b = flag("trans_b", false);
  o.bias = flag("bias", true);
  o.bias_first = flag("bias_first", false);
  o.pre_activation = flag("pre_activation", false);
  o.int8 = flag("int8", false);
  auto unary_kind = [&](const char* key) {
    const std::string text = a.raw(key);
    for (int k = 0; k < kNumUnaryKinds; ++k)
      if (text == unary_name(static_cast<UnaryKind>(k))) return static_cast<UnaryKind>(k);
    fail<ValueError>("matmul_epilogue: unknown {} '{}'", key, text);
  };
  if (a.has("activation")) o.activation = unary_kind("activation");
  if (a.has("activation_grad")) {
    o.activation_grad = unary_kind("activation_grad");
    o.bias = flag("bias", false);  // no bias input in this form
  }
  return std::make_shared<MatmulEpilogue>(o);
}

std::vector<Array> MatmulEpilogue::vjp(const std::vector<Array>&, const std::vector<Array>&, const std::vector<int>&,
                                       const std::vector<Array>&) {
  fail<TransformError>(
      "grad: 'matmul_epilogue' is not differentiable (GEMM epilogue fusion runs after autodiff; differentiate the "
      "unfused function)");
}

Cost MatmulEpilogue::cost(const std::vector<Array>& inputs, const std::vector<Array>& outputs) const {
  // The GEMM's 2 M N K per batch entry, plus one FLOP per output element for the bias
  // add and one for the activation or its gradient (the unfused ops' count); every input read and
  // every output written once.
  Cost c;
  for (const Array& in : inputs) c.bytes += static_cast<double>(in.nbytes());
  for (const Array& out : outputs) c.bytes += static_cast<double>(out.nbytes());
  const double elements = static_cast<double>(outputs[0].size());
  const int64_t k = inputs[0].shape(options_.trans_a ? -2 : -1);
  const bool elementwise_op = options_.activation || options_.activation_grad;
  c.flops = 2.0 * elements * static_cast<double>(k) + elements * ((options_.bias ? 1 : 0) + (elementwise_op ? 1 : 0));
  return c;
}

}  // namespace tessera
