// Philox-4x32-10 streams on the device (see random.h). One thread per Philox block of
// four 32-bit words (grid-stride over blocks); each block feeds the elements the CPU
// kernel feeds from it. Arithmetic that must match the CPU bitwise is spelled with
// explicit round-to-nearest intrinsics, fused exactly where the CPU build fuses: GCC
// (-O3 -mfma, whose default -ffp-contract=fast applies to C++ in every -std mode)
// compiles `low + span * u` to fma(u, span, low) and `mean + stddev * (r * c)` to
// fma(r * c, stddev, mean) (checked in the disassembly of cpu/kernels/random.cpp).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <numbers>
#include <sstream>
#include <string>
#include <type_traits>

#include "backend/cuda/kernels/cuda_check.h"
#include "backend/cuda/kernels/launch_config.h"
#include "backend/cuda/kernels/random.h"

namespace tessera::cuda {
namespace {

constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // Philox multipliers
constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // Weyl key increments

// philox4x32_10(counter = (block low, block high, c2, 0), key = (k0, k1)).
__device__ __forceinline__ uint4 philox(uint64_t block, uint32_t c2, uint32_t k0, uint32_t k1) {
  uint32_t x0 = static_cast<uint32_t>(block), x1 = static_cast<uint32_t>(block >> 32), x2 = c2, x3 = 0;
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    const uint32_t hi0 = __umulhi(kM0, x0), lo0 = kM0 * x0;
    const uint32_t hi1 = __umulhi(kM1, x2), lo1 = kM1 * x2;
    x0 = hi1 ^ x1 ^ k0;
    x1 = lo1;
    x2 = hi0 ^ x3 ^ k1;
    x3 = lo0;
    k0 += kW0;
    k1 += kW1;
  }
  return make_uint4(x0, x1, x2, x3);
}

__device__ __forceinline__ uint32_t word(const uint4& w, int e) {
  return e == 0 ? w.x : e == 1 ? w.y : e == 2 ? w.z : w.w;
}

// The CPU's uniforms (exact: at most 24 or 53 significant bits times a power of two).
__device__ __forceinline__ float uniform24(uint32_t w) { return __fmul_rn(__uint2float_rn(w >> 8), 0x1p-24f); }
__device__ __forceinline__ float uniform24_open0(uint32_t w) {
  return __fmul_rn(__uint2float_rn((w >> 8) + 1), 0x1p-24f);
}
__device__ __forceinline__ uint64_t bits53(uint32_t a, uint32_t b) {
  return (static_cast<uint64_t>(a) << 21) | (b >> 11);
}
__device__ __forceinline__ double uniform53(uint32_t a, uint32_t b) {
  return __dmul_rn(__ull2double_rn(bits53(a, b)), 0x1p-53);
}
__device__ __forceinline__ double uniform53_open0(uint32_t a, uint32_t b) {
  return __dmul_rn(__ull2double_rn(bits53(a, b) + 1), 0x1p-53);
}

// float32 -> storage (one round to nearest even) and the value that storage holds.
template <typename T>
__device__ __forceinline__ T store_as(float v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(v);
  } else {
    return __float2half_rn(v);
  }
}
template <typename T>
__device__ __forceinline__ float round_trip(float v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(__float2bfloat16_rn(v));
  } else {
    return __half2float(__float2half_rn(v));
  }
}

__device__ __forceinline__ float clampf(float v, float lo, float hi) { return v < lo ? lo : hi < v ? hi : v; }

// Grid-stride loops over Philox blocks (64-bit: streams may exceed 2^32 words).
__device__ __forceinline__ int64_t first_index() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t grid_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

__global__ void __launch_bounds__(kThreadsPerBlock)
    bits_kernel(const uint32_t* __restrict__ key, uint32_t* __restrict__ out, int64_t n) {
  const uint32_t k0 = key[0], k1 = key[1];
  for (int64_t b = first_index(); b < (n + 3) / 4; b += grid_stride()) {
    const uint4 w = philox(static_cast<uint64_t>(b), 0, k0, k1);
    for (int e = 0; e < 4 && 4 * b + e < n; ++e) out[4 * b + e] = word(w, e);
  }
}

__global__ void __launch_bounds__(kThreadsPerBlock)
    split_kernel(const uint32_t* __restrict__ key, uint32_t* __restrict__ keys, int64_t n) {
  const uint32_t k0 = key[0], k1 = key[1];
  for (int64_t j = first_index(); j < n; j += grid_stride()) {
    const uint4 w = philox(static_cast<uint64_t>(j), 1, k0, k1);
    keys[2 * j] = w.x;
    keys[2 * j + 1] = w.y;
  }
}

// float32 / bfloat16 / float16: fma(span, u, lo) in float32, clamped to [clo, chi] before and
// (16-bit types) after the final rounding, as the CPU does.
template <typename T>
__global__ void __launch_bounds__(kThreadsPerBlock)
    uniform_kernel(const uint32_t* __restrict__ key, T* __restrict__ out, int64_t n, float lo, float span, float clo,
                   float chi) {
  const uint32_t k0 = key[0], k1 = key[1];
  for (int64_t b = first_index(); b < (n + 3) / 4; b += grid_stride()) {
    const uint4 w = philox(static_cast<uint64_t>(b), 0, k0, k1);
    for (int e = 0; e < 4 && 4 * b + e < n; ++e) {
      float v = clampf(__fmaf_rn(span, uniform24(word(w, e)), lo), clo, chi);
      if constexpr (!std::is_same_v<T, float>) {
        const float r = round_trip<T>(v);
        v = r > chi ? chi : r < clo ? clo : r;
      }
      out[4 * b + e] = store_as<T>(v);
    }
  }
}

// float64: element i from words 2i, 2i+1 (two elements per block).
__global__ void __launch_bounds__(kThreadsPerBlock)
    uniform_f64_kernel(const uint32_t* __restrict__ key, double* __restrict__ out, int64_t n, double low, double span,
                       double clo, double chi) {
  const uint32_t k0 = key[0], k1 = key[1];
  for (int64_t b = first_index(); b < (n + 1) / 2; b += grid_stride()) {
    const uint4 w = philox(static_cast<uint64_t>(b), 0, k0, k1);
    const double v0 = __fma_rn(span, uniform53(w.x, w.y), low);
    out[2 * b] = v0 < clo ? clo : chi < v0 ? chi : v0;
    if (2 * b + 1 < n) {
      const double v1 = __fma_rn(span, uniform53(w.z, w.w), low);
      out[2 * b + 1] = v1 < clo ? clo : chi < v1 ? chi : v1;
    }
  }
}

// Box-Muller pairs (2k, 2k+1) from words (2k, 2k+1): two pairs per block. log, cos and
// sin are evaluated in double and rounded to float32 (nearly always the correctly
// rounded float result, as glibc's logf / cosf / sinf give on the CPU).
template <typename T>
__global__ void __launch_bounds__(kThreadsPerBlock)
    normal_kernel(const uint32_t* __restrict__ key, T* __restrict__ out, int64_t n, float mean, float stddev) {
  constexpr float kTwoPi = 2.0f * std::numbers::pi_v<float>;
  const uint32_t k0 = key[0], k1 = key[1];
  for (int64_t b = first_index(); b < (n + 3) / 4; b += grid_stride()) {
    const uint4 w = philox(static_cast<uint64_t>(b), 0, k0, k1);
    for (int pair = 0; pair < 2; ++pair) {
      const int64_t i = 4 * b + 2 * pair;
      if (i >= n) break;
      const float log_u = static_cast<float>(log(static_cast<double>(uniform24_open0(word(w, 2 * pair)))));
      const float r = __fsqrt_rn(__fmul_rn(-2.0f, log_u));
      const float theta = __fmul_rn(kTwoPi, uniform24(word(w, 2 * pair + 1)));
      double s, c;
      sincos(static_cast<double>(theta), &s, &c);
      out[i] = store_as<T>(__fmaf_rn(__fmul_rn(r, static_cast<float>(c)), stddev, mean));
      if (i + 1 < n) out[i + 1] = store_as<T>(__fmaf_rn(__fmul_rn(r, static_cast<float>(s)), stddev, mean));
    }
  }
}

// float64: one block = one pair (elements 2b, 2b+1): r from words 0-1, angle from 2-3.
__global__ void __launch_bounds__(kThreadsPerBlock)
    normal_f64_kernel(const uint32_t* __restrict__ key, double* __restrict__ out, int64_t n, double mean,
                      double stddev) {
  constexpr double kTwoPi = 2.0 * std::numbers::pi;
  const uint32_t k0 = key[0], k1 = key[1];
  for (int64_t b = first_index(); b < (n + 1) / 2; b += grid_stride()) {
    const uint4 w = philox(static_cast<uint64_t>(b), 0, k0, k1);
    const double r = __dsqrt_rn(__dmul_rn(-2.0, log(uniform53_open0(w.x, w.y))));
    const double theta = __dmul_rn(kTwoPi, uniform53(w.z, w.w));
    double s, c;
    sincos(theta, &s, &c);
    out[2 * b] = __fma_rn(__dmul_rn(r, c), stddev, mean);
    if (2 * b + 1 < n) out[2 * b + 1] = __fma_rn(__dmul_rn(r, s), stddev, mean);
  }
}

template <typename P>
__device__ __forceinline__ double as_double(P v) {
  if constexpr (std::is_same_v<P, __half>) {
    return __half2float(v);
  } else if constexpr (std::is_same_v<P, __nv_bfloat16>) {
    return __bfloat162float(v);
  } else if constexpr (std::is_same_v<P, bool>) {
    return v ? 1.0 : 0.0;
  } else {
    return static_cast<double>(v);
  }
}

template <typename P>
__global__ void __launch_bounds__(kThreadsPerBlock)
    bernoulli_kernel(const uint32_t* __restrict__ key, const P* __restrict__ p, bool p_scalar, bool* __restrict__ out,
                     int64_t n) {
  const uint32_t k0 = key[0], k1 = key[1];
  for (int64_t b = first_index(); b < (n + 3) / 4; b += grid_stride()) {
    const uint4 w = philox(static_cast<uint64_t>(b), 0, k0, k1);
    for (int e = 0; e < 4 && 4 * b + e < n; ++e) {
      const int64_t i = 4 * b + e;
      const double pi = as_double(p[p_scalar ? 0 : i]);
      out[i] = __dmul_rn(static_cast<double>(word(w, e)), 0x1p-32) < pi;
    }
  }
}

// ---- host side: the CPU's bounds for uniform (backend/cpu/kernels/random.cpp) ----

struct Bounds {
  double lo, hi;
};

double round_to(DType dtype, double v) {
  double slot = 0;  // 8 bytes: holds any float dtype
  store_from_double(dtype, &slot, 0, v);
  return load_as_double(dtype, &slot, 0);
}

// Next representable value of a 16-bit (sign-magnitude) float format toward +/-inf.
double step16(DType dtype, double v, bool up) {
  uint16_t h = 0;
  store_from_double(dtype, &h, 0, v);
  const bool neg = (h & 0x8000) != 0;
  if ((h & 0x7fff) == 0) {
    h = up ? 0x0001 : 0x8001;
  } else if (neg != up) {
    ++h;
  } else {
    --h;
  }
  return load_as_double(dtype, &h, 0);
}

double step(DType dtype, double v, bool up) {
  const double toward = up ? INFINITY : -INFINITY;
  if (dtype == DType::Float64) return std::nextafter(v, toward);
  if (dtype == DType::Float32) return std::nextafter(static_cast<float>(v), static_cast<float>(toward));
  return step16(dtype, v, up);
}

Bounds uniform_bounds(DType dtype, double low, double high) {
  if (!std::isfinite(low) || !std::isfinite(high) || !(low <= high) || !std::isfinite(high - low))
    value_error("random_uniform: need finite low <= high (got low=", low, ", high=", high, ")");
  const double lo_r = round_to(dtype, low);
  if (low == high) return {lo_r, lo_r};
  const double lo = lo_r < low ? step(dtype, lo_r, true) : lo_r;
  const double hi_r = round_to(dtype, high);
  const double hi = hi_r >= high ? step(dtype, hi_r, false) : hi_r;
  if (!(lo <= hi) || !std::isfinite(lo) || !std::isfinite(hi))
    value_error("random_uniform: no ", name(dtype), " value lies in [", low, ", ", high, ")");
  return {lo, hi};
}

void check_args(const char* op, const void* key, const void* out, int64_t n) {
  if (n < 0) value_error(op, ": negative element count (got ", n, "; expected >= 0)");
  if (n > 0 && (out == nullptr || key == nullptr)) value_error(op, ": null key or output buffer for ", n, " elements");
}

void check_float_dtype(const char* op, DType dtype) {
  if (!is_floating(dtype))
    throw_dtype_error(std::string(op) + ": dtype must be floating (got " + std::string(name(dtype)) +
                      "; expected float16, bfloat16, float32 or float64)");
}

}  // namespace

void random_bits(const uint32_t* key, uint32_t* out, int64_t n, cudaStream_t stream) {
  check_args("random_bits", key, out, n);
  if (n == 0) return;
  bits_kernel<<<grid_for((n + 3) / 4), kThreadsPerBlock, 0, stream>>>(key, out, n);
  TESSERA_CUDA_CHECK(cudaGetLastError());
}

void split_key(const uint32_t* key, uint32_t* keys, int64_t n, cudaStream_t stream) {
  check_args("split_key", key, keys, n);
  if (n == 0) return;
  split_kernel<<<grid_for(n), kThreadsPerBlock, 0, stream>>>(key, keys, n);
  TESSERA_CUDA_CHECK(cudaGetLastError());
}

void random_uniform(const uint32_t* key, DType dtype, double low, double high, void* out, int64_t n,
                    cudaStream_t stream) {
  check_float_dtype("random_uniform", dtype);
  check_args("random_uniform", key, out, n);
  const Bounds b = uniform_bounds(dtype, low, high);
  if (n == 0) return;
  if (dtype == DType::Float64) {
    uniform_f64_kernel<<<grid_for((n + 1) / 2), kThreadsPerBlock, 0, stream>>>(key, static_cast<double*>(out), n, low,
                                                                               high - low, b.lo, b.hi);
    TESSERA_CUDA_CHECK(cudaGetLastError());
    return;
  }
  const float lo = static_cast<float>(low), span = static_cast<float>(high - low);
  const float clo = static_cast<float>(b.lo), chi = static_cast<float>(b.hi);
  const unsigned grid = grid_for((n + 3) / 4);
  switch (dtype) {
    case DType::Float32:
      uniform_kernel<float>
          <<<grid, kThreadsPerBlock, 0, stream>>>(key, static_cast<float*>(out), n, lo, span, clo, chi);
      break;
    case DType::BFloat16:
      uniform_kernel<__nv_bfloat16>
          <<<grid, kThreadsPerBlock, 0, stream>>>(key, static_cast<__nv_bfloat16*>(out), n, lo, span, clo, chi);
      break;
    default:
      uniform_kernel<__half>
          <<<grid, kThreadsPerBlock, 0, stream>>>(key, static_cast<__half*>(out), n, lo, span, clo, chi);
      break;
  }
  TESSERA_CUDA_CHECK(cudaGetLastError());
}

void random_normal(const uint32_t* key, DType dtype, double mean, double stddev, void* out, int64_t n,
                   cudaStream_t stream) {
  check_float_dtype("random_normal", dtype);
  check_args("random_normal", key, out, n);
  if (!std::isfinite(mean) || !std::isfinite(stddev) || stddev < 0)
    value_error("random_normal: need finite mean and stddev >= 0 (got mean=", mean, ", stddev=", stddev, ")");
  if (n == 0) return;
  if (dtype == DType::Float64) {
    normal_f64_kernel<<<grid_for((n + 1) / 2), kThreadsPerBlock, 0, stream>>>(key, static_cast<double*>(out), n, mean,
                                                                              stddev);
    TESSERA_CUDA_CHECK(cudaGetLastError());
    return;
  }
  const float m = static_cast<float>(mean), s = static_cast<float>(stddev);
  const unsigned grid = grid_for((n + 3) / 4);
  switch (dtype) {
    case DType::Float32:
      normal_kernel<float><<<grid, kThreadsPerBlock, 0, stream>>>(key, static_cast<float*>(out), n, m, s);
      break;
    case DType::BFloat16:
      normal_kernel<__nv_bfloat16>
          <<<grid, kThreadsPerBlock, 0, stream>>>(key, static_cast<__nv_bfloat16*>(out), n, m, s);
      break;
    default:
      normal_kernel<__half><<<grid, kThreadsPerBlock, 0, stream>>>(key, static_cast<__half*>(out), n, m, s);
      break;
  }
  TESSERA_CUDA_CHECK(cudaGetLastError());
}

void random_bernoulli(const uint32_t* key, DType p_dtype, const void* p, bool p_scalar, bool* out, int64_t n,
                      cudaStream_t stream) {
  check_args("random_bernoulli", key, out, n);
  if (n == 0) return;
  if (p == nullptr) value_error("random_bernoulli: null probability buffer");
  const unsigned grid = grid_for((n + 3) / 4);
  auto launch = [&](auto tag) {
    using P = decltype(tag);
    bernoulli_kernel<P><<<grid, kThreadsPerBlock, 0, stream>>>(key, static_cast<const P*>(p), p_scalar, out, n);
    TESSERA_CUDA_CHECK(cudaGetLastError());
  };
  switch (p_dtype) {
    case DType::Bool:
      return launch(bool{});
    case DType::UInt8:
      return launch(uint8_t{});
    case DType::Int8:
      return launch(int8_t{});
    case DType::UInt32:
      return launch(uint32_t{});
    case DType::Int32:
      return launch(int32_t{});
    case DType::Int64:
      return launch(int64_t{});
    case DType::Float16:
      return launch(__half{});
    case DType::BFloat16:
      return launch(__nv_bfloat16{});
    case DType::Float32:
      return launch(float{});
    case DType::Float64:
      return launch(double{});
  }
  value_error("random_bernoulli: unsupported p dtype ", static_cast<int>(p_dtype));
}

}  // namespace tessera::cuda
