// Device discovery, per-device streams and library handles, and the public
// functions of tessera/backend/cuda.h.
#include "backend/cuda/runtime.h"

#include <cublasLt.h>
#include <fmt/format.h>

#include <array>
#include <cstdlib>
#include <mutex>
#include <string>

#include "backend/cuda/device_allocator.h"
#include "backend/cuda/kernels/cuda_check.h"
#include "backend/cuda/kernels/cudnn_attention.h"
#include "tessera/base/flags.h"

namespace tessera::cuda {

namespace {

constexpr int kMaxDevices = 64;

struct DeviceState {
  std::once_flag once;
  cudaStream_t stream = nullptr;
  cublasLtHandle_t cublaslt = nullptr;
};

std::array<DeviceState, kMaxDevices>& states() {
  static std::array<DeviceState, kMaxDevices> s;
  return s;
}

struct Discovery {
  int count = 0;            // logical devices: the GPUs, or the virtual devices of GPU 0
  int virtual_devices = 0;  // TESSERA_GPU_VIRTUAL_DEVICES (0: off)
  std::string reason;
};

// TESSERA_GPU_VIRTUAL_DEVICES=N: N logical devices on GPU 0, each with its own stream,
// library handles and caching allocator (the SPMD correctness mode one GPU can run).
// Returns 0 when unset, or sets `reason` for a bad value.
int virtual_devices_from_env(std::string& reason) {
  const char* v = flags::env("TESSERA_GPU_VIRTUAL_DEVICES");
  if (v == nullptr || *v == '\0') return 0;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || n < 1 || n > kMaxDevices) {
    reason =
        fmt::format("TESSERA_GPU_VIRTUAL_DEVICES={} is not a device count (expected an integer 1..{})", v, kMaxDevices);
    return 0;
  }
  return static_cast<int>(n);
}

const Discovery& discovery() {
  static const Discovery d = [] {
    Discovery out;
    // A bad TESSERA_GPU_VIRTUAL_DEVICES is the reason whether or not a GPU is present.
    out.virtual_devices = virtual_devices_from_env(out.reason);
    if (!out.reason.empty()) return out;
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      out.reason = std::string("no usable CUDA device (cudaGetDeviceCount: ") + cudaGetErrorString(status) + ")";
    } else if (count == 0) {
      out.reason = "no CUDA device (cudaGetDeviceCount returned 0)";
    } else {
      out.count = out.virtual_devices > 0 ? out.virtual_devices : count;
    }
    return out;
  }();
  return d;
}

DeviceState& state(int device) {
  require_device(device);
  DeviceState& s = states()[static_cast<size_t>(device)];
  std::call_once(s.once, [&] {
    set_device(device);
    TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
    const cublasStatus_t st = cublasLtCreate(&s.cublaslt);
    if (st != CUBLAS_STATUS_SUCCESS)
      fail<Error>("cuda: cublasLtCreate failed on device {} (status {})", device, static_cast<int>(st));
  });
  return s;
}

// An estimate of the dense bf16 tensor-core peak (FLOP/s) from the SM count and clock.
// MFU uses the datasheet numbers of configs/accelerators.toml where the part is listed
// (train::cuda_device_peak); this is the fallback for parts it does not list.
double estimated_peak_bf16(const cudaDeviceProp& p, int device) {
  // Per SM per clock: Ampere 1024 bf16 FMA (2048 FLOP), Hopper 2048 FMA (4096 FLOP).
  int clock_khz = 0;
  if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device) != cudaSuccess) (void)cudaGetLastError();
  const double flop_per_sm_clock = p.major >= 9 ? 4096.0 : 2048.0;
  return flop_per_sm_clock * p.multiProcessorCount * (clock_khz > 0 ? clock_khz * 1e3 : 1.5e9);
}

}  // namespace

bool available() { return discovery().count > 0; }
std::string unavailable_reason() { return discovery().reason; }
int device_count() { return discovery().count; }
std::string cudnn_status() { return cudnn_description(); }

void require_device(int device) {
  const Discovery& d = discovery();
  if (d.count == 0) fail<Error>("cuda: {}", d.reason);
  if (device < 0 || device >= d.count || device >= kMaxDevices)
    fail<ValueError>("cuda: device {} does not exist ({} CUDA device(s): 0..{})", device, d.count, d.count - 1);
}

int physical_device(int device) { return discovery().virtual_devices > 0 ? 0 : device; }
int virtual_device_count() { return discovery().virtual_devices; }

void set_device(int device) { TESSERA_CUDA_CHECK(cudaSetDevice(physical_device(device))); }

cudaStream_t stream(int device) { return state(device).stream; }
cublasLtHandle_t cublaslt(int device) { return state(device).cublaslt; }

DeviceInfo device_info(int device) {
  require_device(device);
  cudaDeviceProp p{};
  const int physical = physical_device(device);
  TESSERA_CUDA_CHECK(cudaGetDeviceProperties(&p, physical));
  DeviceInfo info;
  info.ordinal = device;
  info.physical_ordinal = physical;
  info.virtual_devices = virtual_device_count();
  info.name = p.name;
  info.sm_major = p.major;
  info.sm_minor = p.minor;
  info.multiprocessors = p.multiProcessorCount;
  info.memory_bytes = p.totalGlobalMem;
  info.l2_bytes = static_cast<size_t>(p.l2CacheSize);
  TESSERA_CUDA_CHECK(cudaDriverGetVersion(&info.driver_version));
  TESSERA_CUDA_CHECK(cudaRuntimeGetVersion(&info.runtime_version));
  info.estimated_peak_bf16_flops = estimated_peak_bf16(p, physical);
  return info;
}

KernelContext make_context(int device) {
  DeviceState& s = state(device);
  static std::array<std::once_flag, kMaxDevices> info_once;
  static std::array<DeviceInfo, kMaxDevices> infos;
  std::call_once(info_once[static_cast<size_t>(device)],
                 [&] { infos[static_cast<size_t>(device)] = device_info(device); });
  const DeviceInfo& info = infos[static_cast<size_t>(device)];
  KernelContext ctx;
  ctx.stream = s.stream;
  ctx.device = device;
  ctx.sm_major = info.sm_major;
  ctx.sm_minor = info.sm_minor;
  ctx.multiprocessors = info.multiprocessors;
  ctx.cublaslt = s.cublaslt;
  return ctx;
}

MemoryStats memory_stats(int device) {
  require_device(device);
  return DeviceAllocator::get(device).stats();
}
void reset_peak_memory(int device) {
  require_device(device);
  DeviceAllocator::get(device).reset_peak();
}
void empty_cache(int device) {
  require_device(device);
  DeviceAllocator::get(device).empty_cache();
}
void synchronize(int device) {
  require_device(device);
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream(device)));
}

void ensure_kernels_registered() {
  static std::once_flag once;
  std::call_once(once, register_builtin_kernels);
}

}  // namespace tessera::cuda
