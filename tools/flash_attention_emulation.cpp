// Host emulation of the flash-attention CUDA kernels (src/backend/cuda/kernels/
// flash_attention_*.cu), to run their index math on a machine without a GPU: each CUDA
// thread is a ucontext fiber, scheduled in random order; __syncthreads, warp shuffles,
// mma.sync m16n8k16 and ldmatrix (plain and .trans) are warp / block rendezvous computed
// from the PTX fragment layouts; cp.async copies are deferred to the cp.async.wait_group
// that retires them, with their destination poisoned (NaN) at issue, so a missing wait or
// barrier reads garbage. Checks: alignment of cp.async and ldmatrix addresses, bounds of
// shared memory, copies still in flight at thread exit, divergent collectives, deadlock.
// Runs v1 and v2 (TESSERA_ATTENTION_KERNEL) forward and backward on random problems
// against a float64 reference and prints one line per run; on the problems marked packed,
// v2 also through the strided entry points on the fused-QKV layout (out and dqkv poisoned
// with NaN: every element must be written, and the results must equal the contiguous
// v2's bit for bit), with flash_attention_copy_rows packing and unpacking.
// First, the strided entry points' declines and copy_rows on odd strides.
//
//   g++ -std=c++20 -O2 -I/usr/local/cuda/include -Isrc -Iinclude
//       tools/flash_attention_emulation.cpp -o /tmp/flash_emu && /tmp/flash_emu [N [SEED]]
//
// (N: only the N-th problem, 0 all; SEED: the scheduler's random seed.) About two and a
// half minutes for all; not part of the build: it includes the kernel sources with
// TESSERA_FLASH_HOST_EMULATION defined, which swaps the hardware primitives of
// flash_attention_common.cuh and flash_attention_v2.cuh for the ones here.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <ucontext.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#define __launch_bounds__(...)
#define TESSERA_FLASH_HOST_EMULATION 1

namespace tessera::cuda {
[[noreturn]] void throw_cuda_error(cudaError_t, const char* call, const char*, int) { throw std::runtime_error(call); }
[[noreturn]] void throw_value_error(const std::string& m) { throw std::runtime_error(m); }
[[noreturn]] void throw_dtype_error(const std::string& m) { throw std::runtime_error(m); }
[[noreturn]] void throw_error(const std::string& m) { throw std::runtime_error(m); }
}  // namespace tessera::cuda

namespace emu {

[[noreturn]] void fail(const std::string& m) {
  std::fprintf(stderr, "EMULATION FAILURE: %s\n", m.c_str());
  std::abort();
}

struct Copy {
  uint32_t dst;
  const void* src;
  int bytes;
};

struct Fiber {
  ucontext_t ctx;
  std::vector<char> stack;
  int tid = 0;
  bool done = false;
  std::function<bool()> wait;
  std::vector<std::vector<Copy>> groups;  // committed, oldest first
  std::vector<Copy> open;                 // issued, not committed
};

struct Warp {
  int count = 0;
  uint64_t gen = 0;
  int op = -1;
  uint32_t in[32][10];
  uint32_t out[32][4];
};

struct Block {
  int nthreads = 0;
  std::vector<Fiber> fibers;
  int current = -1;
  int bar_count = 0;
  uint64_t bar_gen = 0;
  std::vector<Warp> warps;
  std::vector<unsigned char> smem;
  int64_t index = 0;
  ucontext_t sched;
};

inline Block* g_block = nullptr;
inline std::mt19937_64 g_rng(12345);
inline std::function<void()> g_entry;

inline Fiber& self() { return g_block->fibers[g_block->current]; }

inline void block_until(std::function<bool()> pred) {
  if (pred()) return;
  self().wait = std::move(pred);
  swapcontext(&self().ctx, &g_block->sched);
}

inline void barrier() {
  Block& b = *g_block;
  const uint64_t my = b.bar_gen;
  if (++b.bar_count == b.nthreads) {
    b.bar_count = 0;
    ++b.bar_gen;
  } else {
    block_until([&b, my] { return b.bar_gen != my; });
  }
}

// A warp collective: every lane deposits n words, the last computes all outputs.
template <class F>
void collective(int op, const uint32_t* in, int n, uint32_t* out, F compute) {
  const int tid = self().tid, lane = tid % 32;
  Warp& w = g_block->warps[tid / 32];
  if (w.count == 0) w.op = op;
  if (w.op != op) fail("warp divergence: different collectives in one warp");
  std::memcpy(w.in[lane], in, n * 4);
  const uint64_t my = w.gen;
  if (++w.count == 32) {
    compute(w);
    w.count = 0;
    ++w.gen;
  } else {
    block_until([&w, my] { return w.gen != my; });
  }
  std::memcpy(out, w.out[lane], 16);
}

inline void poison(uint32_t dst, int bytes) {
  if (dst + bytes > g_block->smem.size()) fail("cp.async out of shared memory");
  std::memset(g_block->smem.data() + dst, 0xff, bytes);  // NaN in bf16/f16
}

inline void perform(const Copy& c) {
  const int size = c.bytes < 0 ? -c.bytes : 16;  // negative: a 4-byte copy of -bytes... see cp_async_4
  if (c.bytes > 0 || c.bytes == -4) {
    std::memcpy(g_block->smem.data() + c.dst, c.src, size == 16 ? 16 : 4);
  } else {
    std::memset(g_block->smem.data() + c.dst, 0, c.bytes == -1 ? 4 : 16);
  }
}

inline void run_block(int64_t index, int threads, size_t smem) {
  Block b;
  b.nthreads = threads;
  b.index = index;
  b.warps.resize((threads + 31) / 32);
  if (threads % 32) fail("partial warp");
  b.smem.resize(smem + 16);
  for (auto& x : b.smem) x = static_cast<unsigned char>(g_rng());  // garbage
  b.fibers.resize(threads);
  g_block = &b;
  for (int i = 0; i < threads; ++i) {
    Fiber& f = b.fibers[i];
    f.tid = i;
    f.stack.resize(1 << 18);
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack.data();
    f.ctx.uc_stack.ss_size = f.stack.size();
    f.ctx.uc_link = &b.sched;
    makecontext(
        &f.ctx,
        +[] {
          g_entry();
          Fiber& me = self();
          if (!me.open.empty() || !me.groups.empty()) fail("cp.async in flight at thread exit");
          me.done = true;
        },
        0);
  }
  std::vector<int> runnable;
  for (;;) {
    runnable.clear();
    bool all_done = true;
    for (int i = 0; i < threads; ++i) {
      Fiber& f = b.fibers[i];
      if (f.done) continue;
      all_done = false;
      if (!f.wait || f.wait()) runnable.push_back(i);
    }
    if (all_done) break;
    if (runnable.empty()) fail("deadlock (divergent barrier or collective)");
    const int pick = runnable[g_rng() % runnable.size()];
    b.current = pick;
    b.fibers[pick].wait = nullptr;
    swapcontext(&b.sched, &b.fibers[pick].ctx);
  }
  g_block = nullptr;
}

inline float bits_to_float(uint16_t h, bool bf16) {
  if (bf16) {
    uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  __half_raw raw;
  raw.x = h;
  return __half2float(__half(raw));
}

}  // namespace emu

namespace tessera::cuda::flash {

inline int thread_index() { return emu::self().tid; }
inline int64_t block_index() { return emu::g_block->index; }
inline int64_t block_index_again() { return emu::g_block->index; }
inline void cta_sync() { emu::barrier(); }
inline unsigned char* dynamic_smem() { return emu::g_block->smem.data(); }

inline float shfl_xor(float v, int mask) {
  uint32_t in, out[4];
  std::memcpy(&in, &v, 4);
  emu::collective(1000 + mask, &in, 1, out, [mask](emu::Warp& w) {
    for (int l = 0; l < 32; ++l) w.out[l][0] = w.in[l ^ mask][0];
  });
  float r;
  std::memcpy(&r, &out[0], 4);
  return r;
}
inline float shfl_idx(float v, int src) {
  uint32_t in[2], out[4];
  std::memcpy(&in[0], &v, 4);
  in[1] = static_cast<uint32_t>(src);
  emu::collective(2000, in, 2, out, [](emu::Warp& w) {
    for (int l = 0; l < 32; ++l) w.out[l][0] = w.in[w.in[l][1] % 32][0];
  });
  float r;
  std::memcpy(&r, &out[0], 4);
  return r;
}

// mma.m16n8k16 from the PTX fragment layout.
inline void mma_emu(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], bool bf16) {
  uint32_t in[10], out[4];
  for (int i = 0; i < 4; ++i) in[i] = a[i];
  in[4] = b[0];
  in[5] = b[1];
  for (int i = 0; i < 4; ++i) std::memcpy(&in[6 + i], &d[i], 4);
  emu::collective(bf16 ? 3000 : 3001, in, 10, out, [bf16](emu::Warp& w) {
    float A[16][16], B[16][8], C[16][8];
    for (int l = 0; l < 32; ++l) {
      const int g = l / 4, t = l % 4;
      const auto lo = [&](uint32_t x) { return emu::bits_to_float(static_cast<uint16_t>(x & 0xffff), bf16); };
      const auto hi = [&](uint32_t x) { return emu::bits_to_float(static_cast<uint16_t>(x >> 16), bf16); };
      A[g][2 * t] = lo(w.in[l][0]);
      A[g][2 * t + 1] = hi(w.in[l][0]);
      A[g + 8][2 * t] = lo(w.in[l][1]);
      A[g + 8][2 * t + 1] = hi(w.in[l][1]);
      A[g][2 * t + 8] = lo(w.in[l][2]);
      A[g][2 * t + 9] = hi(w.in[l][2]);
      A[g + 8][2 * t + 8] = lo(w.in[l][3]);
      A[g + 8][2 * t + 9] = hi(w.in[l][3]);
      B[2 * t][g] = lo(w.in[l][4]);
      B[2 * t + 1][g] = hi(w.in[l][4]);
      B[2 * t + 8][g] = lo(w.in[l][5]);
      B[2 * t + 9][g] = hi(w.in[l][5]);
      float c[4];
      std::memcpy(c, &w.in[l][6], 16);
      C[g][2 * t] = c[0];
      C[g][2 * t + 1] = c[1];
      C[g + 8][2 * t] = c[2];
      C[g + 8][2 * t + 1] = c[3];
    }
    float Dm[16][8];
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 8; ++j) {
        double acc = C[i][j];
        for (int k = 0; k < 16; ++k) acc += static_cast<double>(A[i][k]) * B[k][j];
        Dm[i][j] = static_cast<float>(acc);
      }
    for (int l = 0; l < 32; ++l) {
      const int g = l / 4, t = l % 4;
      const float r[4] = {Dm[g][2 * t], Dm[g][2 * t + 1], Dm[g + 8][2 * t], Dm[g + 8][2 * t + 1]};
      std::memcpy(w.out[l], r, 16);
    }
  });
  std::memcpy(d, out, 16);
}

template <typename T>
inline void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  mma_emu(d, a, b, std::is_same_v<T, __nv_bfloat16>);
}

inline int current_sm_major() { return 9; }

// ---- v2 primitives ----
inline uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(static_cast<const unsigned char*>(p) - emu::g_block->smem.data());
}
inline void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  if (dst % 16) emu::fail("cp.async dst not 16-byte aligned");
  if (reinterpret_cast<uintptr_t>(src) % 16) emu::fail("cp.async src not 16-byte aligned");
  emu::poison(dst, 16);
  emu::self().open.push_back({dst, src, src_bytes});
}
// 4-byte copies are encoded as bytes = -4 (copy) or -1 (zero-fill).
inline void cp_async_4(uint32_t dst, const void* src, int src_bytes) {
  if (dst % 4) emu::fail("cp.async 4 dst misaligned");
  if (reinterpret_cast<uintptr_t>(src) % 4) emu::fail("cp.async 4 src misaligned");
  emu::poison(dst, 4);
  emu::self().open.push_back({dst, src, src_bytes == 4 ? -4 : -1});
}
inline void cp_async_commit() {
  emu::Fiber& f = emu::self();
  f.groups.push_back(std::move(f.open));
  f.open.clear();
}
template <int kPending>
inline void cp_async_wait() {
  emu::Fiber& f = emu::self();
  if (!f.open.empty()) emu::fail("cp.async issued but not committed before a wait");
  while (static_cast<int>(f.groups.size()) > kPending) {
    for (const emu::Copy& c : f.groups.front()) emu::perform(c);
    f.groups.erase(f.groups.begin());
  }
}
inline void ldsm_common(uint32_t (&r)[4], uint32_t addr, bool trans) {
  uint32_t out[4];
  if (addr % 16) emu::fail("ldmatrix row address not 16-byte aligned");
  emu::collective(trans ? 4001 : 4000, &addr, 1, out, [trans](emu::Warp& w) {
    const unsigned char* sm = emu::g_block->smem.data();
    const size_t size = emu::g_block->smem.size();
    const auto elem = [&](int matrix, int row, int col) {
      const uint32_t a = w.in[8 * matrix + row][0] + 2 * col;
      if (a + 2 > size) emu::fail("ldmatrix out of shared memory");
      uint16_t v;
      std::memcpy(&v, sm + a, 2);
      return static_cast<uint32_t>(v);
    };
    for (int l = 0; l < 32; ++l) {
      const int g = l / 4, t = l % 4;
      for (int i = 0; i < 4; ++i) {
        const uint32_t lo = trans ? elem(i, 2 * t, g) : elem(i, g, 2 * t);
        const uint32_t hi = trans ? elem(i, 2 * t + 1, g) : elem(i, g, 2 * t + 1);
        w.out[l][i] = lo | (hi << 16);
      }
    }
  });
  std::memcpy(r, out, 16);
}
inline void ldsm_x4(uint32_t (&r)[4], uint32_t addr) { ldsm_common(r, addr, false); }
inline void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) { ldsm_common(r, addr, true); }
inline int g_max_smem = 227 * 1024;
inline int max_dynamic_smem_per_block() { return g_max_smem; }

}  // namespace tessera::cuda::flash

#include "backend/cuda/kernels/flash_attention_common.cuh"

namespace tessera::cuda::flash {
template <typename P>
void launch(void (*kernel)(P), int64_t blocks, int threads, size_t smem, cudaStream_t, const P& params) {
  for (int64_t blk = 0; blk < blocks; ++blk) {
    emu::g_entry = [kernel, &params] { kernel(params); };
    emu::run_block(blk, threads, smem);
  }
}
}  // namespace tessera::cuda::flash

namespace tessera::cuda {
inline FlashAttentionKernel g_kernel = FlashAttentionKernel::V2;
FlashAttentionKernel flash_attention_kernel() { return g_kernel; }
}  // namespace tessera::cuda

#include "backend/cuda/kernels/flash_attention_backward.cu"
#include "backend/cuda/kernels/flash_attention_backward_generic.cu"
#include "backend/cuda/kernels/flash_attention_backward_tensor_core.cu"
#include "backend/cuda/kernels/flash_attention_forward.cu"
#include "backend/cuda/kernels/flash_attention_forward_v2.cu"
#if __has_include("backend/cuda/kernels/flash_attention_backward_v2.cu")
#include "backend/cuda/kernels/flash_attention_backward_v2.cu"
#endif

// ---------------------------------------------------------------------------------
// Driver: random problems, float64 reference, emulated v1 and v2 (v2 also on the packed
// QKV layout through the strided entry points).

namespace {
using namespace tessera;
using tessera::cuda::FlashAttentionLayout;
using tessera::cuda::FlashAttentionShape;
using tessera::cuda::FlashAttentionStrides;

constexpr uint16_t kPoison = 0xffff;  // NaN in bf16 and f16: an element no kernel wrote

uint16_t to_bits(float x, bool bf16) {
  uint16_t h;
  if (bf16) {
    __nv_bfloat16 b = __float2bfloat16_rn(x);
    std::memcpy(&h, &b, 2);
  } else {
    __half b = __float2half_rn(x);
    std::memcpy(&h, &b, 2);
  }
  return h;
}

struct Problem {
  int B, H, Hkv, T, S, D;
  bool causal;
  bool bf16;
  int documents = 0;    // > 0: T == S tokens packed as this many documents (segment ids)
  bool packed = false;  // v2 also through the packed QKV layout (T == S)
};

double rel(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) && !(std::isinf(a[i]) && a[i] == b[i])) return INFINITY;
    if (std::isinf(b[i])) continue;
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// The inputs (contiguous layouts, 8 elements of slack each) and the GPU's results, in
// the contiguous layouts.
struct Inputs {
  std::vector<uint16_t> q, k, v, dout;
};
struct Results {
  std::vector<uint16_t> out, dq, dk, dv;
  std::vector<float> lse;
};

Results run_contiguous(DType dt, const FlashAttentionShape& sh, const Inputs& in, int64_t nq, int64_t nk,
                       int64_t rows) {
  Results r{std::vector<uint16_t>(nq + 8, kPoison), std::vector<uint16_t>(nq + 8, kPoison),
            std::vector<uint16_t>(nk + 8, kPoison), std::vector<uint16_t>(nk + 8, kPoison),
            std::vector<float>(rows + 4, NAN)};
  std::vector<float> scratch(rows + 4, NAN);
  tessera::cuda::flash_attention_forward(dt, sh, in.q.data(), in.k.data(), in.v.data(), r.out.data(), r.lse.data(),
                                         nullptr);
  // Backward from the GPU's own forward (out rounded as stored).
  tessera::cuda::flash_attention_backward(dt, sh, in.q.data(), in.k.data(), in.v.data(), r.out.data(), r.lse.data(),
                                          in.dout.data(), r.dq.data(), r.dk.data(), r.dv.data(), scratch.data(),
                                          nullptr);
  return r;
}

// Element offsets of rows in the packed layouts, written out as flash_attention.h states
// them (not taken from packed_qkv_attention_layout, which they check): qkv [B, T, Hkv,
// G + 2, D], out / dout [B, T, H, D].
struct PackedOffsets {
  int64_t T, H, G, D, W;  // W = Hkv (G + 2) D
  int64_t q(int64_t b, int64_t h, int64_t t) const { return b * T * W + (h / G) * (G + 2) * D + (h % G) * D + t * W; }
  int64_t k(int64_t b, int64_t kvh, int64_t s) const { return b * T * W + kvh * (G + 2) * D + G * D + s * W; }
  int64_t v(int64_t b, int64_t kvh, int64_t s) const { return k(b, kvh, s) + D; }
  int64_t o(int64_t b, int64_t h, int64_t t) const { return b * T * H * D + h * D + t * H * D; }
};

// v2 through flash_attention_forward_strided / flash_attention_backward_strided on the
// packed layouts (qkv, out, dout, dqkv), the results unpacked into *r. Also checks that
// every element of out and dqkv is written (and nothing past them), and packs the inputs
// and unpacks dq, dk, dv once more with flash_attention_copy_rows. False (with a message)
// on any failure.
bool run_packed(DType dt, const FlashAttentionShape& sh, const Inputs& in, Results* r) {
  using namespace tessera::cuda;
  const int64_t B = sh.batch, H = sh.heads, Hkv = sh.kv_heads, T = sh.q_len, D = sh.head_dim, G = H / Hkv;
  const PackedOffsets pk{T, H, G, D, Hkv * (G + 2) * D};
  const int64_t n_qkv = B * T * pk.W, n_o = B * T * H * D, rows = B * H * T;
  std::vector<uint16_t> qkv(n_qkv + 8, kPoison), dout(n_o + 8, kPoison);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t d = 0; d < D; ++d) {
        for (int64_t h = 0; h < H; ++h) {
          qkv[pk.q(b, h, t) + d] = in.q[((b * H + h) * T + t) * D + d];
          dout[pk.o(b, h, t) + d] = in.dout[((b * H + h) * T + t) * D + d];
        }
        for (int64_t kvh = 0; kvh < Hkv; ++kvh) {
          qkv[pk.k(b, kvh, t) + d] = in.k[((b * Hkv + kvh) * T + t) * D + d];
          qkv[pk.v(b, kvh, t) + d] = in.v[((b * Hkv + kvh) * T + t) * D + d];
        }
      }
  const FlashAttentionLayout layout = packed_qkv_attention_layout(sh), flat = contiguous_attention_layout(sh);
  std::vector<uint16_t> copied(n_qkv + 8, kPoison);
  flash_attention_copy_rows(dt, B, H, G, T, D, in.q.data(), flat.q, copied.data(), layout.q, nullptr);
  flash_attention_copy_rows(dt, B, Hkv, 1, T, D, in.k.data(), flat.kv, copied.data() + G * D, layout.kv, nullptr);
  flash_attention_copy_rows(dt, B, Hkv, 1, T, D, in.v.data(), flat.kv, copied.data() + (G + 1) * D, layout.kv, nullptr);
  if (copied != qkv) {
    std::printf("FAIL flash_attention_copy_rows: contiguous q, k, v -> packed qkv differs\n");
    return false;
  }

  std::vector<uint16_t> out(n_o + 8, kPoison), dqkv(n_qkv + 8, kPoison);
  r->lse.assign(rows + 4, NAN);
  std::vector<float> scratch(rows + 4, NAN);
  const uint16_t *q = qkv.data(), *k = q + G * D, *v = q + (G + 1) * D;
  if (!flash_attention_forward_strided(dt, sh, layout, q, k, v, out.data(), r->lse.data(), nullptr) ||
      !flash_attention_backward_strided(dt, sh, layout, q, k, v, out.data(), r->lse.data(), dout.data(), dqkv.data(),
                                        dqkv.data() + G * D, dqkv.data() + (G + 1) * D, scratch.data(), nullptr)) {
    std::printf("FAIL a strided entry point returned false\n");
    return false;
  }
  const auto unwritten = [](const std::vector<uint16_t>& x, int64_t n) {
    int64_t count = 0;
    for (int64_t i = 0; i < n; ++i) count += x[i] == kPoison;
    for (int64_t i = n; i < n + 8; ++i) count += x[i] != kPoison;  // written past the end
    return count;
  };
  if (const int64_t bad = unwritten(out, n_o) + unwritten(dqkv, n_qkv); bad > 0) {
    std::printf("FAIL %lld elements of out / dqkv not written (or written past the end)\n",
                static_cast<long long>(bad));
    return false;
  }

  r->out.assign(n_o + 8, kPoison);
  r->dq.assign(n_o + 8, kPoison);
  r->dk.assign(B * Hkv * T * D + 8, kPoison);
  r->dv.assign(B * Hkv * T * D + 8, kPoison);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t d = 0; d < D; ++d) {
        for (int64_t h = 0; h < H; ++h) {
          r->out[((b * H + h) * T + t) * D + d] = out[pk.o(b, h, t) + d];
          r->dq[((b * H + h) * T + t) * D + d] = dqkv[pk.q(b, h, t) + d];
        }
        for (int64_t kvh = 0; kvh < Hkv; ++kvh) {
          r->dk[((b * Hkv + kvh) * T + t) * D + d] = dqkv[pk.k(b, kvh, t) + d];
          r->dv[((b * Hkv + kvh) * T + t) * D + d] = dqkv[pk.v(b, kvh, t) + d];
        }
      }
  std::vector<uint16_t> dq(n_o + 8, kPoison), dk(B * Hkv * T * D + 8, kPoison);
  flash_attention_copy_rows(dt, B, H, G, T, D, dqkv.data(), layout.q, dq.data(), flat.q, nullptr);
  flash_attention_copy_rows(dt, B, Hkv, 1, T, D, dqkv.data() + G * D, layout.kv, dk.data(), flat.kv, nullptr);
  if (dq != r->dq || dk != r->dk) {
    std::printf("FAIL flash_attention_copy_rows: packed dqkv -> contiguous dq, dk differs\n");
    return false;
  }
  return true;
}

// The strided entry points decline (false, nothing launched: outputs and scratch
// untouched) where v2 does not apply.
int check_declines() {
  using namespace tessera::cuda;
  FlashAttentionShape sh;
  sh.heads = sh.kv_heads = 2;
  sh.q_len = sh.kv_len = 8;
  sh.head_dim = 64;
  const FlashAttentionLayout good = packed_qkv_attention_layout(sh);
  std::vector<uint16_t> qkv(8 * 2 * 3 * 64 + 64, 0), out(8 * 2 * 64 + 64, 0), dqkv(qkv.size(), kPoison);
  std::vector<float> lse(64, 0.0f), scratch(64, NAN);
  const auto declines = [&](const char* what, DType dt, const FlashAttentionShape& s, const FlashAttentionLayout& l,
                            const uint16_t* q) {
    std::vector<uint16_t> out_p(out.size(), kPoison);
    const bool ran =
        flash_attention_forward_strided(dt, s, l, q, q + 64, q + 128, out_p.data(), lse.data(), nullptr) ||
        flash_attention_backward_strided(dt, s, l, q, q + 64, q + 128, out.data(), lse.data(), out.data(), dqkv.data(),
                                         dqkv.data() + 64, dqkv.data() + 128, scratch.data(), nullptr);
    bool untouched = true;
    for (uint16_t x : out_p) untouched = untouched && x == kPoison;
    for (uint16_t x : dqkv) untouched = untouched && x == kPoison;
    for (float x : scratch) untouched = untouched && std::isnan(x);
    std::printf("%s strided forward and backward decline: %s\n", !ran && untouched ? "ok  " : "FAIL", what);
    return !ran && untouched ? 0 : 1;
  };
  int failures = 0;
  FlashAttentionLayout odd = good;
  odd.kv.row += 4;  // 8 bytes: not 16-byte aligned
  failures += declines("a kv row stride not 16-byte aligned", DType::BFloat16, sh, odd, qkv.data());
  failures += declines("a q pointer not 16-byte aligned", DType::BFloat16, sh, good, qkv.data() + 4);
  failures += declines("float32", DType::Float32, sh, good, qkv.data());
  FlashAttentionShape d32 = sh;
  d32.head_dim = 32;
  failures += declines("head_dim 32", DType::BFloat16, d32, packed_qkv_attention_layout(d32), qkv.data());
  g_kernel = FlashAttentionKernel::V1;
  failures += declines("TESSERA_ATTENTION_KERNEL=v1", DType::BFloat16, sh, good, qkv.data());
  g_kernel = FlashAttentionKernel::V2;
  return failures;
}

// flash_attention_copy_rows where 16-byte units do not fit (2- and 4-byte elements,
// head_dim 5, odd strides): every row lands where the formula says, nothing else moves.
int check_copy_rows() {
  std::mt19937_64 rng(7);
  int failures = 0;
  for (const DType dt : {DType::BFloat16, DType::Float32}) {
    const int64_t batch = 2, heads = 6, group = 3, rows = 5, hd = 5, esize = dt == DType::Float32 ? 4 : 2;
    const FlashAttentionStrides src{heads * rows * hd, group * rows * hd, rows * hd, hd};
    const int64_t W = (heads / group) * (group + 1) * hd + 1;
    const FlashAttentionStrides dst{rows * W + 3, (group + 1) * hd, hd, W};
    const int64_t n_src = batch * heads * rows * hd, n_dst = batch * dst.batch;
    std::vector<unsigned char> from(n_src * esize), to(n_dst * esize, 0xab);
    for (auto& x : from) x = static_cast<unsigned char>(rng());
    tessera::cuda::flash_attention_copy_rows(dt, batch, heads, group, rows, hd, from.data(), src, to.data(), dst,
                                             nullptr);
    std::vector<unsigned char> expect(n_dst * esize, 0xab);
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t t = 0; t < rows; ++t) {
          const auto at = [&](const FlashAttentionStrides& s) {
            return b * s.batch + (h / group) * s.group + (h % group) * s.head + t * s.row;
          };
          std::memcpy(&expect[at(dst) * esize], &from[at(src) * esize], hd * esize);
        }
    const bool ok = to == expect;
    std::printf("%s flash_attention_copy_rows, %lld-byte elements, head_dim %lld, odd strides\n", ok ? "ok  " : "FAIL",
                static_cast<long long>(esize), static_cast<long long>(hd));
    failures += !ok;
  }
  return failures;
}

int run(const Problem& pr, int version, std::mt19937_64& rng) {
  const int64_t nq = int64_t(pr.B) * pr.H * pr.T * pr.D, nk = int64_t(pr.B) * pr.Hkv * pr.S * pr.D;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto make = [&](int64_t n) {
    std::vector<uint16_t> v(n + 8);
    for (int64_t i = 0; i < n; ++i) v[i] = to_bits(nd(rng), pr.bf16);
    return v;
  };
  Inputs in;
  in.q = make(nq);
  in.k = make(nk);
  in.v = make(nk);
  in.dout = make(nq);
  const std::vector<uint16_t>&q = in.q, &k = in.k, &v = in.v, &dout = in.dout;
  auto f = [&](const std::vector<uint16_t>& x, int64_t i) { return double(emu::bits_to_float(x[i], pr.bf16)); };
  const double scale = 1.0 / std::sqrt(double(pr.D));
  // Segment ids [B, T]: documents of unequal lengths, one after the other (row b shifted
  // by b tokens so rows differ).
  std::vector<int32_t> seg;
  for (int b = 0; b < pr.B && pr.documents > 0; ++b)
    for (int t = 0; t < pr.T; ++t)
      seg.push_back(std::min(pr.documents - 1, (t + b) * (t + b) * pr.documents / (pr.T * pr.T)));
  auto hidden = [&](int b, int t, int j) {
    return (pr.causal && j > t) || (!seg.empty() && seg[size_t(b) * pr.T + j] != seg[size_t(b) * pr.T + t]);
  };
  // Reference (float64).
  std::vector<double> out_ref(nq, 0), lse_ref(int64_t(pr.B) * pr.H * pr.T), dq_ref(nq, 0), dk_ref(nk, 0), dv_ref(nk, 0);
  const int G = pr.H / pr.Hkv;
  for (int b = 0; b < pr.B; ++b)
    for (int h = 0; h < pr.H; ++h) {
      const int64_t bh = int64_t(b) * pr.H + h, bkv = int64_t(b) * pr.Hkv + h / G;
      for (int t = 0; t < pr.T; ++t) {
        std::vector<double> s(pr.S), p(pr.S, 0.0);
        double mx = -INFINITY;
        for (int j = 0; j < pr.S; ++j) {
          if (hidden(b, t, j)) {
            s[j] = -INFINITY;
            continue;
          }
          double acc = 0;
          for (int d = 0; d < pr.D; ++d) acc += f(q, (bh * pr.T + t) * pr.D + d) * f(k, (bkv * pr.S + j) * pr.D + d);
          s[j] = acc * scale;
          mx = std::max(mx, s[j]);
        }
        double l = 0;
        for (int j = 0; j < pr.S; ++j) l += s[j] == -INFINITY ? 0.0 : std::exp(s[j] - mx);
        const double lse = l > 0 ? mx + std::log(l) : -INFINITY;
        lse_ref[bh * pr.T + t] = lse;
        for (int j = 0; j < pr.S; ++j) p[j] = (l > 0 && s[j] != -INFINITY) ? std::exp(s[j] - lse) : 0.0;
        double delta = 0;
        std::vector<double> o(pr.D, 0.0);
        for (int d = 0; d < pr.D; ++d) {
          for (int j = 0; j < pr.S; ++j) o[d] += p[j] * f(v, (bkv * pr.S + j) * pr.D + d);
          out_ref[(bh * pr.T + t) * pr.D + d] = o[d];
          delta += o[d] * f(dout, (bh * pr.T + t) * pr.D + d);
        }
        for (int j = 0; j < pr.S; ++j) {
          if (p[j] == 0) continue;
          double dp = 0;
          for (int d = 0; d < pr.D; ++d) dp += f(dout, (bh * pr.T + t) * pr.D + d) * f(v, (bkv * pr.S + j) * pr.D + d);
          const double ds = p[j] * (dp - delta);
          for (int d = 0; d < pr.D; ++d) {
            dq_ref[(bh * pr.T + t) * pr.D + d] += scale * ds * f(k, (bkv * pr.S + j) * pr.D + d);
            dk_ref[(bkv * pr.S + j) * pr.D + d] += scale * ds * f(q, (bh * pr.T + t) * pr.D + d);
            dv_ref[(bkv * pr.S + j) * pr.D + d] += p[j] * f(dout, (bh * pr.T + t) * pr.D + d);
          }
        }
      }
    }
  // Emulated GPU.
  FlashAttentionShape sh;
  sh.batch = pr.B;
  sh.heads = pr.H;
  sh.kv_heads = pr.Hkv;
  sh.q_len = pr.T;
  sh.kv_len = pr.S;
  sh.head_dim = pr.D;
  sh.causal = pr.causal;
  sh.scale = scale;
  sh.segments = seg.empty() ? nullptr : seg.data();
  tessera::cuda::g_kernel =
      version == 1 ? tessera::cuda::FlashAttentionKernel::V1 : tessera::cuda::FlashAttentionKernel::V2;
  const DType dt = pr.bf16 ? DType::BFloat16 : DType::Float16;
  const int64_t rows = int64_t(pr.B) * pr.H * pr.T;
  const Results gpu = run_contiguous(dt, sh, in, nq, nk, rows);
  auto as_double = [&](const std::vector<uint16_t>& x, int64_t n) {
    std::vector<double> r(n);
    for (int64_t i = 0; i < n; ++i) r[i] = f(x, i);
    return r;
  };
  // Prints the line of one run; true when within the tolerances.
  const auto check = [&](const Results& r, const char* what) {
    std::vector<double> lse_d(lse_ref.size());
    for (size_t i = 0; i < lse_d.size(); ++i) lse_d[i] = r.lse[i];
    const double e_out = rel(as_double(r.out, nq), out_ref), e_lse = rel(lse_d, lse_ref),
                 e_dq = rel(as_double(r.dq, nq), dq_ref), e_dk = rel(as_double(r.dk, nk), dk_ref),
                 e_dv = rel(as_double(r.dv, nk), dv_ref);
    const bool ok = e_out < 1e-2 && e_lse < 1e-5 && e_dq < 2e-2 && e_dk < 2e-2 && e_dv < 2e-2;
    std::printf("%s v%d%s B=%d H=%d Hkv=%d T=%d S=%d D=%d %s docs=%d: out %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n",
                ok ? "ok  " : "FAIL", version, what, pr.B, pr.H, pr.Hkv, pr.T, pr.S, pr.D,
                pr.causal ? "causal" : "full", pr.documents, e_out, e_lse, e_dq, e_dk, e_dv);
    return ok;
  };
  int failures = check(gpu, "") ? 0 : 1;
  if (pr.packed && version == 2) {
    Results packed;
    if (!run_packed(dt, sh, in, &packed) || !check(packed, " packed")) return failures + 1;
    // The same kernels on the same values: only the addresses differ.
    const auto same = [](const auto& a, const auto& b, int64_t n) {
      return std::memcmp(a.data(), b.data(), n * sizeof(a[0])) == 0;
    };
    const bool bitwise = same(packed.out, gpu.out, nq) && same(packed.lse, gpu.lse, rows) &&
                         same(packed.dq, gpu.dq, nq) && same(packed.dk, gpu.dk, nk) && same(packed.dv, gpu.dv, nk);
    std::printf("%s v2 packed == v2 contiguous, bit for bit\n", bitwise ? "ok  " : "FAIL");
    failures += !bitwise;
  }
  return failures;
}

}  // namespace

int main(int argc, char** argv) {
  std::mt19937_64 rng(99);
  std::vector<Problem> problems;
  const int which = argc > 1 ? std::atoi(argv[1]) : 0;
  if (argc > 2) emu::g_rng.seed(std::strtoull(argv[2], nullptr, 10));  // another schedule
  for (bool bf16 : {true, false})
    for (int D : {64, 128})
      for (int t : {1, 17, 64, 127, 130})
        for (bool causal : {true, false}) problems.push_back({1, 2, 2, t, t, D, causal, bf16});
  problems.push_back({2, 4, 2, 100, 100, 64, true, true});
  problems.push_back({1, 2, 1, 70, 200, 64, true, true});
  problems.push_back({1, 2, 1, 200, 70, 64, true, true});
  problems.push_back({1, 2, 1, 200, 70, 128, false, false});
  problems.push_back({1, 1, 1, 300, 300, 64, true, true});
  problems.push_back({1, 1, 1, 9, 0, 64, false, true});
  problems.push_back({2, 4, 2, 150, 150, 128, true, false});
  problems.push_back({1, 2, 1, 33, 257, 128, false, true});
  problems.push_back({1, 3, 3, 257, 33, 64, true, false});
  problems.push_back({1, 3, 1, 257, 260, 64, true, true});
  problems.push_back({1, 3, 1, 257, 260, 128, true, true});
  // Packed documents (segment ids): v2 on tensor cores (D = 64, 128), v1 on the fp32
  // kernels (as D = 32 always).
  problems.push_back({2, 2, 1, 150, 150, 64, true, true, 4});
  problems.push_back({1, 2, 2, 70, 70, 32, false, false, 3});
  problems.push_back({1, 2, 1, 100, 100, 128, true, false, 3});
  problems.push_back({1, 2, 2, 90, 90, 64, false, true, 5});
  // The packed QKV layout (flash_attention_*_strided): GPT-2-like (G = 1, D = 64, causal,
  // T not a multiple of 128), grouped-query (G = 2, D = 128), segment ids, float16.
  problems.push_back({2, 3, 3, 200, 200, 64, true, true, 0, true});
  problems.push_back({1, 4, 2, 150, 150, 128, false, true, 0, true});
  problems.push_back({2, 4, 2, 130, 130, 64, true, true, 3, true});
  problems.push_back({1, 2, 1, 70, 70, 128, true, false, 2, true});
  int failures = 0;
  failures += check_declines() + check_copy_rows();
  for (size_t i = 0; i < problems.size(); ++i) {
    if (which > 0 && int(i) + 1 != which) continue;
    for (int version : {1, 2}) failures += run(problems[i], version, rng);
  }
  std::printf("%d failures\n", failures);
  return failures != 0;
}
namespace tessera {
std::string_view name(DType) { return "dtype"; }
}  // namespace tessera
