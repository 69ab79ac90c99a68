// AdamW updates (see optim.h). Memory bound: 4 reads and 3 writes per element. Every
// arithmetic step is an explicit round-to-nearest intrinsic (fused or not exactly as
// on the CPU), so nvcc's own contraction choices cannot change the result.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>

#include "backend/cuda/kernels/cuda_check.h"
#include "backend/cuda/kernels/launch_config.h"
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
struct Dynamic {
  const void* lr = nullptr;
  const void* step = nullptr;
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

template <typename T>
__device__ __forceinline__ void update_one(const T* p, const T* g, const typename Param<T>::A* m,
                                           const typename Param<T>::A* v, T* po, typename Param<T>::A* mo,
                                           typename Param<T>::A* vo, int64_t i, const Coeffs<typename Param<T>::A>& k) {
  using A = typename Param<T>::A;
  A pn, mn, vn;
  adamw_element(Param<T>::load(p[i]), Param<T>::load(g[i]), m[i], v[i], k, pn, mn, vn);
  mo[i] = mn;
  vo[i] = vn;
  po[i] = Param<T>::store(pn);
}

// Inputs and outputs may alias (in-place update): no __restrict__.
template <typename T>
__global__ void __launch_bounds__(kThreadsPerBlock)
    adamw_kernel(const T* p, const T* g, const typename Param<T>::A* m, const typename Param<T>::A* v, T* po,
                 typename Param<T>::A* mo, typename Param<T>::A* vo, int64_t n, Coeffs<typename Param<T>::A> k,
                 Dynamic d) {
  k = resolve(k, d);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    update_one(p, g, m, v, po, mo, vo, i, k);
}

struct MtMeta {
  void* p[kMtTensors];
  const void* g[kMtTensors];
  float* m[kMtTensors];
  float* v[kMtTensors];
  int64_t n[kMtTensors];
  unsigned char block_tensor[kMtBlocks];
  int block_chunk[kMtBlocks];
};
static_assert(sizeof(MtMeta) + sizeof(Coeffs<float>) + sizeof(Dynamic) < 4000, "multi-tensor launch parameters");
static_assert(kMtTensors <= 256, "block_tensor is a byte");

// One block per (tensor, chunk) pair of the launch.
template <typename T>
__global__ void __launch_bounds__(kMtThreads) adamw_multi_tensor_kernel(MtMeta meta, Coeffs<float> k, Dynamic d) {
  k = resolve(k, d);
  const int t = meta.block_tensor[blockIdx.x];
  const int64_t begin = static_cast<int64_t>(meta.block_chunk[blockIdx.x]) * kMtChunk;
  const int64_t end = std::min(meta.n[t], begin + kMtChunk);
  T* p = static_cast<T*>(meta.p[t]);
  const T* g = static_cast<const T*>(meta.g[t]);
  float* m = meta.m[t];
  float* v = meta.v[t];
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) update_one<T>(p, g, m, v, p, m, v, i, k);
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

template <typename T>
void launch_single(const void* param, const void* grad, const void* m, const void* v, void* param_out, void* m_out,
                   void* v_out, int64_t n, const AdamWHyper& h, cudaStream_t stream) {
  using A = typename Param<T>::A;
  adamw_kernel<T><<<grid_for(n), kThreadsPerBlock, 0, stream>>>(
      static_cast<const T*>(param), static_cast<const T*>(grad), static_cast<const A*>(m), static_cast<const A*>(v),
      static_cast<T*>(param_out), static_cast<A*>(m_out), static_cast<A*>(v_out), n, host_coeffs<A>(h), dynamic_of(h));
  TESSERA_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void launch_multi(const std::vector<AdamWTensor>& tensors, const AdamWHyper& h, cudaStream_t stream) {
  const Coeffs<float> k = host_coeffs<float>(h);
  const Dynamic d = dynamic_of(h);
  MtMeta meta{};
  int tensors_in = 0, blocks_in = 0;
  auto launch = [&] {
    adamw_multi_tensor_kernel<T><<<blocks_in, kMtThreads, 0, stream>>>(meta, k, d);
    TESSERA_CUDA_CHECK(cudaGetLastError());
    blocks_in = 0;
  };
  for (const AdamWTensor& t : tensors) {
    if (t.n == 0) continue;
    meta.p[tensors_in] = t.param;
    meta.g[tensors_in] = t.grad;
    meta.m[tensors_in] = static_cast<float*>(t.m);
    meta.v[tensors_in] = static_cast<float*>(t.v);
    meta.n[tensors_in] = t.n;
    ++tensors_in;
    const int64_t chunks = (t.n + kMtChunk - 1) / kMtChunk;
    for (int64_t c = 0; c < chunks; ++c) {
      meta.block_tensor[blocks_in] = static_cast<unsigned char>(tensors_in - 1);
      meta.block_chunk[blocks_in] = static_cast<int>(c);
      ++blocks_in;
      const bool last_chunk = c == chunks - 1;
      if (blocks_in == kMtBlocks || (tensors_in == kMtTensors && last_chunk)) {
        launch();
        if (last_chunk) {
          tensors_in = 0;
        } else {  // the tensor goes on in the next launch, from slot 0
          const int s = tensors_in - 1;
          meta.p[0] = meta.p[s];
          meta.g[0] = meta.g[s];
          meta.m[0] = meta.m[s];
          meta.v[0] = meta.v[s];
          meta.n[0] = meta.n[s];
          tensors_in = 1;
        }
      }
    }
  }
  if (blocks_in > 0) launch();
}

}  // namespace

void adamw_update(DType dtype, const void* param, const void* grad, const void* m, const void* v, void* param_out,
                  void* m_out, void* v_out, int64_t n, const AdamWHyper& hyper, cudaStream_t stream) {
  if (n < 0) value_error("adamw_update: negative size (got ", n, "; expected >= 0)");
  check_hyper("adamw_update", hyper);
  if (n == 0) return;
  switch (dtype) {
    case DType::Float32:
      return launch_single<float>(param, grad, m, v, param_out, m_out, v_out, n, hyper, stream);
    case DType::BFloat16:
      return launch_single<__nv_bfloat16>(param, grad, m, v, param_out, m_out, v_out, n, hyper, stream);
    case DType::Float16:
      return launch_single<__half>(param, grad, m, v, param_out, m_out, v_out, n, hyper, stream);
    case DType::Float64:
      return launch_single<double>(param, grad, m, v, param_out, m_out, v_out, n, hyper, stream);
    default:
      value_error("adamw_update: param dtype ", name(dtype), " (expected float32, bfloat16, float16 or float64)");
  }
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
  switch (dtype) {
    case DType::Float32:
      return launch_multi<float>(tensors, hyper, stream);
    case DType::BFloat16:
      return launch_multi<__nv_bfloat16>(tensors, hyper, stream);
    case DType::Float16:
      return launch_multi<__half>(tensors, hyper, stream);
    default:
      value_error("adamw_multi_tensor: param dtype ", name(dtype), " (expected float32, bfloat16 or float16)");
  }
}

}  // namespace tessera::cuda
