// Internal: how the processes of a TCP job find each other (no MPI, no shared files):
// the way torchrun's static rendezvous and JAX's coordinator work, in three steps.
//
//   1. Rank 0 listens on the coordinator's port (TESSERA_COORDINATOR = host:port: on
//      Kubernetes the DNS name of pod 0 through the job's headless Service).
//   2. Every other rank opens a listener of its own on an ephemeral port, connects to
//      the coordinator twice (a data and a control connection: the coordinator's pair
//      connections to rank r) and says hello: world size, rank, channel, its port.
//      Connection refusals and names that do not resolve yet are retried until the
//      timeout: pods start in any order and their DNS records appear late.
//   3. When all world-1 ranks have said hello, rank 0 sends each the table of
//      (address as rank 0 saw it, port) and closes the coordinator's port (a restarted
//      job's ranks cannot join a finished rendezvous). Rank j then connects to every
//      rank 0 < i < j on i's listener, twice, and accepts the connections of the ranks
//      above it: a full mesh of data and control connections.
//
// Every hello is answered at once: a welcome, or, when it disagrees (another world
// size, a rank out of range, a rank that joins twice), the reason, which then fails the
// rendezvous on both sides.
#pragma once

#include <string>
#include <vector>

#include "spmd/tcp/tcp_socket.h"

namespace tessera::spmd::tcp {

struct RendezvousOptions {
  Endpoint coordinator;
  int rank = 0;
  int world = 1;
  double timeout_s = 300;
};

// One data and one control connection to every other rank (index = rank; invalid at
// this rank's own index). Sockets are non-blocking with TCP_NODELAY.
struct PeerSockets {
  std::vector<Socket> data, control;
};

PeerSockets rendezvous(const RendezvousOptions& options);

}  // namespace tessera::spmd::tcp
