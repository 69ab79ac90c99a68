// AdamW and Lion updates (see optim.h). Memory bound: AdamW 4 reads and 3 writes per
// element, Lion 3 and 2. Every arithmetic step is an explicit round-to-nearest
// intrinsic (fused or not exactly as on the CPU), so nvcc's own contraction choices
// cannot change the result.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>

#include "backend/cuda/kernels/cuda_check.h"
#include "backend/cuda/kernels/launch_config.h"
#include "backend/cuda/kernels/multi_tensor_chunks.h"
#include "backend/cuda/kernels/optim.h"

namespace tessera::cuda {
namespace {

// Multi-tensor launches: the launch parameters (under the classic 4 KB limit) hold
// kMtTensors tensors' pointers and sizes and kMtBlocks (tensor, chunk) pairs.
constexpr int kMtTensors = 36;
constexpr int kMtBlocks = 320;
constexpr int64_t kMtChunk = 65536;
constexpr int kMtThreads = 512;

template <typename A>
struct Coeffs {
  A lr, b1, b2, one_minus_b1, one_minus_b2, c1, c2, eps, wd;
};

// lr and step on the device (dynamic schedules); lr == nullptr: the coefficients are final.
// grad_scale: a device scalar of the parameters' dtype multiplying each gradient, or nullptr.
struct Dynamic {
  const void* lr = nullptr;
  const void* step = nullptr;
  const void* grad_scale = nullptr;
  int lr_dtype = 0, step_dtype = 0;
  double beta1 = 0, beta2 = 0;
};

// The host's coefficients, exactly as the CPU kernel computes them.
template <typename A>
Coeffs<A> host_coeffs(const AdamWHyper& h) {
  const double c1 = 1.0 / (1.0 - std::pow(h.beta1, static_cast<double>(h.step)));
  const double c2 = 1.0 / (1.0 - std::pow(h.beta2, static_cast<double>(h.step)));
  return {
      static_cast<A>(h.lr),          static_cast<A>(h.beta1), static_cast<A>(h.beta2), static_cast<A>(1.0 - h.beta1),
      static_cast<A>(1.0 - h.beta2), static_cast<A>(c1),      static_cast<A>(c2),      static_cast<A>(h.eps),
      static_cast<A>(h.weight_decay)};
}

// Element 0 of a scalar of any dtype as a double (DType's enumerator order).
__device__ double load_scalar(const void* p, int dtype) {
  switch (static_cast<DType>(dtype)) {
    case DType::Bool:
      return *static_cast<const bool*>(p) ? 1.0 : 0.0;
    case DType::UInt8:
      return *static_cast<const uint8_t*>(p);
    case DType::Int8:
      return *static_cast<const int8_t*>(p);
    case DType::UInt32:
      return *static_cast<const uint32_t*>(p);
    case DType::Int32:
      return *static_cast<const int32_t*>(p);
    case DType::Int64:
      return static_cast<double>(*static_cast<const long long*>(p));
    case DType::Float16:
      return __half2float(*static_cast<const __half*>(p));
    case DType::BFloat16:
      return __bfloat162float(*static_cast<const __nv_bfloat16*>(p));
    case DType::Float32:
      return *static_cast<const float*>(p);
    case DType::Float64:
      return *static_cast<const double*>(p);
  }
  return nan("");
}

// Replaces lr, c1, c2 by their values for the device's lr and step (the CPU's formulas,
// in double). Invalid values poison lr with NaN, so every updated parameter is NaN.
template <typename A>
__device__ Coeffs<A> resolve(Coeffs<A> k, const Dynamic& d) {
  if (d.lr == nullptr) return k;
  const double lr = load_scalar(d.lr, d.lr_dtype);
  const double step_value = load_scalar(d.step, d.step_dtype);
  const long long step = static_cast<long long>(step_value);
  if (!(step_value >= 1.0) || step < 1 || !(lr >= 0.0)) {
    k.lr = static_cast<A>(nan(""));
    return k;
  }
  k.lr = static_cast<A>(lr);
  k.c1 = static_cast<A>(1.0 / (1.0 - pow(d.beta1, static_cast<double>(step))));
  k.c2 = static_cast<A>(1.0 / (1.0 - pow(d.beta2, static_cast<double>(step))));
  return k;
}

// The CPU's AVX2 float32 sequence.
__device__ __forceinline__ void adamw_element(float p, float g, float m, float v, const Coeffs<float>& k, float& po,
                                              float& mo, float& vo) {
  mo = __fmaf_rn(k.b1, m, __fmul_rn(k.one_minus_b1, g));
  vo = __fmaf_rn(k.b2, v, __fmul_rn(__fmul_rn(k.one_minus_b2, g), g));
  const float den = __fadd_rn(__fsqrt_rn(__fmul_rn(vo, k.c2)), k.eps);
  const float upd = __fmaf_rn(k.wd, p, __fdiv_rn(__fmul_rn(mo, k.c1), den));
  po = __fmaf_rn(-k.lr, upd, p);
}

// float64: the same sequence in double (the CPU's scalar loop, which GCC contracts into
// exactly these FMAs: checked in the disassembly of cpu/kernels/optim.cpp).
__device__ __forceinline__ void adamw_element(double p, double g, double m, double v, const Coeffs<double>& k,
                                              double& po, double& mo, double& vo) {
  mo = __fma_rn(k.b1, m, __dmul_rn(k.one_minus_b1, g));
  vo = __fma_rn(k.b2, v, __dmul_rn(__dmul_rn(k.one_minus_b2, g), g));
  const double den = __dadd_rn(__dsqrt_rn(__dmul_rn(vo, k.c2)), k.eps);
  const double upd = __fma_rn(k.wd, p, __ddiv_rn(__dmul_rn(mo, k.c1), den));
  po = __fma_rn(-k.lr, upd, p);
}

// Storage <-> compute type of parameters and gradients.
template <typename T>
struct Param {
  using A = T;
  __device__ static A load(T x) { return x; }
  __device__ static T store(A x) { return x; }
};
template <>
struct Param<__half> {
  using A = float;
  __device__ static A load(__half x) { return __half2float(x); }
  __device__ static __half store(A x) { return __float2half_rn(x); }
};
template <>
struct Param<__nv_bfloat16> {
  using A = float;
  __device__ static A load(__nv_bfloat16 x) { return __bfloat162float(x); }
  __device__ static __nv_bfloat16 store(A x) { return __float2bfloat16_rn(x); }
};

// The gradient times the clip factor, rounded to T as the multiply op rounds it (a 16-bit
// product is exact in float32, so one rounding to T), widened again.
__device__ __forceinline__ float scaled(float g, float s) { return __fmul_rn(g, s); }
__device__ __forceinline__ double scaled(double g, double s) { return __dmul_rn(g, s); }

// The scale as the compute type (1 when there is none: then `scale` is not applied).
template <typename T>
__device__ __forceinline__ typename Param<T>::A load_grad_scale(const Dynamic& d) {
  return d.grad_scale != nullptr ? Param<T>::load(*static_cast<const T*>(d.grad_scale)) : typename Param<T>::A(1);
}

// G: the gradient's storage type (T, or bfloat16/float16 for float32 T; widened exactly).
// One element from its stored values: the gradient widened (and scaled), the update, the
// parameter stored as T.
template <typename T, typename G>
__device__ __forceinline__ void update_value(T p, G g, typename Param<T>::A m, typename Param<T>::A v,
                                             const Coeffs<typename Param<T>::A>& k, bool has_scale,
                                             typename Param<T>::A scale, T& po, typename Param<T>::A& mo,
                                             typename Param<T>::A& vo) {
  typename Param<T>::A gi = Param<G>::load(g), pn;
  if (has_scale) gi = Param<T>::load(Param<T>::store(scaled(gi, scale)));
  adamw_element(Param<T>::load(p), gi, m, v, k, pn, mo, vo);
  po = Param<T>::store(pn);
}

template <typename T, typename G>
__device__ __forceinline__ void update_one(const T* p, const G* g, const typename Param<T>::A* m,
                                           const typename Param<T>::A* v, T* po, typename Param<T>::A* mo,
                                           typename Param<T>::A* vo, int64_t i, const Coeffs<typename Param<T>::A>& k,
                                           bool has_scale, typename Param<T>::A scale) {
  typename Param<T>::A mn, vn;
  T pn;
  update_value<T, G>(p[i], g[i], m[i], v[i], k, has_scale, scale, pn, mn, vn);
  mo[i] = mn;
  vo[i] = vn;
  po[i] = pn;
}

// Inputs and outputs may alias (in-place update): no __restrict__.
template <typename T, typename G>
__global__ void __launch_bounds__(kThreadsPerBlock)
    adamw_kernel(const T* p, const G* g, const typename Param<T>::A* m, const typename Param<T>::A* v, T* po,
                 typename Param<T>::A* mo, typename Param<T>::A* vo, int64_t n, Coeffs<typename Param<T>::A> k,
                 Dynamic d) {
  k = resolve(k, d);
  const bool has_scale = d.grad_scale != nullptr;
  const typename Param<T>::A scale = load_grad_scale<T>(d);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    update_one(p, g, m, v, po, mo, vo, i, k, has_scale, scale);
}

// Four consecutive elements, loaded and stored as one access.
template <typename T>
struct alignas(4 * sizeof(T)) Quad {
  T v[4];
};

__device__ __forceinline__ bool aligned_to(const void* ptr, size_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

// One multi-tensor launch's pointers and (tensor, chunk) pairs; S float32 state
// tensors per parameter (AdamW: m, v; Lion: m).
template <int S>
struct MtMeta {
  void* p[kMtTensors];
  const void* g[kMtTensors];
  float* state[S][kMtTensors];
  int64_t n[kMtTensors];
  unsigned char block_tensor[kMtBlocks];
  int block_chunk[kMtBlocks];
};
static_assert(sizeof(MtMeta<2>) + sizeof(Coeffs<float>) + sizeof(Dynamic) < 4000, "multi-tensor launch parameters");
static_assert(kMtTensors <= 256, "block_tensor is a byte");

// One block per (tensor, chunk) pair of the launch.
template <typename T, typename G>
__global__ void __launch_bounds__(kMtThreads) adamw_multi_tensor_kernel(MtMeta<2> meta, Coeffs<float> k, Dynamic d) {
  k = resolve(k, d);
  const int t = meta.block_tensor[blockIdx.x];
  const int64_t begin = static_cast<int64_t>(meta.block_chunk[blockIdx.x]) * kMtChunk;
  const int64_t end = std::min(meta.n[t], begin + kMtChunk);
  T* p = static_cast<T*>(meta.p[t]);
  const G* g = static_cast<const G*>(meta.g[t]);
  float* m = meta.state[0][t];
  float* v = meta.state[1][t];
  const bool has_scale = d.grad_scale != nullptr;
  const float scale = load_grad_scale<T>(d);
  // Four elements a thread at a time with 16-byte moment loads when the tensor's
  // buffers allow it (chunks start at multiples of kMtChunk, so the alignment of the base
  // pointers decides): more bytes in flight per thread. The same per-element arithmetic.
  const bool vec =
      aligned_to(p, 4 * sizeof(T)) && aligned_to(g, 4 * sizeof(G)) && aligned_to(m, 16) && aligned_to(v, 16);
  int64_t i = begin + threadIdx.x;
  if (vec) {
    const int64_t quads = (end - begin) / 4;
    for (int64_t q = threadIdx.x; q < quads; q += blockDim.x) {
      const int64_t at = begin + 4 * q;
      const Quad<T> pq = *reinterpret_cast<const Quad<T>*>(p + at);
      const Quad<G> gq = *reinterpret_cast<const Quad<G>*>(g + at);
      const float4 mq = *reinterpret_cast<const float4*>(m + at);
      const float4 vq = *reinterpret_cast<const float4*>(v + at);
      const float mi[4] = {mq.x, mq.y, mq.z, mq.w}, vi[4] = {vq.x, vq.y, vq.z, vq.w};
      Quad<T> po;
      float mo[4], vo[4];
#pragma unroll
      for (int e = 0; e < 4; ++e)
        update_value<T, G>(pq.v[e], gq.v[e], mi[e], vi[e], k, has_scale, scale, po.v[e], mo[e], vo[e]);
      *reinterpret_cast<Quad<T>*>(p + at) = po;
      *reinterpret_cast<float4*>(m + at) = make_float4(mo[0], mo[1], mo[2], mo[3]);
      *reinterpret_cast<float4*>(v + at) = make_float4(vo[0], vo[1], vo[2], vo[3]);
    }
    i = begin + 4 * quads + threadIdx.x;  // the tail of a tensor's last chunk
  }
  for (; i < end; i += blockDim.x) update_one<T, G>(p, g, m, v, p, m, v, i, k, has_scale, scale);
}

// One tensor of a multi-tensor launch: parameter, gradient, S state tensors.
template <int S>
struct MtTensor {
  void* p = nullptr;
  const void* g = nullptr;
  void* state[S] = {};
  int64_t n = 0;
};

// The tensors in launches of up to kMtTensors tensors and kMtBlocks chunks of kMtChunk
// elements (multi_tensor_chunks.h): launch(meta, blocks) runs one.
template <int S, typename Launch>
void pack_multi_tensor(const std::vector<MtTensor<S>>& tensors, Launch&& launch) {
  MtMeta<S> meta{};
  pack_chunks(
      tensors.size(), kMtChunk, kMtTensors, kMtBlocks, [&](size_t t) { return tensors[t].n; },
      [&](int slot, size_t t) {
        meta.p[slot] = tensors[t].p;
        meta.g[slot] = tensors[t].g;
        for (int s = 0; s < S; ++s) meta.state[s][slot] = static_cast<float*>(tensors[t].state[s]);
        meta.n[slot] = tensors[t].n;
      },
      [&](int b, int slot, int64_t chunk) {
        meta.block_tensor[b] = static_cast<unsigned char>(slot);
        meta.block_chunk[b] = static_cast<int>(chunk);
      },
      [&](int blocks) { launch(meta, blocks); });
}

void check_hyper(const char* op, const AdamWHyper& h) {
  if (h.lr_device == nullptr) {
    if (h.step < 1) value_error(op, ": step is 1-based (got ", h.step, "; expected >= 1)");
    if (!(h.lr >= 0.0)) value_error(op, ": lr ", h.lr, " (expected >= 0)");
  } else if (h.step_device == nullptr) {
    value_error(op, ": lr_device is set but step_device is not (dynamic schedules need both)");
  }
  if (!(h.beta1 >= 0.0 && h.beta1 < 1.0) || !(h.beta2 >= 0.0 && h.beta2 < 1.0))
    value_error(op, ": betas out of range (got beta1=", h.beta1, ", beta2=", h.beta2, "; expected 0 <= beta < 1)");
  if (!(h.eps >= 0.0)) value_error(op, ": eps must be >= 0 (got ", h.eps, ")");
}

Dynamic dynamic_of(const AdamWHyper& h) {
  Dynamic d;
  d.grad_scale = h.grad_scale_device;
  if (h.lr_device != nullptr) {
    d.lr = h.lr_device;
    d.step = h.step_device;
    d.lr_dtype = static_cast<int>(h.lr_dtype);
    d.step_dtype = static_cast<int>(h.step_dtype);
    d.beta1 = h.beta1;
    d.beta2 = h.beta2;
  }
  return d;
}

template <typename T, typename G>
void launch_single(const void* param, const void* grad, const void* m, const void* v, void* param_out, void* m_out,
                   void* v_out, int64_t n, const AdamWHyper& h, cudaStream_t stream) {
  using A = typename Param<T>::A;
  adamw_kernel<T, G><<<grid_for(n), kThreadsPerBlock, 0, stream>>>(
      static_cast<const T*>(param), static_cast<const G*>(grad), static_cast<const A*>(m), static_cast<const A*>(v),
      static_cast<T*>(param_out), static_cast<A*>(m_out), static_cast<A*>(v_out), n, host_coeffs<A>(h), dynamic_of(h));
  TESSERA_CUDA_CHECK(cudaGetLastError());
}

template <typename T, typename G>
void launch_multi(const std::vector<AdamWTensor>& tensors, const AdamWHyper& h, cudaStream_t stream) {
  const Coeffs<float> k = host_coeffs<float>(h);
  const Dynamic d = dynamic_of(h);
  std::vector<MtTensor<2>> packed;
  packed.reserve(tensors.size());
  for (const AdamWTensor& t : tensors) packed.push_back({t.param, t.grad, {t.m, t.v}, t.n});
  pack_multi_tensor<2>(packed, [&](const MtMeta<2>& meta, int blocks) {
    adamw_multi_tensor_kernel<T, G><<<blocks, kMtThreads, 0, stream>>>(meta, k, d);
    TESSERA_CUDA_CHECK(cudaGetLastError());
  });
}

// ---- Lion ----

template <typename A>
struct LionCoeffs {
  A lr, b1, b2, one_minus_b1, one_minus_b2, wd;
};

// A dynamic lr on the device; nullptr: the coefficients are final.
struct LionDynamic {
  const void* lr = nullptr;
  int lr_dtype = 0;
};
static_assert(sizeof(MtMeta<1>) + sizeof(LionCoeffs<float>) + sizeof(LionDynamic) < 4000,
              "multi-tensor launch parameters");

// The host's coefficients, exactly as the CPU kernel computes them.
template <typename A>
LionCoeffs<A> lion_host_coeffs(const LionHyper& h) {
  return {static_cast<A>(h.lr),          static_cast<A>(h.beta1),       static_cast<A>(h.beta2),
          static_cast<A>(1.0 - h.beta1), static_cast<A>(1.0 - h.beta2), static_cast<A>(h.weight_decay)};
}

// The device's lr, rounded as the CPU rounds it; an lr that is not >= 0 (the CPU
// throws) becomes NaN, so every updated parameter is NaN.
template <typename A>
__device__ LionCoeffs<A> resolve(LionCoeffs<A> k, const LionDynamic& d) {
  if (d.lr == nullptr) return k;
  const double lr = load_scalar(d.lr, d.lr_dtype);
  k.lr = lr >= 0.0 ? static_cast<A>(lr) : static_cast<A>(nan(""));
  return k;
}

// The CPU's sequence (kernels/optim.cpp's lion_span, float32 AVX2 and scalar alike):
//   c = fma(b1, m, (1-b1) g);  m' = fma(b2, m, (1-b2) g);  p' = fma(-lr, fma(wd, p, sign(c)), p)
// sign keeps +-0 and NaN, as the sign op.
__device__ __forceinline__ void lion_element(float p, float g, float m, const LionCoeffs<float>& k, float& po,
                                             float& mo) {
  const float c = __fmaf_rn(k.b1, m, __fmul_rn(k.one_minus_b1, g));
  const float s = c > 0.0f ? 1.0f : c < 0.0f ? -1.0f : c;
  mo = __fmaf_rn(k.b2, m, __fmul_rn(k.one_minus_b2, g));
  po = __fmaf_rn(-k.lr, __fmaf_rn(k.wd, p, s), p);
}

__device__ __forceinline__ void lion_element(double p, double g, double m, const LionCoeffs<double>& k, double& po,
                                             double& mo) {
  const double c = __fma_rn(k.b1, m, __dmul_rn(k.one_minus_b1, g));
  const double s = c > 0.0 ? 1.0 : c < 0.0 ? -1.0 : c;
  mo = __fma_rn(k.b2, m, __dmul_rn(k.one_minus_b2, g));
  po = __fma_rn(-k.lr, __fma_rn(k.wd, p, s), p);
}

template <typename T>
__device__ __forceinline__ void lion_one(const T* p, const T* g, const typename Param<T>::A* m, T* po,
                                         typename Param<T>::A* mo, int64_t i,
                                         const LionCoeffs<typename Param<T>::A>& k) {
  using A = typename Param<T>::A;
  A pn, mn;
  lion_element(Param<T>::load(p[i]), Param<T>::load(g[i]), m[i], k, pn, mn);
  mo[i] = mn;
  po[i] = Param<T>::store(pn);
}

// Inputs and outputs may alias (in-place update): no __restrict__.
template <typename T>
__global__ void __launch_bounds__(kThreadsPerBlock)
    lion_kernel(const T* p, const T* g, const typename Param<T>::A* m, T* po, typename Param<T>::A* mo, int64_t n,
                LionCoeffs<typename Param<T>::A> k, LionDynamic d) {
  k = resolve(k, d);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    lion_one(p, g, m, po, mo, i, k);
}

// One block per (tensor, chunk) pair of the launch.
template <typename T>
__global__ void __launch_bounds__(kMtThreads)
    lion_multi_tensor_kernel(MtMeta<1> meta, LionCoeffs<float> k, LionDynamic d) {
  k = resolve(k, d);
  const int t = meta.block_tensor[blockIdx.x];
  const int64_t begin = static_cast<int64_t>(meta.block_chunk[blockIdx.x]) * kMtChunk;
  const int64_t end = std::min(meta.n[t], begin + kMtChunk);
  T* p = static_cast<T*>(meta.p[t]);
  const T* g = static_cast<const T*>(meta.g[t]);
  float* m = meta.state[0][t];
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) lion_one<T>(p, g, m, p, m, i, k);
}

void check_lion_hyper(const char* op, const LionHyper& h) {
  if (h.lr_device == nullptr && !(h.lr >= 0.0)) value_error(op, ": lr ", h.lr, " (expected >= 0)");
  if (!(h.beta1 >= 0.0 && h.beta1 < 1.0) || !(h.beta2 >= 0.0 && h.beta2 < 1.0))
    value_error(op, ": betas out of range (got beta1=", h.beta1, ", beta2=", h.beta2, "; expected 0 <= beta < 1)");
}

LionDynamic lion_dynamic_of(const LionHyper& h) {
  LionDynamic d;
  if (h.lr_device != nullptr) {
    d.lr = h.lr_device;
    d.lr_dtype = static_cast<int>(h.lr_dtype);
  }
  return d;
}

template <typename T>
void launch_lion_single(const void* param, const void* grad, const void* m, void* param_out, void* m_out, int64_t n,
                        const LionHyper& h, cudaStream_t stream) {
  using A = typename Param<T>::A;
  lion_kernel<T><<<grid_for(n), kThreadsPerBlock, 0, stream>>>(
      static_cast<const T*>(param), static_cast<const T*>(grad), static_cast<const A*>(m), static_cast<T*>(param_out),
      static_cast<A*>(m_out), n, lion_host_coeffs<A>(h), lion_dynamic_of(h));
  TESSERA_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void launch_lion_multi(const std::vector<LionTensor>& tensors, const LionHyper& h, cudaStream_t stream) {
  const LionCoeffs<float> k = lion_host_coeffs<float>(h);
  const LionDynamic d = lion_dynamic_of(h);
  std::vector<MtTensor<1>> packed;
  packed.reserve(tensors.size());
  for (const LionTensor& t : tensors) packed.push_back({t.param, t.grad, {t.m}, t.n});
  pack_multi_tensor<1>(packed, [&](const MtMeta<1>& meta, int blocks) {
    lion_multi_tensor_kernel<T><<<blocks, kMtThreads, 0, stream>>>(meta, k, d);
    TESSERA_CUDA_CHECK(cudaGetLastError());
  });
}

// Calls fn(T{}, G{}) with the CUDA types of `dtype` parameters and their gradients
// (hyper.grad_dtype, unset: the parameters' own; bfloat16/float16 only for float32
// parameters); float64 only kWithF64. Anything else is a ValueError naming `op`.
template <bool kWithF64, typename Fn>
void dispatch_param_grad(const char* op, DType dtype, const AdamWHyper& hyper, Fn&& fn) {
  const DType grad = hyper.grad_dtype.value_or(dtype);
  if (dtype == DType::Float32 && grad == DType::BFloat16) return fn(float{}, __nv_bfloat16{});
  if (dtype == DType::Float32 && grad == DType::Float16) return fn(float{}, __half{});
  if (grad != dtype)
    value_error(op, ": ", name(grad), " gradients for ", name(dtype),
                " parameters (expected the parameter's dtype, or bfloat16/float16 for float32)");
  switch (dtype) {
    case DType::Float32:
      return fn(float{}, float{});
    case DType::BFloat16:
      return fn(__nv_bfloat16{}, __nv_bfloat16{});
    case DType::Float16:
      return fn(__half{}, __half{});
    case DType::Float64:
      if constexpr (kWithF64) return fn(double{}, double{});
      break;
    default:
      break;
  }
  value_error(
      op, ": param dtype ", name(dtype),
      kWithF64 ? " (expected float32, bfloat16, float16 or float64)" : " (expected float32, bfloat16 or float16)");
}

}  // namespace

void adamw_update(DType dtype, const void* param, const void* grad, const void* m, const void* v, void* param_out,
                  void* m_out, void* v_out, int64_t n, const AdamWHyper& hyper, cudaStream_t stream) {
  if (n < 0) value_error("adamw_update: negative size (got ", n, "; expected >= 0)");
  check_hyper("adamw_update", hyper);
  if (n == 0) return;
  dispatch_param_grad<true>("adamw_update", dtype, hyper, [&](auto t, auto g) {
    launch_single<decltype(t), decltype(g)>(param, grad, m, v, param_out, m_out, v_out, n, hyper, stream);
  });
}

void adamw_multi_tensor(DType dtype, const std::vector<AdamWTensor>& tensors, const AdamWHyper& hyper,
                        cudaStream_t stream) {
  check_hyper("adamw_multi_tensor", hyper);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const AdamWTensor& t = tensors[i];
    if (t.n < 0 || t.n / kMtChunk >= (int64_t{1} << 31))
      value_error("adamw_multi_tensor: tensor ", i, " has ", t.n, " elements (expected 0 <= n < 2^47)");
    if (t.n > 0 && (t.param == nullptr || t.grad == nullptr || t.m == nullptr || t.v == nullptr))
      value_error("adamw_multi_tensor: tensor ", i, " has a null pointer");
  }
  dispatch_param_grad<false>("adamw_multi_tensor", dtype, hyper,
                             [&](auto t, auto g) { launch_multi<decltype(t), decltype(g)>(tensors, hyper, stream); });
}

void lion_update(DType dtype, const void* param, const void* grad, const void* m, void* param_out, void* m_out,
                 int64_t n, const LionHyper& hyper, cudaStream_t stream) {
  if (n < 0) value_error("lion_update: negative size (got ", n, "; expected >= 0)");
  check_lion_hyper("lion_update", hyper);
  if (n == 0) return;
  switch (dtype) {
    case DType::Float32:
      return launch_lion_single<float>(param, grad, m, param_out, m_out, n, hyper, stream);
    case DType::BFloat16:
      return launch_lion_single<__nv_bfloat16>(param, grad, m, param_out, m_out, n, hyper, stream);
    case DType::Float16:
      return launch_lion_single<__half>(param, grad, m, param_out, m_out, n, hyper, stream);
    case DType::Float64:
      return launch_lion_single<double>(param, grad, m, param_out, m_out, n, hyper, stream);
    default:
      value_error("lion_update: param dtype ", name(dtype), " (expected float32, bfloat16, float16 or float64)");
  }
}

void lion_multi_tensor(DType dtype, const std::vector<LionTensor>& tensors, const LionHyper& hyper,
                       cudaStream_t stream) {
  check_lion_hyper("lion_multi_tensor", hyper);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const LionTensor& t = tensors[i];
    if (t.n < 0 || t.n / kMtChunk >= (int64_t{1} << 31))
      value_error("lion_multi_tensor: tensor ", i, " has ", t.n, " elements (expected 0 <= n < 2^47)");
    if (t.n > 0 && (t.param == nullptr || t.grad == nullptr || t.m == nullptr))
      value_error("lion_multi_tensor: tensor ", i, " has a null pointer");
  }
  switch (dtype) {
    case DType::Float32:
      return launch_lion_multi<float>(tensors, hyper, stream);
    case DType::BFloat16:
      return launch_lion_multi<__nv_bfloat16>(tensors, hyper, stream);
    case DType::Float16:
      return launch_lion_multi<__half>(tensors, hyper, stream);
    default:
      value_error("lion_multi_tensor: param dtype ", name(dtype), " (expected float32, bfloat16 or float16)");
  }
}

}  // namespace tessera::cuda
