// bench_collectives: the communicator's collectives between the processes (or virtual
// devices) of one job, as nccl-tests measures them: for each op and message size, the
// median time of a call (every rank starts together after a barrier), the algorithm
// bandwidth (bytes / time) and the bus bandwidth (what each link carried: all-reduce
// 2(n-1)/n of the bytes, all-gather and all-to-all (n-1)/n).
//
//   mpirun -n 2 build/bin/bench_collectives [--max-mb 64] [--rounds 10]
//   build/bin/tessera launch --nproc 2 --coordinator 127.0.0.1:0 -- build/bin/bench_collectives
//   TESSERA_CPU_DEVICES=2 build/bin/bench_collectives          (threads of one process)
//
// bench/spmd/compare_collectives.sh runs the TCP communicator against OpenMPI (over
// TCP and over shared memory) on this machine, interleaved. Rank 0 prints a table; the
// last line is one JSON object with every figure.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "tessera/base/dtype.h"
#include "tessera/spmd/communicator.h"
#include "tessera/spmd/runtime.h"

namespace ts = tessera;

namespace {

struct Row {
  std::string op;
  size_t bytes = 0;
  double median_us = 0, algbw = 0, busbw = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  double max_mb = 64;
  int rounds = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string arg = argv[i];
    if (arg == "--max-mb") max_mb = std::stod(argv[i + 1]);
    if (arg == "--rounds") rounds = std::max(3, std::stoi(argv[i + 1]));
  }
  try {
    ts::spmd::Communicator& comm = ts::spmd::communicator();
    const std::vector<int> world = ts::spmd::world_group();
    const int n = static_cast<int>(world.size());
    if (n < 2) {
      fmt::print(stderr,
                 "bench_collectives: one device; run it under mpirun -n N, tessera launch --nproc N --coordinator "
                 "127.0.0.1:0, or with TESSERA_CPU_DEVICES=N\n");
      return 2;
    }
    const std::vector<int> mine = ts::spmd::local_devices();
    const bool primary = ts::spmd::is_primary_process();
    std::vector<Row> rows;
    for (size_t bytes = 4096; bytes <= static_cast<size_t>(max_mb * (1 << 20)); bytes *= 4) {
      for (const char* op : {"all_reduce", "all_gather", "all_to_all"}) {
        const std::string name = op;
        std::vector<std::vector<double>> times(static_cast<size_t>(n));
        ts::spmd::run_on_devices(mine, [&](int d) {
          // all_reduce: `bytes` of float32 in and out; all_gather: `bytes` out (n blocks);
          // all_to_all: `bytes` in and out (n blocks).
          const size_t block = bytes / static_cast<size_t>(n);
          std::vector<float> in(bytes / 4, 1.0f + static_cast<float>(d)), out(bytes / 4);
          for (int r = 0; r < rounds + 2; ++r) {
            comm.barrier(d, world);
            const auto start = std::chrono::steady_clock::now();
            if (name == "all_reduce")
              comm.all_reduce(d, world, in.data(), out.data(), bytes / 4, ts::DType::Float32);
            else if (name == "all_gather")
              comm.all_gather(d, world, in.data(), out.data(), block);
            else
              comm.all_to_all(d, world, in.data(), out.data(), block);
            const double us =
                std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
            if (r >= 2) times[static_cast<size_t>(d)].push_back(us);  // two warm-up calls
          }
        });
        if (!primary) continue;
        Row row{name, bytes, median(times[static_cast<size_t>(mine.front())]), 0, 0};
        row.algbw = static_cast<double>(bytes) / row.median_us / 1e3;  // GB/s
        const double factor = name == "all_reduce" ? 2.0 * (n - 1) / n : static_cast<double>(n - 1) / n;
        row.busbw = row.algbw * factor;
        rows.push_back(row);
      }
    }
    if (!primary) return 0;
    fmt::print("bench_collectives: {} ({} devices), median of {} calls\n", ts::spmd::runtime_description(), n, rounds);
    fmt::print("{:<12} {:>12} {:>12} {:>12} {:>12}\n", "op", "bytes", "time us", "algbw GB/s", "busbw GB/s");
    std::string json;
    for (const Row& r : rows) {
      fmt::print("{:<12} {:>12} {:>12.1f} {:>12.3f} {:>12.3f}\n", r.op, r.bytes, r.median_us, r.algbw, r.busbw);
      json +=
          fmt::format("{}{{\"op\":\"{}\",\"bytes\":{},\"median_us\":{:.2f},\"algbw_gbs\":{:.4f},\"busbw_gbs\":{:.4f}}}",
                      json.empty() ? "" : ",", r.op, r.bytes, r.median_us, r.algbw, r.busbw);
    }
    fmt::print(
        "{{\"bench\":\"collectives\",\"runtime\":\"{}\",\"communicator\":\"{}\",\"devices\":{},\"rounds\":{},"
        "\"rows\":[{}]}}\n",
        ts::spmd::runtime_description(), comm.kind(), n, rounds, json);
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_collectives: error: {}\n", e.what());
    return 1;
  }
}
