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
  if (a.has("activation")) {
    std::string text = a.raw("activation");
    bool found = false;
    for (int k = 0; k < kNumUnaryKinds && !found; ++k)
      if (text == unary_name(static_cast<UnaryKind>(k))) {
        o.activation = static_cast<UnaryKind>(k);
        found = true;
      }
    if (!found) fail<ValueError>("matmul_epilogue: unknown activation '{}'", text);
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
  // add and one for the activation (the unfused ops' count); every input read and
  // every output written once.
  Cost c;
  for (const Array& in : inputs) c.bytes += static_cast<double>(in.nbytes());
  for (const Array& out : outputs) c.bytes += static_cast<double>(out.nbytes());
  const double elements = static_cast<double>(outputs[0].size());
  const int64_t k = inputs[0].shape(options_.trans_a ? -2 : -1);
  c.flops =
      2.0 * elements * static_cast<double>(k) + elements * ((options_.bias ? 1 : 0) + (options_.activation ? 1 : 0));
  return c;
}

}  // namespace tessera
