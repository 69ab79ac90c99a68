// The NCCL communicator's device-buffer side: the enqueueing bodies every collective
// runs (NCCL calls on device buffers, or device copies for groups of one), the pointer
// checks, and the public *_device functions and synchronize() (communicator_nccl.h).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdint>

#include "spmd/communicator_local.h"
#include "spmd/nccl/communicator_nccl_impl.h"
#include "tessera/base/error.h"

namespace tessera::spmd {

using namespace nccl_detail;  // NOLINT(build/namespaces): the NCCL files' shared helpers

// ---- NcclCommunicator::Impl: the enqueueing bodies ----

void NcclCommunicator::Impl::check_device_pointer(const void* p, const char* what, const char* op) const {
  if (p == nullptr) fail<ValueError>("{}: {} is null", op, what);
  cudaPointerAttributes attributes{};
  const cudaError_t status = cudaPointerGetAttributes(&attributes, p);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    fail<ValueError>("{}: {} ({}) is not a CUDA pointer: {}", op, what, p, cudaGetErrorString(status));
  }
  if (attributes.type == cudaMemoryTypeManaged) return;
  if (attributes.type != cudaMemoryTypeDevice)
    fail<ValueError>("{}: {} ({}) is {} memory, not device memory on GPU {}", op, what, p,
                     attributes.type == cudaMemoryTypeHost ? "pinned host" : "unregistered host", device);
  if (attributes.device != device)
    fail<ValueError>("{}: {} ({}) is on GPU {}, but this rank drives GPU {}", op, what, p, attributes.device, device);
}

void NcclCommunicator::Impl::enqueue_all_gather(const std::vector<int>& group, const void* send, void* recv,
                                                size_t bytes, cudaStream_t s) {
  if (bytes == 0) return;
  if (!uses_nccl(group)) {
    if (send != recv) TESSERA_CUDA_CHECK(cudaMemcpyAsync(recv, send, bytes, cudaMemcpyDeviceToDevice, s));
    return;
  }
  ncclComm_t comm = comm_for(group);
  run_nccl(comm, "all_gather", group, "ncclAllGather",
           [&] { return ncclAllGather(send, recv, bytes, ncclUint8, comm, s); });
}

void NcclCommunicator::Impl::enqueue_all_reduce(const std::vector<int>& group, const void* send, void* recv,
                                                size_t count, DType dtype, cudaStream_t s) {
  const ncclDataType_t type = nccl_sum_type(dtype, "all_reduce");
  if (count == 0) return;
  if (!uses_nccl(group)) {
    if (send != recv)
      TESSERA_CUDA_CHECK(cudaMemcpyAsync(recv, send, count * itemsize(dtype), cudaMemcpyDeviceToDevice, s));
    return;
  }
  ncclComm_t comm = comm_for(group);
  run_nccl(comm, "all_reduce", group, "ncclAllReduce",
           [&] { return ncclAllReduce(send, recv, count, type, ncclSum, comm, s); });
}

void NcclCommunicator::Impl::enqueue_reduce_scatter(const std::vector<int>& group, const void* send, void* recv,
                                                    size_t count, DType dtype, cudaStream_t s) {
  const ncclDataType_t type = nccl_sum_type(dtype, "reduce_scatter");
  if (count == 0) return;
  if (!uses_nccl(group)) {
    if (send != recv)
      TESSERA_CUDA_CHECK(cudaMemcpyAsync(recv, send, count * itemsize(dtype), cudaMemcpyDeviceToDevice, s));
    return;
  }
  ncclComm_t comm = comm_for(group);
  // ncclReduceScatter's count is the per-member (received) count.
  run_nccl(comm, "reduce_scatter", group, "ncclReduceScatter",
           [&] { return ncclReduceScatter(send, recv, count, type, ncclSum, comm, s); });
}

void NcclCommunicator::Impl::enqueue_all_to_all(const std::vector<int>& group, const void* send, void* recv,
                                                size_t bytes, cudaStream_t s) {
  if (bytes == 0) return;
  const size_t n = group.size(), me = index_of(group);
  const char* in = static_cast<const char*>(send);
  char* out = static_cast<char*>(recv);
  // Our own block: a device copy (send and recv never overlap here).
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(out + me * bytes, in + me * bytes, bytes, cudaMemcpyDeviceToDevice, s));
  if (n == 1) return;
  ncclComm_t comm = comm_for(group);
  run_nccl(comm, "all_to_all", group, "ncclGroupStart/ncclSend/ncclRecv/ncclGroupEnd", [&] {
    ncclResult_t result = ncclGroupStart();
    if (result != ncclSuccess) return result;
    for (size_t j = 0; j < n && (result == ncclSuccess || result == ncclInProgress); ++j) {
      if (j == me) continue;
      const int peer = static_cast<int>(j);  // comm rank == position in the group
      result = ncclSend(in + j * bytes, bytes, ncclUint8, peer, comm, s);
      if (result == ncclSuccess || result == ncclInProgress)
        result = ncclRecv(out + j * bytes, bytes, ncclUint8, peer, comm, s);
    }
    const ncclResult_t end = ncclGroupEnd();  // always close the group
    return result != ncclSuccess && result != ncclInProgress ? result : end;
  });
}

void NcclCommunicator::Impl::enqueue_broadcast(const std::vector<int>& group, void* buffer, size_t bytes,
                                               cudaStream_t s) {
  if (bytes == 0 || !uses_nccl(group)) return;
  ncclComm_t comm = comm_for(group);
  // Root 0: the group's first member.
  run_nccl(comm, "broadcast", group, "ncclBroadcast",
           [&] { return ncclBroadcast(buffer, buffer, bytes, ncclUint8, 0, comm, s); });
}

// ---- device buffers ----

void NcclCommunicator::all_gather_device(const std::vector<int>& group, const void* send, void* recv, size_t bytes,
                                         cudaStream_t stream) {
  Impl& m = *impl_;
  const char* op = "all_gather_device";
  const double start = m.begin(m.rank, group, op);
  DeviceGuard guard(m.device);
  const size_t n = group.size();
  if (bytes > 0) {
    m.check_device_pointer(send, "send", op);
    m.check_device_pointer(recv, "recv", op);
    const bool in_place = send == static_cast<const char*>(recv) + m.index_of(group) * bytes;
    if (!in_place && overlaps(send, bytes, recv, n * bytes))
      fail<ValueError>("{}: send and recv overlap (only send == recv + {} * bytes is allowed)", op, m.index_of(group));
    m.enqueue_all_gather(group, send, recv, bytes, stream != nullptr ? stream : m.stream);
  }
  m.finish(start, CommKind::AllGather, n, static_cast<double>(n * bytes));
}

void NcclCommunicator::all_reduce_device(const std::vector<int>& group, const void* send, void* recv, size_t count,
                                         DType dtype, cudaStream_t stream) {
  Impl& m = *impl_;
  const char* op = "all_reduce_device";
  const double start = m.begin(m.rank, group, op);
  nccl_sum_type(dtype, op);
  DeviceGuard guard(m.device);
  const size_t bytes = count * itemsize(dtype);
  if (count > 0) {
    m.check_device_pointer(send, "send", op);
    m.check_device_pointer(recv, "recv", op);
    if (send != recv && overlaps(send, bytes, recv, bytes))
      fail<ValueError>("{}: send and recv overlap (only send == recv is allowed)", op);
    m.enqueue_all_reduce(group, send, recv, count, dtype, stream != nullptr ? stream : m.stream);
  }
  m.finish(start, CommKind::AllReduce, group.size(), static_cast<double>(bytes));
}

void NcclCommunicator::reduce_scatter_device(const std::vector<int>& group, const void* send, void* recv, size_t count,
                                             DType dtype, cudaStream_t stream) {
  Impl& m = *impl_;
  const char* op = "reduce_scatter_device";
  const double start = m.begin(m.rank, group, op);
  nccl_sum_type(dtype, op);
  DeviceGuard guard(m.device);
  const size_t n = group.size(), block = count * itemsize(dtype);
  if (count > 0) {
    m.check_device_pointer(send, "send", op);
    m.check_device_pointer(recv, "recv", op);
    const bool in_place = recv == static_cast<const char*>(send) + m.index_of(group) * block;
    if (!in_place && overlaps(send, n * block, recv, block))
      fail<ValueError>("{}: send and recv overlap (only recv == send + {} * count * itemsize is allowed)", op,
                       m.index_of(group));
    m.enqueue_reduce_scatter(group, send, recv, count, dtype, stream != nullptr ? stream : m.stream);
  }
  m.finish(start, CommKind::ReduceScatter, n, static_cast<double>(n * block));
}

void NcclCommunicator::all_to_all_device(const std::vector<int>& group, const void* send, void* recv, size_t bytes,
                                         cudaStream_t stream) {
  Impl& m = *impl_;
  const char* op = "all_to_all_device";
  const double start = m.begin(m.rank, group, op);
  DeviceGuard guard(m.device);
  const size_t n = group.size();
  if (bytes > 0) {
    m.check_device_pointer(send, "send", op);
    m.check_device_pointer(recv, "recv", op);
    if (overlaps(send, n * bytes, recv, n * bytes))
      fail<ValueError>("{}: send and recv overlap (an all-to-all cannot run in place)", op);
    m.enqueue_all_to_all(group, send, recv, bytes, stream != nullptr ? stream : m.stream);
  }
  m.finish(start, CommKind::AllToAll, n, static_cast<double>(n * bytes));
}

void NcclCommunicator::broadcast_device(const std::vector<int>& group, void* buffer, size_t bytes,
                                        cudaStream_t stream) {
  Impl& m = *impl_;
  const char* op = "broadcast_device";
  const double start = m.begin(m.rank, group, op);
  DeviceGuard guard(m.device);
  if (bytes > 0) {
    m.check_device_pointer(buffer, "buffer", op);
    m.enqueue_broadcast(group, buffer, bytes, stream != nullptr ? stream : m.stream);
  }
  m.finish(start, CommKind::Other, group.size(), 0);
}

void NcclCommunicator::synchronize(cudaStream_t stream) {
  Impl& m = *impl_;
  const std::vector<int> everyone = m.all_ranks();
  if (m.is_aborted) m.throw_aborted("synchronize", everyone);
  DeviceGuard guard(m.device);
  // NCCL's asynchronous errors show up on the world communicator, and on a group's own.
  std::vector<ncclComm_t> comms;
  {
    std::lock_guard<std::mutex> lock(m.nccl_mutex);
    for (auto& [group, comm] : m.groups) comms.push_back(comm);
  }
  cudaStream_t s = stream != nullptr ? stream : m.stream;
  m.wait_until(
      [&] {
        if (m.world != nullptr && !m.comm_ready(m.world, "synchronize", everyone)) return false;
        for (ncclComm_t comm : comms)
          if (!m.comm_ready(comm, "synchronize", everyone)) return false;
        const cudaError_t status = cudaStreamQuery(s);
        if (status == cudaSuccess) return true;
        if (status == cudaErrorNotReady) return false;
        (void)cudaGetLastError();
        m.abort_all(fmt::format("rank {}: CUDA error while synchronizing: {} ({})", m.rank, cudaGetErrorName(status),
                                cudaGetErrorString(status)),
                    true);
        return false;
      },
      "synchronize", everyone, m.timeout);
}

}  // namespace tessera::spmd
