// The in-process communicator and the runtime: each collective on groups of 2, 4 and
// 8 virtual devices against a float64 / exact reference, the ordered (deterministic)
// sums, abort without hangs, statistics, and the runtime's errors.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "spmd/collective_reference.h"
#include "tessera/base/thread_pool.h"
#include "tessera/spmd/runtime.h"

namespace tessera::spmd {
namespace {

using testing::fractional_f32;
using testing::serial_sum;

std::vector<int> iota(int n, int start = 0, int step = 1) {
  std::vector<int> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = start + i * step;
  return v;
}

template <typename T>
std::vector<T> values(int device, size_t count, int salt = 0) {
  std::vector<T> v(count);
  for (size_t k = 0; k < count; ++k) v[k] = static_cast<T>(testing::input_value(device, static_cast<int64_t>(k), salt));
  return v;
}

TEST(AddInto, EveryReducibleDtype) {
  std::vector<double> a{1.5, -2.25, 3e10, 0.1}, b{0.5, 4.0, 1.0, 0.2};
  for (DType dt : {DType::Float32, DType::Float64, DType::BFloat16, DType::Float16}) {
    std::vector<char> x(4 * itemsize(dt)), y(4 * itemsize(dt));
    convert(DType::Float64, a.data(), dt, x.data(), 4);
    convert(DType::Float64, b.data(), dt, y.data(), 4);
    std::vector<double> xa(4), yb(4);
    convert(dt, x.data(), DType::Float64, xa.data(), 4);
    convert(dt, y.data(), DType::Float64, yb.data(), 4);
    add_into(x.data(), y.data(), 4, dt);
    for (int64_t i = 0; i < 4; ++i) {
      // One rounding of the exact sum to the dtype (exact in float64 for these values).
      std::vector<char> expect(itemsize(dt));
      store_from_double(dt, expect.data(), 0, xa[static_cast<size_t>(i)] + yb[static_cast<size_t>(i)]);
      EXPECT_EQ(load_as_double(dt, x.data(), i), load_as_double(dt, expect.data(), 0)) << name(dt) << " " << i;
    }
  }
  std::vector<int32_t> i32{INT32_MAX, -5}, j32{1, 7};
  add_into(i32.data(), j32.data(), 2, DType::Int32);
  EXPECT_EQ(i32[0], INT32_MIN);  // wraps like numpy
  EXPECT_EQ(i32[1], 2);
  std::vector<int64_t> i64{int64_t{1} << 40, -3}, j64{5, -4};
  add_into(i64.data(), j64.data(), 2, DType::Int64);
  EXPECT_EQ(i64[0], (int64_t{1} << 40) + 5);
  EXPECT_EQ(i64[1], -7);
  uint8_t u = 1;
  EXPECT_THROW(add_into(&u, &u, 1, DType::UInt8), DTypeError);
}

// Runs fn on every device of an n-device in-process runtime.
void on_devices(int n, const std::function<void(int, Communicator&)>& fn) {
  set_cpu_devices(n);
  Communicator& comm = communicator();
  run_on_devices(iota(n), [&](int d) { fn(d, comm); });
}

TEST(LocalCommunicator, AllGatherAllToAllBroadcastOnGroupsOf2To8) {
  for (int n : {2, 4, 8}) {
    const size_t count = 5;
    std::vector<std::vector<int32_t>> gathered(static_cast<size_t>(n)), swapped(static_cast<size_t>(n)),
        bcast(static_cast<size_t>(n));
    on_devices(n, [&](int d, Communicator& comm) {
      const std::vector<int> group = iota(n);
      std::vector<int32_t> mine = values<int32_t>(d, count);
      auto& g = gathered[static_cast<size_t>(d)];
      g.resize(count * static_cast<size_t>(n));
      comm.all_gather(d, group, mine.data(), g.data(), count * sizeof(int32_t));
      std::vector<int32_t> blocks = values<int32_t>(d, count * static_cast<size_t>(n), 1);
      auto& s = swapped[static_cast<size_t>(d)];
      s.resize(blocks.size());
      comm.all_to_all(d, group, blocks.data(), s.data(), count * sizeof(int32_t));
      auto& b = bcast[static_cast<size_t>(d)];
      b = values<int32_t>(d, count, 2);
      comm.broadcast(d, group, b.data(), count * sizeof(int32_t));
      comm.barrier(d, group);
    });
    for (int d = 0; d < n; ++d) {
      for (int j = 0; j < n; ++j)
        for (size_t k = 0; k < count; ++k) {
          const size_t at = static_cast<size_t>(j) * count + k;
          EXPECT_EQ(gathered[static_cast<size_t>(d)][at], values<int32_t>(j, count)[k]);
          // Block j of device d's output is block d of device j's input.
          EXPECT_EQ(swapped[static_cast<size_t>(d)][at],
                    values<int32_t>(j, count * static_cast<size_t>(n), 1)[static_cast<size_t>(d) * count + k]);
        }
      EXPECT_EQ(bcast[static_cast<size_t>(d)], values<int32_t>(0, count, 2));
    }
  }
}

TEST(LocalCommunicator, ReductionsMatchFloat64ReferenceOnSubgroups) {
  // 8 devices as a 2 x 4 grid: rows {0..3}, {4..7} and columns {0,4}, {1,5}, ...
  // reduce concurrently, in reversed group order too (the order is the group's).
  const size_t count = 7;  // not divisible by the group size
  std::vector<std::vector<double>> rows(8), cols(8), scattered(8);
  on_devices(8, [&](int d, Communicator& comm) {
    const std::vector<int> row = iota(4, d / 4 * 4);
    std::vector<int> col{d % 4 + 4, d % 4};  // reversed order
    std::vector<double> x = values<double>(d, count);
    rows[static_cast<size_t>(d)].resize(count);
    comm.all_reduce(d, row, x.data(), rows[static_cast<size_t>(d)].data(), count, DType::Float64);
    cols[static_cast<size_t>(d)] = x;  // in place
    comm.all_reduce(d, col, cols[static_cast<size_t>(d)].data(), cols[static_cast<size_t>(d)].data(), count,
                    DType::Float64);
    std::vector<double> blocks = values<double>(d, count * 4, 3);
    scattered[static_cast<size_t>(d)].resize(count);
    comm.reduce_scatter(d, row, blocks.data(), scattered[static_cast<size_t>(d)].data(), count, DType::Float64);
  });
  for (int d = 0; d < 8; ++d) {
    const int r0 = d / 4 * 4;
    for (size_t k = 0; k < count; ++k) {
      double row = 0, col = 0, scat = 0;
      for (int j = 0; j < 4; ++j) {
        row += values<double>(r0 + j, count)[k];
        scat += values<double>(r0 + j, count * 4, 3)[static_cast<size_t>(d - r0) * count + k];
      }
      col = values<double>(d % 4 + 4, count)[k] + values<double>(d % 4, count)[k];
      EXPECT_EQ(rows[static_cast<size_t>(d)][k], row) << d << " " << k;
      EXPECT_EQ(cols[static_cast<size_t>(d)][k], col) << d << " " << k;
      EXPECT_EQ(scattered[static_cast<size_t>(d)][k], scat) << d << " " << k;
    }
  }
}

TEST(LocalCommunicator, SumsAreOrderedAndBitwiseReproducible) {
  // Non-integer float32 and bfloat16 values round on every addition: the result must
  // be exactly ((m0 + m1) + m2) + ... in group order, on every member and every run.
  for (int n : {2, 4, 8}) {
    const size_t count = 1001;
    std::vector<std::vector<char>> inputs(static_cast<size_t>(n));
    for (int d = 0; d < n; ++d) inputs[static_cast<size_t>(d)] = fractional_f32(d, count);
    const std::vector<char> expect = serial_sum(inputs, count, DType::Float32);
    std::vector<std::vector<char>> bf16_inputs(static_cast<size_t>(n));
    for (int d = 0; d < n; ++d) {
      bf16_inputs[static_cast<size_t>(d)].resize(count * 2);
      convert(DType::Float32, inputs[static_cast<size_t>(d)].data(), DType::BFloat16,
              bf16_inputs[static_cast<size_t>(d)].data(), static_cast<int64_t>(count));
    }
    const std::vector<char> expect_bf16 = serial_sum(bf16_inputs, count, DType::BFloat16);
    for (int run = 0; run < 2; ++run) {
      std::vector<std::vector<char>> out(static_cast<size_t>(n)), out_bf16(static_cast<size_t>(n));
      on_devices(n, [&](int d, Communicator& comm) {
        out[static_cast<size_t>(d)].resize(count * 4);
        comm.all_reduce(d, iota(n), inputs[static_cast<size_t>(d)].data(), out[static_cast<size_t>(d)].data(), count,
                        DType::Float32);
        out_bf16[static_cast<size_t>(d)] = bf16_inputs[static_cast<size_t>(d)];
        comm.all_reduce(d, iota(n), out_bf16[static_cast<size_t>(d)].data(), out_bf16[static_cast<size_t>(d)].data(),
                        count, DType::BFloat16);
      });
      for (int d = 0; d < n; ++d) {
        EXPECT_EQ(out[static_cast<size_t>(d)], expect) << "n=" << n << " device " << d << " run " << run;
        EXPECT_EQ(out_bf16[static_cast<size_t>(d)], expect_bf16) << "n=" << n << " device " << d;
      }
    }
    // The ordered sum is not the float64 sum rounded once (so the check above can fail).
    if (n == 8) {
      std::vector<float> got(count);
      std::memcpy(got.data(), expect.data(), count * 4);
      int differ = 0;
      for (size_t k = 0; k < count; ++k) {
        double exact = 0;
        for (int d = 0; d < n; ++d) {
          float v;
          std::memcpy(&v, inputs[static_cast<size_t>(d)].data() + k * 4, 4);
          exact += v;
        }
        differ += static_cast<float>(exact) != got[k];
      }
      EXPECT_GT(differ, 0);
    }
  }
}

TEST(LocalCommunicator, AbortWakesMembersWaitingInAllReduce) {
  set_cpu_devices(4);
  std::atomic<int> waiting{0};
  const auto start = std::chrono::steady_clock::now();
  try {
    run_on_devices(iota(4), [&](int d) {
      std::vector<float> x(16, 1.0f);
      if (d == 2) {
        // Let the others reach the all-reduce first.
        while (waiting.load() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        fail<ValueError>("device 2 ran out of luck");
      }
      ++waiting;
      communicator().all_reduce(d, iota(4), x.data(), x.data(), x.size(), DType::Float32);
    });
    FAIL() << "run_on_devices did not rethrow";
  } catch (const ValueError& e) {
    EXPECT_STREQ(e.what(), "device 2 ran out of luck");  // the first error, not the waiters'
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 1.0);
  // The communicator was reset: the next run works.
  std::vector<float> sums(4);
  run_on_devices(iota(4), [&](int d) {
    float v = static_cast<float>(d);
    communicator().all_reduce(d, iota(4), &v, &sums[static_cast<size_t>(d)], 1, DType::Float32);
  });
  EXPECT_EQ(sums, std::vector<float>(4, 6.0f));
}

TEST(LocalCommunicator, AbortedCallsThrowUntilReset) {
  set_cpu_devices(2);
  Communicator& comm = communicator();
  comm.abort("maintenance");
  float v = 1;
  try {
    comm.all_reduce(0, {0}, &v, &v, 1, DType::Float32);
    FAIL() << "no error after abort";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("maintenance"), std::string::npos) << e.what();
  }
  comm.reset();
  comm.all_reduce(0, {0}, &v, &v, 1, DType::Float32);
  EXPECT_EQ(v, 1.0f);
}

TEST(LocalCommunicator, MismatchedCallsAndAbsentMembersFailInsteadOfHanging) {
  set_cpu_devices(2);
  try {
    run_on_devices({0, 1}, [&](int d) {
      std::vector<float> x(8), y(16);
      if (d == 0)
        communicator().all_reduce(d, {0, 1}, x.data(), x.data(), 8, DType::Float32);
      else
        communicator().all_gather(d, {0, 1}, x.data(), y.data(), 32);
    });
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("members disagree"), std::string::npos) << e.what();
  }
  // Device 1 does not run: waiting for it would never end.
  try {
    run_on_devices({0}, [&](int d) {
      float v = 0;
      communicator().all_reduce(d, {0, 1}, &v, &v, 1, DType::Float32);
    });
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("not running"), std::string::npos) << e.what();
  }
  float v = 0;
  EXPECT_THROW(communicator().all_reduce(0, {1}, &v, &v, 1, DType::Float32), ValueError);  // not a member
  EXPECT_THROW(communicator().all_reduce(0, {0, 0}, &v, &v, 1, DType::Float32), ValueError);
  EXPECT_THROW(communicator().all_reduce(0, {0, 5}, &v, &v, 1, DType::Float32), ValueError);
}

TEST(LocalCommunicator, StatsCountRingBytes) {
  set_cpu_devices(4);
  Communicator& comm = communicator();
  comm.reset_stats();
  run_on_devices(iota(4), [&](int d) {
    std::vector<float> x(64), y(256);
    comm.all_gather(d, iota(4), x.data(), y.data(), 64 * 4);                        // (n-1) * 256 bytes
    comm.all_reduce(d, iota(4), x.data(), x.data(), 64, DType::Float32);            // 2 (n-1)/n * 256
    comm.reduce_scatter(d, iota(4), y.data(), x.data(), 64, DType::Float32);        // (n-1)/n * 1024
    comm.all_to_all(d, iota(4), y.data(), y.data(), 256);                           // (n-1)/n * 1024
    if (d < 2) comm.all_reduce(d, {0, 1}, x.data(), x.data(), 64, DType::Float32);  // 2 * 1/2 * 256
  });
  for (int d = 0; d < 4; ++d) {
    CommStats s = comm.stats(d);
    EXPECT_EQ(s.all_gather_calls, 1);
    EXPECT_EQ(s.all_gather_bytes, 3 * 256.0);
    EXPECT_EQ(s.all_reduce_calls, d < 2 ? 2 : 1);
    EXPECT_EQ(s.all_reduce_bytes, 2 * 0.75 * 256 + (d < 2 ? 256.0 : 0.0));
    EXPECT_EQ(s.reduce_scatter_calls, 1);
    EXPECT_EQ(s.reduce_scatter_bytes, 768.0);
    EXPECT_EQ(s.all_to_all_calls, 1);
    EXPECT_EQ(s.all_to_all_bytes, 768.0);
    EXPECT_EQ(s.total_calls(), d < 2 ? 5 : 4);
    EXPECT_GT(s.seconds, 0.0);
  }
  comm.reset_stats();
  EXPECT_EQ(comm.stats(0).total_calls(), 0);
}

TEST(Runtime, DevicesContextAndDescription) {
  set_cpu_devices(3);
  EXPECT_EQ(device_count(), 3);
  EXPECT_EQ(local_devices(), iota(3));
  EXPECT_FALSE(is_multi_process());
  EXPECT_TRUE(is_primary_process());
  EXPECT_EQ(runtime_description(), "local (3 virtual CPU devices)");
  EXPECT_EQ(communicator().kind(), "local");
  EXPECT_EQ(current_device(), nullptr);
  std::vector<int> seen(3, -1);
  std::vector<std::thread::id> ids(3);
  run_on_devices(iota(3), [&](int d) {
    ASSERT_NE(current_device(), nullptr);
    seen[static_cast<size_t>(d)] = current_device()->device;
    EXPECT_EQ(current_device()->communicator, &communicator());
    ids[static_cast<size_t>(d)] = std::this_thread::get_id();
    // Kernels run single-threaded inside a device thread: every chunk on this thread.
    std::atomic<int> elsewhere{0};
    const auto me = std::this_thread::get_id();
    parallel_for(1 << 12, 16, [&](int64_t, int64_t) { elsewhere += std::this_thread::get_id() != me; });
    EXPECT_EQ(elsewhere.load(), 0);
    EXPECT_THROW(set_cpu_devices(2), ValueError);               // a run is in flight
    EXPECT_THROW(run_on_devices({d}, [](int) {}), ValueError);  // nested
  });
  EXPECT_EQ(seen, iota(3));
  EXPECT_NE(ids[0], ids[1]);
  EXPECT_EQ(current_device(), nullptr);
  set_cpu_devices(1);
  EXPECT_EQ(runtime_description(), "local (1 virtual CPU device)");
  EXPECT_THROW(set_cpu_devices(0), ValueError);
  EXPECT_THROW(run_on_devices({1}, [](int) {}), ValueError);  // not a device of this world
}

TEST(Runtime, CheckMeshNamesTheShortfall) {
  set_cpu_devices(8);
  check_mesh(Mesh::parse("data=2,model=4"));
  check_mesh(Mesh::parse("data=2"));
  try {
    check_mesh(Mesh::parse("data=4,model=4"));
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_STREQ(e.what(), "mesh (data=4, model=4) needs 16 devices but 8 are present (TESSERA_CPU_DEVICES=8)");
  }
}

TEST(SerialKernelsScope, ParallelForRunsInlineOnlyWhileAlive) {
  if (num_threads() < 2) GTEST_SKIP() << "one thread: parallel_for is always inline";
  const auto me = std::this_thread::get_id();
  std::atomic<int> elsewhere{0};
  {
    SerialKernelsScope scope;
    parallel_for(1 << 12, 1, [&](int64_t, int64_t) {
      elsewhere += std::this_thread::get_id() != me;
      std::this_thread::yield();
    });
  }
  EXPECT_EQ(elsewhere.load(), 0);
}

}  // namespace
}  // namespace tessera::spmd
