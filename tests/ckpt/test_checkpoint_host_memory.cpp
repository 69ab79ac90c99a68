// Host memory during a save stays bounded: an asynchronous save adds one staging copy of
// the state (allocated once, reused by later saves), a synchronous one streams from the
// arrays and adds nothing the size of the state. Orbax users have seen saves take 3x the
// host RAM of the state; this is the check that tessera does not.
//
// Measured with the kernel's peak resident set (VmHWM), reset before each save by
// writing 5 to /proc/self/clear_refs.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "data/temp_dir.h"
#include "tessera/ckpt/async_checkpointer.h"
#include "tessera/ckpt/checkpoint.h"

#if defined(__SANITIZE_ADDRESS__)
#define TESSERA_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TESSERA_TEST_ASAN 1
#endif
#endif

namespace tessera::ckpt {
namespace {

using tessera::testing::TempDir;

// A field of /proc/self/status in bytes ("VmRSS", "VmHWM"), or -1.
double status_bytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field + ":", 0) == 0) {
      std::istringstream value(line.substr(field.size() + 1));
      double kb = 0;
      value >> kb;
      return kb * 1024.0;
    }
  return -1;
}

bool reset_peak() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  return static_cast<bool>(clear);
}

Array filled(int64_t n, float value) {
  Array a = Array::empty({n}, DType::Float32);
  float* p = static_cast<float*>(a.mutable_raw_data());
  for (int64_t i = 0; i < n; ++i) p[i] = value + static_cast<float>(i % 1000);
  return a;
}

constexpr double kMiB = 1024.0 * 1024.0;

class CheckpointHostMemory : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!reset_peak() || status_bytes("VmHWM") < 0)
      GTEST_SKIP() << "this kernel does not let a process reset its peak RSS (/proc/self/clear_refs)";
    // 32 MiB of parameters and 64 MiB of optimizer moments, touched (resident).
    state_.step = 1;
    state_.params = Tree{{"w", filled(8 << 20, 1)}};
    state_.opt_state = Tree{{"m", filled(8 << 20, 2)}, {"v", filled(8 << 20, 3)}};
    state_bytes_ = 3.0 * (8 << 20) * 4;
  }

  // The growth of the peak RSS over the resident set before `save` runs.
  double peak_growth(const std::function<void()>& save) {
    reset_peak();
    const double before = status_bytes("VmRSS");
    save();
    return status_bytes("VmHWM") - before;
  }

  // Bookkeeping, buffered file writes, thread stacks: a few MiB; ASan also maps 1/8 of
  // new memory as shadow.
  double slack(double new_bytes) const {
#ifdef TESSERA_TEST_ASAN
    return 24 * kMiB + new_bytes / 8;
#else
    (void)new_bytes;
    return 16 * kMiB;
#endif
  }

  CheckpointState state_;
  double state_bytes_ = 0;
};

TEST_F(CheckpointHostMemory, AnAsyncSaveAddsOneStagingCopyOnceAndNothingAfter) {
  TempDir dir;
  CheckpointManager manager(dir / "ckpt");
  AsyncCheckpointer async([&](const CheckpointState& s) { return manager.save(s); }, manager.directory());
  const double first = peak_growth([&] {
    async.save(state_);
    async.wait();
  });
  std::printf("first async save: peak RSS +%.1f MiB for a %.1f MiB state\n", first / kMiB, state_bytes_ / kMiB);
  EXPECT_LE(first, state_bytes_ + slack(state_bytes_)) << "state + one staging copy at most";
  EXPECT_GE(first, 0.9 * state_bytes_) << "the staging copy is resident: the measurement sees memory";
  state_.step = 2;
  const double second = peak_growth([&] {
    async.save(state_);
    async.wait();
  });
  std::printf("second async save: peak RSS +%.1f MiB\n", second / kMiB);
  EXPECT_LE(second, slack(0)) << "the staging buffers are reused";
  EXPECT_EQ(async.staging_allocations(), 1);
}

TEST_F(CheckpointHostMemory, ASynchronousSaveStreamsFromTheArrays) {
  TempDir dir;
  CheckpointManager manager(dir / "ckpt");
  const double growth = peak_growth([&] { manager.save(state_); });
  std::printf("sync save: peak RSS +%.1f MiB for a %.1f MiB state\n", growth / kMiB, state_bytes_ / kMiB);
  EXPECT_LE(growth, slack(0)) << "no copy of the state";
}

}  // namespace
}  // namespace tessera::ckpt
