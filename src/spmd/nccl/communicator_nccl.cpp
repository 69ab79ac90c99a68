// The NCCL communicator: see communicator_nccl.h for what it promises. In short: one
// process (or thread) per GPU, non-blocking NCCL communicators polled by every wait, so
// an abort (ours, a peer's, a timeout) ends every wait with an error instead of a hang.
// This file: creating the NCCL communicators, the host-buffer API (Communicator) and
// split(). Elsewhere: waiting and abort (communicator_nccl_wait.cpp), the bootstrap
// (nccl_bootstrap.cpp), the device-buffer API (communicator_nccl_device.cpp), Impl
// (communicator_nccl_impl.h).
#include "spmd/nccl/communicator_nccl.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <set>
#include <thread>

#include "spmd/communicator_local.h"
#include "spmd/nccl/communicator_nccl_impl.h"
#include "tessera/base/error.h"

#if TESSERA_HAS_MPI
#include "spmd/mpi/communicator_mpi.h"
#endif

namespace tessera::spmd {
namespace nccl_detail {

ncclDataType_t nccl_sum_type(DType dtype, const char* op) {
  switch (dtype) {
    case DType::Float32:
      return ncclFloat32;
    case DType::Float64:
      return ncclFloat64;
    case DType::BFloat16:
      return ncclBfloat16;
    case DType::Float16:
      return ncclFloat16;
    case DType::Int32:
      return ncclInt32;
    case DType::Int64:
      return ncclInt64;
    default:
      fail<DTypeError>("{}: cannot sum {} values (expected float32, float64, bfloat16, float16, int32 or int64)", op,
                       name(dtype));
  }
}

}  // namespace nccl_detail

using namespace nccl_detail;  // NOLINT(build/namespaces): the NCCL files' shared helpers
namespace fs = std::filesystem;

// ---- NcclCommunicator::Impl ----

NcclCommunicator::Impl::~Impl() {
  try {
    destroy_comms();
  } catch (...) {
  }
  if (staging != nullptr) cudaFree(staging);
  if (stream != nullptr) cudaStreamDestroy(stream);
#if TESSERA_HAS_MPI
  int finalized = 1;
  MPI_Finalized(&finalized);
  if (!finalized) {
    if (boot_comm != MPI_COMM_NULL) MPI_Comm_free(&boot_comm);
    if (abort_comm != MPI_COMM_NULL) MPI_Comm_free(&abort_comm);
  }
#endif
}

ncclConfig_t NcclCommunicator::Impl::config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every call returns at once; waits poll (see the header)
  return config;
}

ncclComm_t NcclCommunicator::Impl::init_comm(const ncclUniqueId& id, const std::vector<int>& group, int index,
                                             const char* what) {
  ncclComm_t comm = nullptr;
  {
    std::lock_guard<std::mutex> lock(nccl_mutex);
    if (is_aborted) throw_aborted(what, group);
    ncclConfig_t cfg = config();
    ncclUniqueId copy = id;
    const ncclResult_t result = ncclCommInitRankConfig(&comm, static_cast<int>(group.size()), copy, index, &cfg);
    if (result != ncclSuccess && result != ncclInProgress) {
      const std::string last = ncclGetLastError(comm);
      if (comm != nullptr) ncclCommAbort(comm);
      fail<Error>("NCCL: {} failed: {} ({})", what, ncclGetErrorString(result), last);
    }
  }
  try {
    wait_comm_ready(comm, what, group);
  } catch (...) {
    // Not stored anywhere yet, so abort_all did not abort it: stop its setup here.
    std::lock_guard<std::mutex> lock(nccl_mutex);
    ncclCommAbort(comm);
    throw;
  }
  return comm;
}

// ---- calls ----

void NcclCommunicator::Impl::run_nccl(ncclComm_t comm, const char* op, const std::vector<int>& group, const char* what,
                                      const std::function<ncclResult_t()>& call) {
  ncclResult_t result = ncclSuccess;
  std::string last;
  {
    std::lock_guard<std::mutex> lock(nccl_mutex);
    if (is_aborted) throw_aborted(op, group);
    result = call();
    if (result != ncclSuccess && result != ncclInProgress) last = ncclGetLastError(comm);
  }
  if (result != ncclSuccess && result != ncclInProgress) {
    const std::string message = fmt::format("rank {}: {} on devices {}: {} failed: {} ({})", rank, op, group, what,
                                            ncclGetErrorString(result), last);
    abort_all(message, true);
    fail<Error>("{}", message);
  }
  wait_comm_ready(comm, op, group);
}

double NcclCommunicator::Impl::begin(int dev, const std::vector<int>& group, const char* op) {
  const double start = now_seconds();
  if (is_aborted) throw_aborted(op, group);
  if (dev != rank) fail<ValueError>("{}: device {} is not driven by this process (rank {})", op, dev, rank);
  check_group_members(op, rank, group, size, fmt::format("world of {}", size));
  return start;
}

void NcclCommunicator::Impl::finish(double start, CommKind kind, size_t n, double full_bytes) {
  const double seconds = now_seconds() - start;
  std::lock_guard<std::mutex> lock(state_mutex);
  record_call(stats, kind, static_cast<int>(n), full_bytes, seconds);
}

ncclComm_t NcclCommunicator::Impl::comm_for(const std::vector<int>& group) {
  if (static_cast<int>(group.size()) == size && std::is_sorted(group.begin(), group.end())) return world;
  {
    std::lock_guard<std::mutex> lock(nccl_mutex);
    auto it = groups.find(group);
    if (it != groups.end()) return it->second;
  }
  const ncclUniqueId id = exchange_id(group, false);
  ncclComm_t comm =
      init_comm(id, group, static_cast<int>(index_of(group)), "ncclCommInitRankConfig (group communicator)");
  std::lock_guard<std::mutex> lock(nccl_mutex);
  if (is_aborted) {
    ncclCommAbort(comm);
    throw_aborted("creating a group communicator", group);
  }
  groups.emplace(group, comm);
  return comm;
}

// ---- host API helpers ----

std::pair<char*, char*> NcclCommunicator::Impl::stage(size_t in_bytes, size_t out_bytes) {
  const auto round = [](size_t b) { return (std::max<size_t>(b, 1) + 255) / 256 * 256; };
  const size_t need = round(in_bytes) + round(out_bytes);
  if (need > staging_bytes) {
    if (staging != nullptr) {
      TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));  // idle already: host calls wait before returning
      TESSERA_CUDA_CHECK(cudaFree(staging));
      staging = nullptr;
      staging_bytes = 0;
    }
    void* p = nullptr;
    TESSERA_CUDA_CHECK(cudaMalloc(&p, need));
    staging = static_cast<char*>(p);
    staging_bytes = need;
  }
  return {staging, staging + round(in_bytes)};
}

void NcclCommunicator::Impl::to_device(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) TESSERA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
}

void NcclCommunicator::Impl::to_host(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) TESSERA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream));
}

void NcclCommunicator::Impl::scatter_sum(const std::vector<int>& group, const void* send, void* recv, size_t count,
                                         DType dtype, const char* op) {
  const size_t n = group.size(), block = count * itemsize(dtype);
  if (n == 1) {
    if (send != recv) std::memmove(recv, send, block);
    return;
  }
  auto [in, out] = stage(n * block, n * block);
  to_device(in, send, n * block);
  enqueue_all_to_all(group, in, out, block, stream);
  std::vector<char> blocks(n * block);
  to_host(blocks.data(), out, n * block);
  wait_stream(stream, comm_or_null(group), op, group);
  std::vector<const char*> srcs(n);
  for (size_t j = 0; j < n; ++j) srcs[j] = blocks.data() + j * block;
  ordered_sum(recv, srcs, count, dtype);
}

// ---- NcclCommunicator ----

NcclCommunicator::NcclCommunicator(const NcclOptions& options) : impl_(std::make_unique<Impl>()) {
  impl_->init(options);
}

NcclCommunicator::~NcclCommunicator() = default;

int NcclCommunicator::world_size() const { return impl_->size; }
std::vector<int> NcclCommunicator::local_devices() const { return {impl_->rank}; }
int NcclCommunicator::rank() const { return impl_->rank; }
int NcclCommunicator::cuda_device() const { return impl_->device; }
cudaStream_t NcclCommunicator::stream() const { return impl_->stream; }
bool NcclCommunicator::aborted() const { return impl_->is_aborted; }
std::string NcclCommunicator::bootstrap() const {
  switch (impl_->boot) {
    case Boot::Mpi:
      return "mpi";
    case Boot::File:
      return "file";
    default:
      return "none";
  }
}

void NcclCommunicator::all_gather(int device, const std::vector<int>& group, const void* send, void* recv,
                                  size_t bytes) {
  Impl& m = *impl_;
  const double start = m.begin(device, group, "all_gather");
  DeviceGuard guard(m.device);
  const size_t n = group.size();
  if (n == 1) {
    if (send != recv) std::memmove(recv, send, bytes);
  } else {
    auto [in, out] = m.stage(bytes, n * bytes);
    m.to_device(in, send, bytes);
    m.enqueue_all_gather(group, in, out, bytes, m.stream);
    m.to_host(recv, out, n * bytes);
    m.wait_stream(m.stream, m.comm_or_null(group), "all_gather", group);
  }
  m.finish(start, CommKind::AllGather, n, static_cast<double>(n * bytes));
}

void NcclCommunicator::all_reduce(int device, const std::vector<int>& group, const void* send, void* recv, size_t count,
                                  DType dtype) {
  Impl& m = *impl_;
  const double start = m.begin(device, group, "all_reduce");
  nccl_sum_type(dtype, "all_reduce");  // the same dtypes as add_into
  DeviceGuard guard(m.device);
  const size_t n = group.size(), item = itemsize(dtype);
  if (n == 1) {
    if (send != recv) std::memmove(recv, send, count * item);
  } else if (count > 0) {
    // As the MPI communicator: pad to n equal chunks, ordered reduce-scatter, all-gather.
    const size_t chunk = (count + n - 1) / n;
    std::vector<char> padded(n * chunk * item, 0);
    std::memcpy(padded.data(), send, count * item);
    std::vector<char> mine(chunk * item);
    m.scatter_sum(group, padded.data(), mine.data(), chunk, dtype, "all_reduce");
    auto [in, out] = m.stage(chunk * item, n * chunk * item);
    m.to_device(in, mine.data(), chunk * item);
    m.enqueue_all_gather(group, in, out, chunk * item, m.stream);
    m.to_host(padded.data(), out, n * chunk * item);
    m.wait_stream(m.stream, m.comm_or_null(group), "all_reduce", group);
    std::memcpy(recv, padded.data(), count * item);
  }
  m.finish(start, CommKind::AllReduce, n, static_cast<double>(count * item));
}

void NcclCommunicator::reduce_scatter(int device, const std::vector<int>& group, const void* send, void* recv,
                                      size_t count, DType dtype) {
  Impl& m = *impl_;
  const double start = m.begin(device, group, "reduce_scatter");
  nccl_sum_type(dtype, "reduce_scatter");
  DeviceGuard guard(m.device);
  const size_t n = group.size(), block = count * itemsize(dtype);
  if (count > 0) m.scatter_sum(group, send, recv, count, dtype, "reduce_scatter");
  m.finish(start, CommKind::ReduceScatter, n, static_cast<double>(n * block));
}

void NcclCommunicator::all_to_all(int device, const std::vector<int>& group, const void* send, void* recv,
                                  size_t bytes) {
  Impl& m = *impl_;
  const double start = m.begin(device, group, "all_to_all");
  DeviceGuard guard(m.device);
  const size_t n = group.size();
  if (n == 1) {
    if (send != recv) std::memmove(recv, send, bytes);
  } else if (bytes > 0) {
    auto [in, out] = m.stage(n * bytes, n * bytes);
    m.to_device(in, send, n * bytes);
    m.enqueue_all_to_all(group, in, out, bytes, m.stream);
    m.to_host(recv, out, n * bytes);
    m.wait_stream(m.stream, m.comm_or_null(group), "all_to_all", group);
  }
  m.finish(start, CommKind::AllToAll, n, static_cast<double>(n * bytes));
}

void NcclCommunicator::broadcast(int device, const std::vector<int>& group, void* buffer, size_t bytes) {
  Impl& m = *impl_;
  const double start = m.begin(device, group, "broadcast");
  DeviceGuard guard(m.device);
  if (group.size() > 1 && bytes > 0) {
    auto [in, out] = m.stage(bytes, 0);
    (void)out;
    m.to_device(in, buffer, bytes);
    m.enqueue_broadcast(group, in, bytes, m.stream);
    m.to_host(buffer, in, bytes);
    m.wait_stream(m.stream, m.comm_or_null(group), "broadcast", group);
  }
  m.finish(start, CommKind::Other, group.size(), 0);
}

void NcclCommunicator::barrier(int device, const std::vector<int>& group) {
  Impl& m = *impl_;
  const double start = m.begin(device, group, "barrier");
  DeviceGuard guard(m.device);
  if (group.size() > 1) {
    // A one-element all-reduce that every member must reach, waited for.
    auto [in, out] = m.stage(sizeof(int32_t), 0);
    (void)out;
    TESSERA_CUDA_CHECK(cudaMemsetAsync(in, 0, sizeof(int32_t), m.stream));
    m.enqueue_all_reduce(group, in, in, 1, DType::Int32, m.stream);
    m.wait_stream(m.stream, m.comm_or_null(group), "barrier", group);
  }
  m.finish(start, CommKind::Other, group.size(), 0);
}

void NcclCommunicator::abort(const std::string& reason) {
  impl_->abort_all(fmt::format("rank {}: {}", impl_->rank, reason), true);
}

CommStats NcclCommunicator::stats(int device) const {
  if (device != impl_->rank)
    fail<ValueError>("communicator stats: device {} belongs to rank {}; this is rank {}", device, device, impl_->rank);
  std::lock_guard<std::mutex> lock(impl_->state_mutex);
  return impl_->stats;
}

void NcclCommunicator::reset_stats() {
  std::lock_guard<std::mutex> lock(impl_->state_mutex);
  impl_->stats = {};
}

// ---- sub-groups ----

void NcclCommunicator::split(const std::vector<std::vector<int>>& group_list) {
  Impl& m = *impl_;
  const std::vector<int> everyone = m.all_ranks();
  if (m.is_aborted) m.throw_aborted("split", everyone);
  std::set<int> seen;
  int color = NCCL_SPLIT_NOCOLOR, key = 0;
  std::vector<int> mine;
  for (size_t g = 0; g < group_list.size(); ++g) {
    const std::vector<int>& group = group_list[g];
    if (group.empty()) fail<ValueError>("split: group {} is empty", g);
    for (size_t j = 0; j < group.size(); ++j) {
      const int d = group[j];
      if (d < 0 || d >= m.size) fail<ValueError>("split: group {} names device {} outside 0..{}", group, d, m.size - 1);
      if (!seen.insert(d).second) fail<ValueError>("split: device {} is in more than one group", d);
      if (d == m.rank) {
        mine = group;
        key = static_cast<int>(j);
      }
    }
  }
  bool needed = !mine.empty() && mine.size() > 1 &&
                !(static_cast<int>(mine.size()) == m.size && std::is_sorted(mine.begin(), mine.end()));
  if (needed) {
    std::lock_guard<std::mutex> lock(m.nccl_mutex);
    needed = m.groups.find(mine) == m.groups.end();
  }
  if (needed) {
    // The color: the group's smallest device (the same on every member, distinct per group).
    color = *std::min_element(mine.begin(), mine.end());
  }
  if (m.size == 1) return;
  DeviceGuard guard(m.device);
  ncclComm_t child = nullptr;
  // Collective over the world; the world communicator is ready again once every rank took part.
  m.run_nccl(m.world, "split", everyone, "ncclCommSplit", [&] {
    ncclConfig_t cfg = Impl::config();
    return ncclCommSplit(m.world, color, key, &child, &cfg);
  });
  if (child == nullptr) return;  // not in a new group
  try {
    m.wait_comm_ready(child, "split", mine);
  } catch (...) {
    std::lock_guard<std::mutex> lock(m.nccl_mutex);
    ncclCommAbort(child);  // not stored yet: abort_all did not abort it
    throw;
  }
  std::lock_guard<std::mutex> lock(m.nccl_mutex);
  if (m.is_aborted) {
    ncclCommAbort(child);
    m.throw_aborted("split", mine);
  }
  m.groups.emplace(mine, child);
}

void NcclCommunicator::split(const Mesh& mesh, const std::vector<int>& axes) {
  if (mesh.size() > impl_->size)
    fail<ValueError>("split: mesh {} needs {} devices but the NCCL world has {}", mesh.to_string(), mesh.size(),
                     impl_->size);
  std::set<std::vector<int>> unique;
  for (int d = 0; d < mesh.size(); ++d) unique.insert(mesh.group(d, axes));
  split(std::vector<std::vector<int>>(unique.begin(), unique.end()));
}

}  // namespace tessera::spmd
