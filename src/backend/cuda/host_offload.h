// Host offload on a GPU (the offload checkpoint policy, compiler/passes/offload.h):
// the offload_to_host / load_from_host steps of a GpuExecutable run as copies to and
// from one pinned host block (the memory plan's host arena) on a side stream, so
// they overlap the kernels on the device's main stream.
//
// Ordering, per copy c (each offload and each load is one copy with two events):
//   * ready[c] is recorded on the main stream where the step sits in the schedule and
//     the side stream waits for it: the copy reads (offload) or overwrites (load) a
//     device buffer only after every kernel queued before the step;
//   * done[c] is recorded on the side stream after the copy; the main stream waits
//     for it before the first later step that writes over the offloaded buffer
//     (offload) or reads the loaded value (load): GpuExecutable computes those steps
//     from the memory plan when it is built;
//   * join() makes the main stream wait for everything on the side stream at the end
//     of a run, so a captured CUDA graph has no unjoined work and the caching
//     allocator's single-stream reasoning (runtime.h) holds between runs.
// Copies on one side stream run in order, so a host block reused by a later offload
// (the planner overlaps host values whose lifetimes do not) is never overwritten
// before the load that reads it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

namespace tessera::cuda {

class HostOffloadStreams {
 public:
  // `host_bytes` of pinned memory and `copies` event pairs on `device`.
  HostOffloadStreams(int device, size_t host_bytes, int copies);
  ~HostOffloadStreams();
  HostOffloadStreams(const HostOffloadStreams&) = delete;
  HostOffloadStreams& operator=(const HostOffloadStreams&) = delete;

  unsigned char* host_base() const { return host_; }
  // Queues copy `c` of `bytes` from `src` to `dst` (device->host or host->device) on
  // the side stream, after the work queued on `main` so far.
  void copy(int c, void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t main);
  // The main stream waits for copy `c`.
  void wait(int c, cudaStream_t main);
  // The main stream waits for every copy queued so far.
  void join(cudaStream_t main);

 private:
  unsigned char* host_ = nullptr;
  cudaStream_t side_ = nullptr;
  std::vector<cudaEvent_t> ready_, done_;
  cudaEvent_t joined_ = nullptr;
};

}  // namespace tessera::cuda
