// The CUDA backend's public face: which GPUs there are, their memory statistics, and
// the switch that runs jitted programs on them (JitOptions::device). Everything here
// also exists in a CPU-only build, where available() is false and says why.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tessera::cuda {

// Devices are logical. Normally device d is GPU d. With TESSERA_GPU_VIRTUAL_DEVICES=N
// there are N devices, all on GPU 0, each with its own stream, library handles and
// caching allocator: an N-device mesh runs on one GPU (the SPMD correctness mode; their
// collectives are device copies ordered by events).
//
// True when tessera was built with CUDA and at least one device is usable.
bool available();
// Why available() is false: "tessera was built without CUDA", "no CUDA device
// (cudaGetDeviceCount: no CUDA-capable device is detected)", ... Empty when available.
std::string unavailable_reason();
int device_count();

struct DeviceInfo {
  int ordinal = 0;           // the logical device
  int physical_ordinal = 0;  // the GPU it runs on
  int virtual_devices = 0;   // > 0: one of that many virtual devices of the GPU
  std::string name;          // "NVIDIA H100 80GB HBM3"
  int sm_major = 0;          // compute capability
  int sm_minor = 0;
  int multiprocessors = 0;
  size_t memory_bytes = 0;
  size_t l2_bytes = 0;
  int driver_version = 0;  // cudaDriverGetVersion: 13000 = 13.0
  int runtime_version = 0;
  // Dense bf16 tensor-core FLOP/s estimated as SMs x clock x FLOP per SM per clock. MFU
  // counts against the accelerator catalog configs/accelerators.toml where the part is listed
  // (train::cuda_device_peak), and against this only where it is not.
  double estimated_peak_bf16_flops = 0;
};
DeviceInfo device_info(int device = 0);

// cuDNN, which runs fused attention when TESSERA_ATTENTION_KERNEL=cudnn: "9.19.0
// (/path/libcudnn.so.9)" when it loaded, else "not used: " and why (not built, no
// library, too old). Opens the library on the first call.
std::string cudnn_status();

// The caching allocator's counters for one device (bytes are rounded block sizes).
struct MemoryStats {
  size_t allocated_bytes = 0;       // handed out now
  size_t reserved_bytes = 0;        // held from cudaMalloc (allocated + cached)
  size_t peak_allocated_bytes = 0;  // since the last reset_peak_memory
  int64_t allocations = 0;          // allocate calls so far
  int64_t frees = 0;                // frees so far (allocations - frees = live blocks)
  int64_t device_mallocs = 0;       // cudaMalloc calls (cache misses)
  int64_t device_frees = 0;         // cudaFree calls (cache releases)
};
MemoryStats memory_stats(int device = 0);
void reset_peak_memory(int device = 0);
// Returns every cached, unused block to the driver.
void empty_cache(int device = 0);
// Waits for all work tessera queued on the device.
void synchronize(int device = 0);

}  // namespace tessera::cuda
