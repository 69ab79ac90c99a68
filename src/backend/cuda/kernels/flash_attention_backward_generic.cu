// Attention backward on CUDA cores in fp32 (any dtype, D <= 256, masks, segment ids): the dQ and
// dK/dV kernels of flash_attention_backward.cu's scheme (see there for the math and
// the order of every sum), and their launch.
#include <algorithm>

#include "backend/cuda/kernels/flash_attention.h"
#include "backend/cuda/kernels/flash_attention_backward_kernels.h"
#include "backend/cuda/kernels/flash_attention_common.cuh"

namespace tessera::cuda::flash {
namespace {

// ---------------------------------------------------------------------------------
// Generic fp32 dQ: 4 warps x 4 query rows per CTA, 32-key tiles (one key per lane for
// the scores and dP, lanes over head_dim for dQ += dS K).

struct BwdQGenericConfig {
  static constexpr int kWarps = 4, kThreads = 32 * kWarps;
  static constexpr int kRowsPerWarp = 4;
  static constexpr int kBM = kWarps * kRowsPerWarp;
  static constexpr int kBN = 32;
  __host__ __device__ static int ld(int D) { return D | 1; }  // odd: column reads across rows are conflict-free
  static size_t smem_bytes(int D) { return sizeof(float) * static_cast<size_t>((2 * kBM + 2 * kBN) * ld(D)); }
};

// (128, 1): with no minimum, ptxas capped the kDPL = 1 instances at 64 registers and
// spilled (a build error, -warn-spills).
template <typename T, int kDPL>
__global__ void __launch_bounds__(128, 1) bwd_dq_generic_kernel(const Params p) {
  using C = BwdQGenericConfig;
  constexpr int kBM = C::kBM, kBN = C::kBN, kRows = C::kRowsPerWarp;
  const int D = p.D, ld = C::ld(D);
  float* sQ = reinterpret_cast<float*>(dynamic_smem());  // [kBM][ld], pre-scaled by `scale`
  float* sdO = sQ + kBM * ld;                            // [kBM][ld]
  float* sK = sdO + kBM * ld;                            // [kBN][ld]
  float* sV = sK + kBN * ld;                             // [kBN][ld]

  const int tid = thread_index(), warp = tid / 32, lane = tid % 32;
  const int64_t BH = p.B * p.H, n_qtiles = ceil_div(p.T, kBM);
  const int64_t bh = block_index() % BH, qt = n_qtiles - 1 - block_index() / BH;
  const int64_t b = bh / p.H, h = bh % p.H, kvh = h / (p.H / p.Hkv);
  const int64_t q0 = qt * kBM, Tq = p.T, S = p.S;
  const int q_valid = static_cast<int>(std::min<int64_t>(Tq - q0, kBM));
  const T* k = static_cast<const T*>(p.k) + (b * p.Hkv + kvh) * S * D;
  const T* v = static_cast<const T*>(p.v) + (b * p.Hkv + kvh) * S * D;
  const uint8_t* mask = p.mask ? p.mask + b * p.mask_b_stride + h * p.mask_h_stride : nullptr;
  const int32_t* seg = p.segments ? p.segments + b * Tq : nullptr;

  load_tile_float(sQ, ld, static_cast<const T*>(p.q) + (bh * Tq + q0) * D, D, kBM, q_valid, p.scale, C::kThreads);
  load_tile_float(sdO, ld, static_cast<const T*>(p.dout) + (bh * Tq + q0) * D, D, kBM, q_valid, 1.0f, C::kThreads);

  float dq[kRows][kDPL], lse[kRows], delta[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t row = q0 + warp * kRows + r;
    lse[r] = row < Tq ? p.lse[bh * Tq + row] : -INFINITY;
    delta[r] = row < Tq ? p.delta[bh * Tq + row] : 0.0f;
#pragma unroll
    for (int i = 0; i < kDPL; ++i) dq[r][i] = 0.0f;
  }

  const int64_t n_ktiles = ceil_div(S, kBN);
  const int64_t kt_end = p.causal ? std::min(n_ktiles, ceil_div(q0 + q_valid, kBN)) : n_ktiles;
  for (int64_t kt = 0; kt < kt_end; ++kt) {
    const int64_t k0 = kt * kBN;
    const int k_valid = static_cast<int>(std::min<int64_t>(S - k0, kBN));
    cta_sync();
    load_tile_float(sK, ld, k + k0 * D, D, kBN, k_valid, 1.0f, C::kThreads);
    load_tile_float(sV, ld, v + k0 * D, D, kBN, k_valid, 1.0f, C::kThreads);
    cta_sync();
    const int64_t key = k0 + lane;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int local = warp * kRows + r;
      const int64_t row = q0 + local;
      if (row >= Tq) continue;  // uniform across the warp
      const bool visible = key < S && lse[r] != -INFINITY && (!p.causal || key <= row) &&
                           (mask == nullptr || mask[row * S + key] != 0) && (seg == nullptr || seg[key] == seg[row]);
      float ds = 0.0f;
      if (visible) {
        const float* qr = sQ + local * ld;
        const float* gr = sdO + local * ld;
        const float* kr = sK + lane * ld;
        const float* vr = sV + lane * ld;
        float s = 0.0f, dpv = 0.0f;
        for (int d = 0; d < D; ++d) {
          s = fmaf(qr[d], kr[d], s);
          dpv = fmaf(gr[d], vr[d], dpv);
        }
        ds = expf(s - lse[r]) * (dpv - delta[r]);
      }
      for (int j = 0; j < kBN; ++j) {
        const float dsj = shfl_idx(ds, j);
        const float* kj = sK + j * ld;
#pragma unroll
        for (int i = 0; i < kDPL; ++i) {
          const int d = lane + 32 * i;
          if (d < D) dq[r][i] = fmaf(dsj, kj[d], dq[r][i]);
        }
      }
    }
  }

  T* dqg = static_cast<T*>(p.dq);
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t row = q0 + warp * kRows + r;
    if (row >= Tq) continue;
#pragma unroll
    for (int i = 0; i < kDPL; ++i) {
      const int d = lane + 32 * i;
      if (d < D) dqg[(bh * Tq + row) * D + d] = from_float<T>(p.scale * dq[r][i]);
    }
  }
}

// ---------------------------------------------------------------------------------
// Generic fp32 dK, dV: one CTA per (batch, kv head, 16-key tile); warp w owns 4 keys
// (accumulators in registers, lanes over head_dim). Per 32-query tile (one query per
// lane for P and dS):
//   dV[key] += sum_q P[q, key] dO[q],  dK[key] += sum_q dS[q, key] Q[q]   (q in lane order)

struct BwdKvGenericConfig {
  static constexpr int kWarps = 4, kThreads = 32 * kWarps;
  static constexpr int kKeysPerWarp = 4;
  static constexpr int kBN = kWarps * kKeysPerWarp;  // keys per CTA
  static constexpr int kBM = 32;                     // queries per step: one per lane
  __host__ __device__ static int ld(int D) { return D | 1; }
  static size_t smem_bytes(int D) {
    return sizeof(float) * (static_cast<size_t>((2 * kBN + 2 * kBM) * ld(D)) + 2 * kBM);
  }
};

template <typename T, int kDPL>
__global__ void __launch_bounds__(128) bwd_dkdv_generic_kernel(const Params p) {
  using C = BwdKvGenericConfig;
  constexpr int kBN = C::kBN, kBM = C::kBM, kKeys = C::kKeysPerWarp;
  const int D = p.D, ld = C::ld(D);
  float* sK = reinterpret_cast<float*>(dynamic_smem());  // [kBN][ld], pre-scaled by `scale`
  float* sV = sK + kBN * ld;                             // [kBN][ld]
  float* sQ = sV + kBN * ld;                             // [kBM][ld]
  float* sdO = sQ + kBM * ld;                            // [kBM][ld]
  float* sLse = sdO + kBM * ld;                          // [kBM]
  float* sDelta = sLse + kBM;                            // [kBM]

  const int tid = thread_index(), warp = tid / 32, lane = tid % 32;
  const int64_t BHkv = p.B * p.Hkv;
  const int64_t bkv = block_index() % BHkv, kt = block_index() / BHkv;
  const int64_t b = bkv / p.Hkv, kvh = bkv % p.Hkv, G = p.H / p.Hkv;
  const int64_t k0 = kt * kBN, Tq = p.T, S = p.S;
  const int k_valid = static_cast<int>(std::min<int64_t>(S - k0, kBN));
  const int64_t kv_offset = (bkv * S + k0) * D;

  // Scores as the CPU backward computes them: q . (scale k).
  load_tile_float(sK, ld, static_cast<const T*>(p.k) + kv_offset, D, kBN, k_valid, p.scale, C::kThreads);
  load_tile_float(sV, ld, static_cast<const T*>(p.v) + kv_offset, D, kBN, k_valid, 1.0f, C::kThreads);

  float dk[kKeys][kDPL], dv[kKeys][kDPL];
#pragma unroll
  for (int j = 0; j < kKeys; ++j)
#pragma unroll
    for (int i = 0; i < kDPL; ++i) dk[j][i] = dv[j][i] = 0.0f;

  const int64_t n_qtiles = ceil_div(Tq, kBM);
  const int64_t qt_begin = p.causal ? k0 / kBM : 0;
  for (int64_t gi = 0; gi < G; ++gi) {
    const int64_t h = kvh * G + gi, bh = b * p.H + h;
    const uint8_t* mask = p.mask ? p.mask + b * p.mask_b_stride + h * p.mask_h_stride : nullptr;
    for (int64_t qt = qt_begin; qt < n_qtiles; ++qt) {
      const int64_t q0 = qt * kBM;
      const int q_valid = static_cast<int>(std::min<int64_t>(Tq - q0, kBM));
      cta_sync();
      load_tile_float(sQ, ld, static_cast<const T*>(p.q) + (bh * Tq + q0) * D, D, kBM, q_valid, 1.0f, C::kThreads);
      load_tile_float(sdO, ld, static_cast<const T*>(p.dout) + (bh * Tq + q0) * D, D, kBM, q_valid, 1.0f, C::kThreads);
      for (int i = tid; i < kBM; i += C::kThreads) {
        sLse[i] = i < q_valid ? p.lse[bh * Tq + q0 + i] : -INFINITY;
        sDelta[i] = i < q_valid ? p.delta[bh * Tq + q0 + i] : 0.0f;
      }
      cta_sync();
      const int64_t query = q0 + lane;  // this lane's query
#pragma unroll
      for (int j = 0; j < kKeys; ++j) {
        const int local = warp * kKeys + j;
        const int64_t key = k0 + local;
        if (key >= S) continue;  // uniform across the warp
        const float lse = sLse[lane];
        const bool visible = lane < q_valid && lse != -INFINITY && (!p.causal || key <= query) &&
                             (mask == nullptr || mask[query * S + key] != 0) &&
                             // Segment ids read through the kernel parameter: a pointer held
                             // across the loops spills a register on sm_80.
                             (p.segments == nullptr || p.segments[b * Tq + key] == p.segments[b * Tq + query]);
        float pr = 0.0f, ds = 0.0f;
        if (visible) {
          const float* qr = sQ + lane * ld;
          const float* gr = sdO + lane * ld;
          const float* kr = sK + local * ld;
          const float* vr = sV + local * ld;
          float s = 0.0f, dpv = 0.0f;
          for (int d = 0; d < D; ++d) {
            s = fmaf(qr[d], kr[d], s);
            dpv = fmaf(gr[d], vr[d], dpv);
          }
          pr = expf(s - lse);
          ds = pr * (dpv - sDelta[lane]);
        }
        for (int qi = 0; qi < kBM; ++qi) {
          const float pq = shfl_idx(pr, qi), dsq = shfl_idx(ds, qi);
          const float* gq = sdO + qi * ld;
          const float* qq = sQ + qi * ld;
#pragma unroll
          for (int i = 0; i < kDPL; ++i) {
            const int d = lane + 32 * i;
            if (d < D) {
              dv[j][i] = fmaf(pq, gq[d], dv[j][i]);
              dk[j][i] = fmaf(dsq, qq[d], dk[j][i]);
            }
          }
        }
      }
    }
  }

  T* dkg = static_cast<T*>(p.dk) + bkv * S * D;
  T* dvg = static_cast<T*>(p.dv) + bkv * S * D;
#pragma unroll
  for (int j = 0; j < kKeys; ++j) {
    const int64_t key = k0 + warp * kKeys + j;
    if (key >= S) continue;
#pragma unroll
    for (int i = 0; i < kDPL; ++i) {
      const int d = lane + 32 * i;
      if (d < D) {
        dkg[key * D + d] = from_float<T>(p.scale * dk[j][i]);
        dvg[key * D + d] = from_float<T>(dv[j][i]);
      }
    }
  }
}

template <typename T, int kDPL>
void launch_generic_backward_dpl(const Params& p, cudaStream_t stream) {
  launch(bwd_dkdv_generic_kernel<T, kDPL>, p.B * p.Hkv * ceil_div(p.S, BwdKvGenericConfig::kBN),
         BwdKvGenericConfig::kThreads, BwdKvGenericConfig::smem_bytes(p.D), stream, p);
  launch(bwd_dq_generic_kernel<T, kDPL>, p.B * p.H * ceil_div(p.T, BwdQGenericConfig::kBM), BwdQGenericConfig::kThreads,
         BwdQGenericConfig::smem_bytes(p.D), stream, p);
}

template <typename T>
void launch_generic_backward(const Params& p, cudaStream_t stream) {
  switch (dims_per_lane(p.D)) {
    case 1:
      launch_generic_backward_dpl<T, 1>(p, stream);
      break;
    case 2:
      launch_generic_backward_dpl<T, 2>(p, stream);
      break;
    case 4:
      launch_generic_backward_dpl<T, 4>(p, stream);
      break;
    default:
      launch_generic_backward_dpl<T, 8>(p, stream);
      break;
  }
}

}  // namespace

void launch_backward_generic(DType dtype, const Params& p, cudaStream_t stream) {
  switch (dtype) {
    case DType::BFloat16:
      launch_generic_backward<__nv_bfloat16>(p, stream);
      break;
    case DType::Float16:
      launch_generic_backward<__half>(p, stream);
      break;
    default:
      launch_generic_backward<float>(p, stream);
      break;
  }
}

}  // namespace tessera::cuda::flash
