// Private device helpers of the reduction kernels (reduce.cu, column_sum.cu, ordered_sum.cu): the
// accumulator type of each element type, element loads and rounding stores, and the
// reduce ops' identities and combine rules. One definition, so every path of a
// reduction rounds and propagates NaN the same way.
#pragma once

#include <cuda_fp16.h>

#include <limits>
#include <type_traits>

#include "backend/cuda/kernels/reduce.h"

namespace tessera::cuda::reduce_element {

// ---- element access ------------------------------------------------------------

template <typename T>
struct AccOf {
  using type = long long;  // integers and bool: int64, wrapping
};
template <>
struct AccOf<float> {
  using type = float;
};
template <>
struct AccOf<bfloat16> {
  using type = float;
};
template <>
struct AccOf<float16> {
  using type = float;
};
template <>
struct AccOf<double> {
  using type = double;
};
template <typename T>
using Acc = typename AccOf<T>::type;

// A bfloat16 or float16 (T) from its bits, widened to float.
template <typename T>
__device__ __forceinline__ float widen_half(unsigned short bits) {
  if constexpr (std::is_same_v<T, bfloat16>)
    return __uint_as_float(static_cast<unsigned int>(bits) << 16);
  else
    return __half2float(__ushort_as_half(bits));
}

template <typename T>
__device__ __forceinline__ Acc<T> load(const T* x, int64_t i) {
  if constexpr (std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>) {
    return widen_half<T>(reinterpret_cast<const unsigned short*>(x)[i]);
  } else if constexpr (std::is_same_v<T, bool>) {
    return reinterpret_cast<const unsigned char*>(x)[i] != 0 ? 1 : 0;  // any nonzero byte is true
  } else {
    return static_cast<Acc<T>>(x[i]);
  }
}

// float -> bfloat16 bits, round to nearest even (tessera::float_to_bf16).
__device__ __forceinline__ unsigned short bf16_bits(float f) {
  unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<unsigned short>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<unsigned short>(u >> 16);
}

template <typename T>
__device__ __forceinline__ void store(T* out, int64_t i, Acc<T> v) {
  if constexpr (std::is_same_v<T, bfloat16>) {
    reinterpret_cast<unsigned short*>(out)[i] = bf16_bits(v);
  } else if constexpr (std::is_same_v<T, float16>) {
    reinterpret_cast<unsigned short*>(out)[i] = __half_as_ushort(__float2half_rn(v));
  } else if constexpr (std::is_same_v<T, bool>) {
    reinterpret_cast<unsigned char*>(out)[i] = v != 0 ? 1 : 0;
  } else {
    out[i] = static_cast<T>(v);  // integers: the int64 accumulator wraps into T
  }
}

// ---- the reduce ops --------------------------------------------------------------

template <typename A>
__device__ __forceinline__ A identity(ReduceOp op) {
  constexpr bool kFloat = std::is_floating_point_v<A>;
  switch (op) {
    case ReduceOp::Sum:
      return A(0);
    case ReduceOp::Prod:
      return A(1);
    case ReduceOp::Max:
      return kFloat ? -std::numeric_limits<A>::infinity() : std::numeric_limits<A>::lowest();
    case ReduceOp::Min:
      break;
  }
  return kFloat ? std::numeric_limits<A>::infinity() : std::numeric_limits<A>::max();
}

// NaN in either operand wins for Max/Min; integer sums and products wrap.
template <typename A>
__device__ __forceinline__ A combine(ReduceOp op, A a, A b) {
  switch (op) {
    case ReduceOp::Sum:
      if constexpr (std::is_integral_v<A>)
        return static_cast<A>(static_cast<unsigned long long>(a) + static_cast<unsigned long long>(b));
      else
        return a + b;
    case ReduceOp::Prod:
      if constexpr (std::is_integral_v<A>)
        return static_cast<A>(static_cast<unsigned long long>(a) * static_cast<unsigned long long>(b));
      else
        return a * b;
    case ReduceOp::Max:
      return (b > a || b != b) ? b : a;
    case ReduceOp::Min:
      break;
  }
  return (b < a || b != b) ? b : a;
}

}  // namespace tessera::cuda::reduce_element
