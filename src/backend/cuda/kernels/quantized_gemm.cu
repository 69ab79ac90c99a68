// The int8 GEMM's kernels (see quantized_gemm.h). Every float operation that decides a
// quantized value or a result is an explicitly rounded intrinsic (__fmul_rn, __fadd_rn,
// __fdiv_rn), so no contraction into an FMA changes a bit against the CPU, and a NaN
// result carries the payload the CPU's (x86's) arithmetic gives it.
#include <cstdint>

#include "backend/cuda/kernels/cuda_check.h"
#include "backend/cuda/kernels/launch_config.h"
#include "backend/cuda/kernels/quantized_gemm.h"
#include "backend/cuda/kernels/reduce_element.cuh"

namespace tessera::cuda {
namespace {

constexpr float kLevels = 127.0f;

template <typename T>
__device__ __forceinline__ float element(const void* base, int64_t i) {
  return reduce_element::load(static_cast<const T*>(base), i);
}

// QuantizedMatmul::rounding_seed on the device.
__device__ __forceinline__ unsigned long long rounding_seed(const DeviceRounding& r) {
  const unsigned long long key = (static_cast<unsigned long long>(r.key[1]) << 32) | r.key[0];
  unsigned long long z =
      key ^ ((static_cast<unsigned long long>(r.salt) << 1 | static_cast<unsigned long long>(r.operand)) *
             0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// cpu::int8_rounding_noise.
__device__ __forceinline__ float rounding_noise(unsigned long long seed, uint32_t p, uint32_t bits) {
  uint32_t h = (bits ^ static_cast<uint32_t>(seed) ^ (p * 0x9e3779b1u)) + static_cast<uint32_t>(seed >> 32);
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return __fmul_rn(static_cast<float>(h >> 8), 1.0f / 16777216.0f);
}

// The CPU's quantize_one.
__device__ __forceinline__ int8_t quantize_one(float x, float inv, bool stochastic, unsigned long long seed,
                                               uint32_t p) {
  float t = __fmul_rn(x, inv);
  if (stochastic) {
    t = floorf(__fadd_rn(t, rounding_noise(seed, p, __float_as_uint(x))));
  } else {
    t = rintf(t);
  }
  if (!(t >= -kLevels)) t = -kLevels;  // NaN (a non-finite line's) -> -127, as the CPU
  if (t > kLevels) t = kLevels;
  return static_cast<int8_t>(t);
}

// The CPU's scale_of: amax over the line and whether every value was finite.
__device__ __forceinline__ void store_scale(float amax, bool finite, float* scale, float* inv) {
  if (!finite) {
    *scale = __int_as_float(0x7fc00000);
    *inv = 0.0f;
  } else if (amax == 0.0f) {
    *scale = 0.0f;
    *inv = 0.0f;
  } else {
    *scale = __fdiv_rn(amax, kLevels);
    *inv = __fdiv_rn(kLevels, amax);
  }
}

// |x| folded into (amax, non-finite flag); max is exact, so any order gives the same.
__device__ __forceinline__ void fold(float x, float& amax, bool& bad) {
  const float a = fabsf(x);
  if (!(a <= 3.402823466e38f))
    bad = true;  // inf or NaN
  else
    amax = fmaxf(amax, a);
}

// Contiguous lines: one block per line, a block-wide max.
template <typename T>
__global__ void row_scales_kernel(const void* x, int64_t lines, int64_t k, float* scale, float* inv) {
  __shared__ float s_amax[32];
  __shared__ int s_bad[32];
  for (int64_t l = blockIdx.x; l < lines; l += gridDim.x) {
    float amax = 0.0f;
    bool bad = false;
    for (int64_t p = threadIdx.x; p < k; p += blockDim.x) fold(element<T>(x, l * k + p), amax, bad);
    for (int off = 16; off > 0; off /= 2) {
      amax = fmaxf(amax, __shfl_down_sync(0xffffffffu, amax, off));
      bad = __shfl_down_sync(0xffffffffu, static_cast<int>(bad), off) != 0 || bad;
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) {
      s_amax[warp] = amax;
      s_bad[warp] = bad;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float total = 0.0f;
      bool any_bad = false;
      for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) {
        total = fmaxf(total, s_amax[w]);
        any_bad = any_bad || s_bad[w] != 0;
      }
      store_scale(total, !any_bad, scale + l, inv + l);
    }
    __syncthreads();
  }
}

// Lines stored as columns: one thread per line, reading rows (coalesced across lines).
template <typename T>
__global__ void column_scales_kernel(const void* x, int64_t lines, int64_t k, float* scale, float* inv) {
  for (int64_t l = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; l < lines;
       l += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float amax = 0.0f;
    bool bad = false;
    for (int64_t p = 0; p < k; ++p) fold(element<T>(x, p * lines + l), amax, bad);
    store_scale(amax, !bad, scale + l, inv + l);
  }
}

// Contiguous lines: one thread per byte of q.
template <typename T>
__global__ void quantize_rows_kernel(const void* x, int64_t lines, int64_t k, const float* inv, DeviceRounding r,
                                     int8_t* q, int64_t k_pad) {
  const unsigned long long seed = r.stochastic ? rounding_seed(r) : 0ull;
  const int64_t total = lines * k_pad;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t l = e / k_pad, p = e % k_pad;
    q[e] = p < k ? quantize_one(element<T>(x, l * k + p), inv[l], r.stochastic, seed, static_cast<uint32_t>(p)) : 0;
  }
}

// Lines stored as columns: 32 x 32 tiles (p, l) read along l, written along p.
template <typename T>
__global__ void quantize_columns_kernel(const void* x, int64_t lines, int64_t k, const float* inv, DeviceRounding r,
                                        int8_t* q, int64_t k_pad) {
  __shared__ int8_t tile[32][33];
  const unsigned long long seed = r.stochastic ? rounding_seed(r) : 0ull;
  const int64_t l0 = static_cast<int64_t>(blockIdx.x) * 32, p0 = static_cast<int64_t>(blockIdx.y) * 32;
  for (int dy = threadIdx.y; dy < 32; dy += blockDim.y) {
    const int64_t p = p0 + dy, l = l0 + threadIdx.x;
    int8_t v = 0;
    if (p < k && l < lines)
      v = quantize_one(element<T>(x, p * lines + l), inv[l], r.stochastic, seed, static_cast<uint32_t>(p));
    tile[dy][threadIdx.x] = v;
  }
  __syncthreads();
  for (int dy = threadIdx.y; dy < 32; dy += blockDim.y) {
    const int64_t l = l0 + dy, p = p0 + threadIdx.x;
    if (l < lines && p < k_pad) q[l * k_pad + p] = tile[threadIdx.x][dy];
  }
}

// One thread per output: the int32 sum over the K words (4 int8 products each).
__global__ void int8_gemm_reference_kernel(const int8_t* qa, const int8_t* qb, int64_t m, int64_t n, int64_t k_pad,
                                           int32_t* acc, int64_t ldc) {
  const int64_t total = m * n;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = e / n, j = e % n;
    const int* a = reinterpret_cast<const int*>(qa + i * k_pad);
    const int* b = reinterpret_cast<const int*>(qb + j * k_pad);
    int sum = 0;
    for (int64_t w = 0; w < k_pad / 4; ++w) sum = __dp4a(a[w], b[w], sum);
    acc[i * ldc + j] = sum;
  }
}

// x86's NaN rule for a two-operand op, which the CPU's results follow: a NaN operand
// comes out quieted with its payload (the first one when both are NaN). CUDA's
// arithmetic returns its canonical NaN instead, so the NaN cases are taken first.
__device__ __forceinline__ float quieted(float x) { return __uint_as_float(__float_as_uint(x) | 0x00400000u); }
__device__ __forceinline__ float x86_mul(float a, float b) {
  if (isnan(a)) return quieted(a);
  if (isnan(b)) return quieted(b);
  return __fmul_rn(a, b);
}
__device__ __forceinline__ float x86_add(float a, float b) {
  if (isnan(a)) return quieted(a);
  if (isnan(b)) return quieted(b);
  return __fadd_rn(a, b);
}

template <typename T>
__global__ void dequantize_kernel(const int32_t* acc, int64_t ldc, const float* sa, const float* sb, int64_t m,
                                  int64_t n, const T* bias, bool bias_first, T* pre, T* c) {
  const int64_t total = m * n;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = e / n, j = e % n;
    float v = x86_mul(x86_mul(__int2float_rn(acc[i * ldc + j]), sa[i]), sb[j]);
    if (bias != nullptr) {
      // The unfused add reads the product rounded to T.
      reduce_element::store(c, e, v);
      const float s = reduce_element::load(c, e), b = reduce_element::load(bias, j);
      v = bias_first ? x86_add(b, s) : x86_add(s, b);
    }
    reduce_element::store(pre != nullptr ? pre : c, e, v);
  }
}

template <typename F>
void dispatch(const char* op, DType dtype, F&& f) {
  switch (dtype) {
    case DType::Float32:
      f(float{});
      break;
    case DType::BFloat16:
      f(bfloat16{});
      break;
    default:
      value_error(op, ": ", name(dtype), " operands (expected float32 or bfloat16)");
  }
}

}  // namespace

void launch_line_scales(DType dtype, const QuantLines& x, float* scale, float* inv, cudaStream_t stream) {
  if (x.lines == 0) return;
  dispatch("quantized_matmul", dtype, [&](auto tag) {
    using T = decltype(tag);
    if (x.contiguous)
      row_scales_kernel<T><<<grid_for(x.lines, 1, 1), kThreadsPerBlock, 0, stream>>>(x.base, x.lines, x.k, scale, inv);
    else
      column_scales_kernel<T><<<grid_for(x.lines), kThreadsPerBlock, 0, stream>>>(x.base, x.lines, x.k, scale, inv);
    TESSERA_CUDA_CHECK(cudaGetLastError());
  });
}

void launch_quantize_lines(DType dtype, const QuantLines& x, const float* inv, const DeviceRounding& rounding,
                           int8_t* q, int64_t k_pad, cudaStream_t stream) {
  if (x.lines == 0 || k_pad == 0) return;
  dispatch("quantized_matmul", dtype, [&](auto tag) {
    using T = decltype(tag);
    if (x.contiguous) {
      quantize_rows_kernel<T><<<grid_for(x.lines * k_pad, 4), kThreadsPerBlock, 0, stream>>>(x.base, x.lines, x.k, inv,
                                                                                             rounding, q, k_pad);
    } else {
      const dim3 grid(static_cast<unsigned>((x.lines + 31) / 32), static_cast<unsigned>((k_pad + 31) / 32));
      quantize_columns_kernel<T><<<grid, dim3(32, 8), 0, stream>>>(x.base, x.lines, x.k, inv, rounding, q, k_pad);
    }
    TESSERA_CUDA_CHECK(cudaGetLastError());
  });
}

void launch_int8_gemm_reference(const int8_t* qa, const int8_t* qb, int64_t m, int64_t n, int64_t k_pad, int32_t* acc,
                                int64_t ldc, cudaStream_t stream) {
  if (m * n == 0) return;
  int8_gemm_reference_kernel<<<grid_for(m * n), kThreadsPerBlock, 0, stream>>>(qa, qb, m, n, k_pad, acc, ldc);
  TESSERA_CUDA_CHECK(cudaGetLastError());
}

void launch_dequantize(DType dtype, const int32_t* acc, int64_t ldc, const float* sa, const float* sb, int64_t m,
                       int64_t n, const QuantizedEpilogue& epilogue, void* c, cudaStream_t stream) {
  if (m * n == 0) return;
  dispatch("quantized_matmul", dtype, [&](auto tag) {
    using T = decltype(tag);
    dequantize_kernel<T><<<grid_for(m * n, 4), kThreadsPerBlock, 0, stream>>>(
        acc, ldc, sa, sb, m, n, static_cast<const T*>(epilogue.bias), epilogue.bias_first,
        static_cast<T*>(epilogue.pre_activation), static_cast<T*>(c));
    TESSERA_CUDA_CHECK(cudaGetLastError());
  });
}

}  // namespace tessera::cuda
