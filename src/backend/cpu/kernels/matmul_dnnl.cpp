// oneDNN matmul primitives for bfloat16 GEMM tiles (matmul_dnnl.h).
//
// Measured on one core of a Xeon with AMX (2026-11-27, bench/results/2026-11-27-bf16-gemm.md):
// oneDNN's brgemm AMX kernels run 512x768x256 bf16 tiles at ~800-950 GFLOP/s against
// ~165 GFLOP/s for float32 sgemm, so bf16 compute is ~5x faster than widening.
// A primitive is created per tile shape and layout (the first creation JIT-compiles,
// ~0.3 ms; oneDNN's own cache makes later ones ~5 us) and kept per thread with its
// memory objects, whose data handles are swapped per call.
#include "backend/cpu/kernels/matmul_dnnl.h"

#include <omp.h>

#include <cstring>
#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>

#include "tessera/base/error.h"
#include "tessera/base/flags.h"
#include "tessera/base/signal_mask.h"

namespace tessera::cpu {
namespace {

using dnnl::memory;

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// oneDNN runs its OpenMP team on the calling thread: a team of one, as for sgemm.
void single_threaded_dnnl() {
  thread_local bool set = false;
  if (!set) {
    omp_set_num_threads(1);
    set = true;
  }
}

// A tile's operands: dims and strides of A [m, k], B [k, n], C [m, n] (row-major
// storage of the full problem, transposes as strides).
struct TileKey {
  int64_t m, n, k, lda, ldb, ldc;
  bool trans_a, trans_b, float32_c;
  auto tie() const { return std::tie(m, n, k, lda, ldb, ldc, trans_a, trans_b, float32_c); }
  bool operator<(const TileKey& o) const { return tie() < o.tie(); }
};

struct TileGemm {
  dnnl::matmul primitive;
  memory a, b, c;
  std::string implementation;
};

TileGemm make_tile_gemm(const TileKey& key) {
  const memory::dims a_strides = key.trans_a ? memory::dims{1, key.lda} : memory::dims{key.lda, 1};
  const memory::dims b_strides = key.trans_b ? memory::dims{1, key.ldb} : memory::dims{key.ldb, 1};
  const memory::desc a({key.m, key.k}, memory::data_type::bf16, a_strides);
  const memory::desc b({key.k, key.n}, memory::data_type::bf16, b_strides);
  const memory::desc c({key.m, key.n}, key.float32_c ? memory::data_type::f32 : memory::data_type::bf16,
                       memory::dims{key.ldc, 1});
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), cpu_engine());
  dnnl::engine& engine = cpu_engine();
  return TileGemm{dnnl::matmul(pd), memory(a, engine, DNNL_MEMORY_NONE), memory(b, engine, DNNL_MEMORY_NONE),
                  memory(c, engine, DNNL_MEMORY_NONE), pd.impl_info_str()};
}

TileGemm& tile_gemm(const TileKey& key) {
  thread_local std::map<TileKey, TileGemm> cache;
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, make_tile_gemm(key)).first;
  return it->second;
}

Bf16GemmPath probe() {
  const char* setting = flags::env("TESSERA_CPU_BF16_GEMM");
  const std::string mode = setting && *setting ? setting : "auto";
  if (mode != "auto" && mode != "float32")
    fail<ValueError>("TESSERA_CPU_BF16_GEMM={} (expected auto or float32)", mode);
  if (mode == "float32") return {false, "float32 sgemm on widened operands (TESSERA_CPU_BF16_GEMM=float32)"};
  try {
    single_threaded_dnnl();
    const std::string impl = make_tile_gemm({64, 64, 64, 64, 64, 64, false, false, false}).implementation;
    // brgemm names its ISA: avx512_core_amx(_bf16) for AMX tiles, avx512_core_bf16 for
    // AVX512-BF16; plain avx512_core / avx2 kernels would emulate bf16 (no faster than sgemm).
    const bool native = impl.find("amx") != std::string::npos || impl.find("avx512_core_bf16") != std::string::npos;
    if (native) return {true, fmt::format("oneDNN {} (bf16 operands, float32 accumulation)", impl)};
    return {false,
            fmt::format("float32 sgemm on widened operands (oneDNN offers only {}: no AMX or AVX512-BF16)", impl)};
  } catch (const dnnl::error& e) {
    return {false, fmt::format("float32 sgemm on widened operands (oneDNN bf16 matmul unavailable: {})", e.what())};
  }
}

}  // namespace

const Bf16GemmPath& bf16_gemm_path() {
  static const Bf16GemmPath path = probe();
  return path;
}

void bf16_gemm_tile(const bfloat16* a, const bfloat16* b, void* c, int64_t ldc, bool float32_c, const MatmulShape& sub,
                    const MatmulShape& full) {
  single_threaded_dnnl();
  const TileKey key{sub.m,       sub.n,       sub.k,    sub.trans_a ? full.m : sub.k, sub.trans_b ? sub.k : full.n, ldc,
                    sub.trans_a, sub.trans_b, float32_c};
  try {
    TileGemm& gemm = tile_gemm(key);
    gemm.a.set_data_handle(const_cast<bfloat16*>(a));
    gemm.b.set_data_handle(const_cast<bfloat16*>(b));
    gemm.c.set_data_handle(c);
    thread_local dnnl::stream stream(cpu_engine());
    // No signal frame may land while oneDNN's kernel has rsp in the heap (signal_mask.h).
    const AsyncSignalsBlocked no_signals;
    gemm.primitive.execute(stream, {{DNNL_ARG_SRC, gemm.a}, {DNNL_ARG_WEIGHTS, gemm.b}, {DNNL_ARG_DST, gemm.c}});
    stream.wait();
  } catch (const dnnl::error& e) {
    fail<Error>("matmul: oneDNN bf16 matmul of a {}x{}x{} tile failed ({})", sub.m, sub.n, sub.k, e.what());
  }
}

}  // namespace tessera::cpu
