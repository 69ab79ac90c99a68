// Error checks for CUDA calls. A failing call becomes a tessera::Error naming the call,
// CUDA's message and the source line.
//
// This header is usable from .cu files: nvcc's front end cannot compile fmt (which
// tessera/base/error.h pulls in), so .cu code reports errors through the plain
// functions below, defined in cuda_check.cpp, and never includes base/error.h.
#pragma once

#include <cuda_runtime_api.h>

#include <sstream>
#include <string>

namespace tessera::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line);
// Throws tessera::ValueError / DTypeError / Error with `message` (for .cu launchers).
[[noreturn]] void throw_value_error(const std::string& message);
[[noreturn]] void throw_dtype_error(const std::string& message);
[[noreturn]] void throw_error(const std::string& message);

// value_error("take: index ", i, " out of range") -> ValueError with the pieces joined.
template <typename... Args>
[[noreturn]] void value_error(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  throw_value_error(os.str());
}

}  // namespace tessera::cuda

#define TESSERA_CUDA_CHECK(call)                                                          \
  do {                                                                                    \
    const cudaError_t tessera_cuda_status_ = (call);                                      \
    if (tessera_cuda_status_ != cudaSuccess)                                              \
      ::tessera::cuda::throw_cuda_error(tessera_cuda_status_, #call, __FILE__, __LINE__); \
  } while (0)
