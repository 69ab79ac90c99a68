// Fusion code generator, part 1 of 3 (see fusion_codegen_detail.h): dtypes as C types,
// one instruction (unary, binary, convert) as a C expression with the CPU's semantics,
// and kPrelude, the fixed helpers (bf16/f16 conversions, the CPU's conversion rules, the
// op formulas, integer division and power) that every generated source starts with.
#include <fmt/format.h>

#include "backend/cuda/kernels/fusion_codegen_detail.h"
#include "tessera/base/error.h"

namespace tessera::cuda::detail {
namespace {

bool is_half(DType d) { return d == DType::BFloat16 || d == DType::Float16; }

}  // namespace

// ---- dtypes in generated code ----------------------------------------------------

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

namespace {

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

}  // namespace

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

namespace {

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

}  // namespace

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

const char* const kPrelude = R"CUDA(// Generated by tessera (backend/cuda/kernels/fusion_codegen.cpp).
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

}  // namespace tessera::cuda::detail
