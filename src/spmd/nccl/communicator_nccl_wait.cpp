// The NCCL communicator's waiting and abort (see communicator_nccl.h): every wait polls
// its NCCL communicator, the peers' abort notices and the timeout, so an abort (ours,
// a peer's, a timeout) ends every wait with an error instead of a hang; abort tears the
// communicators down and tells the peers.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <thread>

#include "spmd/nccl/communicator_nccl.h"
#include "spmd/nccl/communicator_nccl_impl.h"
#include "tessera/base/error.h"

#if TESSERA_HAS_MPI
#include "spmd/mpi/communicator_mpi.h"
#endif

namespace tessera::spmd {

using namespace nccl_detail;  // NOLINT(build/namespaces): the NCCL files' shared helpers
namespace fs = std::filesystem;

namespace {

// Spins briefly, then yields, then sleeps: waits often last milliseconds, and ranks can
// share cores.
void backoff(int spins) {
  if (spins > 1024)
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  else if (spins > 64)
    std::this_thread::yield();
}

}  // namespace

// ---- waiting ----

void NcclCommunicator::Impl::wait_until(const std::function<bool()>& ready, const char* op,
                                        const std::vector<int>& group, double limit) {
  const double start = now_seconds();
  for (int spins = 0;; ++spins) {
    poll_peer_abort();  // first: a peer's reason beats the error its abort causes here
    if (is_aborted) throw_aborted(op, group);
    if (ready()) return;
    if (is_aborted) throw_aborted(op, group);
    if (limit > 0 && now_seconds() - start > limit) {
      abort_all(fmt::format("rank {}: {} on devices {} did not finish within {:.3g} s (TESSERA_NCCL_TIMEOUT_S)", rank,
                            op, group, limit),
                true);
      throw_aborted(op, group);
    }
    backoff(spins);
  }
}

bool NcclCommunicator::Impl::comm_ready(ncclComm_t comm, const char* op, const std::vector<int>& group) {
  ncclResult_t state = ncclSuccess;
  std::string last;
  {
    std::lock_guard<std::mutex> lock(nccl_mutex);
    if (is_aborted) return false;  // the caller's loop throws
    const ncclResult_t result = ncclCommGetAsyncError(comm, &state);
    if (result != ncclSuccess) state = result;
    if (state != ncclSuccess && state != ncclInProgress) last = ncclGetLastError(comm);
  }
  if (state == ncclSuccess) return true;
  if (state == ncclInProgress) return false;
  // A peer that aborted makes NCCL fail here too: prefer its note (its reason), which
  // it sends before aborting its NCCL communicators; give an MPI note a moment to arrive.
  for (const double until = now_seconds() + 0.2; !is_aborted && now_seconds() < until;) {
    poll_peer_abort(/*now=*/true);
    if (!is_aborted) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (!is_aborted)
    abort_all(fmt::format("rank {}: NCCL error in {} on devices {}: {} ({})", rank, op, group,
                          ncclGetErrorString(state), last),
              true);
  throw_aborted(op, group);
}

void NcclCommunicator::Impl::wait_comm_ready(ncclComm_t comm, const char* op, const std::vector<int>& group) {
  wait_until([&] { return comm_ready(comm, op, group); }, op, group, timeout);
}

void NcclCommunicator::Impl::wait_stream(cudaStream_t s, ncclComm_t comm, const char* op,
                                         const std::vector<int>& group) {
  wait_until(
      [&] {
        if (comm != nullptr && !comm_ready(comm, op, group)) return false;
        const cudaError_t status = cudaStreamQuery(s);
        if (status == cudaSuccess) return true;
        if (status == cudaErrorNotReady) return false;
        (void)cudaGetLastError();
        abort_all(fmt::format("rank {}: CUDA error in {} on devices {}: {} ({})", rank, op, group,
                              cudaGetErrorName(status), cudaGetErrorString(status)),
                  true);
        return false;  // aborted: the loop throws
      },
      op, group, timeout);
}

// ---- abort ----

void NcclCommunicator::Impl::poll_peer_abort(bool now) {
  if (is_aborted) return;
#if TESSERA_HAS_MPI
  if (boot == Boot::Mpi) {
    int flag = 0;
    MPI_Status status;
    MPI_Iprobe(MPI_ANY_SOURCE, kAbortTag, abort_comm, &flag, &status);
    if (!flag) return;
    int length = 0;
    MPI_Get_count(&status, MPI_CHAR, &length);
    std::string text(static_cast<size_t>(std::max(0, length)), '\0');
    MPI_Recv(text.data(), length, MPI_CHAR, status.MPI_SOURCE, kAbortTag, abort_comm, MPI_STATUS_IGNORE);
    abort_all(text, false);
    return;
  }
#endif
  if (boot == Boot::File) {
    const double t = now_seconds();
    if (!now && t < next_file_poll) return;
    next_file_poll = t + 0.01;
    std::string text;
    if (read_file(dir / "abort", &text)) abort_all(text.empty() ? "a peer aborted" : text, false);
  }
}

void NcclCommunicator::Impl::abort_all(const std::string& why, bool tell_peers) {
  {
    std::lock_guard<std::mutex> lock(state_mutex);
    if (is_aborted) return;
    reason = why;
    is_aborted = true;
  }
  if (tell_peers) {
    try {
      tell_peers_about(why);
    } catch (...) {  // best effort: the timeout still ends the peers' waits
    }
  }
#if TESSERA_HAS_MPI
  // So the job ends with MPI_Abort at exit instead of a hanging MPI_Finalize.
  if (boot == Boot::Mpi) {
    try {
      mpi_communicator().abort(why);
    } catch (...) {
    }
  }
#endif
  std::lock_guard<std::mutex> lock(nccl_mutex);
  for (auto& [group, comm] : groups)
    if (comm != nullptr) ncclCommAbort(comm);
  groups.clear();
  if (world != nullptr) ncclCommAbort(world);
  world = nullptr;
}

void NcclCommunicator::Impl::tell_peers_about(const std::string& why) {
#if TESSERA_HAS_MPI
  if (boot == Boot::Mpi || (boot == Boot::None && abort_comm != MPI_COMM_NULL)) {
    // Never waited for (the job ends at exit with MPI_Abort), so the text must outlive
    // this object: a copy that is never freed.
    const std::string* note = new std::string(why);
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      MPI_Request request;
      if (MPI_Isend(note->data(), static_cast<int>(note->size()), MPI_CHAR, r, kAbortTag, abort_comm, &request) ==
          MPI_SUCCESS)
        MPI_Request_free(&request);
    }
    return;
  }
#endif
  if (boot == Boot::File && !fs::exists(dir / "abort")) write_atomic(dir / "abort", why);
}

void NcclCommunicator::Impl::throw_aborted(const char* op, const std::vector<int>& group) const {
  std::string text;
  {
    std::lock_guard<std::mutex> lock(state_mutex);
    text = reason;
  }
  fail<Error>("{} on devices {}: aborted: {}", op, group, text);
}

void NcclCommunicator::Impl::destroy_comms() {
  if (is_aborted) return;  // abort_all freed them
  std::vector<std::pair<std::vector<int>, ncclComm_t>> all(groups.begin(), groups.end());
  if (world != nullptr) all.emplace_back(all_ranks(), world);
  if (all.empty()) return;
  DeviceGuard guard(device);
  // Finalize every communicator first (each waits for its peers), then free them.
  bool ok = true;
  for (auto& [group, comm] : all) {
    try {
      {
        std::lock_guard<std::mutex> lock(nccl_mutex);
        const ncclResult_t result = ncclCommFinalize(comm);
        if (result != ncclSuccess && result != ncclInProgress) fail<Error>("ncclCommFinalize failed");
      }
      wait_comm_ready(comm, "ncclCommFinalize", group);
    } catch (...) {
      ok = false;
      break;
    }
  }
  if (!ok) {
    abort_all(fmt::format("rank {}: finalizing the NCCL communicators failed", rank), true);
    return;
  }
  std::lock_guard<std::mutex> lock(nccl_mutex);
  for (auto& [group, comm] : all) ncclCommDestroy(comm);
  groups.clear();
  world = nullptr;
}

}  // namespace tessera::spmd
