// Elementwise ops: dtype promotion, broadcasting checks, and node construction.
#include <cmath>

#include "tessera/core/ops.h"
#include "tessera/ir/primitives/elementwise.h"

namespace tessera {
namespace {

// Integer/bool inputs of transcendental ops compute in float32 (like jax.numpy).
Array to_float(const Array& a) { return is_floating(a.dtype()) ? a : astype(a, DType::Float32); }

Array unary_op(UnaryKind kind, const Array& a) {
  return Array::make(a.shape(), a.dtype(), std::make_shared<Unary>(kind), {a});
}

Array float_unary(UnaryKind kind, const Array& a) { return unary_op(kind, to_float(a)); }

bool is_compare(BinaryKind k) { return k >= BinaryKind::Equal && k <= BinaryKind::GreaterEqual; }

Array binary_op(BinaryKind kind, const Array& a, const Array& b) {
  const char* op = binary_name(kind);
  Shape shape = broadcast_shapes(a.shape(), b.shape(), op);
  DType dtype = promote_types(a.dtype(), b.dtype());
  if (kind == BinaryKind::LogicalAnd || kind == BinaryKind::LogicalOr) dtype = DType::Bool;
  Array x = a.dtype() == dtype ? a : astype(a, dtype);
  Array y = b.dtype() == dtype ? b : astype(b, dtype);
  DType out = is_compare(kind) || kind == BinaryKind::LogicalAnd || kind == BinaryKind::LogicalOr ? DType::Bool : dtype;
  return Array::make(shape, out, std::make_shared<Binary>(kind), {x, y});
}

}  // namespace

Array scalar_like(double value, const Array& like) {
  DType dtype = like.dtype();
  if (!is_floating(dtype) && value != std::trunc(value)) dtype = DType::Float32;
  if (dtype == DType::Bool && value != 0 && value != 1) dtype = DType::Int64;
  return Array::scalar(value, dtype);
}

Array add(const Array& a, const Array& b) { return binary_op(BinaryKind::Add, a, b); }
Array subtract(const Array& a, const Array& b) { return binary_op(BinaryKind::Sub, a, b); }
Array multiply(const Array& a, const Array& b) { return binary_op(BinaryKind::Mul, a, b); }
Array divide(const Array& a, const Array& b) { return binary_op(BinaryKind::Div, a, b); }
Array power(const Array& a, const Array& b) { return binary_op(BinaryKind::Pow, a, b); }
Array maximum(const Array& a, const Array& b) { return binary_op(BinaryKind::Maximum, a, b); }
Array minimum(const Array& a, const Array& b) { return binary_op(BinaryKind::Minimum, a, b); }
Array equal(const Array& a, const Array& b) { return binary_op(BinaryKind::Equal, a, b); }
Array not_equal(const Array& a, const Array& b) { return binary_op(BinaryKind::NotEqual, a, b); }
Array less(const Array& a, const Array& b) { return binary_op(BinaryKind::Less, a, b); }
Array less_equal(const Array& a, const Array& b) { return binary_op(BinaryKind::LessEqual, a, b); }
Array greater(const Array& a, const Array& b) { return binary_op(BinaryKind::Greater, a, b); }
Array greater_equal(const Array& a, const Array& b) { return binary_op(BinaryKind::GreaterEqual, a, b); }
Array logical_and(const Array& a, const Array& b) { return binary_op(BinaryKind::LogicalAnd, a, b); }
Array logical_or(const Array& a, const Array& b) { return binary_op(BinaryKind::LogicalOr, a, b); }
Array logical_not(const Array& a) { return unary_op(UnaryKind::LogicalNot, astype(a, DType::Bool)); }

Array where(const Array& cond, const Array& a, const Array& b) {
  Shape shape = broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), "where"), b.shape(), "where");
  DType dtype = promote_types(a.dtype(), b.dtype());
  Array c = cond.dtype() == DType::Bool ? cond : astype(cond, DType::Bool);
  Array x = a.dtype() == dtype ? a : astype(a, dtype);
  Array y = b.dtype() == dtype ? b : astype(b, dtype);
  return Array::make(shape, dtype, std::make_shared<Where>(), {c, x, y});
}

Array negative(const Array& a) {
  if (a.dtype() == DType::Bool) fail<DTypeError>("negative: not defined for bool (use logical_not)");
  return unary_op(UnaryKind::Neg, a);
}
Array abs(const Array& a) { return unary_op(UnaryKind::Abs, a); }
Array sign(const Array& a) { return unary_op(UnaryKind::Sign, a); }
Array square(const Array& a) { return unary_op(UnaryKind::Square, a); }
Array exp(const Array& a) { return float_unary(UnaryKind::Exp, a); }
Array log(const Array& a) { return float_unary(UnaryKind::Log, a); }
Array log1p(const Array& a) { return float_unary(UnaryKind::Log1p, a); }
Array sqrt(const Array& a) { return float_unary(UnaryKind::Sqrt, a); }
Array rsqrt(const Array& a) { return float_unary(UnaryKind::Rsqrt, a); }
Array tanh(const Array& a) { return float_unary(UnaryKind::Tanh, a); }
Array erf(const Array& a) { return float_unary(UnaryKind::Erf, a); }
Array sin(const Array& a) { return float_unary(UnaryKind::Sin, a); }
Array cos(const Array& a) { return float_unary(UnaryKind::Cos, a); }
Array sigmoid(const Array& a) { return float_unary(UnaryKind::Sigmoid, a); }
Array relu(const Array& a) { return unary_op(UnaryKind::Relu, a); }
Array silu(const Array& a) { return float_unary(UnaryKind::Silu, a); }
Array gelu(const Array& a, bool approximate) {
  return float_unary(approximate ? UnaryKind::GeluTanh : UnaryKind::GeluErf, a);
}

Array astype(const Array& a, DType dtype) {
  if (a.dtype() == dtype) return a;
  return Array::make(a.shape(), dtype, std::make_shared<Cast>(dtype), {a});
}

Array stop_gradient(const Array& a) { return Array::make(a.shape(), a.dtype(), std::make_shared<StopGradient>(), {a}); }

Array operator+(const Array& a, const Array& b) { return add(a, b); }
Array operator-(const Array& a, const Array& b) { return subtract(a, b); }
Array operator*(const Array& a, const Array& b) { return multiply(a, b); }
Array operator/(const Array& a, const Array& b) { return divide(a, b); }
Array operator-(const Array& a) { return negative(a); }
Array operator+(const Array& a, double b) { return add(a, scalar_like(b, a)); }
Array operator-(const Array& a, double b) { return subtract(a, scalar_like(b, a)); }
Array operator*(const Array& a, double b) { return multiply(a, scalar_like(b, a)); }
Array operator/(const Array& a, double b) { return divide(a, scalar_like(b, a)); }
Array operator+(double a, const Array& b) { return add(scalar_like(a, b), b); }
Array operator-(double a, const Array& b) { return subtract(scalar_like(a, b), b); }
Array operator*(double a, const Array& b) { return multiply(scalar_like(a, b), b); }
Array operator/(double a, const Array& b) { return divide(scalar_like(a, b), b); }

}  // namespace tessera
