// Internal: the in-process communicator (N virtual CPU devices, a thread each).
//
// Each group (its list of devices) has a rendezvous. Every member posts its buffer
// pointers and waits at a barrier; then each member reads what it needs straight
// from the others' buffers and writes only its own; a second barrier keeps every
// buffer alive and unchanged until nobody reads it any more. Waiting is on
// condition variables (device threads often outnumber cores).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tessera/spmd/communicator.h"

namespace tessera::spmd {

// Statistics shared by every communicator (communicator.cpp): one call of `kind` over
// a group of n whose full buffer (the gathered output, the reduced input, all the
// blocks of an all-to-all) has `full_bytes`, counted as a ring moves it; for
// RaggedAllToAll (an all-to-all call) `full_bytes` is what this member sent to others.
enum class CommKind { AllGather, AllReduce, ReduceScatter, AllToAll, RaggedAllToAll, Other };
void record_call(CommStats& stats, CommKind kind, int n, double full_bytes, double seconds);

// Checks a collective's group for every communicator: not empty, no device twice,
// every device in 0..world-1, and `device` a member. ValueErrors name `op`; `world_name`
// says what the world is in the message ("the local world has 4 devices").
void check_group_members(const char* op, int device, const std::vector<int>& group, int world,
                         const std::string& world_name);

// dst = ((src[0] + src[1]) + src[2]) + ... elementwise, `count` elements: the order
// every communicator reduces in (in-process, MPI, TCP, NCCL's host path).
void ordered_sum(void* dst, const std::vector<const char*>& srcs, size_t count, DType dtype);

// Whether two byte ranges share a byte (empty ranges share none).
bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes);

// The checks and sums of an all_to_all_v call (communicator.h): both size lists have one
// entry per member (a ValueError naming `op` otherwise). offsets: exclusive prefix sums.
struct RaggedBlocks {
  std::vector<size_t> send_offsets, recv_offsets;
  size_t send_total = 0, recv_total = 0;
  double sent_to_others = 0;  // bytes, for the statistics
};
RaggedBlocks ragged_blocks(const char* op, const std::vector<int>& group, size_t index,
                           const std::vector<size_t>& send_bytes, const std::vector<size_t>& recv_bytes);

class LocalCommunicator : public Communicator {
 public:
  explicit LocalCommunicator(int devices);

  std::string kind() const override { return "local"; }
  int world_size() const override { return devices_; }
  std::vector<int> local_devices() const override;

  void all_gather(int device, const std::vector<int>& group, const void* send, void* recv, size_t bytes) override;
  void all_reduce(int device, const std::vector<int>& group, const void* send, void* recv, size_t count,
                  DType dtype) override;
  void reduce_scatter(int device, const std::vector<int>& group, const void* send, void* recv, size_t count,
                      DType dtype) override;
  void all_to_all(int device, const std::vector<int>& group, const void* send, void* recv, size_t bytes) override;
  void all_to_all_v(int device, const std::vector<int>& group, const void* send, const std::vector<size_t>& send_bytes,
                    void* recv, const std::vector<size_t>& recv_bytes) override;
  void broadcast(int device, const std::vector<int>& group, void* buffer, size_t bytes) override;
  void barrier(int device, const std::vector<int>& group) override;

  void abort(const std::string& reason) override;
  // Not while a collective is in flight (run_on_devices calls it after joining).
  void reset() override;

  CommStats stats(int device) const override;
  void reset_stats() override;

  // The devices of the run in flight (run_on_devices): a collective whose group
  // names a device that is not running fails at once instead of waiting forever.
  // Without a run (threads driven by hand) every device counts as running.
  void begin_run(const std::vector<int>& devices);
  void end_run(const std::vector<int>& devices);

  // What one member posted for one collective.
  struct Slot {
    const char* op = nullptr;
    size_t size = 0;  // bytes, or elements for reductions
    DType dtype = DType::Float32;
    bool reduction = false;
    const void* send = nullptr;
    void* recv = nullptr;
    void* scratch = nullptr;
    bool in_place = false;           // recv overlaps send
    const size_t* blocks = nullptr;  // all_to_all_v: the member's send_bytes (size: their count)
  };
  struct Rendezvous {
    explicit Rendezvous(size_t n) : slots(n) {}
    std::mutex mutex;
    std::condition_variable cv;
    int arrived = 0;
    uint64_t generation = 0;
    std::vector<Slot> slots;
  };
  // One member inside one collective.
  struct Call {
    Rendezvous* rendezvous = nullptr;
    const std::vector<int>* group = nullptr;
    int device = 0;
    int index = 0;  // position in the group
    int n = 1;
    double start = 0;
  };

 private:
  Call enter(int device, const std::vector<int>& group, const Slot& mine);
  void sync(const Call& call);  // a barrier of the group; throws when aborted
  void leave(const Call& call, CommKind kind, double full_bytes);
  void check_group(int device, const std::vector<int>& group, const char* op) const;
  [[noreturn]] void throw_aborted(const char* op, const std::vector<int>& group) const;

  int devices_;
  mutable std::mutex mutex_;  // groups_, reason_, running_
  std::map<std::vector<int>, std::unique_ptr<Rendezvous>> groups_;
  std::atomic<bool> aborted_{false};
  std::string reason_;
  std::vector<int> running_;  // per device: the runs in flight that include it
  int runs_ = 0;              // runs in flight (0: every device counts as running)
  mutable std::mutex stats_mutex_;
  std::vector<CommStats> stats_;
};

}  // namespace tessera::spmd
