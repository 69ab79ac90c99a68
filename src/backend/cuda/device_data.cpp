// Reading a device-resident array on the host: one copy into host storage, kept.
#include "tessera/backend/device_data.h"

#include <mutex>

#include "backend/cuda/kernels/cuda_check.h"
#include "backend/cuda/runtime.h"
#include "tessera/core/array.h"

namespace tessera::backend {

bool on_device(const Array& a) { return a.impl()->device_data != nullptr; }

void fetch_to_host(const Array& a) {
  detail::ArrayImpl* impl = a.impl();
  const std::shared_ptr<const DeviceData> data = impl->device_data;
  if (!data || impl->storage) return;
  static std::mutex mutex;  // two threads reading the same array copy it once
  std::lock_guard<std::mutex> lock(mutex);
  if (impl->storage) return;
  auto storage = std::make_shared<Storage>(a.nbytes());
  if (a.nbytes() > 0) {
    cuda::set_device(data->device);
    cudaStream_t s = cuda::stream(data->device);
    TESSERA_CUDA_CHECK(cudaMemcpyAsync(storage->data, data->ptr, a.nbytes(), cudaMemcpyDeviceToHost, s));
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(s));
  }
  impl->storage = std::move(storage);
}

}  // namespace tessera::backend
