// The NCCL communicator (src/spmd/nccl/communicator_nccl.h).
//
//   * Bootstrap errors (no GPU needed): a missing peer's id times out naming the file, a
//     stale or foreign id file is refused, a peer's abort note ends the wait.
//   * One GPU: a world of one runs every collective through NCCL (device API) and the
//     host API; abort and the timeout make calls throw.
//   * Two or more GPUs in this process (a thread and a communicator per GPU, file
//     bootstrap): every collective against host references; host-API reductions are
//     bitwise the ordered sum ((m0 + m1) + ...) of the CPU runtime, device-API
//     reductions are NCCL's (bitwise for two members, within tolerance beyond), and
//     repeat bitwise; sub-groups through ncclCommSplit and created on first use; a
//     peer's abort ends a waiting rank's collective with its reason.
//   * NcclMultiProcess.*: the same checks, one process per GPU: cmake/gpu_tests.cmake
//     starts two test_cuda processes with --gtest_filter=NcclMultiProcess.*, under
//     mpirun (MPI build) and with the file bootstrap; skipped without a GPU per process.
#include <gtest/gtest.h>

#if TESSERA_HAS_NCCL  // CMake compiles the NCCL communicator only when it found NCCL
#include <fmt/ranges.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/kernels/cuda_check.h"
#include "cuda_test_util.h"
#include "spmd/nccl/communicator_nccl.h"
#include "tessera/base/error.h"

namespace tessera::spmd {
namespace {

namespace fs = std::filesystem;
using cuda_test::DeviceBuffer;

int gpu_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

// A fresh, empty directory (the file bootstrap needs one per run), removed afterwards.
class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    static std::atomic<int> counter{0};
    path_ =
        (fs::temp_directory_path() / fmt::format("tessera-nccl-test-{}-{}-{}", ::getpid(), tag, counter.fetch_add(1)))
            .string();
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Uploads (cudaMemcpy from pageable memory) and poison (cudaMemset) run on the legacy
// default stream, which does not order against the communicator's non-blocking stream.
void settle() { TESSERA_CUDA_CHECK(cudaDeviceSynchronize()); }

std::string error_text(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// ---- bootstrap (no GPU) ----

TEST(NcclBootstrap, MissingPeerTimesOutNamingTheFile) {
  NcclOptions o;
  o.rank = 1;
  o.world_size = 2;
  o.bootstrap = "file";
  TempDir dir("timeout");
  o.bootstrap_dir = dir.path();
  o.bootstrap_timeout_s = 0.3;
  const auto start = std::chrono::steady_clock::now();
  const std::string what = error_text([&] { NcclCommunicator comm(o); });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_TRUE(contains(what, "nccl-world.id")) << what;
  EXPECT_TRUE(contains(what, "rank 0")) << what;
  EXPECT_LT(seconds, 20.0);
  // It tells the (absent) peers: an abort note is left in the directory.
  EXPECT_TRUE(fs::exists(fs::path(o.bootstrap_dir) / "abort"));
}

TEST(NcclBootstrap, StaleIdFileIsRefused) {
  NcclOptions o;
  o.rank = 0;
  o.world_size = 2;
  o.bootstrap = "file";
  TempDir dir("stale");
  o.bootstrap_dir = dir.path();
  std::ofstream(fs::path(o.bootstrap_dir) / "nccl-world.id") << "left over";
  const std::string what = error_text([&] { NcclCommunicator comm(o); });
  EXPECT_TRUE(contains(what, "already exists")) << what;
}

TEST(NcclBootstrap, ForeignIdFileIsRejected) {
  NcclOptions o;
  o.rank = 1;
  o.world_size = 2;
  o.bootstrap = "file";
  TempDir dir("foreign");
  o.bootstrap_dir = dir.path();
  o.bootstrap_timeout_s = 5;
  std::ofstream(fs::path(o.bootstrap_dir) / "nccl-world.id") << "not an id";
  const std::string what = error_text([&] { NcclCommunicator comm(o); });
  EXPECT_TRUE(contains(what, "not an id file")) << what;
}

TEST(NcclBootstrap, PeerAbortEndsTheWait) {
  NcclOptions o;
  o.rank = 1;
  o.world_size = 2;
  o.bootstrap = "file";
  TempDir dir("abort");
  o.bootstrap_dir = dir.path();
  o.bootstrap_timeout_s = 60;
  std::ofstream(fs::path(o.bootstrap_dir) / "abort") << "rank 0: no GPU here";
  const auto start = std::chrono::steady_clock::now();
  const std::string what = error_text([&] { NcclCommunicator comm(o); });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_TRUE(contains(what, "rank 0: no GPU here")) << what;
  EXPECT_LT(seconds, 20.0);
}

TEST(NcclBootstrap, BadOptions) {
  if (std::getenv("TESSERA_NCCL_BOOTSTRAP_DIR") != nullptr) GTEST_SKIP() << "TESSERA_NCCL_BOOTSTRAP_DIR is set";
  NcclOptions o;
  o.rank = 0;
  o.world_size = 2;
  o.bootstrap = "file";
  EXPECT_TRUE(contains(error_text([&] { NcclCommunicator comm(o); }), "TESSERA_NCCL_BOOTSTRAP_DIR"));
  o.rank = 2;
  TempDir dir("bad");
  o.bootstrap_dir = dir.path();
  EXPECT_TRUE(contains(error_text([&] { NcclCommunicator comm(o); }), "rank 2 of a world of 2"));
  o.rank = 0;
  o.bootstrap = "tcp";
  EXPECT_TRUE(contains(error_text([&] { NcclCommunicator comm(o); }), "unknown bootstrap 'tcp'"));
}

// ---- references ----

// Member `device`'s input (fresh per test through `salt`), float32 or rounded to bf16.
std::vector<float> input(int device, size_t count, uint64_t salt) {
  return cuda_test::random_floats(count, salt * 7919 + static_cast<uint64_t>(device) + 1);
}

std::vector<char> as_bytes(const std::vector<float>& v, DType dtype) {
  std::vector<char> out(v.size() * itemsize(dtype));
  if (dtype == DType::Float32) {
    std::memcpy(out.data(), v.data(), out.size());
  } else {
    const std::vector<bfloat16> h = cuda_test::to_bf16(v);
    std::memcpy(out.data(), h.data(), out.size());
  }
  return out;
}

std::vector<float> as_floats(const std::vector<char>& bytes, DType dtype) {
  const size_t n = bytes.size() / itemsize(dtype);
  std::vector<float> out(n);
  if (dtype == DType::Float32) {
    std::memcpy(out.data(), bytes.data(), bytes.size());
  } else {
    std::vector<bfloat16> h(n);
    std::memcpy(h.data(), bytes.data(), bytes.size());
    out = cuda_test::from_bf16(h);
  }
  return out;
}

// ((m0 + m1) + m2) + ... over `group` of elements [offset, offset + count) of each
// member's input, with add_into: the CPU runtime's result.
std::vector<char> ordered_sum(const std::vector<int>& group, size_t total, size_t offset, size_t count, DType dtype,
                              uint64_t salt) {
  const size_t item = itemsize(dtype);
  std::vector<char> acc;
  for (int member : group) {
    const std::vector<char> all = as_bytes(input(member, total, salt), dtype);
    std::vector<char> part(all.begin() + static_cast<std::ptrdiff_t>(offset * item),
                           all.begin() + static_cast<std::ptrdiff_t>((offset + count) * item));
    if (acc.empty())
      acc = part;
    else
      add_into(acc.data(), part.data(), count, dtype);
  }
  return acc;
}

template <typename T>
std::vector<T> download(NcclCommunicator& comm, const DeviceBuffer<T>& buffer) {
  comm.synchronize();  // abort-aware; download() then finds the device idle
  return buffer.download();
}

// Failures of one rank (gtest assertions are not thread-aware across our ranks: collect,
// then report on the main thread).
struct Log {
  int rank = 0;
  std::vector<std::string> failures;
  void expect(bool ok, const std::string& what) {
    if (!ok) failures.push_back(fmt::format("rank {}: {}", rank, what));
  }
};

// Device-API reduction result vs the ordered sum: bitwise for two members (one addition,
// commutative), within the dtype's tolerance beyond.
void expect_sum(Log& log, const std::vector<char>& got, const std::vector<char>& ref, size_t members, DType dtype,
                const std::string& what) {
  if (members <= 2 && dtype == DType::Float32) {
    log.expect(got == ref, what + ": not bitwise the ordered sum");
    return;
  }
  const double err = cuda_test::rel_error(as_floats(got, dtype), as_floats(ref, dtype));
  const double tol = dtype == DType::Float32 ? cuda_test::kF32Tolerance : cuda_test::kBf16Tolerance;
  log.expect(err < tol, fmt::format("{}: rel error {} >= {}", what, err, tol));
}

// Every collective over `group` (this rank is a member), device and host APIs.
void check_group(NcclCommunicator& comm, const std::vector<int>& group, uint64_t salt, Log& log) {
  const int me = comm.rank();
  const size_t n = group.size();
  const size_t index = static_cast<size_t>(std::find(group.begin(), group.end(), me) - group.begin());
  const std::string where = fmt::format("group {}", group);

  for (DType dtype : {DType::Float32, DType::BFloat16}) {
    const size_t item = itemsize(dtype);
    for (size_t count : {size_t{1}, size_t{7}, size_t{1000}, size_t{65537}}) {
      const std::string tag = fmt::format("{} {} count {}", where, name(dtype), count);
      const std::vector<char> mine = as_bytes(input(me, count, salt + count), dtype);
      const std::vector<char> ref = ordered_sum(group, count, 0, count, dtype, salt + count);

      // Device all-reduce, out of place and in place; twice: bitwise the same.
      DeviceBuffer<char> send(mine), recv(count * item);
      recv.poison();
      settle();
      comm.all_reduce_device(group, send.get(), recv.get(), count, dtype);
      const std::vector<char> first = download(comm, recv);
      expect_sum(log, first, ref, n, dtype, "all_reduce_device " + tag);
      comm.all_reduce_device(group, send.get(), send.get(), count, dtype);
      log.expect(download(comm, send) == first, "in-place all_reduce_device differs from out of place " + tag);

      // Host all-reduce: bitwise the ordered sum.
      std::vector<char> host = mine, out(count * item, '\xff');
      comm.all_reduce(me, group, host.data(), out.data(), count, dtype);
      log.expect(out == ref, "host all_reduce is not the ordered sum " + tag);
      comm.all_reduce(me, group, host.data(), host.data(), count, dtype);
      log.expect(host == ref, "in-place host all_reduce " + tag);

      // Reduce-scatter: member i gets the sum of block i.
      const std::vector<char> blocks = as_bytes(input(me, n * count, salt + 3 * count), dtype);
      const std::vector<char> block_ref = ordered_sum(group, n * count, index * count, count, dtype, salt + 3 * count);
      DeviceBuffer<char> rs_send(blocks), rs_recv(count * item);
      rs_recv.poison();
      settle();
      comm.reduce_scatter_device(group, rs_send.get(), rs_recv.get(), count, dtype);
      expect_sum(log, download(comm, rs_recv), block_ref, n, dtype, "reduce_scatter_device " + tag);
      comm.reduce_scatter_device(group, rs_send.get(), rs_send.get() + index * count * item, count, dtype);
      const std::vector<char> in_place = download(comm, rs_send);
      expect_sum(log,
                 std::vector<char>(in_place.begin() + static_cast<std::ptrdiff_t>(index * count * item),
                                   in_place.begin() + static_cast<std::ptrdiff_t>((index + 1) * count * item)),
                 block_ref, n, dtype, "in-place reduce_scatter_device " + tag);
      std::vector<char> rs_host(count * item, '\xff');
      comm.reduce_scatter(me, group, blocks.data(), rs_host.data(), count, dtype);
      log.expect(rs_host == block_ref, "host reduce_scatter is not the ordered sum " + tag);
    }
  }

  // Byte movers: all-gather, all-to-all, broadcast (exact).
  for (size_t bytes : {size_t{1}, size_t{13}, size_t{4096}, size_t{100003}}) {
    const std::string tag = fmt::format("{} {} bytes", where, bytes);
    auto member_bytes = [&](int member, size_t size) {
      std::vector<char> v(size);
      for (size_t k = 0; k < size; ++k) v[k] = static_cast<char>((member * 131 + k * 7 + salt) & 0xff);
      return v;
    };
    std::vector<char> gathered_ref;
    for (int member : group) {
      const std::vector<char> b = member_bytes(member, bytes);
      gathered_ref.insert(gathered_ref.end(), b.begin(), b.end());
    }
    DeviceBuffer<char> ag_send(member_bytes(me, bytes)), ag_recv(n * bytes);
    ag_recv.poison();
    settle();
    comm.all_gather_device(group, ag_send.get(), ag_recv.get(), bytes);
    log.expect(download(comm, ag_recv) == gathered_ref, "all_gather_device " + tag);
    // In place: our block already sits at its slot of recv.
    std::vector<char> slots(n * bytes, '\x5a');
    std::copy_n(member_bytes(me, bytes).begin(), bytes, slots.begin() + static_cast<std::ptrdiff_t>(index * bytes));
    DeviceBuffer<char> ag_inplace(slots);
    settle();
    comm.all_gather_device(group, ag_inplace.get() + index * bytes, ag_inplace.get(), bytes);
    log.expect(download(comm, ag_inplace) == gathered_ref, "in-place all_gather_device " + tag);
    std::vector<char> ag_host(n * bytes, '\x5a');
    comm.all_gather(me, group, member_bytes(me, bytes).data(), ag_host.data(), bytes);
    log.expect(ag_host == gathered_ref, "host all_gather " + tag);

    // All-to-all: block j of member i is member_bytes(i, n * bytes)[j]; member i receives
    // block i of every member, in group order.
    std::vector<char> a2a_ref;
    for (int member : group) {
      const std::vector<char> b = member_bytes(member + 17, n * bytes);
      a2a_ref.insert(a2a_ref.end(), b.begin() + static_cast<std::ptrdiff_t>(index * bytes),
                     b.begin() + static_cast<std::ptrdiff_t>((index + 1) * bytes));
    }
    DeviceBuffer<char> a2a_send(member_bytes(me + 17, n * bytes)), a2a_recv(n * bytes);
    a2a_recv.poison();
    settle();
    comm.all_to_all_device(group, a2a_send.get(), a2a_recv.get(), bytes);
    log.expect(download(comm, a2a_recv) == a2a_ref, "all_to_all_device " + tag);
    std::vector<char> a2a_host = member_bytes(me + 17, n * bytes);
    comm.all_to_all(me, group, a2a_host.data(), a2a_host.data(), bytes);  // in place on the host
    log.expect(a2a_host == a2a_ref, "host all_to_all " + tag);

    // Broadcast from the group's first member.
    const std::vector<char> root = member_bytes(group.front() + 29, bytes);
    DeviceBuffer<char> bc(member_bytes(me + 29, bytes));
    settle();
    comm.broadcast_device(group, bc.get(), bytes);
    log.expect(download(comm, bc) == root, "broadcast_device " + tag);
    std::vector<char> bc_host = member_bytes(me + 29, bytes);
    comm.broadcast(me, group, bc_host.data(), bytes);
    log.expect(bc_host == root, "host broadcast " + tag);
  }
  comm.barrier(me, group);
}

// Everything a rank checks in a world of n >= 2 (in-process threads or MPI ranks).
void check_world(NcclCommunicator& comm, Log& log) {
  TESSERA_CUDA_CHECK(cudaSetDevice(comm.cuda_device()));  // our DeviceBuffers live there
  const int n = comm.world_size(), me = comm.rank();
  std::vector<int> world(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) world[static_cast<size_t>(r)] = r;
  const std::vector<int> reversed(world.rbegin(), world.rend());
  check_group(comm, world, 100, log);
  check_group(comm, reversed, 200, log);  // a new communicator, ranks in group order
  check_group(comm, {me}, 300, log);      // a group of one: copies

  // Sub-groups: pairs through ncclCommSplit, then strided groups created on first use.
  if (n >= 4) {
    std::vector<std::vector<int>> pairs;
    for (int r = 0; r + 1 < n; r += 2) pairs.push_back({r, r + 1});
    comm.split(pairs);
    if (me < n / 2 * 2) check_group(comm, {me / 2 * 2, me / 2 * 2 + 1}, 400, log);
    const std::vector<int> strided = me % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3};
    if (me < 4) check_group(comm, strided, 500, log);
  } else {
    comm.split(std::vector<std::vector<int>>{{0}, {1}});  // groups of one: nothing to create
  }

  // Statistics (ring-algorithm bytes, as every communicator counts them).
  comm.reset_stats();
  DeviceBuffer<float> x(64), y(64 * static_cast<size_t>(n));
  TESSERA_CUDA_CHECK(cudaMemset(x.get(), 0, 64 * sizeof(float)));
  TESSERA_CUDA_CHECK(cudaMemset(y.get(), 0, 64 * sizeof(float) * static_cast<size_t>(n)));
  settle();
  comm.all_gather_device(world, x.get(), y.get(), 256);
  comm.all_reduce_device(world, x.get(), x.get(), 64, DType::Float32);
  comm.reduce_scatter_device(world, y.get(), x.get(), 64, DType::Float32);
  comm.synchronize();
  const CommStats s = comm.stats(me);
  const double nd = n;
  log.expect(s.all_gather_calls == 1 && s.all_gather_bytes == (nd - 1) * 256, "all_gather stats");
  log.expect(s.all_reduce_calls == 1 && s.all_reduce_bytes == 2 * (nd - 1) / nd * 256, "all_reduce stats");
  log.expect(s.reduce_scatter_calls == 1 && s.reduce_scatter_bytes == (nd - 1) * 256, "reduce_scatter stats");
}

// Runs body(comm) on n threads, one NcclCommunicator per GPU (file bootstrap in a fresh
// directory). A rank that throws aborts (so no other rank hangs); returns every failure.
std::vector<std::string> run_ranks(int n, const std::string& tag, double timeout_s,
                                   const std::function<void(NcclCommunicator&, Log&)>& body) {
  const TempDir temp(tag);
  const std::string dir = temp.path();
  std::vector<Log> logs(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      Log& log = logs[static_cast<size_t>(r)];
      log.rank = r;
      NcclOptions o;
      o.rank = r;
      o.world_size = n;
      o.device = r;
      o.bootstrap = "file";
      o.bootstrap_dir = dir;
      o.bootstrap_timeout_s = 60;
      o.timeout_s = timeout_s;
      std::unique_ptr<NcclCommunicator> comm;
      try {
        comm = std::make_unique<NcclCommunicator>(o);
        body(*comm, log);
      } catch (const std::exception& e) {
        log.failures.push_back(fmt::format("rank {} threw: {}", r, e.what()));
        if (comm) comm->abort(e.what());
      }
      comm.reset();  // finalize with the peers (or nothing, after an abort)
    });
  }
  for (std::thread& t : threads) t.join();
  std::vector<std::string> failures;
  for (const Log& log : logs) failures.insert(failures.end(), log.failures.begin(), log.failures.end());
  return failures;
}

// ---- one GPU ----

TEST(NcclCommunicator, WorldOfOne) {
  TESSERA_REQUIRE_GPU();
  NcclOptions o;
  o.rank = 0;
  o.world_size = 1;
  o.timeout_s = 120;
  NcclCommunicator comm(o);
  EXPECT_EQ(comm.kind(), "nccl");
  EXPECT_EQ(comm.world_size(), 1);
  EXPECT_EQ(comm.local_devices(), std::vector<int>{0});
  EXPECT_EQ(comm.bootstrap(), "none");
  TESSERA_CUDA_CHECK(cudaSetDevice(comm.cuda_device()));
  Log log;
  // The world of one runs its collectives through NCCL (a single-rank communicator).
  check_group(comm, {0}, 1, log);
  for (const std::string& f : log.failures) ADD_FAILURE() << f;
}

TEST(NcclCommunicator, DeviceApiChecksItsArguments) {
  TESSERA_REQUIRE_GPU();
  NcclOptions o;
  o.rank = 0;
  o.world_size = 1;
  NcclCommunicator comm(o);
  TESSERA_CUDA_CHECK(cudaSetDevice(comm.cuda_device()));
  std::vector<float> host(16, 1.0f);
  DeviceBuffer<float> buf(32);
  EXPECT_THROW(comm.all_reduce_device({0}, host.data(), buf.get(), 16, DType::Float32), ValueError);
  EXPECT_THROW(comm.all_reduce_device({0}, buf.get(), buf.get() + 1, 16, DType::Float32), ValueError);
  EXPECT_THROW(comm.all_to_all_device({0}, buf.get(), buf.get(), 16), ValueError);
  EXPECT_THROW(comm.all_reduce_device({0}, buf.get(), buf.get(), 16, DType::Bool), DTypeError);
  EXPECT_THROW(comm.all_reduce_device({1}, buf.get(), buf.get(), 16, DType::Float32), ValueError);
  EXPECT_THROW(comm.all_reduce(1, {0}, host.data(), host.data(), 16, DType::Float32), ValueError);
  EXPECT_FALSE(comm.aborted());  // argument errors do not abort
}

TEST(NcclCommunicator, AbortMakesEveryCallThrow) {
  TESSERA_REQUIRE_GPU();
  NcclOptions o;
  o.rank = 0;
  o.world_size = 1;
  NcclCommunicator comm(o);
  comm.abort("stop on purpose");
  EXPECT_TRUE(comm.aborted());
  std::vector<float> x(4, 1.0f);
  const std::string what = error_text([&] { comm.all_reduce(0, {0}, x.data(), x.data(), 4, DType::Float32); });
  EXPECT_TRUE(contains(what, "aborted: rank 0: stop on purpose")) << what;
  EXPECT_TRUE(contains(error_text([&] { comm.synchronize(); }), "stop on purpose"));
}

void CUDART_CB sleep_on_stream(void* seconds) {
  std::this_thread::sleep_for(std::chrono::duration<double>(*static_cast<double*>(seconds)));
}

TEST(NcclCommunicator, WaitTimesOut) {
  TESSERA_REQUIRE_GPU();
  NcclOptions o;
  o.rank = 0;
  o.world_size = 1;
  o.timeout_s = 0.2;
  NcclCommunicator comm(o);
  TESSERA_CUDA_CHECK(cudaSetDevice(comm.cuda_device()));
  static double seconds = 2.0;  // a stream that stays busy past the timeout
  TESSERA_CUDA_CHECK(cudaLaunchHostFunc(comm.stream(), sleep_on_stream, &seconds));
  const std::string what = error_text([&] { comm.synchronize(); });
  EXPECT_TRUE(contains(what, "did not finish within")) << what;
  EXPECT_TRUE(comm.aborted());
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(comm.stream()));
}

// ---- several GPUs, one thread each ----

TEST(NcclCommunicator, ThreadsOnEveryGpu) {
  TESSERA_REQUIRE_GPU();
  const int n = std::min(gpu_count(), 4);
  if (n < 2) GTEST_SKIP() << "needs 2 GPUs; " << n << " present";
  for (const std::string& f : run_ranks(n, "world", 120, check_world)) ADD_FAILURE() << f;
}

TEST(NcclCommunicator, PeerAbortEndsACollective) {
  TESSERA_REQUIRE_GPU();
  if (gpu_count() < 2) GTEST_SKIP() << "needs 2 GPUs; " << gpu_count() << " present";
  std::string caught;
  double seconds = 0;
  const std::vector<std::string> failures = run_ranks(2, "abort", 120, [&](NcclCommunicator& comm, Log&) {
    if (comm.rank() == 1) {
      comm.abort("rank 1 fails on purpose");
      return;
    }
    std::vector<float> x(1000, 1.0f);
    const auto start = std::chrono::steady_clock::now();
    caught = error_text([&] { comm.all_reduce(0, {0, 1}, x.data(), x.data(), x.size(), DType::Float32); });
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  });
  for (const std::string& f : failures) ADD_FAILURE() << f;
  EXPECT_TRUE(contains(caught, "aborted: rank 1: rank 1 fails on purpose")) << caught;
  EXPECT_LT(seconds, 60.0);
}

// ---- one process per GPU (cmake/gpu_tests.cmake starts two) ----

// Why the NcclMultiProcess tests cannot run in this process, or "" when they can: they
// need to be one of several processes, started by mpirun (MPI build) or with
// TESSERA_NCCL_RANK / TESSERA_NCCL_WORLD_SIZE / TESSERA_NCCL_BOOTSTRAP_DIR (file bootstrap),
// and a GPU per process on this node.
std::string multi_process_skip_reason() {
  const char* size = std::getenv("TESSERA_NCCL_WORLD_SIZE");
#if TESSERA_HAS_MPI
  if (size == nullptr) size = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (size == nullptr) size = std::getenv("PMI_SIZE");
#endif
  if (size == nullptr)
    return "not one of several processes (cmake/gpu_tests.cmake starts 2, with mpirun or TESSERA_NCCL_RANK)";
  const int ranks = std::atoi(size);
  if (gpu_count() < ranks) return fmt::format("{} processes but {} GPUs on this node", ranks, gpu_count());
  return "";
}

TEST(NcclMultiProcess, Collectives) {
  TESSERA_REQUIRE_GPU();
  const std::string why = multi_process_skip_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  NcclOptions o;
  o.timeout_s = 120;
  Log log;
  {
    NcclCommunicator comm(o);
    EXPECT_NE(comm.bootstrap(), "none");
    log.rank = comm.rank();
    try {
      check_world(comm, log);
    } catch (const std::exception& e) {
      log.failures.push_back(fmt::format("rank {} threw: {}", log.rank, e.what()));
      comm.abort(e.what());
    }
  }
  for (const std::string& f : log.failures) ADD_FAILURE() << f;
}

// Rank 1 aborts; rank 0's collective throws with its reason. Under mpirun the job then
// ends with MPI_Abort (nonzero status), so ctest looks for rank 0's line instead.
TEST(NcclMultiProcess, Abort) {
  TESSERA_REQUIRE_GPU();
  const std::string why = multi_process_skip_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  NcclOptions o;
  o.timeout_s = 120;
  NcclCommunicator comm(o);
  if (comm.rank() == 1) {
    comm.abort("rank 1 fails on purpose");
    return;
  }
  std::vector<float> x(1000, 1.0f);
  const auto start = std::chrono::steady_clock::now();
  const std::string caught = error_text([&] {
    comm.all_reduce(0, {0, 1}, x.data(), x.data(), x.size(), DType::Float32);
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("rank 0 caught after %.2f s: %s\n", seconds, caught.c_str());
  std::fflush(stdout);
  EXPECT_TRUE(contains(caught, "rank 1 fails on purpose")) << caught;
}

}  // namespace
}  // namespace tessera::spmd

#endif  // TESSERA_HAS_NCCL
