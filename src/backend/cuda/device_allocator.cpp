#include "backend/cuda/device_allocator.h"

#include <array>

#include "backend/cuda/kernels/cuda_check.h"
#include "backend/cuda/runtime.h"
#include "tessera/base/error.h"

namespace tessera::cuda {

DeviceAllocator& DeviceAllocator::get(int device) {
  static std::mutex mutex;
  static std::array<std::unique_ptr<DeviceAllocator>, 64> allocators;
  if (device < 0 || device >= static_cast<int>(allocators.size()))
    fail<ValueError>("cuda: device {} out of range", device);
  std::lock_guard<std::mutex> lock(mutex);
  auto& a = allocators[static_cast<size_t>(device)];
  if (!a) a.reset(new DeviceAllocator(device));
  return *a;
}

void* DeviceAllocator::allocate(size_t bytes) {
  const size_t size = round_size(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.allocations;
  void* ptr = nullptr;
  auto it = free_blocks_.lower_bound(size);
  if (it != free_blocks_.end() && it->first <= size + size / 4) {
    ptr = it->second;
    live_[ptr] = it->first;
    stats_.allocated_bytes += it->first;
    free_blocks_.erase(it);
  } else {
    set_device(device_);
    cudaError_t status = cudaMalloc(&ptr, size);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();  // clear the sticky-free error state of a failed malloc
      release_cached_locked();
      status = cudaMalloc(&ptr, size);
    }
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      fail<Error>(
          "cuda: out of device memory on device {}: cannot allocate {} bytes ({}); allocator holds {} bytes "
          "({} in use, peak {})",
          device_, size, cudaGetErrorString(status), stats_.reserved_bytes, stats_.allocated_bytes,
          stats_.peak_allocated_bytes);
    }
    ++stats_.device_mallocs;
    stats_.reserved_bytes += size;
    stats_.allocated_bytes += size;
    live_[ptr] = size;
  }
  if (stats_.allocated_bytes > stats_.peak_allocated_bytes) stats_.peak_allocated_bytes = stats_.allocated_bytes;
  return ptr;
}

void DeviceAllocator::free(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(ptr);
  if (it == live_.end()) fail<Error>("cuda: free of {} which device {}'s allocator did not hand out", ptr, device_);
  ++stats_.frees;
  stats_.allocated_bytes -= it->second;
  free_blocks_.emplace(it->second, ptr);
  live_.erase(it);
}

std::shared_ptr<void> DeviceAllocator::allocate_shared(size_t bytes) {
  void* ptr = allocate(bytes);
  return std::shared_ptr<void>(ptr, [this](void* p) {
    try {
      free(p);
    } catch (...) {
      // A destructor must not throw; the block is simply not cached.
    }
  });
}

MemoryStats DeviceAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void DeviceAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
}

void DeviceAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_cached_locked();
}

void DeviceAllocator::release_cached_locked() {
  if (free_blocks_.empty()) return;
  set_device(device_);
  // Work queued earlier may still read a freed block: wait before returning it.
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream(device_)));
  for (auto& [size, ptr] : free_blocks_) {
    TESSERA_CUDA_CHECK(cudaFree(ptr));
    stats_.reserved_bytes -= size;
    ++stats_.device_frees;
  }
  free_blocks_.clear();
}

}  // namespace tessera::cuda
