// Internal: the TCP communicator, one process per device (device == rank), for jobs
// that have no MPI: pods of a Kubernetes Job, `tessera launch --nnodes N --node-rank R
// --coordinator HOST:PORT` on hosts without a scheduler, or several processes on one
// machine. The ranks find each other through a coordinator (tcp_rendezvous.h) and keep
// a full mesh of connections: one for data, one for abort notes, per pair.
//
// Collectives (the same algorithms as the MPI communicator, so the numbers are bitwise
// those of the in-process runtime): every exchange is direct, member to member, driven
// by one poll() loop over the sockets involved, so no pair waits on another.
//   all_gather      each member sends its block to every other member;
//   all_to_all      member i sends its block j to member j;
//   reduce_scatter  an all-to-all, then the ordered sum (((m0 + m1) + m2) + ...);
//   all_reduce      that reduce-scatter on n equal chunks, then an all-gather;
//   broadcast       the first member sends to the others; barrier: empty messages.
// Each message has a header (op, per-connection sequence number, bytes) that the
// receiver checks: ranks that run different programs get an error naming both sides'
// op and size, never silently mixed data.
//
// Failures: a member that fails calls abort(); every other rank gets the reason on its
// control connection and throws tessera::Error from its collective. A peer that dies
// without a word (SIGKILL) closes its connections: the members waiting on it throw,
// naming it, and pass the abort on. A collective that waits longer than the timeout
// (TESSERA_TCP_TIMEOUT_S, default 1800 s; 0: forever) aborts. An aborted communicator
// stays aborted: the process is expected to exit and its launcher to restart the job.
#pragma once

#include <memory>
#include <string>

#include "spmd/tcp/tcp_socket.h"
#include "tessera/spmd/communicator.h"

namespace tessera::spmd {

struct TcpOptions {
  tcp::Endpoint coordinator;
  int rank = 0;
  int world = 1;
  double rendezvous_timeout_s = 300;
  double timeout_s = 1800;  // per collective; 0: no limit
};

// Runs the rendezvous (blocks until every rank joined or rendezvous_timeout_s) and
// returns the connected communicator. Tests make several in one process, a thread each.
std::unique_ptr<Communicator> make_tcp_communicator(const TcpOptions& options);

// Whether this process was started as a rank of a TCP job (TESSERA_COORDINATOR set).
bool tcp_requested();

// The process's TCP communicator, made on first use from TESSERA_COORDINATOR,
// TESSERA_RANK, TESSERA_WORLD_SIZE, TESSERA_RENDEZVOUS_TIMEOUT_S and
// TESSERA_TCP_TIMEOUT_S (ValueErrors naming the variable when one is missing or bad).
// Never destroyed.
Communicator& tcp_communicator();

}  // namespace tessera::spmd
