// Shared helpers for the SPMD tests: random host arrays, tolerance checks, and
// "run f sharded and unsharded, compare".
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tessera/api/jit.h"
#include "tessera/core/ops.h"
#include "tessera/spmd/api.h"
#include "tessera/spmd/runtime.h"

namespace tessera::testing {

// Devices 0 .. n-1 (run_on_devices over a whole mesh).
inline std::vector<int> all_devices(int n) {
  std::vector<int> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
  return v;
}

// An array's value as bytes (bitwise comparisons).
inline std::vector<char> bytes_of(const Array& a) {
  std::vector<char> b(a.nbytes());
  if (!b.empty()) std::memcpy(b.data(), a.raw_data(), b.size());
  return b;
}

inline Array random_array(const Shape& shape, uint64_t seed, double scale = 1.0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(numel(shape)));
  for (float& x : v) x = static_cast<float>(u(rng) * scale);
  return Array::from_vector(v, shape);
}

// Relative error in the 2-norm, ||a - b|| / ||b|| <= rtol (the usual measure for a
// whole tensor: one element near zero does not dominate it).
inline void expect_close(const Array& actual, const Array& expected, double rtol, const std::string& what) {
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  std::vector<double> a = spmd::gather(actual).to_vector<double>();
  std::vector<double> b = spmd::gather(expected).to_vector<double>();
  double err = 0, mag = 0, worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    err += (a[i] - b[i]) * (a[i] - b[i]);
    mag += b[i] * b[i];
    worst = std::max(worst, std::abs(a[i] - b[i]));
  }
  err = std::sqrt(err);
  mag = std::sqrt(mag);
  EXPECT_LE(err, rtol * mag + 1e-30) << what << ": relative error " << err / (mag + 1e-30) << " (largest element error "
                                     << worst << ")";
}

// The message of the E that fn throws; a test failure when it throws nothing or
// another exception type.
template <typename E, typename F>
std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw another exception type: " << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected an exception";
  return "";
}

inline void expect_contains(const std::string& text, const std::vector<std::string>& parts) {
  for (const std::string& p : parts) EXPECT_NE(text.find(p), std::string::npos) << "'" << p << "' not in: " << text;
}

// Switches the in-process runtime to n virtual devices for the test's lifetime.
class VirtualDevices {
 public:
  explicit VirtualDevices(int n) : previous_(spmd::device_count()) { spmd::set_cpu_devices(n); }
  ~VirtualDevices() { spmd::set_cpu_devices(previous_); }

 private:
  int previous_;
};

}  // namespace tessera::testing
