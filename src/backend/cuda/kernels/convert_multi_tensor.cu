// convert_multi_tensor (convert_multi_tensor.h): float32 -> bfloat16 / float16 over
// many tensors. Memory bound: 4 bytes read and 2 written per element.
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/kernels/convert_multi_tensor.h"
#include "backend/cuda/kernels/cuda_check.h"
#include "backend/cuda/kernels/multi_tensor_chunks.h"

namespace tessera::cuda {
namespace {

constexpr int kTensors = 48;
constexpr int kBlocks = 400;
constexpr int64_t kChunk = 65536;
constexpr int kThreads = 256;

struct ConvertMeta {
  const float* src[kTensors];
  unsigned short* dst[kTensors];
  int64_t n[kTensors];
  unsigned char block_tensor[kBlocks];
  int block_chunk[kBlocks];
};
static_assert(sizeof(ConvertMeta) < 4000, "multi-tensor launch parameters");

// The convert kernel's roundings (fusion_codegen_ops.cpp's ts_float_to_bf16 / _f16).
__device__ __forceinline__ unsigned short to_bf16(float f) {
  unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<unsigned short>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<unsigned short>(u >> 16);
}
__device__ __forceinline__ unsigned short to_f16(float f) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}

template <bool Bf16>
__device__ __forceinline__ unsigned short narrow(float f) {
  if constexpr (Bf16) {
    return to_bf16(f);
  } else {
    return to_f16(f);
  }
}

__device__ __forceinline__ unsigned int pack(unsigned short lo, unsigned short hi) {
  return static_cast<unsigned int>(lo) | (static_cast<unsigned int>(hi) << 16);
}

// One block per (tensor, chunk) pair; 8 elements a thread at a time (two 16-byte loads,
// one 16-byte store) where the tensor's pointers allow it.
template <bool Bf16>
__global__ void __launch_bounds__(kThreads) convert_multi_tensor_kernel(ConvertMeta meta) {
  const int t = meta.block_tensor[blockIdx.x];
  const int64_t begin = static_cast<int64_t>(meta.block_chunk[blockIdx.x]) * kChunk;
  const int64_t end = min(meta.n[t], begin + kChunk);
  const float* src = meta.src[t];
  unsigned short* dst = meta.dst[t];
  int64_t i = begin + threadIdx.x;
  if (reinterpret_cast<uintptr_t>(src) % 32 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0) {
    const int64_t octets = (end - begin) / 8;
    for (int64_t o = threadIdx.x; o < octets; o += blockDim.x) {
      const int64_t at = begin + 8 * o;
      const float4 a = *reinterpret_cast<const float4*>(src + at);
      const float4 b = *reinterpret_cast<const float4*>(src + at + 4);
      uint4 out;
      out.x = pack(narrow<Bf16>(a.x), narrow<Bf16>(a.y));
      out.y = pack(narrow<Bf16>(a.z), narrow<Bf16>(a.w));
      out.z = pack(narrow<Bf16>(b.x), narrow<Bf16>(b.y));
      out.w = pack(narrow<Bf16>(b.z), narrow<Bf16>(b.w));
      *reinterpret_cast<uint4*>(dst + at) = out;
    }
    i = begin + 8 * octets + threadIdx.x;  // the tail of the tensor's last chunk
  }
  for (; i < end; i += blockDim.x) dst[i] = narrow<Bf16>(src[i]);
}

}  // namespace

bool convert_multi_tensor(DType from, DType to, const std::vector<ConvertTensor>& tensors, cudaStream_t stream) {
  if (from != DType::Float32 || (to != DType::BFloat16 && to != DType::Float16)) return false;
  const bool bf16 = to == DType::BFloat16;
  ConvertMeta meta{};
  pack_chunks(
      tensors.size(), kChunk, kTensors, kBlocks, [&](size_t t) { return tensors[t].n; },
      [&](int slot, size_t t) {
        meta.src[slot] = static_cast<const float*>(tensors[t].src);
        meta.dst[slot] = static_cast<unsigned short*>(tensors[t].dst);
        meta.n[slot] = tensors[t].n;
      },
      [&](int b, int slot, int64_t chunk) {
        meta.block_tensor[b] = static_cast<unsigned char>(slot);
        meta.block_chunk[b] = static_cast<int>(chunk);
      },
      [&](int blocks) {
        if (bf16) {
          convert_multi_tensor_kernel<true><<<blocks, kThreads, 0, stream>>>(meta);
        } else {
          convert_multi_tensor_kernel<false><<<blocks, kThreads, 0, stream>>>(meta);
        }
        TESSERA_CUDA_CHECK(cudaGetLastError());
      });
  return true;
}

}  // namespace tessera::cuda
