// DeviceTransport: moves whole blocks between the device buffers of a collective's
// group — the two exchanges a CollectivePlan asks for (spmd/collective_plan.h). The GPU
// collective kernels (eval_collective.cpp) run every other step of a plan themselves
// (strided device copies, ordered sums), so a transport never adds anything: whichever
// transport moves the blocks, the sums are bitwise the CPU communicators'.
//
//   * In-process (the local runtime: a thread per mesh device, each driving its own
//     logical CUDA device — GPUs of this process, or virtual devices of one GPU): every
//     member posts its send pointer and an event recorded on its stream, meets the others
//     at a host barrier of the runtime's communicator (abort-aware: a failing member
//     wakes the rest), and copies its blocks straight from the peers' buffers on its own
//     stream after waiting for their events. A second barrier exchanges "done" events,
//     which every member's stream waits for before it may overwrite a buffer a peer
//     reads. No host thread waits for the GPU.
//   * NCCL (one process per GPU, the runtime an MPI or TCP world): ncclAllGather and
//     grouped ncclSend/ncclRecv on the executable's stream (NcclCommunicator's device
//     calls), the NCCL world created on first use on the process's GPU.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <vector>

#include "tessera/spmd/runtime.h"

namespace tessera::cuda {

class DeviceTransport {
 public:
  virtual ~DeviceTransport() = default;
  virtual std::string kind() const = 0;
  // recv + k * bytes = member k's send (bytes each), on every member.
  virtual void all_gather(const spmd::DeviceContext& context, int cuda_device, const std::vector<int>& group,
                          const void* send, void* recv, size_t bytes, cudaStream_t stream) = 0;
  // send holds one block of `bytes` per member; recv + k * bytes = member k's block for
  // this member.
  virtual void all_to_all(const spmd::DeviceContext& context, int cuda_device, const std::vector<int>& group,
                          const void* send, void* recv, size_t bytes, cudaStream_t stream) = 0;
};

// The transport for the runtime of `context` (its communicator's kind): in-process for
// "local", NCCL for a multi-process world when this build has NCCL; otherwise an Error
// that says what is missing.
DeviceTransport& transport_for(const spmd::DeviceContext& context);

}  // namespace tessera::cuda
