// Binary elementwise kernels and where(), with numpy broadcasting given as strides.
//
// The broadcast layout is collapsed (detail::collapse), the flat output range is cut
// into fixed chunks, and each chunk is walked as runs along the innermost dim. Each
// run is specialised for (contiguous, contiguous), (scalar, contiguous) and
// (contiguous, scalar) operands, with a strided fallback. float32 runs use AVX2;
// bfloat16/float16 runs are gathered into float32 blocks and reuse the float32 code.
#include <cmath>
#include <cstring>
#include <string_view>
#include <type_traits>

#include "backend/cpu/kernels/elementwise.h"
#include "backend/cpu/kernels/elementwise_detail.h"
#include "backend/cpu/kernels/vector_math.h"

namespace tessera::cpu {

bool is_comparison(BinaryOp op) { return op >= BinaryOp::Equal && op <= BinaryOp::GreaterEqual; }

namespace {

using detail::Compute;
using detail::kIsHalf;

bool bool_output(BinaryOp op) { return is_comparison(op) || op == BinaryOp::LogicalAnd || op == BinaryOp::LogicalOr; }
bool is_grad(BinaryOp op) { return op >= BinaryOp::GeluTanhGrad; }

std::string_view op_name(BinaryOp op) {
  static constexpr std::string_view kNames[] = {"add",           "sub",         "mul",          "div",
                                                "pow",           "maximum",     "minimum",      "equal",
                                                "not_equal",     "less",        "less_equal",   "greater",
                                                "greater_equal", "logical_and", "logical_or",   "gelu_tanh_grad",
                                                "gelu_erf_grad", "silu_grad",   "sigmoid_grad", "tanh_grad"};
  return kNames[static_cast<int>(op)];
}

// ---- scalar semantics, per compute type ------------------------------------------

template <typename F>
F float_op(BinaryOp op, F a, F b) {
  switch (op) {
    case BinaryOp::Add:
      return a + b;
    case BinaryOp::Sub:
      return a - b;
    case BinaryOp::Mul:
      return a * b;
    case BinaryOp::Div:
      return a / b;
    case BinaryOp::Pow:
      return std::pow(a, b);
    case BinaryOp::Maximum:
      return (a != a || b != b) ? a + b : (a > b ? a : b);
    case BinaryOp::Minimum:
      return (a != a || b != b) ? a + b : (a < b ? a : b);
    case BinaryOp::GeluTanhGrad: {
      F k = F(vmath::kSqrt2OverPi), c = F(vmath::kGeluCubic);
      F t = std::tanh(k * (a + c * a * a * a));
      return b * (F(0.5) * (F(1) + t) + F(0.5) * a * (F(1) - t * t) * k * (F(1) + F(3) * c * a * a));
    }
    case BinaryOp::GeluErfGrad:
      return b * (F(0.5) * (F(1) + std::erf(a * F(vmath::kInvSqrt2))) +
                  a * F(vmath::kInvSqrt2Pi) * std::exp(F(-0.5) * a * a));
    case BinaryOp::SiluGrad: {
      F s = F(1) / (F(1) + std::exp(-a));
      return b * (s * (F(1) + a * (F(1) - s)));
    }
    case BinaryOp::SigmoidGrad: {
      F s = F(1) / (F(1) + std::exp(-a));
      return b * (s * (F(1) - s));
    }
    case BinaryOp::TanhGrad:
      return b * (F(1) - a * a);
    default:
      return F(0);
  }
}

template <typename T>
bool compare_op(BinaryOp op, T a, T b) {
  switch (op) {
    case BinaryOp::Equal:
      return a == b;
    case BinaryOp::NotEqual:
      return a != b;
    case BinaryOp::Less:
      return a < b;
    case BinaryOp::LessEqual:
      return a <= b;
    case BinaryOp::Greater:
      return a > b;
    case BinaryOp::GreaterEqual:
      return a >= b;
    case BinaryOp::LogicalAnd:
      return a != T(0) && b != T(0);
    case BinaryOp::LogicalOr:
      return a != T(0) || b != T(0);
    default:
      return false;
  }
}

// Integer semantics: wrap-around arithmetic (computed unsigned, no UB), truncating
// division with x / 0 = 0, Pow by repeated squaring (negative exponent -> 0 unless |a| = 1).
template <typename T>
T int_op(BinaryOp op, T a, T b) {
  using U = std::make_unsigned_t<T>;
  switch (op) {
    case BinaryOp::Add:
      return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
    case BinaryOp::Sub:
      return static_cast<T>(static_cast<U>(a) - static_cast<U>(b));
    case BinaryOp::Mul:
      return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
    case BinaryOp::Div:
      if (b == T(0)) return T(0);
      if constexpr (std::is_signed_v<T>) {
        if (b == T(-1)) return static_cast<T>(U(0) - static_cast<U>(a));  // INT_MIN / -1 wraps
      }
      return static_cast<T>(a / b);
    case BinaryOp::Pow: {
      if constexpr (std::is_signed_v<T>) {
        if (b < T(0)) {
          if (a == T(1)) return T(1);
          if (a == T(-1)) return (b % 2 == 0) ? T(1) : T(-1);
          return T(0);
        }
      }
      U base = static_cast<U>(a), result = 1;
      for (auto e = static_cast<U>(b); e != 0; e >>= 1) {
        if (e & 1) result = static_cast<U>(result * base);
        base = static_cast<U>(base * base);
      }
      return static_cast<T>(result);
    }
    case BinaryOp::Maximum:
      return a > b ? a : b;
    case BinaryOp::Minimum:
      return a < b ? a : b;
    default:
      return T(0);
  }
}

bool bool_op(BinaryOp op, bool a, bool b) {
  switch (op) {
    case BinaryOp::Add:
    case BinaryOp::Maximum:
      return a || b;
    case BinaryOp::Mul:
    case BinaryOp::Minimum:
      return a && b;
    default:
      return false;
  }
}

// ---- float32 runs --------------------------------------------------------------

#ifdef __AVX2__
// Applies vec/scalar to a run with operand strides sa, sb in {0, 1} fast paths.
template <typename V>
void run_f32_vec(const float* a, int64_t sa, const float* b, int64_t sb, float* o, int64_t n, V&& vec) {
  int64_t i = 0;
  if (sa == 1 && sb == 1) {
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(o + i, vec(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
  } else if (sa == 0 && sb == 1) {
    __m256 va = _mm256_set1_ps(a[0]);
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(o + i, vec(va, _mm256_loadu_ps(b + i)));
  } else if (sa == 1 && sb == 0) {
    __m256 vb = _mm256_set1_ps(b[0]);
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(o + i, vec(_mm256_loadu_ps(a + i), vb));
  }
  // Remainder and strided runs: gather 8 at a time through the same vector code so each
  // element's result does not depend on where it falls in a run.
  for (; i < n; i += 8) {
    int64_t m = std::min<int64_t>(8, n - i);
    alignas(32) float ba[8] = {}, bb[8] = {}, bo[8];
    for (int64_t j = 0; j < m; ++j) {
      ba[j] = a[(i + j) * sa];
      bb[j] = b[(i + j) * sb];
    }
    _mm256_store_ps(bo, vec(_mm256_load_ps(ba), _mm256_load_ps(bb)));
    std::memcpy(o + i, bo, sizeof(float) * m);
  }
}

bool run_f32_avx2(BinaryOp op, const float* a, int64_t sa, const float* b, int64_t sb, float* o, int64_t n) {
  switch (op) {
    case BinaryOp::Add:
      run_f32_vec(a, sa, b, sb, o, n, [](__m256 x, __m256 y) { return _mm256_add_ps(x, y); });
      return true;
    case BinaryOp::Sub:
      run_f32_vec(a, sa, b, sb, o, n, [](__m256 x, __m256 y) { return _mm256_sub_ps(x, y); });
      return true;
    case BinaryOp::Mul:
      run_f32_vec(a, sa, b, sb, o, n, [](__m256 x, __m256 y) { return _mm256_mul_ps(x, y); });
      return true;
    case BinaryOp::Div:
      run_f32_vec(a, sa, b, sb, o, n, [](__m256 x, __m256 y) { return _mm256_div_ps(x, y); });
      return true;
    case BinaryOp::Maximum:
    case BinaryOp::Minimum: {
      bool mx = op == BinaryOp::Maximum;
      run_f32_vec(a, sa, b, sb, o, n, [mx](__m256 x, __m256 y) {
        __m256 r = mx ? _mm256_max_ps(x, y) : _mm256_min_ps(x, y);
        return _mm256_blendv_ps(r, _mm256_add_ps(x, y), _mm256_cmp_ps(x, y, _CMP_UNORD_Q));  // NaN propagates
      });
      return true;
    }
    case BinaryOp::GeluTanhGrad:
      run_f32_vec(a, sa, b, sb, o, n, [](__m256 x, __m256 g) { return _mm256_mul_ps(g, vmath::gelu_tanh_grad(x)); });
      return true;
    case BinaryOp::GeluErfGrad:
      run_f32_vec(a, sa, b, sb, o, n, [](__m256 x, __m256 g) { return _mm256_mul_ps(g, vmath::gelu_erf_grad(x)); });
      return true;
    case BinaryOp::SiluGrad:
      run_f32_vec(a, sa, b, sb, o, n, [](__m256 x, __m256 g) { return _mm256_mul_ps(g, vmath::silu_grad(x)); });
      return true;
    case BinaryOp::SigmoidGrad:
      run_f32_vec(a, sa, b, sb, o, n, [](__m256 x, __m256 g) {
        __m256 s = vmath::sigmoid(x);
        return _mm256_mul_ps(g, _mm256_mul_ps(s, _mm256_sub_ps(_mm256_set1_ps(1.0f), s)));
      });
      return true;
    case BinaryOp::TanhGrad:
      run_f32_vec(a, sa, b, sb, o, n,
                  [](__m256 y, __m256 g) { return _mm256_mul_ps(g, _mm256_fnmadd_ps(y, y, _mm256_set1_ps(1.0f))); });
      return true;
    default:
      return false;
  }
}
#endif

void run_f32(BinaryOp op, const float* a, int64_t sa, const float* b, int64_t sb, float* o, int64_t n) {
#ifdef __AVX2__
  if (run_f32_avx2(op, a, sa, b, sb, o, n)) return;
#endif
  for (int64_t i = 0; i < n; ++i) o[i] = float_op<float>(op, a[i * sa], b[i * sb]);
}

// ---- generic run: one contiguous output run of n elements ---------------------------

template <typename T>
void run(BinaryOp op, const T* a, int64_t sa, const T* b, int64_t sb, void* out, int64_t n) {
  if (bool_output(op)) {
    bool* o = static_cast<bool*>(out);
    if constexpr (std::is_same_v<T, bool>) {
      for (int64_t i = 0; i < n; ++i) o[i] = compare_op<int>(op, a[i * sa], b[i * sb]);
    } else {
      for (int64_t i = 0; i < n; ++i)
        o[i] = compare_op<Compute<T>>(op, detail::load(a[i * sa]), detail::load(b[i * sb]));
    }
    return;
  }
  T* o = static_cast<T*>(out);
  if constexpr (std::is_same_v<T, float>) {
    run_f32(op, a, sa, b, sb, o, n);
  } else if constexpr (std::is_same_v<T, double>) {
    for (int64_t i = 0; i < n; ++i) o[i] = float_op<double>(op, a[i * sa], b[i * sb]);
  } else if constexpr (kIsHalf<T>) {
    // Contiguous operands widen with the vectorized casts (cast_span: bit-identical to
    // load/store), a broadcast one once; the float32 code runs on the blocks.
    constexpr int64_t kBlock = 256;
    float fa[kBlock], fb[kBlock], fo[kBlock];
    auto gather = [](const T* x, int64_t stride, int64_t at, int64_t m, float* f) {
      if (stride == 1)
        cast_span(dtype_v<T>, x + at, DType::Float32, f, m);
      else
        for (int64_t j = 0; j < m; ++j) f[j] = detail::load(x[(at + j) * stride]);
    };
    const int64_t a_step = sa == 0 ? 0 : 1, b_step = sb == 0 ? 0 : 1;
    if (sa == 0) fa[0] = detail::load(a[0]);
    if (sb == 0) fb[0] = detail::load(b[0]);
    for (int64_t i = 0; i < n; i += kBlock) {
      int64_t m = std::min(kBlock, n - i);
      if (sa != 0) gather(a, sa, i, m, fa);
      if (sb != 0) gather(b, sb, i, m, fb);
      run_f32(op, fa, a_step, fb, b_step, fo, m);
      cast_span(DType::Float32, fo, dtype_v<T>, o + i, m);
    }
  } else if constexpr (std::is_same_v<T, bool>) {
    for (int64_t i = 0; i < n; ++i) o[i] = bool_op(op, a[i * sa], b[i * sb]);
  } else {
    if (sa == 1 && sb == 1) {
      for (int64_t i = 0; i < n; ++i) o[i] = int_op<T>(op, a[i], b[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) o[i] = int_op<T>(op, a[i * sa], b[i * sb]);
    }
  }
}

void check_supported(BinaryOp op, DType dtype) {
  if (dtype == DType::Bool) {
    bool ok = bool_output(op) || op == BinaryOp::Add || op == BinaryOp::Mul || op == BinaryOp::Maximum ||
              op == BinaryOp::Minimum;
    if (!ok) fail<DTypeError>("{}: not defined for dtype bool", op_name(op));
  } else if (is_integral(dtype) && is_grad(op)) {
    fail<DTypeError>("{}: not defined for integer dtype {} (cast to a floating dtype first)", op_name(op), name(dtype));
  }
}

void check_strides(std::string_view what, const Shape& shape, DimsRef a, DimsRef b) {
  if (a.size() != shape.size() || b.size() != shape.size())
    fail<ShapeError>("{}: stride ranks do not match the output shape {} (got {} and {})", what, to_string(shape),
                     a.size(), b.size());
}

}  // namespace

void binary(BinaryOp op, DType dtype, const void* a, DimsRef a_strides, const void* b, DimsRef b_strides, void* out,
            const Shape& out_shape) {
  check_strides(op_name(op), out_shape, a_strides, b_strides);
  check_supported(op, dtype);
  SmallDims o_strides;
  contiguous_strides_into(out_shape, o_strides);
  auto layout = detail::collapse<3>(out_shape, {a_strides, b_strides, o_strides});
  if (layout.numel == 0) return;
  const size_t out_size = bool_output(op) ? 1 : itemsize(dtype);
  detail::dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pa = static_cast<const T*>(a);
    const T* pb = static_cast<const T*>(b);
    auto* po = static_cast<unsigned char*>(out);
    const int64_t sa = layout.strides[0].back(), sb = layout.strides[1].back();
    parallel_for(layout.numel, detail::kStreamGrain, [&](int64_t begin, int64_t end) {
      detail::for_each_run<3>(layout, begin, end, [&](const std::array<int64_t, 3>& off, int64_t n) {
        run<T>(op, pa + off[0], sa, pb + off[1], sb, po + off[2] * out_size, n);
      });
    });
  });
}

void binary_span(BinaryOp op, DType dtype, const void* a, int64_t a_stride, const void* b, int64_t b_stride, void* out,
                 int64_t n) {
  check_supported(op, dtype);
  if (n <= 0) return;
  detail::dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    run<T>(op, static_cast<const T*>(a), a_stride, static_cast<const T*>(b), b_stride, out, n);
  });
}

void where(const void* cond, DimsRef cond_strides, DType dtype, const void* a, DimsRef a_strides, const void* b,
           DimsRef b_strides, void* out, const Shape& out_shape) {
  check_strides("where", out_shape, a_strides, b_strides);
  if (cond_strides.size() != out_shape.size())
    fail<ShapeError>("where: condition stride rank does not match the output shape {} (got {})", to_string(out_shape),
                     cond_strides.size());
  SmallDims o_strides;
  contiguous_strides_into(out_shape, o_strides);
  auto layout = detail::collapse<4>(out_shape, {cond_strides, a_strides, b_strides, o_strides});
  if (layout.numel == 0) return;
  detail::dispatch_bytes(dtype, [&](auto tag) {
    using U = typename decltype(tag)::type;
    const bool* pc = static_cast<const bool*>(cond);
    const U* pa = static_cast<const U*>(a);
    const U* pb = static_cast<const U*>(b);
    U* po = static_cast<U*>(out);
    const int64_t sc = layout.strides[0].back(), sa = layout.strides[1].back(), sb = layout.strides[2].back();
    parallel_for(layout.numel, detail::kStreamGrain, [&](int64_t begin, int64_t end) {
      detail::for_each_run<4>(layout, begin, end, [&](const std::array<int64_t, 4>& off, int64_t n) {
        const bool* c = pc + off[0];
        const U* x = pa + off[1];
        const U* y = pb + off[2];
        U* o = po + off[3];
        if (sc == 1 && sa == 1 && sb == 1) {
          for (int64_t i = 0; i < n; ++i) o[i] = c[i] ? x[i] : y[i];
        } else {
          for (int64_t i = 0; i < n; ++i) o[i] = c[i * sc] ? x[i * sa] : y[i * sb];
        }
      });
    });
  });
}

}  // namespace tessera::cpu
