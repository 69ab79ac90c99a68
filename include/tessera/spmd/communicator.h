// Communicator: moves bytes between the devices of an SPMD program. One interface,
// three implementations: in-process (N virtual CPU devices, a thread each;
// communicator_local.cpp), MPI (one process per device; communicator_mpi.cpp) and
// NCCL (the CUDA backend).
//
// Every collective is called by each member of `group` (global device ids, in group
// order, see Mesh::group) with the same arguments except the buffers. Blocks are
// ordered by position in the group. Reductions add the members' values in group
// order (((m0 + m1) + m2) + ...) elementwise, whatever the implementation, so a
// sharded program gives bitwise the same numbers in-process, under MPI, on every
// run.
//
// A member that fails calls abort(): every member waiting in a collective then
// throws tessera::Error instead of hanging.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tessera/base/dtype.h"

namespace tessera::spmd {

// Bytes each device sent, per collective kind, counted as a bandwidth-optimal ring
// algorithm moves them (what the cost model and the reports use): all-gather and
// reduce-scatter (n-1)/n of the full buffer, all-reduce 2(n-1)/n, all-to-all (n-1)/n.
struct CommStats {
  int64_t all_gather_calls = 0, all_reduce_calls = 0, reduce_scatter_calls = 0, all_to_all_calls = 0;
  double all_gather_bytes = 0, all_reduce_bytes = 0, reduce_scatter_bytes = 0, all_to_all_bytes = 0;
  double seconds = 0;  // wall time inside collectives
  double total_bytes() const { return all_gather_bytes + all_reduce_bytes + reduce_scatter_bytes + all_to_all_bytes; }
  int64_t total_calls() const { return all_gather_calls + all_reduce_calls + reduce_scatter_calls + all_to_all_calls; }
};
// What happened between two snapshots of one device's statistics.
CommStats operator-(const CommStats& after, const CommStats& before);
// Both together (a program's collectives counted by two sources).
CommStats operator+(const CommStats& a, const CommStats& b);

class Communicator {
 public:
  virtual ~Communicator() = default;
  // "local", "mpi", "nccl".
  virtual std::string kind() const = 0;
  // Devices in the world (mesh devices are 0 .. world_size()-1).
  virtual int world_size() const = 0;
  // The devices this process drives (all of them in-process; its rank under MPI).
  virtual std::vector<int> local_devices() const = 0;

  // recv = concat over members of their `bytes`-sized send blocks (group order).
  virtual void all_gather(int device, const std::vector<int>& group, const void* send, void* recv, size_t bytes) = 0;
  // recv = elementwise sum over members of send (count elements); in place allowed.
  virtual void all_reduce(int device, const std::vector<int>& group, const void* send, void* recv, size_t count,
                          DType dtype) = 0;
  // send holds n blocks of `count` elements; member i receives the sum of block i.
  virtual void reduce_scatter(int device, const std::vector<int>& group, const void* send, void* recv, size_t count,
                              DType dtype) = 0;
  // send holds n blocks of `bytes`; member i receives block i of every member,
  // concatenated in group order.
  virtual void all_to_all(int device, const std::vector<int>& group, const void* send, void* recv, size_t bytes) = 0;
  // Ragged all-to-all (expert parallelism's dropless dispatch and combine): send holds
  // n blocks packed in group order, block j (send_bytes[j] bytes) for member j; recv
  // gets member k's block for this member (recv_bytes[k] bytes, which must equal member
  // k's send_bytes for this member: an error naming the call otherwise), packed in group
  // order.
  // Statistics count an all-to-all call and exactly the bytes sent to the others. This
  // default pads every block to the group's largest (an all_gather of the block sizes,
  // then all_to_all, each counted as such); the in-process, MPI and TCP communicators
  // move only the blocks.
  virtual void all_to_all_v(int device, const std::vector<int>& group, const void* send,
                            const std::vector<size_t>& send_bytes, void* recv, const std::vector<size_t>& recv_bytes);
  // Broadcast of `bytes` from the group's first member to every member.
  virtual void broadcast(int device, const std::vector<int>& group, void* buffer, size_t bytes) = 0;
  virtual void barrier(int device, const std::vector<int>& group) = 0;

  // Point-to-point messages (pipeline stages on different processes hand over their
  // activations and gradients). send() posts `bytes` for device `to` under `tag` and
  // returns without waiting for the receiver: the buffer must stay unchanged until
  // wait_sends(). recv() waits for device `from`'s message with `tag` (its size must be
  // `bytes`). Messages of one pair and tag arrive in the order they were sent. Tags are
  // 0 .. kMaxTag. Both are abort-aware like the collectives. MPI and TCP implement them;
  // the default (in-process: pipeline stages there hand over their arrays directly) is a
  // ValueError naming the communicator.
  static constexpr int kMaxTag = 32767;
  virtual void send(int device, int to, int tag, const void* data, size_t bytes);
  virtual void recv(int device, int from, int tag, void* data, size_t bytes);
  // Waits until every send() of `device` has left its buffer.
  virtual void wait_sends(int device);

  // Wakes every waiting member with an error mentioning `reason`; later calls throw
  // too until reset().
  virtual void abort(const std::string& reason) = 0;
  virtual void reset() = 0;

  // Per-device statistics since the last reset_stats().
  virtual CommStats stats(int device) const = 0;
  virtual void reset_stats() = 0;
};

// The sum reductions use (base/dtype.h).
using tessera::add_into;

}  // namespace tessera::spmd
