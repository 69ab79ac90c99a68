// Per-device state of the CUDA backend: the stream all of tessera's work on a device
// goes to, and the library handles bound to it. One in-order stream per device is what
// makes the caching allocator's reuse safe without events: a block freed on the host
// is only reused by work queued after everything that used it.
#pragma once

#include <cuda_runtime_api.h>

#include "backend/cuda/kernel_registry.h"
#include "tessera/backend/cuda.h"

namespace tessera::cuda {

// Throws Error with unavailable_reason() when there is no usable device `device`.
void require_device(int device);
// Devices are logical: the GPUs, or under TESSERA_GPU_VIRTUAL_DEVICES=N the N virtual
// devices of GPU 0 (each its own stream, handles and allocator; cuda.h).
// The GPU a logical device runs on.
int physical_device(int device);
// N under TESSERA_GPU_VIRTUAL_DEVICES=N, else 0.
int virtual_device_count();
// cudaSetDevice(physical_device(device)), checked.
void set_device(int device);
cudaStream_t stream(int device);
cublasLtHandle_t cublaslt(int device);
// A launch context for `device` (scratch left empty: the caller provides it).
KernelContext make_context(int device);
// Registers every family's kernels once (kernel_registry.h).
void ensure_kernels_registered();

}  // namespace tessera::cuda
