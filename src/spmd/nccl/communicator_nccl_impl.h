// Private to the NCCL communicator (communicator_nccl*.cpp, nccl_bootstrap.cpp): the
// definition of NcclCommunicator::Impl and the helpers its files share. Where Impl's
// members are defined:
//   nccl_bootstrap.cpp: init, select_device, exchange_id (the world's setup and the
//     unique-id exchange);
//   communicator_nccl.cpp: communicators, the host-buffer API, split;
//   communicator_nccl_wait.cpp: waiting and abort;
//   communicator_nccl_device.cpp: the enqueueing bodies and the device-buffer API.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/kernels/cuda_check.h"
#include "spmd/communicator_local.h"
#include "spmd/nccl/communicator_nccl.h"
#include "spmd/nccl/nccl_bootstrap.h"

#if TESSERA_HAS_MPI
#include <mpi.h>
#endif

namespace tessera::spmd {
namespace nccl_detail {

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The NCCL type of a sum over `dtype` (DTypeError naming `op` for other dtypes).
ncclDataType_t nccl_sum_type(DType dtype, const char* op);

// Makes the current thread's device `device` for the guard's lifetime.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    TESSERA_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) TESSERA_CUDA_CHECK(cudaSetDevice(device));
    device_ = device;
  }
  ~DeviceGuard() {
    if (previous_ != device_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0, device_ = 0;
};

}  // namespace nccl_detail

struct NcclCommunicator::Impl {
  int rank = 0, size = 1, device = 0;
  nccl_detail::Boot boot = nccl_detail::Boot::None;
  std::filesystem::path dir;
  double timeout = nccl_detail::kDefaultTimeout, bootstrap_timeout = nccl_detail::kDefaultBootstrapTimeout;
  cudaStream_t stream = nullptr;

  // Every NCCL call holds nccl_mutex, so abort() (any thread) never frees a communicator
  // another thread is using; waits take it once per poll.
  std::mutex nccl_mutex;
  ncclComm_t world = nullptr;
  std::map<std::vector<int>, ncclComm_t> groups;  // group (in group order) -> its communicator

  mutable std::mutex state_mutex;  // reason, stats
  std::atomic<bool> is_aborted{false};
  std::string reason;
  CommStats stats;
  double next_file_poll = 0;

  // Host-API staging on the device (grow-only; every host call waits before returning).
  char* staging = nullptr;
  size_t staging_bytes = 0;

#if TESSERA_HAS_MPI
  MPI_Comm boot_comm = MPI_COMM_NULL;   // ids
  MPI_Comm abort_comm = MPI_COMM_NULL;  // abort notes
#endif

  ~Impl();

  // ---- setup (nccl_bootstrap.cpp, then communicator_nccl.cpp) ----

  void init(const NcclOptions& options);

  // The GPU, before any NCCL call (ncclCommInitRank binds the current device).
  void select_device(const NcclOptions& options);

  std::vector<int> all_ranks() const {
    std::vector<int> everyone(static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) everyone[static_cast<size_t>(r)] = r;
    return everyone;
  }

  // group[0] makes an id and hands it to the other members.
  ncclUniqueId exchange_id(const std::vector<int>& group, bool is_world);

  static ncclConfig_t config();

  // A member's communicator for `group` (it is member `index`), waited for.
  ncclComm_t init_comm(const ncclUniqueId& id, const std::vector<int>& group, int index, const char* what);

  // ---- waiting (communicator_nccl_wait.cpp) ----

  // Polls `ready` until true, watching the abort channel and the timeout; throws when aborted.
  void wait_until(const std::function<bool()>& ready, const char* op, const std::vector<int>& group, double limit);

  // One poll of a communicator's state: true when it is idle and healthy, false while an
  // operation is still being set up; an error aborts everything and throws.
  bool comm_ready(ncclComm_t comm, const char* op, const std::vector<int>& group);

  void wait_comm_ready(ncclComm_t comm, const char* op, const std::vector<int>& group);

  // Everything queued on `s` has run; NCCL errors and peers' aborts are watched meanwhile.
  void wait_stream(cudaStream_t s, ncclComm_t comm, const char* op, const std::vector<int>& group);

  // ---- abort (communicator_nccl_wait.cpp) ----

  // A peer's note: MPI message or <dir>/abort.
  // Rate-limited for the file (a stat per 10 ms) unless `now`.
  void poll_peer_abort(bool now = false);

  // Marks the communicator aborted (first reason wins), tells the peers when
  // `tell_peers`, and aborts every NCCL communicator.
  void abort_all(const std::string& why, bool tell_peers);

  void tell_peers_about(const std::string& why);

  [[noreturn]] void throw_aborted(const char* op, const std::vector<int>& group) const;

  void destroy_comms();

  // ---- calls ----

  // Runs `call` (NCCL calls on `comm`) under nccl_mutex, then, outside the lock, turns an
  // error into an abort (peers told) and waits until the communicator is ready again (a
  // non-blocking call may still be setting up connections).
  void run_nccl(ncclComm_t comm, const char* op, const std::vector<int>& group, const char* what,
                const std::function<ncclResult_t()>& call);

  // Checks one call's arguments (the MPI communicator's checks); returns the start time.
  double begin(int dev, const std::vector<int>& group, const char* op);

  void finish(double start, CommKind kind, size_t n, double full_bytes);

  size_t index_of(const std::vector<int>& group) const {
    return static_cast<size_t>(std::find(group.begin(), group.end(), rank) - group.begin());
  }

  // The communicator of a group of two or more (ranks in group order), created on first use.
  ncclComm_t comm_for(const std::vector<int>& group);

  void check_device_pointer(const void* p, const char* what, const char* op) const;

  // Whether a group's collective goes through NCCL: groups of two or more, and the world
  // of one (so a single-GPU machine runs NCCL too); other groups of one are device copies.
  bool uses_nccl(const std::vector<int>& group) const { return group.size() > 1 || size == 1; }

  // ---- device buffers (communicator_nccl_device.cpp) ----

  // The enqueueing bodies (arguments checked by the caller). Each leaves the
  // communicator ready for the next call.
  void enqueue_all_gather(const std::vector<int>& group, const void* send, void* recv, size_t bytes, cudaStream_t s);

  void enqueue_all_reduce(const std::vector<int>& group, const void* send, void* recv, size_t count, DType dtype,
                          cudaStream_t s);

  // recv (count elements) = sum over members of their block `index` of send (n blocks).
  void enqueue_reduce_scatter(const std::vector<int>& group, const void* send, void* recv, size_t count, DType dtype,
                              cudaStream_t s);

  void enqueue_all_to_all(const std::vector<int>& group, const void* send, void* recv, size_t bytes, cudaStream_t s);

  void enqueue_broadcast(const std::vector<int>& group, void* buffer, size_t bytes, cudaStream_t s);

  // ---- host API helpers ----

  // Two device regions of at least `in_bytes` and `out_bytes` (256-byte aligned).
  std::pair<char*, char*> stage(size_t in_bytes, size_t out_bytes);

  void to_device(void* dst, const void* src, size_t bytes);

  void to_host(void* dst, const void* src, size_t bytes);

  // recv (count elements) = ordered sum over members of their block `index` of send (n
  // blocks of count): an all-to-all on the GPUs, then the sum on the host in group order.
  void scatter_sum(const std::vector<int>& group, const void* send, void* recv, size_t count, DType dtype,
                   const char* op);

  ncclComm_t comm_or_null(const std::vector<int>& group) { return group.size() > 1 ? comm_for(group) : nullptr; }
};

}  // namespace tessera::spmd
