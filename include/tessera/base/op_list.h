// The elementwise and reduction op lists, once. Each X-macro row is (enumerator, IR
// name). The IR's kinds (ir/primitives/elementwise.h, reduce.h), the CPU kernels'
// ops (backend/cpu/kernels/) and the CUDA code generator's ops
// (backend/cuda/kernels/fusion_codegen.h, reduce.h) are these enums, so a new op is one
// row here plus its math in each backend, and a reorder cannot desynchronize them.
// Kernels depend on base/ only, so the list lives here. No fmt, no std::string: nvcc
// compiles this header.
#pragma once

// Unary ops. LogicalNot reads and writes bool; Copy must stay last (fusion's identity).
#define TESSERA_UNARY_OPS(X)   \
  X(Neg, "negative")           \
  X(Abs, "abs")                \
  X(Sign, "sign")              \
  X(Square, "square")          \
  X(Exp, "exp")                \
  X(Log, "log")                \
  X(Log1p, "log1p")            \
  X(Sqrt, "sqrt")              \
  X(Rsqrt, "rsqrt")            \
  X(Tanh, "tanh")              \
  X(Erf, "erf")                \
  X(GeluTanh, "gelu_tanh")     \
  X(GeluErf, "gelu_erf")       \
  X(Silu, "silu")              \
  X(Sigmoid, "sigmoid")        \
  X(Relu, "relu")              \
  X(Sin, "sin")                \
  X(Cos, "cos")                \
  X(LogicalNot, "logical_not") \
  X(Copy, "copy")

// Binary ops. Equal..GreaterEqual compare (bool out); LogicalAnd/Or read and write
// bool; the *Grad ops compute g * f'(x) for (a = x, b = g), TanhGrad from a = tanh(x).
#define TESSERA_BINARY_OPS(X)       \
  X(Add, "add")                     \
  X(Sub, "subtract")                \
  X(Mul, "multiply")                \
  X(Div, "divide")                  \
  X(Pow, "power")                   \
  X(Maximum, "maximum")             \
  X(Minimum, "minimum")             \
  X(Equal, "equal")                 \
  X(NotEqual, "not_equal")          \
  X(Less, "less")                   \
  X(LessEqual, "less_equal")        \
  X(Greater, "greater")             \
  X(GreaterEqual, "greater_equal")  \
  X(LogicalAnd, "logical_and")      \
  X(LogicalOr, "logical_or")        \
  X(GeluTanhGrad, "gelu_tanh_grad") \
  X(GeluErfGrad, "gelu_erf_grad")   \
  X(SiluGrad, "silu_grad")          \
  X(SigmoidGrad, "sigmoid_grad")    \
  X(TanhGrad, "tanh_grad")

// Reductions over axes.
#define TESSERA_REDUCE_OPS(X) \
  X(Sum, "reduce_sum")        \
  X(Prod, "reduce_prod")      \
  X(Max, "reduce_max")        \
  X(Min, "reduce_min")

namespace tessera {

#define TESSERA_OP_ENUMERATOR(name, ir_name) name,
#define TESSERA_OP_COUNT(name, ir_name) +1
#define TESSERA_OP_NAME(name, ir_name) ir_name,

enum class UnaryKind { TESSERA_UNARY_OPS(TESSERA_OP_ENUMERATOR) };
enum class BinaryKind { TESSERA_BINARY_OPS(TESSERA_OP_ENUMERATOR) };
enum class ReduceKind { TESSERA_REDUCE_OPS(TESSERA_OP_ENUMERATOR) };

inline constexpr int kNumUnaryKinds = 0 TESSERA_UNARY_OPS(TESSERA_OP_COUNT);
inline constexpr int kNumBinaryKinds = 0 TESSERA_BINARY_OPS(TESSERA_OP_COUNT);
inline constexpr int kNumReduceKinds = 0 TESSERA_REDUCE_OPS(TESSERA_OP_COUNT);

// The IR spelling ("negative", "add", "sum").
constexpr const char* unary_name(UnaryKind kind) {
  constexpr const char* kNames[] = {TESSERA_UNARY_OPS(TESSERA_OP_NAME)};
  return kNames[static_cast<int>(kind)];
}
constexpr const char* binary_name(BinaryKind kind) {
  constexpr const char* kNames[] = {TESSERA_BINARY_OPS(TESSERA_OP_NAME)};
  return kNames[static_cast<int>(kind)];
}
constexpr const char* reduce_name(ReduceKind kind) {
  constexpr const char* kNames[] = {TESSERA_REDUCE_OPS(TESSERA_OP_NAME)};
  return kNames[static_cast<int>(kind)];
}

#undef TESSERA_OP_ENUMERATOR
#undef TESSERA_OP_COUNT
#undef TESSERA_OP_NAME

static_assert(static_cast<int>(UnaryKind::Copy) == kNumUnaryKinds - 1, "Copy is the last unary op");

}  // namespace tessera
