// Helpers for the CUDA kernel tests: skip cleanly without a GPU, move data to and
// from the device, poison outputs so an element a kernel never writes fails the
// comparison, and the relative error the tolerances are stated in.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "tessera/backend/cuda.h"
#include "tessera/base/dtype.h"
#include "tessera/base/error.h"

// Every GPU test starts with this: without a device the test is skipped and says why.
#define TESSERA_REQUIRE_GPU()                                                                               \
  do {                                                                                                      \
    if (!::tessera::cuda::available()) GTEST_SKIP() << "no GPU: " << ::tessera::cuda::unavailable_reason(); \
  } while (0)

namespace tessera::cuda_test {

inline void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) fail<Error>("{}: {}", what, cudaGetErrorString(status));
}

// A device buffer of n elements of T (RAII).
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (n > 0) check(cudaMalloc(&ptr_, n * sizeof(T)), "cudaMalloc");
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), n_(o.n_) {
    o.ptr_ = nullptr;
    o.n_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(n_, o.n_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return static_cast<T*>(ptr_); }
  size_t size() const { return n_; }
  void upload(const std::vector<T>& host) {
    if (host.size() != n_) fail<ValueError>("upload: {} elements into a buffer of {}", host.size(), n_);
    if (n_ > 0) check(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), "upload");
  }
  std::vector<T> download() const {
    check(cudaDeviceSynchronize(), "kernel (cudaDeviceSynchronize)");
    std::vector<T> host(n_);
    if (n_ > 0) check(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return host;
  }
  // 0xFF bytes: NaN in every float format, so unwritten outputs fail any comparison.
  void poison() {
    if (n_ > 0) check(cudaMemset(ptr_, 0xFF, n_ * sizeof(T)), "poison");
  }

 private:
  void* ptr_ = nullptr;
  size_t n_ = 0;
};

// Fresh random inputs per test (seeded from the test's own counter so a failure
// reproduces): normal(0, scale).
inline std::vector<float> random_floats(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

inline std::vector<bfloat16> to_bf16(const std::vector<float>& v) {
  std::vector<bfloat16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = float_to_bf16(v[i]);
  return out;
}
inline std::vector<float> from_bf16(const std::vector<bfloat16>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = bf16_to_float(v[i]);
  return out;
}
// Rounds through bf16 (the reference computes from the same rounded inputs).
inline std::vector<float> round_bf16(const std::vector<float>& v) { return from_bf16(to_bf16(v)); }

// ||out - ref|| / ||ref|| in float64; infinite when out has a NaN (poison left over).
inline double rel_error(const std::vector<float>& out, const std::vector<float>& ref) {
  if (out.size() != ref.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i]) && std::isfinite(ref[i])) return INFINITY;
    const double d = static_cast<double>(out[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  if (den == 0) return std::sqrt(num);
  return std::sqrt(num / den);
}

// The tolerances: bf16 results 1e-2, float32 results 1e-5.
inline constexpr double kBf16Tolerance = 1e-2;
inline constexpr double kF32Tolerance = 1e-5;

}  // namespace tessera::cuda_test
