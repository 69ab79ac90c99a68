// Fusion program -> CUDA C++ source. The generated text has four parts:
//   1. kPrelude: fixed helpers (bf16/f16 conversions, the CPU's conversion rules,
//      the op formulas, integer division and power);
//   2. `Args`, the kernels' one parameter: pointers, sizes, collapsed dims, strides;
//   3. ts_body (the instructions on registers) and ts_element (loads through each
//      input's layout, then ts_body);
//   4. the kernels: map (+ map_vec) for elementwise programs; rows, warps and finish
//      for fused reductions.
#include "backend/cuda/kernels/fusion_codegen.h"

#include <fmt/format.h>

#include <algorithm>

#include "tessera/base/error.h"

namespace tessera::cuda {
namespace {

// ---- dtypes in generated code ----------------------------------------------------

bool is_half(DType d) { return d == DType::BFloat16 || d == DType::Float16; }
bool is_float_class(DType d) { return is_floating(d); }  // f16, bf16, f32, f64

// The C type elements are stored as (bool as bytes, halves as bits).
const char* storage_type(DType d) {
  switch (d) {
    case DType::Bool:
    case DType::UInt8:
      return "unsigned char";
    case DType::Int8:
      return "signed char";
    case DType::UInt32:
      return "unsigned int";
    case DType::Int32:
      return "int";
    case DType::Int64:
      return "long long";
    case DType::Float16:
    case DType::BFloat16:
      return "unsigned short";
    case DType::Float32:
      return "float";
    case DType::Float64:
      return "double";
  }
  return "void";
}

// The C type a register of dtype d is computed in.
const char* register_type(DType d) {
  switch (d) {
    case DType::Bool:
      return "bool";
    case DType::Float16:
    case DType::BFloat16:
    case DType::Float32:
      return "float";
    default:
      return storage_type(d);
  }
}

// The unsigned integer of the same width (integer arithmetic wraps through it).
const char* unsigned_type(DType d) {
  switch (d) {
    case DType::UInt8:
    case DType::Int8:
      return "unsigned char";
    case DType::UInt32:
    case DType::Int32:
      return "unsigned int";
    default:
      return "unsigned long long";
  }
}

// Reduction accumulator: float for float32 and halves, double, else int64.
const char* accumulator_type(DType d) {
  if (d == DType::Float64) return "double";
  if (is_float_class(d)) return "float";
  return "long long";
}

std::string load_expr(DType d, const std::string& stored) {
  switch (d) {
    case DType::Bool:
      return "(" + stored + " != 0)";
    case DType::BFloat16:
      return "ts_bf16_to_float(" + stored + ")";
    case DType::Float16:
      return "ts_f16_to_float(" + stored + ")";
    default:
      return stored;
  }
}

std::string store_expr(DType d, const std::string& value) {
  switch (d) {
    case DType::Bool:
      return "(unsigned char)(" + value + " ? 1 : 0)";
    case DType::BFloat16:
      return "ts_float_to_bf16(" + value + ")";
    case DType::Float16:
      return "ts_float_to_f16(" + value + ")";
    default:
      return value;
  }
}

// A computed value rounded to / typed as a register of dtype d.
std::string result_expr(DType d, const std::string& value) {
  switch (d) {
    case DType::BFloat16:
      return "ts_round_bf16(" + value + ")";
    case DType::Float16:
      return "ts_round_f16(" + value + ")";
    case DType::Bool:
      return "(bool)(" + value + ")";
    default:
      return std::string("(") + register_type(d) + ")(" + value + ")";
  }
}

// ---- instructions ------------------------------------------------------------------

// Names as the CPU kernels' error messages spell them.
const char* unary_op_name(FusedUnary k) {
  static const char* kNames[] = {"neg",     "abs",   "sign", "square", "exp",         "log",      "log1p",
                                 "sqrt",    "rsqrt", "tanh", "erf",    "gelu_tanh",   "gelu_erf", "silu",
                                 "sigmoid", "relu",  "sin",  "cos",    "logical_not", "copy"};
  return kNames[static_cast<int>(k)];
}

const char* binary_op_name(FusedBinary k) {
  static const char* kNames[] = {"add",           "sub",         "mul",          "div",
                                 "pow",           "maximum",     "minimum",      "equal",
                                 "not_equal",     "less",        "less_equal",   "greater",
                                 "greater_equal", "logical_and", "logical_or",   "gelu_tanh_grad",
                                 "gelu_erf_grad", "silu_grad",   "sigmoid_grad", "tanh_grad"};
  return kNames[static_cast<int>(k)];
}

[[noreturn]] void unsupported(const char* op, DType d) {
  if (d == DType::Bool) fail<DTypeError>("{}: not defined for dtype bool", op);
  fail<DTypeError>("{}: not defined for integer dtype {} (cast to a floating dtype first)", op, name(d));
}

// A unary op on register x of dtype d (the operand's dtype), before rounding.
std::string unary_code(FusedUnary k, DType d, const std::string& x) {
  if (k == FusedUnary::LogicalNot) return "!(" + x + " != 0)";
  if (k == FusedUnary::Copy) return x;
  if (d == DType::Bool) {
    if (k == FusedUnary::Abs || k == FusedUnary::Relu || k == FusedUnary::Square || k == FusedUnary::Sign) return x;
    unsupported(unary_op_name(k), d);
  }
  if (!is_float_class(d)) {
    const std::string t = register_type(d), u = unsigned_type(d);
    const bool sgn = is_signed(d);
    switch (k) {
      case FusedUnary::Neg:  // two's-complement wrap, like numpy
        return fmt::format("({})(({})0 - ({}){})", t, u, u, x);
      case FusedUnary::Abs:
        return sgn ? fmt::format("({0} < ({1})0 ? ({1})(({2})0 - ({2}){0}) : {0})", x, t, u) : x;
      case FusedUnary::Sign:
        return sgn ? fmt::format("({})(({} > 0) - ({} < 0))", t, x, x) : fmt::format("({})({} > 0)", t, x);
      case FusedUnary::Square:
        return fmt::format("({})(({}){} * ({}){})", t, u, x, u, x);
      case FusedUnary::Relu:
        return sgn ? fmt::format("({0} > ({1})0 ? {0} : ({1})0)", x, t) : x;
      default:
        unsupported(unary_op_name(k), d);
    }
  }
  const std::string f = d == DType::Float64 ? "double" : "float";
  switch (k) {
    case FusedUnary::Neg:
      return "-" + x;
    case FusedUnary::Abs:
      return "ts_fabs(" + x + ")";
    case FusedUnary::Sign:
      return "ts_sign(" + x + ")";
    case FusedUnary::Square:
      return x + " * " + x;
    case FusedUnary::Exp:
      return "ts_exp(" + x + ")";
    case FusedUnary::Log:
      return "ts_log(" + x + ")";
    case FusedUnary::Log1p:
      return "ts_log1p(" + x + ")";
    case FusedUnary::Sqrt:
      return "ts_sqrt(" + x + ")";
    case FusedUnary::Rsqrt:
      return "(" + f + ")1 / ts_sqrt(" + x + ")";
    case FusedUnary::Tanh:
      return "ts_tanh(" + x + ")";
    case FusedUnary::Erf:
      return "ts_erf(" + x + ")";
    case FusedUnary::GeluTanh:
      return "ts_gelu_tanh(" + x + ")";
    case FusedUnary::GeluErf:
      return "ts_gelu_erf(" + x + ")";
    case FusedUnary::Silu:
      return "ts_silu(" + x + ")";
    case FusedUnary::Sigmoid:
      return "ts_sigmoid(" + x + ")";
    case FusedUnary::Relu:
      return "ts_relu(" + x + ")";
    case FusedUnary::Sin:
      return "ts_sin(" + x + ")";
    case FusedUnary::Cos:
      return "ts_cos(" + x + ")";
    default:
      break;
  }
  fail<ValueError>("fusion codegen: unknown unary op {}", static_cast<int>(k));
}

const char* comparison_operator(FusedBinary k) {
  switch (k) {
    case FusedBinary::Equal:
      return "==";
    case FusedBinary::NotEqual:
      return "!=";
    case FusedBinary::Less:
      return "<";
    case FusedBinary::LessEqual:
      return "<=";
    case FusedBinary::Greater:
      return ">";
    case FusedBinary::GreaterEqual:
      return ">=";
    default:
      return nullptr;
  }
}

// A binary op on registers a, b of dtype d, before rounding.
std::string binary_code(FusedBinary k, DType d, const std::string& a, const std::string& b) {
  if (const char* op = comparison_operator(k)) {
    if (d == DType::Bool) return fmt::format("((int){} {} (int){})", a, op, b);
    return fmt::format("({} {} {})", a, op, b);
  }
  if (k == FusedBinary::LogicalAnd) return fmt::format("({} != 0 && {} != 0)", a, b);
  if (k == FusedBinary::LogicalOr) return fmt::format("({} != 0 || {} != 0)", a, b);
  if (d == DType::Bool) {
    if (k == FusedBinary::Add || k == FusedBinary::Maximum) return fmt::format("({} || {})", a, b);
    if (k == FusedBinary::Mul || k == FusedBinary::Minimum) return fmt::format("({} && {})", a, b);
    unsupported(binary_op_name(k), d);
  }
  if (!is_float_class(d)) {
    const std::string t = register_type(d), u = unsigned_type(d);
    switch (k) {
      case FusedBinary::Add:
        return fmt::format("({})(({}){} + ({}){})", t, u, a, u, b);
      case FusedBinary::Sub:
        return fmt::format("({})(({}){} - ({}){})", t, u, a, u, b);
      case FusedBinary::Mul:
        return fmt::format("({})(({}){} * ({}){})", t, u, a, u, b);
      case FusedBinary::Div:
        return is_signed(d) ? fmt::format("ts_sdiv<{}, {}>({}, {})", t, u, a, b)
                            : fmt::format("ts_udiv<{}>({}, {})", t, a, b);
      case FusedBinary::Pow:
        return fmt::format("{}<{}, {}>({}, {})", is_signed(d) ? "ts_spow" : "ts_upow", t, u, a, b);
      case FusedBinary::Maximum:
        return fmt::format("({0} > {1} ? {0} : {1})", a, b);
      case FusedBinary::Minimum:
        return fmt::format("({0} < {1} ? {0} : {1})", a, b);
      default:
        unsupported(binary_op_name(k), d);
    }
  }
  switch (k) {
    case FusedBinary::Add:
      return a + " + " + b;
    case FusedBinary::Sub:
      return a + " - " + b;
    case FusedBinary::Mul:
      return a + " * " + b;
    case FusedBinary::Div:
      return a + " / " + b;
    case FusedBinary::Pow:
      return fmt::format("ts_pow({}, {})", a, b);
    case FusedBinary::Maximum:
      return fmt::format("ts_fmaximum({}, {})", a, b);
    case FusedBinary::Minimum:
      return fmt::format("ts_fminimum({}, {})", a, b);
    case FusedBinary::GeluTanhGrad:
      return fmt::format("ts_gelu_tanh_grad({}, {})", a, b);
    case FusedBinary::GeluErfGrad:
      return fmt::format("ts_gelu_erf_grad({}, {})", a, b);
    case FusedBinary::SiluGrad:
      return fmt::format("ts_silu_grad({}, {})", a, b);
    case FusedBinary::SigmoidGrad:
      return fmt::format("ts_sigmoid_grad({}, {})", a, b);
    case FusedBinary::TanhGrad:
      return fmt::format("ts_tanh_grad({}, {})", a, b);
    default:
      break;
  }
  fail<ValueError>("fusion codegen: unknown binary op {}", static_cast<int>(k));
}

// Register x of dtype `from` converted to a register of dtype `to` (the rules of
// tessera::convert; registers of halves hold their exact value as a float).
std::string convert_code(DType from, DType to, const std::string& x) {
  if (from == to) return x;
  if (to == DType::Bool) return "(" + x + " != 0)";
  const std::string t = register_type(to);
  if (from == DType::Bool) return fmt::format("({})({} ? 1 : 0)", t, x);
  if (is_integral(to)) {
    if (is_float_class(from)) return fmt::format("ts_float_to_int<{}>({})", t, x);
    return fmt::format("({})({})", t, x);  // integer narrowing wraps
  }
  if (to == DType::Float32 || to == DType::Float64) return fmt::format("({})({})", t, x);  // one IEEE rounding
  // To a half: one correct rounding of the exact source value.
  const char* round = to == DType::BFloat16 ? "ts_round_bf16" : "ts_round_f16";
  if (from == DType::Float32 || is_half(from)) return fmt::format("{}({})", round, x);
  if (from == DType::Float64) return fmt::format("{}(ts_round_to_odd_float({}))", round, x);
  if (from == DType::Int64) return fmt::format("{}(ts_round_to_odd_float(ts_i64_to_odd_double({})))", round, x);
  return fmt::format("{}(ts_round_to_odd_float((double)({})))", round, x);  // exact in double
}

// ---- the fixed part of every source -----------------------------------------------

constexpr const char* kPrelude = R"CUDA(// Generated by tessera (backend/cuda/kernels/fusion_codegen.cpp).
// ---- storage formats ----
__device__ __forceinline__ float ts_bf16_to_float(unsigned short b) { return __uint_as_float(((unsigned int)b) << 16); }
__device__ __forceinline__ unsigned short ts_float_to_bf16(float f) {  // round to nearest even, NaN stays quiet NaN
  unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (unsigned short)(u >> 16);
}
__device__ __forceinline__ float ts_f16_to_float(unsigned short h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ unsigned short ts_float_to_f16(float f) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
__device__ __forceinline__ float ts_round_bf16(float f) { return ts_bf16_to_float(ts_float_to_bf16(f)); }
__device__ __forceinline__ float ts_round_f16(float f) { return ts_f16_to_float(ts_float_to_f16(f)); }

// ---- conversions (tessera/base/dtype.h) ----
// d rounded to float with round-to-odd: a later rounding to 8 or 11 bits is then one
// correct rounding of d (no double rounding).
__device__ __forceinline__ float ts_round_to_odd_float(double d) {
  const float f = __double2float_rz(d);
  if (d != d || (double)f == d) return (float)d;
  return __uint_as_float(__float_as_uint(f) | 1u);
}
// int64 -> double: exact below 2^53, else rounded to odd at 53 bits.
__device__ __forceinline__ double ts_i64_to_odd_double(long long v) {
  const unsigned long long mag = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
  if (mag < (1ull << 53)) return (double)v;
  const int shift = (64 - __clzll((long long)mag)) - 53;
  unsigned long long kept = mag >> shift;
  if ((mag & ((1ull << shift) - 1ull)) != 0ull) kept |= 1ull;
  const double d = ldexp((double)kept, shift);
  return v < 0 ? -d : d;
}
template <typename T> struct ts_limits;
template <> struct ts_limits<unsigned char> { static constexpr unsigned char lo = 0, hi = 255; };
template <> struct ts_limits<signed char> { static constexpr signed char lo = -128, hi = 127; };
template <> struct ts_limits<unsigned int> { static constexpr unsigned int lo = 0u, hi = 4294967295u; };
template <> struct ts_limits<int> { static constexpr int lo = -2147483647 - 1, hi = 2147483647; };
template <> struct ts_limits<long long> {
  static constexpr long long lo = -9223372036854775807LL - 1, hi = 9223372036854775807LL;
};
// float -> integer: truncate toward zero, NaN -> 0, saturate outside the range.
template <typename To, typename F> __device__ __forceinline__ To ts_float_to_int(F v) {
  const F lo = (F)ts_limits<To>::lo, hi = (F)ts_limits<To>::hi;
  if (v != v) return (To)0;
  if (v <= lo) return ts_limits<To>::lo;
  if (v >= hi) return ts_limits<To>::hi;
  return (To)v;
}

// ---- math (float and double overloads) ----
__device__ __forceinline__ float ts_exp(float x) { return expf(x); }
__device__ __forceinline__ double ts_exp(double x) { return exp(x); }
__device__ __forceinline__ float ts_log(float x) { return logf(x); }
__device__ __forceinline__ double ts_log(double x) { return log(x); }
__device__ __forceinline__ float ts_log1p(float x) { return log1pf(x); }
__device__ __forceinline__ double ts_log1p(double x) { return log1p(x); }
__device__ __forceinline__ float ts_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double ts_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float ts_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double ts_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float ts_erf(float x) { return erff(x); }
__device__ __forceinline__ double ts_erf(double x) { return erf(x); }
__device__ __forceinline__ float ts_sin(float x) { return sinf(x); }
__device__ __forceinline__ double ts_sin(double x) { return sin(x); }
__device__ __forceinline__ float ts_cos(float x) { return cosf(x); }
__device__ __forceinline__ double ts_cos(double x) { return cos(x); }
__device__ __forceinline__ float ts_fabs(float x) { return fabsf(x); }
__device__ __forceinline__ double ts_fabs(double x) { return fabs(x); }
__device__ __forceinline__ float ts_pow(float a, float b) { return powf(a, b); }
__device__ __forceinline__ double ts_pow(double a, double b) { return pow(a, b); }

// ---- op formulas (backend/cpu/kernels/elementwise_*.cpp) ----
template <typename F> __device__ __forceinline__ F ts_sign(F x) { return x > F(0) ? F(1) : (x < F(0) ? F(-1) : x); }
template <typename F> __device__ __forceinline__ F ts_relu(F x) { return x > F(0) ? x : (x != x ? x : F(0)); }
template <typename F> __device__ __forceinline__ F ts_sigmoid(F x) { return F(1) / (F(1) + ts_exp(-x)); }
template <typename F> __device__ __forceinline__ F ts_silu(F x) { return x / (F(1) + ts_exp(-x)); }
// GELU (tanh form). float: 0.5 x (1 + tanh u) = x / (1 + exp(-2u)), as the CPU's vector
// code computes it (exact tails for large negative x); double: the CPU's scalar form.
__device__ __forceinline__ float ts_gelu_tanh(float x) {
  const float m2k = (float)(-2.0 * 0.7978845608028654), c = (float)0.044715;
  return x / (1.0f + expf(m2k * (c * (x * x * x) + x)));
}
__device__ __forceinline__ double ts_gelu_tanh(double x) {
  const double k = 0.7978845608028654, c = 0.044715;
  return 0.5 * x * (1.0 + tanh(k * (x + c * x * x * x)));
}
template <typename F> __device__ __forceinline__ F ts_gelu_erf(F x) {
  return F(0.5) * x * (F(1) + ts_erf(x * F(0.7071067811865476)));
}
// NaN in either operand propagates (as a + b).
template <typename F> __device__ __forceinline__ F ts_fmaximum(F a, F b) {
  return (a != a || b != b) ? a + b : (a > b ? a : b);
}
template <typename F> __device__ __forceinline__ F ts_fminimum(F a, F b) {
  return (a != a || b != b) ? a + b : (a < b ? a : b);
}
// Derivative helpers: g * f'(x) (tanh_grad takes y = tanh(x)).
// float: with s = sigmoid(2u) = (1 + tanh u) / 2, f' = s + 2 x s (1 - s) k (1 + 3 c x^2) (the
// CPU's vector form); double: the CPU's scalar form.
__device__ __forceinline__ float ts_gelu_tanh_grad(float x, float g) {
  const float m2k = (float)(-2.0 * 0.7978845608028654), p2k = (float)(2.0 * 0.7978845608028654);
  const float c = (float)0.044715, c3 = (float)(3.0 * 0.044715);
  const float x2 = x * x;
  const float s = 1.0f / (1.0f + expf(m2k * ((c * x2) * x + x)));
  const float du = p2k * (c3 * x2 + 1.0f);
  return g * ((x * (s * (1.0f - s))) * du + s);
}
__device__ __forceinline__ double ts_gelu_tanh_grad(double x, double g) {
  const double k = 0.7978845608028654, c = 0.044715;
  const double t = tanh(k * (x + c * x * x * x));
  return g * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * c * x * x));
}
template <typename F> __device__ __forceinline__ F ts_gelu_erf_grad(F x, F g) {
  return g * (F(0.5) * (F(1) + ts_erf(x * F(0.7071067811865476))) +
              x * F(0.3989422804014327) * ts_exp(F(-0.5) * x * x));
}
template <typename F> __device__ __forceinline__ F ts_silu_grad(F x, F g) {
  const F s = F(1) / (F(1) + ts_exp(-x));
  return g * (s * (F(1) + x * (F(1) - s)));
}
template <typename F> __device__ __forceinline__ F ts_sigmoid_grad(F x, F g) {
  const F s = F(1) / (F(1) + ts_exp(-x));
  return g * (s * (F(1) - s));
}
template <typename F> __device__ __forceinline__ F ts_tanh_grad(F y, F g) { return g * (F(1) - y * y); }

// ---- integers: truncating division with x / 0 = 0, power by squaring ----
template <typename T, typename U> __device__ __forceinline__ T ts_sdiv(T a, T b) {
  if (b == (T)0) return (T)0;
  if (b == (T)-1) return (T)((U)0 - (U)a);  // INT_MIN / -1 wraps
  return (T)(a / b);
}
template <typename T> __device__ __forceinline__ T ts_udiv(T a, T b) { return b == (T)0 ? (T)0 : (T)(a / b); }
template <typename T, typename U> __device__ __forceinline__ T ts_pow_bits(U base, U e) {
  U result = 1;
  for (; e != 0; e >>= 1) {
    if (e & 1) result = (U)(result * base);
    base = (U)(base * base);
  }
  return (T)result;
}
template <typename T, typename U> __device__ __forceinline__ T ts_spow(T a, T b) {
  if (b < (T)0) {  // only |a| = 1 survives a negative exponent
    if (a == (T)1) return (T)1;
    if (a == (T)-1) return (b % 2 == 0) ? (T)1 : (T)-1;
    return (T)0;
  }
  return ts_pow_bits<T, U>((U)a, (U)b);
}
template <typename T, typename U> __device__ __forceinline__ T ts_upow(T a, T b) {
  return ts_pow_bits<T, U>((U)a, (U)b);
}

// ---- memory ----
template <typename T, int N> struct alignas(sizeof(T) * N) ts_pack { T v[N]; };
)CUDA";

// ---- the generated part -------------------------------------------------------------

std::string reg(int r) { return "r" + std::to_string(r); }

// "a, b" from two comma-separated lists either of which may be empty.
std::string join_args(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (b.empty()) return a;
  return a + ", " + b;
}

bool vectorizable(const FusedProgram& p, const FusionLayout& layout) {
  if (p.reduce != FusedReduce::None) return false;
  return std::none_of(layout.kinds.begin(), layout.kinds.end(),
                      [](FusedInputKind k) { return k == FusedInputKind::Strided; });
}

// Elements per vector access: 16 bytes of the widest non-scalar operand, at most 8.
int vector_width(const FusedProgram& p, const FusionLayout& layout) {
  size_t widest = 1;
  for (size_t i = 0; i < p.inputs.size(); ++i)
    if (layout.kinds[i] != FusedInputKind::Scalar) widest = std::max(widest, itemsize(p.inputs[i].dtype));
  for (int r : p.outputs) widest = std::max(widest, itemsize(p.register_dtype(r)));
  return static_cast<int>(std::min<size_t>(8, 16 / widest));
}

void append_args_struct(std::string& s, const FusedProgram& p, const FusionLayout& layout) {
  const int rank = static_cast<int>(layout.dims.size()), ns = layout.num_strided();
  s += "\n// ---- the kernels' parameter (every field 8 bytes: see pack_fusion_args) ----\nstruct Args {\n";
  for (size_t i = 0; i < p.inputs.size(); ++i)
    s += fmt::format("  const {}* in{};\n", storage_type(p.inputs[i].dtype), i);
  for (size_t j = 0; j < p.outputs.size(); ++j)
    s += fmt::format("  {}* out{};\n", storage_type(p.register_dtype(p.outputs[j])), j);
  s += "  void* partial;     // reduction chunk partials\n";
  s += "  long long n;       // elements of the domain\n";
  s += "  long long rows, len, chunk_len, chunks;  // reduction: domain = [rows, len]\n";
  if (ns > 0) {
    s += fmt::format("  long long dims[{}];      // collapsed domain, row-major\n", rank);
    s += fmt::format("  long long st[{}][{}];    // strides of the strided inputs over dims\n", ns, rank);
  }
  const size_t slots = p.inputs.size() + p.outputs.size() + 6 + static_cast<size_t>(ns > 0 ? rank * (1 + ns) : 0);
  s += fmt::format("}};\nstatic_assert(sizeof(Args) == {}, \"Args layout\");\n", 8 * slots);
}

// ts_body: the instructions, from the input registers to the output registers.
void append_body(std::string& s, const FusedProgram& p) {
  const int n_in = static_cast<int>(p.inputs.size());
  s += "\n// ---- the program ----\n__device__ __forceinline__ void ts_body(";
  for (int i = 0; i < n_in; ++i)
    s += fmt::format("{}const {} {}", i ? ", " : "", register_type(p.inputs[i].dtype), reg(i));
  for (size_t j = 0; j < p.outputs.size(); ++j)
    s += fmt::format("{}{}& o{}", n_in + j ? ", " : "", register_type(p.register_dtype(p.outputs[j])), j);
  s += ") {\n";
  for (size_t k = 0; k < p.body.size(); ++k) {
    const FusedInstruction& in = p.body[k];
    const int self = n_in + static_cast<int>(k);
    const DType arg_dtype = p.register_dtype(in.args.at(0));
    for (int a : in.args)
      if (a >= self) fail<ValueError>("fusion codegen: instruction t{} reads register {} before it is defined", k, a);
    const int last_op = in.kind == FusedInstruction::Kind::Unary    ? static_cast<int>(FusedUnary::Copy)
                        : in.kind == FusedInstruction::Kind::Binary ? static_cast<int>(FusedBinary::TanhGrad)
                                                                    : 0;
    if (in.op < 0 || in.op > last_op) fail<ValueError>("fusion codegen: instruction t{} has op {}", k, in.op);
    std::string value;
    switch (in.kind) {
      case FusedInstruction::Kind::Unary:
        value = unary_code(static_cast<FusedUnary>(in.op), arg_dtype, reg(in.args[0]));
        break;
      case FusedInstruction::Kind::Binary:
        value = binary_code(static_cast<FusedBinary>(in.op), arg_dtype, reg(in.args[0]), reg(in.args.at(1)));
        break;
      case FusedInstruction::Kind::Where:
        value = fmt::format("({} ? {} : {})", reg(in.args[0]), reg(in.args.at(1)), reg(in.args.at(2)));
        break;
      case FusedInstruction::Kind::Convert:
        value = convert_code(arg_dtype, in.dtype, reg(in.args[0]));
        break;
    }
    // Where and Convert produce exact values of the dtype already; ops round here.
    const bool exact = in.kind == FusedInstruction::Kind::Where || in.kind == FusedInstruction::Kind::Convert;
    s += fmt::format("  const {} {} = {};\n", register_type(in.dtype), reg(self),
                     exact ? value : result_expr(in.dtype, value));
  }
  for (size_t j = 0; j < p.outputs.size(); ++j) s += fmt::format("  o{} = {};\n", j, reg(p.outputs[j]));
  s += "}\n";
}

// ts_offsets: the strided inputs' element offsets of flat domain index i.
void append_offsets(std::string& s, const FusionLayout& layout) {
  const int rank = static_cast<int>(layout.dims.size()), ns = layout.num_strided();
  if (ns == 0) return;
  s += fmt::format(
      "\n// Offsets of the strided inputs at flat domain index i (I: 32-bit when the domain fits).\n"
      "template <typename I>\n__device__ __forceinline__ void ts_offsets(const Args& a, I i, I (&off)[{}]) {{\n"
      "  I rem = i;\n",
      ns);
  for (int d = rank - 1; d >= 0; --d) {
    if (d > 0) {
      s += fmt::format("  {{\n    const I dim = (I)a.dims[{0}], c = rem % dim;\n    rem /= dim;\n", d);
    } else {
      s += "  {\n    const I c = rem;\n";
    }
    for (int k = 0; k < ns; ++k) s += fmt::format("    off[{0}] += c * (I)a.st[{0}][{1}];\n", k, d);
    s += "  }\n";
  }
  s += "}\n";
}

std::string output_args(const FusedProgram& p);

// ts_element: loads every input at flat index i and runs the body.
void append_element(std::string& s, const FusedProgram& p, const FusionLayout& layout) {
  const int ns = layout.num_strided();
  s += "\ntemplate <typename I>\n__device__ __forceinline__ void ts_element(const Args& a, I i";
  for (size_t j = 0; j < p.outputs.size(); ++j)
    s += fmt::format(", {}& o{}", register_type(p.register_dtype(p.outputs[j])), j);
  s += ") {\n";
  if (ns > 0) {
    s += fmt::format("  I off[{}] = {{}};\n  ts_offsets<I>(a, i, off);\n", ns);
  }
  std::string operands;
  int strided = 0;
  for (size_t i = 0; i < p.inputs.size(); ++i) {
    std::string at;
    switch (layout.kinds[i]) {
      case FusedInputKind::Scalar:
        at = "0";
        break;
      case FusedInputKind::Contiguous:
        at = "i";
        break;
      case FusedInputKind::Strided:
        at = fmt::format("off[{}]", strided++);
        break;
    }
    operands = join_args(operands, load_expr(p.inputs[i].dtype, fmt::format("a.in{}[{}]", i, at)));
  }
  s += "  ts_body(" + join_args(operands, output_args(p)) + ");\n}\n";
}

// Declarations "T0 o0; T1 o1;" and the call arguments "o0, o1" for the outputs.
std::string output_decls(const FusedProgram& p) {
  std::string s;
  for (size_t j = 0; j < p.outputs.size(); ++j)
    s += fmt::format("{} o{}; ", register_type(p.register_dtype(p.outputs[j])), j);
  return s;
}
// "o0, o1": the output registers as call arguments.
std::string output_args(const FusedProgram& p) {
  std::string s;
  for (size_t j = 0; j < p.outputs.size(); ++j) s = join_args(s, fmt::format("o{}", j));
  return s;
}
std::string output_stores(const FusedProgram& p, const std::string& at) {
  std::string s;
  for (size_t j = 0; j < p.outputs.size(); ++j)
    s += fmt::format(" a.out{}[{}] = {};", j, at, store_expr(p.register_dtype(p.outputs[j]), fmt::format("o{}", j)));
  return s;
}

constexpr const char* kGridStride =
    "  const unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  const unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;\n";

void append_map_kernels(std::string& s, const FusedProgram& p, const FusionLayout& layout, int vec) {
  s += fmt::format(
      "\n// ---- elementwise: one element per thread, grid-stride ----\n"
      "template <typename I>\n__device__ __forceinline__ void ts_map(const Args& a, I first, I n, I step) {{\n"
      "  for (I i = first; i < n; i += step) {{\n"
      "    {}\n    ts_element<I>(a, i, {});\n   {}\n  }}\n}}\n"
      "extern \"C\" __global__ void __launch_bounds__(256) @NAME@(const Args a) {{\n{}"
      "  const unsigned long long n = (unsigned long long)a.n;\n"
      "  if (n + step <= 0xffffffffull)\n"
      "    ts_map<unsigned int>(a, (unsigned int)first, (unsigned int)n, (unsigned int)step);\n"
      "  else\n"
      "    ts_map<unsigned long long>(a, first, n, step);\n"
      "}}\n",
      output_decls(p), output_args(p), output_stores(p, "i"), kGridStride);
  if (vec == 0) return;
  // Vector kernel: every non-scalar operand is contiguous, so element j of a pack is
  // flat index i0 + j everywhere; scalars are loaded per element (cached broadcasts).
  std::string loads, operands, stores;
  for (size_t i = 0; i < p.inputs.size(); ++i) {
    const DType d = p.inputs[i].dtype;
    if (layout.kinds[i] == FusedInputKind::Scalar) {
      operands = join_args(operands, load_expr(d, fmt::format("a.in{}[0]", i)));
    } else {
      loads +=
          fmt::format("    const ts_pack<{0}, {1}> p{2} = *reinterpret_cast<const ts_pack<{0}, {1}>*>(a.in{2} + i0);\n",
                      storage_type(d), vec, i);
      operands = join_args(operands, load_expr(d, fmt::format("p{}.v[j]", i)));
    }
  }
  std::string packs, pack_stores, assigns;
  for (size_t j = 0; j < p.outputs.size(); ++j) {
    const DType d = p.register_dtype(p.outputs[j]);
    packs += fmt::format("    ts_pack<{}, {}> q{};\n", storage_type(d), vec, j);
    assigns += fmt::format(" q{0}.v[j] = {1};", j, store_expr(d, fmt::format("o{}", j)));
    pack_stores +=
        fmt::format("    *reinterpret_cast<ts_pack<{0}, {1}>*>(a.out{2} + i0) = q{2};\n", storage_type(d), vec, j);
  }
  s += fmt::format(
      "\n// ---- elementwise, {0} elements per thread (aligned contiguous operands) ----\n"
      "extern \"C\" __global__ void __launch_bounds__(256) @NAME@_vec(const Args a) {{\n{1}"
      "  const unsigned long long n = (unsigned long long)a.n, packs = n / {0};\n"
      "  for (unsigned long long v = first; v < packs; v += step) {{\n"
      "    const unsigned long long i0 = v * {0};\n{2}{3}"
      "#pragma unroll\n"
      "    for (int j = 0; j < {0}; ++j) {{\n"
      "      {4}\n      ts_body({5});\n     {7}\n    }}\n{8}"
      "  }}\n"
      "  for (unsigned long long i = packs * {0} + first; i < n; i += step) {{  // the tail\n"
      "    {4}\n    ts_element<unsigned long long>(a, i, {6});\n   {9}\n  }}\n"
      "}}\n",
      vec, kGridStride, loads, packs, output_decls(p), join_args(operands, output_args(p)), output_args(p), assigns,
      pack_stores, output_stores(p, "i"));
}

void append_reduce_kernels(std::string& s, const FusedProgram& p) {
  const DType d = p.register_dtype(p.outputs.at(0));
  const std::string acc = accumulator_type(d);
  const bool sum = p.reduce == FusedReduce::Sum;
  std::string combine, identity;
  if (sum) {
    combine = acc == "long long" ? "(long long)((unsigned long long)a + (unsigned long long)b)" : "a + b";
    identity = "(" + acc + ")0";
  } else {
    combine = "(b > a || b != b) ? b : a";  // NaN wins
    identity = acc == "float"    ? "-__int_as_float(0x7f800000)"
               : acc == "double" ? "-__longlong_as_double(0x7ff0000000000000LL)"
                                 : "(-9223372036854775807LL - 1)";
  }
  // The accumulator as the output register, then stored.
  const std::string as_register = d == DType::Bool    ? "(acc != 0)"
                                  : is_float_class(d) ? "acc"
                                                      : fmt::format("({})acc", register_type(d));
  const std::string store = store_expr(d, as_register);
  s += fmt::format(R"CUDA(
// ---- fused reduction ({0} over the trailing axes), accumulated in {1} ----
typedef {1} Acc;
__device__ __forceinline__ Acc ts_identity() {{ return {2}; }}
__device__ __forceinline__ Acc ts_combine(Acc a, Acc b) {{ return {3}; }}
// Fixed shuffle tree: lane l takes lane l + o for o = 16, 8, 4, 2, 1 (result in lane 0).
__device__ __forceinline__ Acc ts_warp_reduce(Acc v) {{
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = ts_combine(v, __shfl_down_sync(0xffffffffu, v, o));
  return v;
}}
// Block of a multiple of 32 threads: warps, then warp 0 over the warp results (thread 0).
__device__ __forceinline__ Acc ts_block_reduce(Acc v, Acc* shared) {{
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = ts_warp_reduce(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) v = ts_warp_reduce(lane < (int)(blockDim.x >> 5) ? shared[lane] : ts_identity());
  __syncthreads();  // shared is reused by the block's next row
  return v;
}}
template <typename I>
__device__ __forceinline__ Acc ts_reduce_span(const Args& a, I base, I c, I end, I step) {{
  Acc acc = ts_identity();
  for (; c < end; c += step) {{
    {4}
    ts_element<I>(a, base + c, o0);
    acc = ts_combine(acc, (Acc)o0);
  }}
  return acc;
}}
// Thread's share of row `row`, columns c0 + first, c0 + first + step, ... < c1.
__device__ __forceinline__ Acc ts_row_span(const Args& a, long long row, long long c0, long long c1, int first,
                                           int step) {{
  if ((unsigned long long)a.n + 1024ull <= 0xffffffffull)
    return ts_reduce_span<unsigned int>(a, (unsigned int)(row * a.len), (unsigned int)(c0 + first), (unsigned int)c1,
                                        (unsigned int)step);
  return ts_reduce_span<unsigned long long>(a, (unsigned long long)(row * a.len), (unsigned long long)(c0 + first),
                                            (unsigned long long)c1, (unsigned long long)step);
}}
// A block per (row, chunk): the row's columns [chunk * chunk_len, +chunk_len); with one
// chunk the block writes the output, else its partial.
extern "C" __global__ void __launch_bounds__(256) @NAME@_rows(const Args a) {{
  __shared__ Acc shared[32];
  const long long units = a.rows * a.chunks;
  for (long long u = blockIdx.x; u < units; u += gridDim.x) {{
    const long long row = u / a.chunks, chunk = u - row * a.chunks;
    const long long c0 = chunk * a.chunk_len;
    const long long c1 = a.len - c0 < a.chunk_len ? a.len : c0 + a.chunk_len;
    Acc acc = ts_row_span(a, row, c0, c1, (int)threadIdx.x, (int)blockDim.x);
    acc = ts_block_reduce(acc, shared);
    if (threadIdx.x == 0) {{
      if (a.chunks == 1) {{
        a.out0[row] = {5};
      }} else {{
        static_cast<Acc*>(a.partial)[u] = acc;
      }}
    }}
  }}
}}
// A warp per row (short rows).
extern "C" __global__ void __launch_bounds__(256) @NAME@_warps(const Args a) {{
  const int lane = threadIdx.x & 31;
  const long long warps = ((long long)gridDim.x * blockDim.x) >> 5;
  for (long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; row < a.rows; row += warps) {{
    Acc acc = ts_warp_reduce(ts_row_span(a, row, 0, a.len, lane, 32));
    if (lane == 0) a.out0[row] = {5};
  }}
}}
// A warp per row over the rows kernel's chunk partials, in chunk order.
extern "C" __global__ void __launch_bounds__(256) @NAME@_finish(const Args a) {{
  const int lane = threadIdx.x & 31;
  const long long warps = ((long long)gridDim.x * blockDim.x) >> 5;
  const Acc* partial = static_cast<const Acc*>(a.partial);
  for (long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; row < a.rows; row += warps) {{
    Acc acc = ts_identity();
    for (long long k = lane; k < a.chunks; k += 32) acc = ts_combine(acc, partial[row * a.chunks + k]);
    acc = ts_warp_reduce(acc);
    if (lane == 0) a.out0[row] = {5};
  }}
}}
)CUDA",
                   sum ? "sum" : "max", acc, identity, combine, output_decls(p), store);
}

const char* kind_code(FusedInputKind k) {
  switch (k) {
    case FusedInputKind::Scalar:
      return "S";
    case FusedInputKind::Contiguous:
      return "C";
    case FusedInputKind::Strided:
      return "X";
  }
  return "?";
}

// FNV-1a, 64 bits: a stable hash (std::hash may differ between libraries).
uint64_t fnv1a(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (size_t pos = s.find(from); pos != std::string::npos; pos = s.find(from, pos + to.size()))
    s.replace(pos, from.size(), to);
}

}  // namespace

DType FusedProgram::register_dtype(int r) const {
  const int n_in = static_cast<int>(inputs.size());
  if (r < 0 || r >= n_in + static_cast<int>(body.size()))
    fail<ValueError>("fusion codegen: register {} out of range (the program has {})", r, n_in + body.size());
  return r < n_in ? inputs[r].dtype : body[r - n_in].dtype;
}

int FusionLayout::num_strided() const {
  return static_cast<int>(std::count(kinds.begin(), kinds.end(), FusedInputKind::Strided));
}

FusionLayout fusion_layout(const FusedProgram& p) {
  FusionLayout layout;
  const Shape& shape = p.shape;
  layout.numel = numel(shape, "fusion");
  if (p.reduce_axes < 0 || p.reduce_axes > static_cast<int>(shape.size()) ||
      (p.reduce == FusedReduce::None && p.reduce_axes != 0))
    fail<ValueError>("fusion codegen: {} reduce axes for a domain of rank {}", p.reduce_axes, shape.size());
  const size_t out_rank = shape.size() - static_cast<size_t>(p.reduce_axes);
  layout.rows = 1;
  layout.len = 1;
  for (size_t d = 0; d < shape.size(); ++d) (d < out_rank ? layout.rows : layout.len) *= shape[d];
  const Strides dense = contiguous_strides(shape);
  std::vector<Strides> full;  // broadcast strides over the uncollapsed domain
  for (const FusedInput& in : p.inputs) {
    Strides st = broadcast_strides(in.shape, shape);
    FusedInputKind kind = FusedInputKind::Strided;
    if (numel(in.shape, "fusion") == 1) {
      kind = FusedInputKind::Scalar;
    } else {
      bool contiguous = true;
      for (size_t d = 0; d < shape.size(); ++d) contiguous = contiguous && (shape[d] == 1 || st[d] == dense[d]);
      if (contiguous) kind = FusedInputKind::Contiguous;
    }
    layout.kinds.push_back(kind);
    full.push_back(kind == FusedInputKind::Strided ? std::move(st) : Strides{});
  }
  layout.strides.resize(p.inputs.size());
  if (layout.num_strided() == 0) return layout;
  // Collapse: drop size-1 dims; merge dim d into the previous kept dim when every
  // strided input steps over it contiguously (stride[prev] == stride[d] * size[d]).
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !layout.dims.empty();
    for (size_t i = 0; i < p.inputs.size() && merge; ++i)
      if (layout.kinds[i] == FusedInputKind::Strided) merge = layout.strides[i].back() == full[i][d] * shape[d];
    if (merge) {
      layout.dims.back() *= shape[d];
      for (size_t i = 0; i < p.inputs.size(); ++i)
        if (layout.kinds[i] == FusedInputKind::Strided) layout.strides[i].back() = full[i][d];
    } else {
      layout.dims.push_back(shape[d]);
      for (size_t i = 0; i < p.inputs.size(); ++i)
        if (layout.kinds[i] == FusedInputKind::Strided) layout.strides[i].push_back(full[i][d]);
    }
  }
  return layout;
}

std::string fusion_signature(const FusedProgram& p, const FusionLayout& layout) {
  std::string s;
  s.reserve(64 + 16 * p.body.size());
  for (size_t i = 0; i < p.inputs.size(); ++i) (s += short_name(p.inputs[i].dtype)) += kind_code(layout.kinds[i]);
  s += '|';
  for (const FusedInstruction& in : p.body) {
    s += fmt::format("{}{}{}", static_cast<int>(in.kind), in.op, short_name(in.dtype));
    for (int a : in.args) s += fmt::format(",{}", a);
    s += ';';
  }
  s += '|';
  for (int r : p.outputs) s += fmt::format("{},", r);
  s += fmt::format("|R{}|{}", layout.dims.size(), static_cast<int>(p.reduce));
  return s;
}

FusionSource generate_fusion_source(const FusedProgram& p, const FusionLayout& layout) {
  if (layout.kinds.size() != p.inputs.size())
    fail<ValueError>("fusion codegen: layout has {} inputs (the program has {})", layout.kinds.size(), p.inputs.size());
  if (p.outputs.empty()) fail<ValueError>("fusion codegen: the program has no outputs");
  FusionSource out;
  std::string s = kPrelude;
  append_args_struct(s, p, layout);
  append_body(s, p);
  append_offsets(s, layout);
  append_element(s, p, layout);
  if (p.reduce != FusedReduce::None) {
    if (p.outputs.size() != 1) fail<ValueError>("fusion codegen: a fused reduction has one output");
    append_reduce_kernels(s, p);
    const std::string acc = accumulator_type(p.register_dtype(p.outputs[0]));
    out.accumulator_bytes = acc == "float" ? 4 : 8;
  } else {
    out.vector_width = vectorizable(p, layout) ? vector_width(p, layout) : 0;
    append_map_kernels(s, p, layout, out.vector_width);
  }
  const std::string name = fmt::format("tessera_fused_{:016x}", fnv1a(s));
  replace_all(s, "@NAME@", name);
  if (p.reduce != FusedReduce::None) {
    out.kernels = {name + "_rows", name + "_warps", name + "_finish"};
  } else {
    out.kernels = {name, out.vector_width > 0 ? name + "_vec" : std::string()};
  }
  out.source = std::move(s);
  return out;
}

std::vector<uint64_t> pack_fusion_args(const FusedProgram& p, const FusionLayout& layout, const void* const* inputs,
                                       void* const* outputs, void* partial, int64_t chunk_len, int64_t chunks) {
  std::vector<uint64_t> slots;
  auto ptr = [](const void* q) { return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(q)); };
  auto num = [](int64_t v) { return static_cast<uint64_t>(v); };
  for (size_t i = 0; i < p.inputs.size(); ++i) slots.push_back(ptr(inputs[i]));
  for (size_t j = 0; j < p.outputs.size(); ++j) slots.push_back(ptr(outputs[j]));
  slots.push_back(ptr(partial));
  for (int64_t v : {layout.numel, layout.rows, layout.len, chunk_len, chunks}) slots.push_back(num(v));
  if (layout.num_strided() > 0) {
    for (int64_t d : layout.dims) slots.push_back(num(d));
    for (size_t i = 0; i < p.inputs.size(); ++i)
      if (layout.kinds[i] == FusedInputKind::Strided)
        for (int64_t st : layout.strides[i]) slots.push_back(num(st));
  }
  return slots;
}

}  // namespace tessera::cuda
