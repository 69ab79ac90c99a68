// SPMD hello world: x @ x.T on a (data=2, model=4) mesh of 8 devices.
//
// x is f32[N, N] split as P('data', 'model'): device (d, m) holds rows d*N/2 .. and
// columns m*N/4 ... jit partitions the global program: every device multiplies its
// blocks, the partitioner inserts the collectives (an all-gather of x over `data` for
// the right operand, a reduce-scatter over `model` of the partial products) and the
// result stays split as P('data', 'model'). The example prints the per-device program
// with its collectives, times the sharded run, and checks ~1000 entries of the product
// against a float64 dot product on the host (exit status 1 on a mismatch).
//
//   example_parallel_matmul                # N = 8192 on 8 virtual CPU devices
//   example_parallel_matmul --size 512     # smaller
//   TESSERA_CPU_DEVICES=16 example_parallel_matmul   # more devices (the mesh uses 8)
//   mpirun -n 8 example_parallel_matmul    # one process per device
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tessera/spmd/api.h"
#include "tessera/spmd/runtime.h"
#include "tessera/spmd/spmd_executable.h"
#include "tessera/tessera.h"

namespace ts = tessera;
namespace spmd = tessera::spmd;

namespace {

int64_t parse_size(int argc, char** argv) {
  int64_t n = 8192;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--size") == 0 && i + 1 < argc) {
      n = std::atoll(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--size N]   (N a positive multiple of 4, default 8192)\n", argv[0]);
      std::exit(2);
    }
  }
  if (n <= 0 || n % 4 != 0) {
    std::fprintf(stderr, "--size %lld: expected a positive multiple of 4 (the mesh splits x 2 x 4 ways)\n",
                 static_cast<long long>(n));
    std::exit(2);
  }
  return n;
}

// The local shard of y holding global entry (i, j), and the entry's offset in it;
// nullptr when that shard lives in another process.
const float* entry_in_shards(const ts::Array& y, int64_t i, int64_t j) {
  const spmd::Sharding& s = *spmd::sharding_of(y);
  ts::Shape local = s.local_shape(y.shape());
  const std::vector<ts::Array>& shards = spmd::addressable_shards(y);
  for (int d = 0; d < s.mesh().size(); ++d) {
    std::vector<int64_t> off = s.shard_offsets(y.shape(), d);
    if (i < off[0] || i >= off[0] + local[0] || j < off[1] || j >= off[1] + local[1]) continue;
    const ts::Array& shard = shards[static_cast<size_t>(d)];
    if (!shard.valid()) continue;
    return shard.data<float>() + (i - off[0]) * local[1] + (j - off[1]);
  }
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = parse_size(argc, argv);
  // 8 virtual CPU devices unless the environment chose (TESSERA_CPU_DEVICES, mpirun).
  if (std::getenv("TESSERA_CPU_DEVICES") == nullptr && !spmd::is_multi_process()) spmd::set_cpu_devices(8);
  const bool primary = spmd::is_primary_process();

  spmd::Mesh mesh = spmd::Mesh::parse("data=2,model=4");
  spmd::NamedSharding layout(mesh, spmd::P("data", "model"));
  if (primary)
    std::printf("tessera %s: x @ x.T, x f32[%lld, %lld] %s on %s\n", ts::version(), static_cast<long long>(n),
                static_cast<long long>(n), layout.to_string().c_str(), spmd::runtime_description().c_str());

  // Every process draws the same x (counter-based random numbers), so each can check
  // the entries its devices hold.
  ts::Array x = ts::random::uniform(ts::key(0), {n, n}, ts::DType::Float32, -1, 1).eval();
  ts::Array xs = spmd::device_put(x, layout, "x");

  ts::JitOptions options;
  options.name = "parallel_matmul";
  options.out_shardings = {layout.resolve(2, "y")};
  auto f = ts::jit([](const ts::Array& m) { return ts::matmul(m, m.T()); }, options);

  // Lowering compiles the per-device program; the timed call below only runs it.
  ts::Lowered lowered = f.lowered(ts::Tree(xs));
  if (primary) std::printf("\n%s\n", lowered.text().c_str());

  auto start = std::chrono::steady_clock::now();
  ts::Array y = f(xs);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (primary) {
    const spmd::CommStats& comm = lowered.spmd()->last_comm_stats().at(0);
    std::printf("sharded run: %.3f s (%.1f GFLOP/s over all devices; device 0 spent %.3f s in collectives)\n", seconds,
                2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / seconds * 1e-9,
                comm.seconds);
    std::printf("output: %s %s\n", ts::type_string(y).c_str(), spmd::sharding_of(y)->to_string().c_str());
  }

  // ~1000 random entries (and a few diagonal ones) against float64 dot products of x's rows.
  const float* xv = x.data<float>();
  std::mt19937_64 rng(1);
  std::uniform_int_distribution<int64_t> pick(0, n - 1);
  double max_err = 0, max_ref = 0;
  int checked = 0;
  for (int s = 0; s < 1000; ++s) {
    int64_t i = pick(rng), j = s % 100 == 0 ? i : pick(rng);
    const float* got = entry_in_shards(y, i, j);
    if (got == nullptr) continue;  // held by another process, which checks it
    double ref = 0;
    for (int64_t k = 0; k < n; ++k) ref += static_cast<double>(xv[i * n + k]) * static_cast<double>(xv[j * n + k]);
    max_err = std::max(max_err, std::abs(static_cast<double>(*got) - ref));
    max_ref = std::max(max_ref, std::abs(ref));
    ++checked;
  }
  double rel = max_err / std::max(max_ref, 1e-30);
  bool ok = checked > 0 && rel < 1e-4;
  std::printf(
      "%scheck: %d sampled entries vs float64 on the host, max error %.3g (relative %.3g): %s\n",
      spmd::is_multi_process() ? ("[process " + std::to_string(spmd::local_devices().at(0)) + "] ").c_str() : "",
      checked, max_err, rel, ok ? "ok" : "MISMATCH");
  return ok ? 0 : 1;
}
