// DeviceData: an array's value held in accelerator memory. A GPU executable's outputs
// are arrays whose value lives here (ArrayImpl::device_data) and not on the host:
// the next GPU program reads them in place (a training step's parameters never leave
// the GPU). Reading such an array on the host (data(), to_vector(), a CPU program)
// copies the value into host storage once; the device copy stays (arrays are
// immutable), so a checkpoint save does not move the parameters off the GPU.
#pragma once

#include <cstddef>
#include <memory>

namespace tessera {
class Array;
}

namespace tessera::backend {

struct DeviceData {
  int device = 0;       // CUDA device ordinal
  void* ptr = nullptr;  // device pointer
  size_t bytes = 0;
  std::shared_ptr<void> owner;  // returns the memory to the device allocator when the last holder goes
};

// Whether the array's value lives on a device (its host storage may be missing).
bool on_device(const Array& a);
// Copies a device-resident array's value into host storage (a no-op for host arrays).
// Throws Error when tessera was built without CUDA.
void fetch_to_host(const Array& a);

}  // namespace tessera::backend
