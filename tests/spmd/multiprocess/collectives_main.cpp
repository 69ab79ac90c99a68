// The collectives with one process per device, under MPI or a TCP job: run by ctest as
//   mpirun -n 2 / -n 4 multiprocess_collectives            (spmd.mpi_collectives_np2 / _np4)
//   mpirun -n 2 multiprocess_collectives abort             (spmd.mpi_abort_np2)
//   tessera launch --nproc 2 / 4 --coordinator 127.0.0.1:0 -- multiprocess_collectives
//                                                          (spmd.tcp_collectives_np2 / _np4,
//                                                           spmd.tcp_abort_np2 with `abort`)
// Each rank checks its own results against references it computes locally (the same
// element-by-element definitions and serial ordered sums the in-process tests use),
// so passing here means multi-process and in-process runs agree bitwise. Exits nonzero
// on any mismatch. Point-to-point messages (send / recv) are checked too.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "spmd/collective_reference.h"
#include "tessera/spmd/runtime.h"

using namespace tessera;
using namespace tessera::spmd;
using tessera::spmd::testing::Case;

namespace {

int g_failures = 0;
int g_checks = 0;
int g_rank = 0;

void expect(bool ok, const std::string& what) {
  ++g_checks;
  if (ok) return;
  ++g_failures;
  std::fprintf(stderr, "rank %d: FAILED %s\n", g_rank, what.c_str());
}

void check_case(const Mesh& mesh, const Case& c, const Shape& shape, DType dtype, int salt) {
  if (g_rank >= mesh.size()) return;  // this device is not in the mesh
  std::vector<double> got;
  Shape got_shape;
  run_on_devices({g_rank}, [&](int d) {
    Array x = testing::input_array(d, shape, dtype, salt);
    Array out = testing::run_collective(testing::build(c, x, mesh));
    got_shape = out.shape();
    got = testing::as_doubles(out);
  });
  const int n = mesh.group_size(c.axes);
  const std::string where = fmt::format("{} {} axes={} dim={} concat={} {}", mesh.to_string(), to_string(c.kind),
                                        c.axes, c.dim, c.concat, name(dtype));
  expect(got_shape == testing::output_shape(c, shape, n), where + ": shape");
  expect(got == testing::reference(c, mesh, shape, g_rank,
                                   [&](int dev) { return testing::input_values(dev, numel(shape), salt, dtype); }),
         where + ": values");
}

void check_primitives() {
  std::vector<const char*> meshes;
  if (device_count() == 2) meshes = {"data=2", "data=1,model=2"};
  if (device_count() == 4) meshes = {"data=2,model=2", "model=4", "data=2"};  // data=2: ranks 2, 3 idle
  const Shape shape{8, 4, 3};
  for (const char* spec : meshes) {
    const Mesh mesh = Mesh::parse(spec);
    testing::for_each_case(mesh, shape, [&](const testing::Case& c, const Shape& s, DType dt, int salt) {
      check_case(mesh, c, s, dt, salt);
    });
    for (DType dt : {DType::Float64, DType::BFloat16, DType::Float16, DType::Int32, DType::Int64})
      check_case(mesh, {CollectiveKind::AllReduce, {0}}, Shape{5, 3}, dt, 1);
    check_case(mesh, {CollectiveKind::AllGather, {0}, 1}, Shape{2, 3}, DType::Bool, 2);
  }
}

// Raw communicator calls: uneven all-reduce counts, in place, and the sums bitwise
// equal to the serial ordered sum in float32 and bfloat16.
void check_communicator() {
  Communicator& comm = communicator();
  const std::vector<int> group = world_group();
  const int n = static_cast<int>(group.size());
  std::vector<int> reversed(group.rbegin(), group.rend());
  for (const auto& g : {group, reversed}) {
    for (size_t count : {size_t{1}, size_t{7}, size_t{1000}}) {
      std::vector<std::vector<char>> members;
      for (int dev : g) members.push_back(testing::fractional_f32(dev, count));
      const std::vector<char> expect32 = testing::serial_sum(members, count, DType::Float32);
      std::vector<char> mine = testing::fractional_f32(g_rank, count), out(count * 4);
      run_on_devices({g_rank}, [&](int d) {
        comm.all_reduce(d, g, mine.data(), out.data(), count, DType::Float32);
        comm.all_reduce(d, g, mine.data(), mine.data(), count, DType::Float32);  // in place
      });
      expect(out == expect32, fmt::format("all_reduce f32 group {} count {}", g, count));
      expect(mine == expect32, fmt::format("in-place all_reduce f32 group {} count {}", g, count));

      std::vector<std::vector<char>> half(members.size());
      for (size_t j = 0; j < members.size(); ++j) {
        half[j].resize(count * 2);
        convert(DType::Float32, members[j].data(), DType::BFloat16, half[j].data(), static_cast<int64_t>(count));
      }
      const std::vector<char> expect16 = testing::serial_sum(half, count, DType::BFloat16);
      const size_t me = static_cast<size_t>(std::find(g.begin(), g.end(), g_rank) - g.begin());
      std::vector<char> h = half[me];
      run_on_devices({g_rank}, [&](int d) { comm.all_reduce(d, g, h.data(), h.data(), count, DType::BFloat16); });
      expect(h == expect16, fmt::format("all_reduce bf16 group {} count {}", g, count));
    }
  }
  // Reduce-scatter of fractional values: member i gets the ordered sum of block i.
  const size_t count = 33;
  std::vector<std::vector<char>> inputs;
  for (int dev : group) inputs.push_back(testing::fractional_f32(dev, count * static_cast<size_t>(n)));
  std::vector<std::vector<char>> blocks;
  for (const auto& in : inputs)
    blocks.emplace_back(in.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(g_rank) * count * 4),
                        in.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(g_rank + 1) * count * 4));
  std::vector<char> out(count * 4);
  run_on_devices({g_rank}, [&](int d) {
    comm.reduce_scatter(d, group, inputs[static_cast<size_t>(g_rank)].data(), out.data(), count, DType::Float32);
  });
  expect(out == testing::serial_sum(blocks, count, DType::Float32), "reduce_scatter f32");

  // Broadcast, barrier, subgroups of one and of two.
  std::vector<int> buf(5, g_rank + 1);
  run_on_devices({g_rank}, [&](int d) {
    comm.broadcast(d, reversed, buf.data(), buf.size() * sizeof(int));  // root: the group's first member
    comm.barrier(d, group);
    int v = g_rank, w = 0;
    comm.all_reduce(d, {g_rank}, &v, &w, 1, DType::Int32);
    expect(w == g_rank, "all_reduce over a group of one");
    const int partner = g_rank ^ 1;
    std::vector<int> pair{std::min(g_rank, partner), std::max(g_rank, partner)};
    comm.all_reduce(d, pair, &v, &w, 1, DType::Int32);
    expect(w == pair[0] + pair[1], "all_reduce over pairs");
  });
  expect(buf == std::vector<int>(5, n), "broadcast from the group's first member");
}

// Point-to-point messages (pipeline stages across processes), MPI and TCP: every rank sends
// to the next before it receives from the previous (a ring that only works if a send
// does not wait for its receiver), two tags between one pair arriving in order, and a
// size mismatch named.
void check_point_to_point() {
  auto error_of = [](const auto& fn) -> std::string {
    try {
      fn();
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  };
  Communicator& comm = communicator();
  const int n = device_count(), next = (g_rank + 1) % n, previous = (g_rank + n - 1) % n;
  std::vector<float> out(1000, static_cast<float>(g_rank)), first(1000), second(1000);
  std::vector<float> out2(1000, static_cast<float>(10 + g_rank));
  comm.send(g_rank, next, 3, out.data(), out.size() * sizeof(float));
  comm.send(g_rank, next, 3, out2.data(), out2.size() * sizeof(float));
  comm.recv(g_rank, previous, 3, first.data(), first.size() * sizeof(float));
  comm.recv(g_rank, previous, 3, second.data(), second.size() * sizeof(float));
  comm.wait_sends(g_rank);
  expect(first == std::vector<float>(1000, static_cast<float>(previous)), "p2p ring: the first message");
  expect(second == std::vector<float>(1000, static_cast<float>(10 + previous)), "p2p ring: the second, in order");
  // Tags out of order: the later tag is kept until its recv.
  comm.send(g_rank, next, 6, out.data(), 16);
  comm.send(g_rank, next, 5, out2.data(), 16);
  comm.recv(g_rank, previous, 5, second.data(), 16);
  comm.recv(g_rank, previous, 6, first.data(), 16);
  comm.wait_sends(g_rank);
  expect(first[0] == static_cast<float>(previous) && second[0] == static_cast<float>(10 + previous),
         "p2p: messages of two tags received in the other order");
  // A point-to-point message sent before a collective waits for its recv behind it.
  comm.send(g_rank, next, 7, out.data(), 16);
  comm.barrier(g_rank, world_group());
  comm.recv(g_rank, previous, 7, first.data(), 16);
  comm.wait_sends(g_rank);
  expect(first[0] == static_cast<float>(previous), "p2p: a message that arrived before a barrier");
  if (comm.kind() == "mpi") {
    // (On TCP a size mismatch desynchronizes the stream: it aborts the communicator.)
    comm.send(g_rank, next, 4, out.data(), 8);
    const std::string error = error_of([&] { comm.recv(g_rank, previous, 4, first.data(), 4); });
    comm.wait_sends(g_rank);
    expect(!error.empty(), "p2p: a message larger than the receive buffer is an error");
  }
  const std::string bad_tag = error_of([&] { comm.send(g_rank, next, -1, nullptr, 0); });
  expect(bad_tag.find("tag -1 is outside 0 .. 32767") != std::string::npos, "p2p bad tag: " + bad_tag);
}

void check_stats() {
  Communicator& comm = communicator();
  const std::vector<int> group = world_group();
  const double n = static_cast<double>(group.size());
  comm.reset_stats();
  run_on_devices({g_rank}, [&](int d) {
    std::vector<float> x(64), y(64 * group.size());
    comm.all_gather(d, group, x.data(), y.data(), 256);
    comm.all_reduce(d, group, x.data(), x.data(), 64, DType::Float32);
    comm.reduce_scatter(d, group, y.data(), x.data(), 64, DType::Float32);
    comm.all_to_all(d, group, y.data(), y.data(), 256);
  });
  const CommStats s = comm.stats(g_rank);
  expect(s.all_gather_calls == 1 && s.all_gather_bytes == (n - 1) * 256, "all_gather stats");
  expect(s.all_reduce_calls == 1 && s.all_reduce_bytes == 2 * (n - 1) / n * 256, "all_reduce stats");
  expect(s.reduce_scatter_calls == 1 && s.reduce_scatter_bytes == (n - 1) * 256, "reduce_scatter stats");
  expect(s.all_to_all_calls == 1 && s.all_to_all_bytes == (n - 1) * 256, "all_to_all stats");
}

// The ragged all-to-all of dropless expert parallelism: each pair its own block size
// (some empty); the contents, and statistics that count exactly the bytes sent.
void check_ragged() {
  Communicator& comm = communicator();
  const std::vector<int> group = world_group();
  const int n = static_cast<int>(group.size());
  auto bytes_of = [](int from, int to) { return static_cast<size_t>((from * 3 + to) % 4 * 1000); };
  auto byte_of = [](int from, int to, size_t k) {
    return static_cast<char>(from * 16 + to * 4 + static_cast<int>(k % 3));
  };
  std::vector<size_t> send_bytes, recv_bytes;
  std::vector<char> send, want;
  double sent = 0;
  for (int j = 0; j < n; ++j) {
    send_bytes.push_back(bytes_of(g_rank, j));
    recv_bytes.push_back(bytes_of(j, g_rank));
    if (j != g_rank) sent += static_cast<double>(bytes_of(g_rank, j));
    for (size_t k = 0; k < bytes_of(g_rank, j); ++k) send.push_back(byte_of(g_rank, j, k));
    for (size_t k = 0; k < bytes_of(j, g_rank); ++k) want.push_back(byte_of(j, g_rank, k));
  }
  std::vector<char> got(want.size(), 'x');
  comm.reset_stats();
  run_on_devices({g_rank},
                 [&](int d) { comm.all_to_all_v(d, group, send.data(), send_bytes, got.data(), recv_bytes); });
  const CommStats s = comm.stats(g_rank);
  expect(got == want, "all_to_all_v: each member's block for this rank");
  expect(s.all_to_all_calls == 1 && s.all_to_all_bytes == sent,
         fmt::format("all_to_all_v stats: {} calls, {} bytes (expected 1, {})", s.all_to_all_calls, s.all_to_all_bytes,
                     sent));
}

// Rank 1 fails while the others wait in an all-reduce: they must throw, not hang.
int run_abort() {
  const auto start = std::chrono::steady_clock::now();
  try {
    run_on_devices({g_rank}, [&](int d) {
      float v = 1;
      if (d == 1) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        fail<ValueError>("rank 1 fails on purpose");
      }
      communicator().all_reduce(d, world_group(), &v, &v, 1, DType::Float32);
    });
    std::printf("rank %d: no error\n", g_rank);
  } catch (const Error& e) {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("rank %d caught after %.2f s: %s\n", g_rank, seconds, e.what());
  }
  std::fflush(stdout);
  // Under MPI the failing rank ends the job at exit (MPI_Abort); give the others time to report.
  if (g_rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (!is_multi_process()) {
      // A rank that runs in-process: the runtime missed its launcher. Started by hand, there
      // is nothing to check (ctest always starts it under one).
      const bool launched = std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") ||
                            std::getenv("PMIX_RANK") || std::getenv("TESSERA_COORDINATOR");
      std::printf("multiprocess_collectives: %s\n", launched
                                                        ? "started as a rank but the runtime is in-process"
                                                        : "not started by mpirun or tessera launch; nothing to check");
      return launched ? 1 : 0;
    }
    g_rank = local_devices().front();
    if (argc > 1 && std::strcmp(argv[1], "abort") == 0) return run_abort();
    check_primitives();
    check_communicator();
    check_point_to_point();
    check_stats();
    check_ragged();
    // Every rank learns the total, so they all exit with the same status.
    int64_t failures = g_failures;
    run_on_devices({g_rank},
                   [&](int d) { communicator().all_reduce(d, world_group(), &failures, &failures, 1, DType::Int64); });
    std::printf("rank %d of %d (%s): %d checks, %d failed here, %lld failed in all\n", g_rank, device_count(),
                runtime_description().c_str(), g_checks, g_failures, static_cast<long long>(failures));
    return failures == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: error: %s\n", g_rank, e.what());
    return 1;
  }
}
