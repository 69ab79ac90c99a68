#include "backend/cuda/host_offload.h"

#include "backend/cuda/kernels/cuda_check.h"
#include "backend/cuda/runtime.h"

namespace tessera::cuda {

namespace {
// Ordering only: events without timing are the cheap kind to record and wait on.
cudaEvent_t make_event() {
  cudaEvent_t e = nullptr;
  TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}
}  // namespace

HostOffloadStreams::HostOffloadStreams(int device, size_t host_bytes, int copies) {
  set_device(device);
  // Pinned: the DMA engine copies it asynchronously; a pageable block would make
  // cudaMemcpyAsync stage through a bounce buffer and block the host.
  if (host_bytes > 0)
    TESSERA_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host_), host_bytes, cudaHostAllocDefault));
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
  for (int c = 0; c < copies; ++c) {
    ready_.push_back(make_event());
    done_.push_back(make_event());
  }
  joined_ = make_event();
}

HostOffloadStreams::~HostOffloadStreams() {
  // Destructors do not throw: the results are ignored. Pending copies finish first.
  if (side_ != nullptr) cudaStreamSynchronize(side_);
  for (cudaEvent_t e : ready_) cudaEventDestroy(e);
  for (cudaEvent_t e : done_) cudaEventDestroy(e);
  if (joined_ != nullptr) cudaEventDestroy(joined_);
  if (side_ != nullptr) cudaStreamDestroy(side_);
  if (host_ != nullptr) cudaFreeHost(host_);
}

void HostOffloadStreams::copy(int c, void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t main) {
  const auto i = static_cast<size_t>(c);
  TESSERA_CUDA_CHECK(cudaEventRecord(ready_.at(i), main));
  TESSERA_CUDA_CHECK(cudaStreamWaitEvent(side_, ready_[i], 0));
  if (bytes > 0) TESSERA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, side_));
  TESSERA_CUDA_CHECK(cudaEventRecord(done_[i], side_));
}

void HostOffloadStreams::wait(int c, cudaStream_t main) {
  TESSERA_CUDA_CHECK(cudaStreamWaitEvent(main, done_.at(static_cast<size_t>(c)), 0));
}

void HostOffloadStreams::join(cudaStream_t main) {
  TESSERA_CUDA_CHECK(cudaEventRecord(joined_, side_));
  TESSERA_CUDA_CHECK(cudaStreamWaitEvent(main, joined_, 0));
}

}  // namespace tessera::cuda
