// tessera/backend/cuda.h and backend/device_data.h in a build without CUDA: there are no
// devices, and nothing can be device-resident.
#include "tessera/backend/cuda.h"
#include "tessera/backend/device_data.h"
#include "tessera/base/error.h"
#include "tessera/compiler/device_program.h"
#include "tessera/core/array.h"

namespace tessera::cuda {

namespace {
[[noreturn]] void no_cuda(const char* what) {
  fail<Error>(
      "cuda: {} needs a GPU, but tessera was built without CUDA (configure with nvcc on the PATH or "
      "-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc)",
      what);
}
}  // namespace

bool available() { return false; }
std::string unavailable_reason() { return "tessera was built without CUDA"; }
int device_count() { return 0; }
DeviceInfo device_info(int) { no_cuda("device_info"); }
std::string cudnn_status() { return "not used: tessera was built without CUDA"; }
MemoryStats memory_stats(int) { no_cuda("memory_stats"); }
void reset_peak_memory(int) { no_cuda("reset_peak_memory"); }
void empty_cache(int) { no_cuda("empty_cache"); }
void synchronize(int) { no_cuda("synchronize"); }

}  // namespace tessera::cuda

namespace tessera::backend {

bool on_device(const Array& a) { return a.impl()->device_data != nullptr; }
void fetch_to_host(const Array& a) {
  if (a.impl()->device_data) fail<Error>("cuda: a device-resident array in a build without CUDA");
}

}  // namespace tessera::backend

namespace tessera::compiler {

std::shared_ptr<DeviceProgram> make_device_program(std::shared_ptr<Executable>, const DeviceSpec& device) {
  fail<Error>("jit: device {} needs a GPU, but tessera was built without CUDA", device.to_string());
}

}  // namespace tessera::compiler
