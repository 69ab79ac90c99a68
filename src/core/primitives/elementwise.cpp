// vjp and batching rules of the elementwise primitives.
#include "tessera/ir/primitives/elementwise.h"

#include <cmath>
#include <numbers>

#include "core/primitives/rule_utils.h"
#include "tessera/core/ops.h"
#include "tessera/core/transforms.h"

namespace tessera {

namespace {

Array unary_grad(UnaryKind kind, const Array& x, const Array& y, const Array& g) {
  switch (kind) {
    case UnaryKind::Neg:
      return -g;
    case UnaryKind::Abs:
      return g * sign(x);
    case UnaryKind::Sign:
      return zeros_like(x);
    case UnaryKind::Square:
      return g * x * 2.0;
    case UnaryKind::Exp:
      return g * y;
    case UnaryKind::Log:
      return g / x;
    case UnaryKind::Log1p:
      return g / (x + 1.0);
    case UnaryKind::Sqrt:
      return g * 0.5 / y;
    case UnaryKind::Rsqrt:
      return g * y * y * y * -0.5;
    case UnaryKind::Tanh:
      return Array::make(x.shape(), x.dtype(), std::make_shared<Binary>(BinaryKind::TanhGrad), {y, g});
    case UnaryKind::Erf:
      return g * exp(-square(x)) * (2.0 / std::sqrt(std::numbers::pi));
    case UnaryKind::GeluTanh:
      return Array::make(x.shape(), x.dtype(), std::make_shared<Binary>(BinaryKind::GeluTanhGrad), {x, g});
    case UnaryKind::GeluErf:
      return Array::make(x.shape(), x.dtype(), std::make_shared<Binary>(BinaryKind::GeluErfGrad), {x, g});
    case UnaryKind::Silu:
      return Array::make(x.shape(), x.dtype(), std::make_shared<Binary>(BinaryKind::SiluGrad), {x, g});
    case UnaryKind::Sigmoid:
      return Array::make(x.shape(), x.dtype(), std::make_shared<Binary>(BinaryKind::SigmoidGrad), {x, g});
    case UnaryKind::Relu:
      return g * astype(greater(x, zeros({}, x.dtype())), x.dtype());
    case UnaryKind::Sin:
      return g * cos(x);
    case UnaryKind::Cos:
      return -(g * sin(x));
    case UnaryKind::Copy:
      return g;
    case UnaryKind::LogicalNot:
      break;
  }
  fail<TransformError>("grad: '{}' is not differentiable", unary_name(kind));
}

}  // namespace

std::vector<Array> Unary::vjp(const std::vector<Array>& primals, const std::vector<Array>& cotangents,
                              const std::vector<int>&, const std::vector<Array>& outputs) {
  return {unary_grad(kind_, primals[0], outputs[0], cotangents[0])};
}

std::pair<std::vector<Array>, std::vector<int>> Unary::vmap(const std::vector<Array>& inputs,
                                                            const std::vector<int>& axes) {
  Array x = inputs[0];
  return {{Array::make(x.shape(), x.dtype(), std::make_shared<Unary>(kind_), {x})}, {axes[0]}};
}

// Composite forms of the derivative helpers (for second derivatives).
std::vector<Array> Binary::composite(const std::vector<Array>& in) const {
  const Array& a = in[0];
  const Array& g = in[1];
  switch (kind_) {
    case BinaryKind::TanhGrad:
      return {g * (1.0 - square(a))};  // a = tanh(x)
    case BinaryKind::SigmoidGrad: {
      Array sg = sigmoid(a);
      return {g * sg * (1.0 - sg)};
    }
    case BinaryKind::SiluGrad: {
      Array s = sigmoid(a);
      return {g * s * (1.0 + a * (1.0 - s))};
    }
    case BinaryKind::GeluErfGrad: {
      Array cdf = (erf(a * (1.0 / std::numbers::sqrt2)) + 1.0) * 0.5;
      Array pdf = exp(square(a) * -0.5) * (1.0 / std::sqrt(2.0 * std::numbers::pi));
      return {g * (cdf + a * pdf)};
    }
    case BinaryKind::GeluTanhGrad: {
      const double k = std::sqrt(2.0 / std::numbers::pi);
      Array inner = (a + a * a * a * 0.044715) * k;
      Array t = tanh(inner);
      Array dinner = (square(a) * (3 * 0.044715) + 1.0) * k;
      return {g * ((t + 1.0) * 0.5 + a * 0.5 * (1.0 - square(t)) * dinner)};
    }
    default:
      return {};
  }
}

std::vector<Array> Binary::vjp(const std::vector<Array>& primals, const std::vector<Array>& cotangents,
                               const std::vector<int>& argnums, const std::vector<Array>& outputs) {
  const Array& a = primals[0];
  const Array& b = primals[1];
  const Array& g = cotangents[0];
  const Array& y = outputs[0];
  auto grad_of = [&](int arg) -> Array {
    switch (kind_) {
      case BinaryKind::Add:
        return g;
      case BinaryKind::Sub:
        return arg == 0 ? g : -g;
      case BinaryKind::Mul:
        return arg == 0 ? g * b : g * a;
      case BinaryKind::Div:
        return arg == 0 ? g / b : -(g * y / b);
      case BinaryKind::Pow:
        return arg == 0 ? g * b * power(a, b - 1.0)
                        : g * y * log(where(greater(a, zeros({}, a.dtype())), a, ones({}, a.dtype())));
      case BinaryKind::Maximum:
      case BinaryKind::Minimum: {
        // The operand that is picked gets the gradient; a tie splits it equally (JAX's and
        // PyTorch's rule, and the max reduction's: the mean of the one-sided derivatives).
        const Array& self = arg == 0 ? a : b;
        const Array& other = arg == 0 ? b : a;
        Array wins = kind_ == BinaryKind::Maximum ? greater(self, other) : less(self, other);
        Array share = astype(wins, g.dtype()) + astype(equal(self, other), g.dtype()) * 0.5;
        return g * share;
      }
      case BinaryKind::TanhGrad:
      case BinaryKind::SigmoidGrad:
      case BinaryKind::SiluGrad:
      case BinaryKind::GeluErfGrad:
      case BinaryKind::GeluTanhGrad: {
        auto fn = [this](const std::vector<Array>& xs) { return composite(xs); };
        auto [outs, grads] = tessera::vjp(fn, primals, cotangents);
        return grads[arg];
      }
      default:
        fail<TransformError>("grad: '{}' is not differentiable (boolean output)", binary_name(kind_));
    }
  };
  std::vector<Array> result;
  for (int arg : argnums) result.push_back(rules::sum_to_shape(grad_of(arg), primals[arg].shape()));
  return result;
}

std::pair<std::vector<Array>, std::vector<int>> Binary::vmap(const std::vector<Array>& inputs,
                                                             const std::vector<int>& axes) {
  int rank = std::max(inputs[0].ndim() - (axes[0] >= 0), inputs[1].ndim() - (axes[1] >= 0));
  Array a = rules::batched_operand(inputs[0], axes[0], rank);
  Array b = rules::batched_operand(inputs[1], axes[1], rank);
  Shape shape = broadcast_shapes(a.shape(), b.shape(), binary_name(kind_));
  DType out = (kind_ >= BinaryKind::Equal && kind_ <= BinaryKind::LogicalOr) ? DType::Bool : a.dtype();
  return {{Array::make(shape, out, std::make_shared<Binary>(kind_), {a, b})}, {0}};
}

std::vector<Array> Where::vjp(const std::vector<Array>& primals, const std::vector<Array>& cotangents,
                              const std::vector<int>& argnums, const std::vector<Array>&) {
  const Array& c = primals[0];
  const Array& g = cotangents[0];
  std::vector<Array> result;
  for (int arg : argnums) {
    if (arg == 0) {
      result.push_back(zeros_like(c));
      continue;
    }
    Array z = zeros({}, g.dtype());
    Array picked = arg == 1 ? where(c, g, z) : where(c, z, g);
    result.push_back(rules::sum_to_shape(picked, primals[arg].shape()));
  }
  return result;
}

std::pair<std::vector<Array>, std::vector<int>> Where::vmap(const std::vector<Array>& inputs,
                                                            const std::vector<int>& axes) {
  int rank = 0;
  for (size_t i = 0; i < 3; ++i) rank = std::max(rank, inputs[i].ndim() - (axes[i] >= 0));
  Array c = rules::batched_operand(inputs[0], axes[0], rank);
  Array a = rules::batched_operand(inputs[1], axes[1], rank);
  Array b = rules::batched_operand(inputs[2], axes[2], rank);
  Array out = where(c, a, b);
  // An unbatched operand may have the larger rank; where() broadcast everything to
  // the batched layout [batch, ...] because at least one operand carries the batch.
  return {{out}, {0}};
}

std::string Cast::attributes() const { return "dtype=" + std::string(tessera::name(dtype_)); }

std::vector<Array> Cast::vjp(const std::vector<Array>& primals, const std::vector<Array>& cotangents,
                             const std::vector<int>&, const std::vector<Array>&) {
  const Array& x = primals[0];
  if (!is_floating(x.dtype())) return {zeros_like(x)};
  return {astype(cotangents[0], x.dtype())};
}

std::pair<std::vector<Array>, std::vector<int>> Cast::vmap(const std::vector<Array>& inputs,
                                                           const std::vector<int>& axes) {
  return {{astype(inputs[0], dtype_)}, {axes[0]}};
}

std::vector<Array> StopGradient::vjp(const std::vector<Array>& primals, const std::vector<Array>&,
                                     const std::vector<int>&, const std::vector<Array>&) {
  return {zeros_like(primals[0])};
}

std::pair<std::vector<Array>, std::vector<int>> StopGradient::vmap(const std::vector<Array>& inputs,
                                                                   const std::vector<int>& axes) {
  return {{stop_gradient(inputs[0])}, {axes[0]}};
}

std::vector<Array> Identity::vjp(const std::vector<Array>&, const std::vector<Array>& cotangents,
                                 const std::vector<int>&, const std::vector<Array>&) {
  return {cotangents[0]};
}

std::pair<std::vector<Array>, std::vector<int>> Identity::vmap(const std::vector<Array>& inputs,
                                                               const std::vector<int>& axes) {
  return {{inputs[0]}, {axes[0]}};
}

}  // namespace tessera
