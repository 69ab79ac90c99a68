// Kernels compiled at run time: CUDA C++ source -> NVRTC -> a library loaded with the
// CUDA runtime's library API (cudaLibraryLoadData / cudaLibraryGetKernel), launched
// with cudaLaunchKernel. Only the runtime and NVRTC are linked, never libcuda (the
// driver API), so a binary that uses this still starts on a machine without a driver.
//
// Every source is compiled once per process and architecture: a process-wide,
// thread-safe cache keyed by (architecture, source text) holds the loaded libraries
// for the life of the process, so two executables that generate the same source (the
// fused-kernel generator is deterministic) share one compilation.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tessera::cuda {

// One compiled source with the kernels that were asked for, in the order they were
// named. Immutable once built; shared by every user of the same source.
class NvrtcModule {
 public:
  NvrtcModule(std::string arch, std::vector<std::string> names, std::vector<const void*> kernels, void* library)
      : arch_(std::move(arch)), names_(std::move(names)), kernels_(std::move(kernels)), library_(library) {}
  NvrtcModule(const NvrtcModule&) = delete;
  NvrtcModule& operator=(const NvrtcModule&) = delete;

  // The kernel names[i] of compile_module's call, as the function pointer
  // cudaLaunchKernel takes (a cudaKernel_t), loaded into the current device's
  // context (the first call on a device forces the lazy load there, so it never
  // happens inside a CUDA graph capture that follows).
  const void* kernel(size_t i) const;
  size_t size() const { return kernels_.size(); }
  const std::string& name(size_t i) const { return names_.at(i); }
  const std::string& arch() const { return arch_; }  // "sm_90", or "compute_90" (PTX)

 private:
  std::string arch_;
  std::vector<std::string> names_;
  std::vector<const void*> kernels_;
  void* library_;                               // cudaLibrary_t, never unloaded
  mutable std::atomic<uint64_t> loaded_on_{0};  // bit d: touched on device d
};

// Compiles `source` for the architecture of the current device and loads it, or
// returns the cached module. `kernel_names` are extern "C" __global__ functions of
// the source. Options: --gpu-architecture=sm_XY (compute_XY, as PTX for the driver to
// finish, when this NVRTC does not know the device), -default-device, --std=c++17.
// Throws tessera::Error with NVRTC's log and the first lines of the source when the
// source does not compile, and when a named kernel is missing.
std::shared_ptr<const NvrtcModule> compile_module(const std::string& source,
                                                  const std::vector<std::string>& kernel_names);

// cudaLaunchKernel(kernel, grid, block, args, shared_bytes, stream), checked.
// args[i] points to the i-th kernel parameter's value.
void launch_kernel(const void* kernel, dim3 grid, dim3 block, void** args, size_t shared_bytes, cudaStream_t stream);

// How many sources this process has compiled with NVRTC (cache misses).
int64_t nvrtc_compile_count();

}  // namespace tessera::cuda
