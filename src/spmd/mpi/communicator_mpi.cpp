// The MPI communicator: one process per device (mpirun -n N), device == rank.
//
// Determinism: MPI's own reductions may add in any order (trees, pipelined rings),
// so none is used. A reduce-scatter is an all-to-all (member i receives everyone's
// block i) followed by the same ordered sum the in-process communicator does
// (((m0 + m1) + m2) + ...); an all-reduce is that reduce-scatter followed by an
// all-gather (bandwidth-optimal like a ring, and the order is fixed). Results are
// bitwise those of the in-process runtime.
//
// Abort: every wait polls its request and a side channel (a duplicate of
// MPI_COMM_WORLD) on which a failing rank posts its reason to every rank, so peers
// throw tessera::Error instead of hanging. A collective cannot be cancelled once
// posted, so an aborted communicator stays aborted, and at exit the job is ended with
// MPI_Abort instead of a (hanging) MPI_Finalize.
#include "spmd/mpi/communicator_mpi.h"

#include <fmt/ranges.h>
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "spmd/communicator_local.h"
#include "tessera/base/error.h"

namespace tessera::spmd {
namespace {

constexpr int kAbortTag = 7001;
constexpr int kHandshakeTag = 7002;

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void check_mpi(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  fail<Error>("MPI: {} failed: {}", what, std::string(text, static_cast<size_t>(length)));
}

int as_count(size_t bytes, const char* op) {
  if (bytes > static_cast<size_t>(INT_MAX))
    fail<ValueError>("{}: a block of {} bytes is too large for one MPI call (at most {} bytes)", op, bytes, INT_MAX);
  return static_cast<int>(bytes);
}

class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      // One device per process, so one thread at a time talks to MPI; it need not be
      // the thread that initialized it.
      check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
      owns_mpi_ = true;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &abort_comm_), "MPI_Comm_dup");
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &control_comm_), "MPI_Comm_dup");
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &world_comm_), "MPI_Comm_dup");
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &p2p_comm_), "MPI_Comm_dup");
    stats_ = {};
  }

  std::string kind() const override { return "mpi"; }
  int world_size() const override { return size_; }
  std::vector<int> local_devices() const override { return {rank_}; }

  void all_gather(int device, const std::vector<int>& group, const void* send, void* recv, size_t bytes) override {
    const double start = begin(device, group, "all_gather");
    const size_t n = group.size(), index = index_of(group);
    if (n == 1) {
      if (send != recv) std::memmove(recv, send, bytes);
    } else {
      const int count = as_count(bytes, "all_gather");
      const bool own_block = send == static_cast<char*>(recv) + index * bytes;
      std::vector<char> staged;
      const void* source = own_block ? MPI_IN_PLACE : send;
      if (!own_block && overlaps(send, bytes, recv, n * bytes)) {
        staged.assign(static_cast<const char*>(send), static_cast<const char*>(send) + bytes);
        source = staged.data();
      }
      MPI_Request request;
      check_mpi(MPI_Iallgather(source, count, MPI_BYTE, recv, count, MPI_BYTE, comm_for(group), &request),
                "MPI_Iallgather");
      wait(&request, "all_gather", group);
    }
    finish(start, CommKind::AllGather, static_cast<int>(n), static_cast<double>(n * bytes));
  }

  void reduce_scatter(int device, const std::vector<int>& group, const void* send, void* recv, size_t count,
                      DType dtype) override {
    const double start = begin(device, group, "reduce_scatter");
    const size_t n = group.size(), block = count * itemsize(dtype);
    scatter_sum(group, send, recv, count, dtype, "reduce_scatter");
    finish(start, CommKind::ReduceScatter, static_cast<int>(n), static_cast<double>(n * block));
  }

  void all_reduce(int device, const std::vector<int>& group, const void* send, void* recv, size_t count,
                  DType dtype) override {
    const double start = begin(device, group, "all_reduce");
    const size_t n = group.size(), item = itemsize(dtype);
    if (n == 1) {
      if (send != recv) std::memmove(recv, send, count * item);
    } else {
      // Pad to n equal chunks (zeros past the end never reach the output).
      const size_t chunk = (count + n - 1) / n;
      const bool padded = chunk * n != count;
      std::vector<char> in, mine(chunk * item), out;
      const void* source = send;
      if (padded) {
        in.assign(n * chunk * item, 0);
        std::memcpy(in.data(), send, count * item);
        source = in.data();
      }
      scatter_sum(group, source, mine.data(), chunk, dtype, "all_reduce");
      void* target = recv;
      if (padded) {
        out.resize(n * chunk * item);
        target = out.data();
      }
      const int c = as_count(chunk * item, "all_reduce");
      MPI_Request request;
      check_mpi(MPI_Iallgather(mine.data(), c, MPI_BYTE, target, c, MPI_BYTE, comm_for(group), &request),
                "MPI_Iallgather");
      wait(&request, "all_reduce", group);
      if (padded) std::memcpy(recv, out.data(), count * item);
    }
    finish(start, CommKind::AllReduce, static_cast<int>(n), static_cast<double>(count * item));
  }

  void all_to_all(int device, const std::vector<int>& group, const void* send, void* recv, size_t bytes) override {
    const double start = begin(device, group, "all_to_all");
    const size_t n = group.size();
    std::vector<char> staged;
    const void* source = send;
    if (overlaps(send, n * bytes, recv, n * bytes)) {
      staged.assign(static_cast<const char*>(send), static_cast<const char*>(send) + n * bytes);
      source = staged.data();
    }
    if (n == 1) {
      std::memmove(recv, source, bytes);
    } else {
      const int count = as_count(bytes, "all_to_all");
      MPI_Request request;
      check_mpi(MPI_Ialltoall(source, count, MPI_BYTE, recv, count, MPI_BYTE, comm_for(group), &request),
                "MPI_Ialltoall");
      wait(&request, "all_to_all", group);
    }
    finish(start, CommKind::AllToAll, static_cast<int>(n), static_cast<double>(n * bytes));
  }

  void all_to_all_v(int device, const std::vector<int>& group, const void* send, const std::vector<size_t>& send_bytes,
                    void* recv, const std::vector<size_t>& recv_bytes) override {
    const double start = begin(device, group, "all_to_all_v");
    const size_t n = group.size();
    const size_t index = static_cast<size_t>(std::find(group.begin(), group.end(), device) - group.begin());
    const RaggedBlocks b = ragged_blocks("all_to_all_v", group, index, send_bytes, recv_bytes);
    std::vector<char> staged;
    const void* source = send;
    if (overlaps(send, b.send_total, recv, b.recv_total)) {
      staged.assign(static_cast<const char*>(send), static_cast<const char*>(send) + b.send_total);
      source = staged.data();
    }
    // MPI_Alltoallv in bytes: counts and displacements are ints.
    std::vector<int> send_counts(n), send_displs(n), recv_counts(n), recv_displs(n);
    for (size_t j = 0; j < n; ++j) {
      send_counts[j] = as_count(send_bytes[j], "all_to_all_v");
      send_displs[j] = as_count(b.send_offsets[j], "all_to_all_v");
      recv_counts[j] = as_count(recv_bytes[j], "all_to_all_v");
      recv_displs[j] = as_count(b.recv_offsets[j], "all_to_all_v");
    }
    MPI_Request request;
    check_mpi(MPI_Ialltoallv(source, send_counts.data(), send_displs.data(), MPI_BYTE, recv, recv_counts.data(),
                             recv_displs.data(), MPI_BYTE, comm_for(group), &request),
              "MPI_Ialltoallv");
    wait(&request, "all_to_all_v", group);
    finish(start, CommKind::RaggedAllToAll, static_cast<int>(n), b.sent_to_others);
  }

  void broadcast(int device, const std::vector<int>& group, void* buffer, size_t bytes) override {
    const double start = begin(device, group, "broadcast");
    if (group.size() > 1) {
      MPI_Request request;
      check_mpi(MPI_Ibcast(buffer, as_count(bytes, "broadcast"), MPI_BYTE, 0, comm_for(group), &request), "MPI_Ibcast");
      wait(&request, "broadcast", group);
    }
    finish(start, CommKind::Other, static_cast<int>(group.size()), 0);
  }

  void barrier(int device, const std::vector<int>& group) override {
    const double start = begin(device, group, "barrier");
    if (group.size() > 1) {
      MPI_Request request;
      check_mpi(MPI_Ibarrier(comm_for(group), &request), "MPI_Ibarrier");
      wait(&request, "barrier", group);
    }
    finish(start, CommKind::Other, static_cast<int>(group.size()), 0);
  }

  // Point-to-point: MPI_Isend / MPI_Irecv on their own communicator. A posted send is
  // kept until wait_sends(); MPI progresses it during later calls (a recv included),
  // so two stages that each send before they receive do not wait on each other.
  void send(int device, int to, int tag, const void* data, size_t bytes) override {
    const std::vector<int> pair{rank_, to};
    const double start = begin(device, pair, "send");
    check_tag(tag, "send");
    sends_.emplace_back();
    check_mpi(MPI_Isend(data, as_count(bytes, "send"), MPI_BYTE, to, tag, p2p_comm_, &sends_.back()), "MPI_Isend");
    finish(start, CommKind::Other, 2, 0);
  }

  void recv(int device, int from, int tag, void* data, size_t bytes) override {
    const std::vector<int> pair{from, rank_};
    const double start = begin(device, pair, "recv");
    check_tag(tag, "recv");
    MPI_Request request;
    MPI_Status status;
    check_mpi(MPI_Irecv(data, as_count(bytes, "recv"), MPI_BYTE, from, tag, p2p_comm_, &request), "MPI_Irecv");
    for (int spins = 0;; ++spins) {
      int done = 0;
      check_mpi(MPI_Test(&request, &done, &status), "MPI_Test");
      if (done) break;
      poll_abort();
      if (aborted_) throw_aborted("recv", pair);
      if (spins > 1024)
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      else if (spins > 64)
        std::this_thread::yield();
    }
    int received = 0;
    MPI_Get_count(&status, MPI_BYTE, &received);
    if (static_cast<size_t>(received) != bytes)
      fail<Error>("recv on rank {} from rank {} (tag {}): {} bytes arrived where {} were expected", rank_, from, tag,
                  received, bytes);
    finish(start, CommKind::Other, 2, 0);
  }

  void wait_sends(int device) override {
    const double start = begin(device, {rank_}, "wait_sends");
    for (MPI_Request& request : sends_) wait(&request, "send", {rank_});
    sends_.clear();
    finish(start, CommKind::Other, 1, 0);
  }

  void abort(const std::string& reason) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (aborted_) return;  // already aborted (perhaps by a peer's note): nothing to tell
      aborted_ = true;
      reason_ = fmt::format("rank {}: {}", rank_, reason);
    }
    // Tell every other rank; the sends are never waited for (the job ends at exit).
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      MPI_Request request;
      if (MPI_Isend(reason_.data(), static_cast<int>(reason_.size()), MPI_CHAR, r, kAbortTag, abort_comm_, &request) ==
          MPI_SUCCESS)
        MPI_Request_free(&request);
    }
  }

  // Posted collectives cannot be cancelled: after an abort the communicator stays
  // aborted (every call throws) and the process ends the job at exit.
  void reset() override {}

  CommStats stats(int device) const override {
    if (device != rank_)
      fail<ValueError>("communicator stats: device {} belongs to rank {}; this is rank {}", device, device, rank_);
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }
  void reset_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_ = {};
  }

  // atexit: end MPI the way the run went.
  void finalize() {
    if (aborted_) {
      std::fprintf(stderr, "tessera: MPI run aborted (%s); ending the job\n", reason_.c_str());
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 1);
      return;
    }
    if (!owns_mpi_) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (auto& [group, comm] : comms_)
      if (comm != MPI_COMM_SELF && comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
    comms_.clear();
    MPI_Comm_free(&abort_comm_);
    MPI_Comm_free(&control_comm_);
    MPI_Comm_free(&world_comm_);
    MPI_Comm_free(&p2p_comm_);
    MPI_Finalize();
  }

 private:
  double begin(int device, const std::vector<int>& group, const char* op) {
    const double start = now_seconds();
    if (aborted_) throw_aborted(op, group);
    if (device != rank_) fail<ValueError>("{}: device {} is not driven by this process (rank {})", op, device, rank_);
    check_group_members(op, rank_, group, size_, fmt::format("mpirun -n {}", size_));
    return start;
  }

  void finish(double start, CommKind kind, int n, double full_bytes) {
    const double seconds = now_seconds() - start;
    std::lock_guard<std::mutex> lock(mutex_);
    record_call(stats_, kind, n, full_bytes, seconds);
  }

  static void check_tag(int tag, const char* op) {
    if (tag < 0 || tag > Communicator::kMaxTag)
      fail<ValueError>("{}: tag {} is outside 0 .. {}", op, tag, Communicator::kMaxTag);
  }

  size_t index_of(const std::vector<int>& group) const {
    return static_cast<size_t>(std::find(group.begin(), group.end(), rank_) - group.begin());
  }

  // recv (count elements) = ordered sum over members of their block `index` of send
  // (n blocks of count): all-to-all, then the sum in group order.
  void scatter_sum(const std::vector<int>& group, const void* send, void* recv, size_t count, DType dtype,
                   const char* op) {
    const size_t n = group.size(), block = count * itemsize(dtype);
    if (n == 1) {
      if (send != recv) std::memmove(recv, send, block);
      return;
    }
    std::vector<char> blocks(n * block);
    const int c = as_count(block, op);
    MPI_Request request;
    check_mpi(MPI_Ialltoall(send, c, MPI_BYTE, blocks.data(), c, MPI_BYTE, comm_for(group), &request), "MPI_Ialltoall");
    wait(&request, op, group);
    std::vector<const char*> srcs(n);
    for (size_t j = 0; j < n; ++j) srcs[j] = blocks.data() + j * block;
    ordered_sum(recv, srcs, count, dtype);
  }

  // One communicator per distinct group, ranks in group order (so comm rank == index
  // in the group). Only the members create it (MPI_Comm_create_group), the first time
  // they use the group; every member reaches that point in the same program order.
  MPI_Comm comm_for(const std::vector<int>& group) {
    if (group.size() == 1) return MPI_COMM_SELF;
    auto it = comms_.find(group);
    if (it != comms_.end()) return it->second;
    if (static_cast<int>(group.size()) == size_ && std::is_sorted(group.begin(), group.end()))
      return world_comm_;  // the whole world in rank order
    // MPI_Comm_create_group blocks until every member calls it and knows nothing of
    // abort notes: meet first (a handshake the abort-aware wait watches), so a member
    // that failed before getting here makes the others throw instead of hanging.
    handshake(group);
    MPI_Group world_group, sub_group;
    MPI_Comm_group(world_comm_, &world_group);
    MPI_Group_incl(world_group, static_cast<int>(group.size()), group.data(), &sub_group);
    MPI_Comm comm = MPI_COMM_NULL;
    const int code = MPI_Comm_create_group(world_comm_, sub_group, 0, &comm);
    MPI_Group_free(&sub_group);
    MPI_Group_free(&world_group);
    check_mpi(code, "MPI_Comm_create_group");
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    comms_.emplace(group, comm);
    return comm;
  }

  // Zero-byte messages to and from every other member on the control communicator
  // (pairs match in program order, which is the same on every member).
  void handshake(const std::vector<int>& group) {
    std::vector<MPI_Request> requests;
    char token = 0;
    for (int member : group) {
      if (member == rank_) continue;
      requests.emplace_back();
      check_mpi(MPI_Irecv(nullptr, 0, MPI_BYTE, member, kHandshakeTag, control_comm_, &requests.back()), "MPI_Irecv");
      requests.emplace_back();
      check_mpi(MPI_Isend(&token, 0, MPI_BYTE, member, kHandshakeTag, control_comm_, &requests.back()), "MPI_Isend");
    }
    for (MPI_Request& request : requests) wait(&request, "creating the group communicator", group);
  }

  // Waits for `request`, watching for a peer's abort note meanwhile. Spins briefly,
  // then yields, then sleeps: ranks often outnumber cores (mpirun --oversubscribe).
  void wait(MPI_Request* request, const char* op, const std::vector<int>& group) {
    for (int spins = 0;; ++spins) {
      int done = 0;
      check_mpi(MPI_Test(request, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (done) return;
      poll_abort();
      if (aborted_) throw_aborted(op, group);
      if (spins > 1024)
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      else if (spins > 64)
        std::this_thread::yield();
    }
  }

  void poll_abort() {
    int flag = 0;
    MPI_Status status;
    MPI_Iprobe(MPI_ANY_SOURCE, kAbortTag, abort_comm_, &flag, &status);
    if (!flag) return;
    int length = 0;
    MPI_Get_count(&status, MPI_CHAR, &length);
    std::string text(static_cast<size_t>(std::max(0, length)), '\0');
    MPI_Recv(text.data(), length, MPI_CHAR, status.MPI_SOURCE, kAbortTag, abort_comm_, MPI_STATUS_IGNORE);
    std::lock_guard<std::mutex> lock(mutex_);
    if (!aborted_) {
      aborted_ = true;
      reason_ = text;
    }
  }

  [[noreturn]] void throw_aborted(const char* op, const std::vector<int>& group) const {
    std::string reason;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      reason = reason_;
    }
    fail<Error>("{} on devices {}: aborted: {}", op, group, reason);
  }

  int rank_ = 0, size_ = 1;
  bool owns_mpi_ = false;
  MPI_Comm abort_comm_ = MPI_COMM_NULL;    // abort notes
  MPI_Comm control_comm_ = MPI_COMM_NULL;  // handshakes before creating group communicators
  MPI_Comm world_comm_ = MPI_COMM_NULL;    // the parent of every group communicator
  MPI_Comm p2p_comm_ = MPI_COMM_NULL;      // point-to-point messages
  std::vector<MPI_Request> sends_;         // posted, not yet waited for
  std::map<std::vector<int>, MPI_Comm> comms_;
  mutable std::mutex mutex_;  // stats_, reason_
  std::atomic<bool> aborted_{false};
  std::string reason_;
  CommStats stats_;
};

MpiCommunicator* g_mpi = nullptr;

void finalize_at_exit() {
  if (g_mpi) g_mpi->finalize();
}

}  // namespace

Communicator& mpi_communicator() {
  static std::once_flag once;
  std::call_once(once, [] {
    g_mpi = new MpiCommunicator();  // never deleted: see the header
    std::atexit(finalize_at_exit);
  });
  return *g_mpi;
}

}  // namespace tessera::spmd
