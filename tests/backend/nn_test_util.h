// Test helpers for the NN / matmul / gather / optimizer kernels: typed buffers filled
// from doubles, dtype tolerances, and a runner that checks thread-count independence.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "tessera/base/dtype.h"
#include "tessera/base/thread_pool.h"

namespace tessera::cpu::testing {

// The CPU flags line of /proc/cpuinfo (Linux), with a space on each side of every flag.
// The value of the first `key` line of /proc/cpuinfo ("" if none).
inline std::string cpuinfo_field(const std::string& key) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0 && line.find(':') != std::string::npos) return line.substr(line.find(':') + 1);
  return "";
}

inline std::string cpu_flags() {
  const std::string flags = cpuinfo_field("flags");
  return flags.empty() ? "" : " " + flags + " ";
}

// A buffer of `dtype` elements read and written as doubles.
class Buf {
 public:
  Buf(DType dtype, int64_t n) : dtype_(dtype), n_(n), bytes_(static_cast<size_t>(n) * itemsize(dtype) + 1) {}
  Buf(DType dtype, const std::vector<double>& values) : Buf(dtype, static_cast<int64_t>(values.size())) {
    for (int64_t i = 0; i < n_; ++i) set(i, values[static_cast<size_t>(i)]);
  }
  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }
  int64_t size() const { return n_; }
  DType dtype() const { return dtype_; }
  double get(int64_t i) const { return load_as_double(dtype_, bytes_.data(), i); }
  void set(int64_t i, double v) { store_from_double(dtype_, bytes_.data(), i, v); }
  std::vector<double> values() const {
    std::vector<double> v(static_cast<size_t>(n_));
    for (int64_t i = 0; i < n_; ++i) v[static_cast<size_t>(i)] = get(i);
    return v;
  }
  bool bitwise_equal(const Buf& o) const {
    return n_ == o.n_ && std::memcmp(bytes_.data(), o.bytes_.data(), static_cast<size_t>(n_) * itemsize(dtype_)) == 0;
  }

 private:
  DType dtype_;
  int64_t n_;
  std::vector<unsigned char> bytes_;
};

inline std::vector<double> uniform(size_t n, double lo, double hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(n);
  for (auto& e : v) e = dist(rng);
  return v;
}

// The values a dtype actually holds for `v` (what a reference must start from).
inline std::vector<double> rounded(DType dtype, const std::vector<double>& v) { return Buf(dtype, v).values(); }

inline const DType kFloatTypes[] = {DType::Float64, DType::Float32, DType::BFloat16, DType::Float16};

// |got - want| <= atol + rtol |want| for results computed from values exactly held by
// the dtype (so the error is compute + output rounding only).
struct Tol {
  double atol, rtol;
};
inline Tol tol_for(DType dtype) {
  switch (dtype) {
    case DType::Float64:
      return {1e-12, 1e-11};
    case DType::Float32:
      return {2e-6, 2e-5};
    case DType::BFloat16:
      return {2e-2, 1.6e-2};
    default:
      return {2e-3, 2e-3};  // float16
  }
}

inline void expect_close(const std::vector<double>& got, const std::vector<double>& want, Tol tol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int reported = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(got[i] - want[i]);
    if (!(err <= tol.atol + tol.rtol * std::abs(want[i])) && reported++ < 5) {
      ADD_FAILURE() << what << ": element " << i << " got " << got[i] << " want " << want[i] << " (err " << err << ")";
    }
  }
}

// Runs fn under 1 and then 2 threads, restoring the previous thread count.
inline void with_threads(int n, const std::function<void()>& fn) {
  const int saved = num_threads();
  set_num_threads(n);
  fn();
  set_num_threads(saved);
}

}  // namespace tessera::cpu::testing
