// The TCP communicator, its ranks as threads of one process (each with its own
// communicator and sockets, as separate processes would have): every collective
// bitwise equal to the serial ordered sum / exact reference, on the world and on
// subgroups, large messages, and the failure paths — an abort note, a rank that
// vanishes, ranks running different programs, a collective timeout, and the
// rendezvous' own errors. (tests/spmd/multiprocess runs the same collectives and a GPT
// step with real processes under `tessera launch --coordinator`.)
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "spmd/collective_reference.h"
#include "spmd/tcp/communicator_tcp.h"
#include "tessera/base/error.h"

namespace tessera::spmd {
namespace {

using testing::fractional_f32;
using testing::serial_sum;

// A port nothing listens on right now (the kernel's choice for port 0).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), length), 0);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  ::close(fd);
  return ntohs(address.sin_port);
}

TcpOptions options(int port, int rank, int world, double timeout_s = 60) {
  TcpOptions o;
  o.coordinator = {"127.0.0.1", port};
  o.rank = rank;
  o.world = world;
  o.rendezvous_timeout_s = 30;
  o.timeout_s = timeout_s;
  return o;
}

// Runs fn(rank, communicator) on `world` threads, each a rank of one TCP job; the
// errors each rank threw come back in rank order ("" where it finished).
std::vector<std::string> on_ranks(int world, const std::function<void(int, Communicator&)>& fn, double timeout_s = 60) {
  const int port = free_port();
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        std::unique_ptr<Communicator> comm = make_tcp_communicator(options(port, r, world, timeout_s));
        try {
          fn(r, *comm);
        } catch (const std::exception& e) {
          comm->abort(e.what());
          throw;
        }
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (std::thread& t : threads) t.join();
  return errors;
}

std::vector<int> iota(int n) {
  std::vector<int> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
  return v;
}

void expect_no_errors(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(TcpCommunicator, ReductionsAreTheOrderedSumBitwiseOnTheWorldAndSubgroups) {
  for (int world : {2, 3, 4}) {
    const std::vector<int> all = iota(world);
    const std::vector<int> reversed(all.rbegin(), all.rend());
    for (const std::vector<int>& group : {all, reversed}) {
      for (size_t count : {size_t{1}, size_t{7}, size_t{1000}}) {
        std::vector<std::vector<char>> members;
        for (int dev : group) members.push_back(fractional_f32(dev, count));
        const std::vector<char> expect = serial_sum(members, count, DType::Float32);
        std::vector<std::vector<char>> got(static_cast<size_t>(world)), in_place(static_cast<size_t>(world));
        expect_no_errors(on_ranks(world, [&](int r, Communicator& comm) {
          std::vector<char> mine = fractional_f32(r, count);
          got[r].resize(count * 4);
          comm.all_reduce(r, group, mine.data(), got[r].data(), count, DType::Float32);
          comm.all_reduce(r, group, mine.data(), mine.data(), count, DType::Float32);
          in_place[r] = mine;
        }));
        for (int r = 0; r < world; ++r) {
          EXPECT_EQ(got[r], expect) << "world " << world << " rank " << r << " count " << count;
          EXPECT_EQ(in_place[r], expect) << "in place, world " << world << " rank " << r;
        }
      }
    }
    // Reduce-scatter: member i gets the ordered sum of everyone's block i.
    const size_t count = 33;
    std::vector<std::vector<char>> out(static_cast<size_t>(world));
    expect_no_errors(on_ranks(world, [&](int r, Communicator& comm) {
      std::vector<char> in = fractional_f32(r, count * static_cast<size_t>(world));
      out[r].resize(count * 4);
      comm.reduce_scatter(r, all, in.data(), out[r].data(), count, DType::Float32);
    }));
    for (int r = 0; r < world; ++r) {
      std::vector<std::vector<char>> blocks;
      for (int m = 0; m < world; ++m) {
        const std::vector<char> in = fractional_f32(m, count * static_cast<size_t>(world));
        blocks.emplace_back(in.begin() + static_cast<std::ptrdiff_t>(r * count * 4),
                            in.begin() + static_cast<std::ptrdiff_t>((r + 1) * count * 4));
      }
      EXPECT_EQ(out[r], serial_sum(blocks, count, DType::Float32)) << "reduce_scatter world " << world << " rank " << r;
    }
  }
}

TEST(TcpCommunicator, GatherAllToAllBroadcastAndBarrierMoveTheRightBlocks) {
  const int world = 4;
  const size_t bytes = 12;
  auto block = [](int from, int to) {  // the bytes `from` sends to `to` in an all-to-all
    std::vector<char> b(bytes);
    for (size_t k = 0; k < bytes; ++k) b[k] = static_cast<char>(from * 40 + to * 4 + static_cast<int>(k));
    return b;
  };
  std::vector<std::vector<char>> gathered(world), exchanged(world), pair_gathered(world);
  std::vector<std::vector<int>> broadcast(world);
  expect_no_errors(on_ranks(world, [&](int r, Communicator& comm) {
    std::vector<char> mine = block(r, r);
    gathered[r].resize(world * bytes);
    comm.all_gather(r, iota(world), mine.data(), gathered[r].data(), bytes);
    std::vector<char> send;
    for (int to = 0; to < world; ++to) {
      const std::vector<char> b = block(r, to);
      send.insert(send.end(), b.begin(), b.end());
    }
    exchanged[r] = send;  // in place: recv == send
    comm.all_to_all(r, iota(world), exchanged[r].data(), exchanged[r].data(), bytes);
    broadcast[r].assign(3, r + 1);
    const std::vector<int> from_last{3, 0, 1, 2};  // root: the group's first member, rank 3
    comm.broadcast(r, from_last, broadcast[r].data(), 3 * sizeof(int));
    comm.barrier(r, iota(world));
    const std::vector<int> pair = r < 2 ? std::vector<int>{1, 0} : std::vector<int>{2, 3};
    pair_gathered[r].resize(2 * bytes);
    comm.all_gather(r, pair, mine.data(), pair_gathered[r].data(), bytes);
  }));
  for (int r = 0; r < world; ++r) {
    std::vector<char> want_gather, want_exchange;
    for (int m = 0; m < world; ++m) {
      const std::vector<char> g = block(m, m), x = block(m, r);
      want_gather.insert(want_gather.end(), g.begin(), g.end());
      want_exchange.insert(want_exchange.end(), x.begin(), x.end());
    }
    EXPECT_EQ(gathered[r], want_gather) << "all_gather rank " << r;
    EXPECT_EQ(exchanged[r], want_exchange) << "all_to_all rank " << r;
    EXPECT_EQ(broadcast[r], std::vector<int>(3, 4)) << "broadcast rank " << r;
    const std::vector<int> pair = r < 2 ? std::vector<int>{1, 0} : std::vector<int>{2, 3};
    std::vector<char> want_pair = block(pair[0], pair[0]);
    const std::vector<char> second = block(pair[1], pair[1]);
    want_pair.insert(want_pair.end(), second.begin(), second.end());
    EXPECT_EQ(pair_gathered[r], want_pair) << "all_gather over a pair, rank " << r;
  }
}

// Expert parallelism's ragged all-to-all: each pair its own block size (some empty),
// only those bytes sent and counted; a size the receiver does not expect is an error.
TEST(TcpCommunicator, RaggedAllToAllMovesOnlyEachPairsBlock) {
  const int world = 3;
  auto bytes_of = [](int from, int to) { return static_cast<size_t>((from * 3 + to) % 4 * 5000); };
  auto byte_of = [](int from, int to, size_t k) {
    return static_cast<char>(from * 16 + to * 4 + static_cast<int>(k % 3));
  };
  std::vector<std::vector<char>> got(world), want(world);
  std::vector<CommStats> stats(world);
  expect_no_errors(on_ranks(world, [&](int r, Communicator& comm) {
    std::vector<size_t> send_bytes, recv_bytes;
    std::vector<char> send;
    for (int j = 0; j < world; ++j) {
      send_bytes.push_back(bytes_of(r, j));
      recv_bytes.push_back(bytes_of(j, r));
      for (size_t k = 0; k < bytes_of(r, j); ++k) send.push_back(byte_of(r, j, k));
      for (size_t k = 0; k < bytes_of(j, r); ++k) want[r].push_back(byte_of(j, r, k));
    }
    got[r].assign(want[r].size(), 'x');
    comm.all_to_all_v(r, iota(world), send.data(), send_bytes, got[r].data(), recv_bytes);
    stats[r] = comm.stats(r);
  }));
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(got[r] == want[r]) << "rank " << r;
    double sent = 0;
    for (int j = 0; j < world; ++j)
      if (j != r) sent += static_cast<double>(bytes_of(r, j));
    EXPECT_EQ(stats[r].all_to_all_calls, 1) << r;
    EXPECT_DOUBLE_EQ(stats[r].all_to_all_bytes, sent) << r;
  }
  const std::vector<std::string> errors = on_ranks(2, [&](int r, Communicator& comm) {
    std::vector<char> send(8), recv(8);
    comm.all_to_all_v(r, iota(2), send.data(), {4, 4}, recv.data(), {4, r == 0 ? size_t{2} : size_t{4}});
  });
  bool named = false;
  for (const std::string& e : errors) named = named || e.find("all_to_all_v") != std::string::npos;
  EXPECT_TRUE(named) << "no rank named the ragged all-to-all";
}

TEST(TcpCommunicator, LargeMessagesArriveWholeAndStatsCountRingBytes) {
  // 8 MiB per member: far more than a socket buffer, so every send and receive goes
  // through many partial writes and reads interleaved across peers.
  const int world = 3;
  const size_t count = size_t{2} << 20;
  std::vector<std::vector<char>> got(world);
  std::vector<CommStats> stats(world);
  expect_no_errors(on_ranks(world, [&](int r, Communicator& comm) {
    std::vector<char> mine = fractional_f32(r, count);
    got[r].resize(count * 4);
    comm.all_reduce(r, iota(world), mine.data(), got[r].data(), count, DType::Float32);
    stats[r] = comm.stats(r);
  }));
  std::vector<std::vector<char>> members;
  for (int m = 0; m < world; ++m) members.push_back(fractional_f32(m, count));
  const std::vector<char> expect = serial_sum(members, count, DType::Float32);
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(got[r] == expect) << "rank " << r;
    EXPECT_EQ(stats[r].all_reduce_calls, 1);
    EXPECT_DOUBLE_EQ(stats[r].all_reduce_bytes, 2.0 * (world - 1) / world * static_cast<double>(count * 4));
  }
}

TEST(TcpCommunicator, AFailingRankAbortsTheOthersWithItsReason) {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<std::string> errors = on_ranks(3, [&](int r, Communicator& comm) {
    float v = 1;
    if (r == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      fail<ValueError>("rank 1 fails on purpose");
    }
    comm.all_reduce(r, iota(3), &v, &v, 1, DType::Float32);
  });
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 20);
  EXPECT_EQ(errors[1], "rank 1 fails on purpose");
  for (int r : {0, 2}) {
    EXPECT_NE(errors[r].find("aborted: rank 1: rank 1 fails on purpose"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("all_reduce on devices [0, 1, 2]"), std::string::npos) << errors[r];
  }
}

TEST(TcpCommunicator, ARankThatVanishesIsNamedByThoseWaitingOnIt) {
  // Rank 2 closes its sockets without a word (as a SIGKILLed process would); rank 0
  // waits on it and names it; rank 1, waiting on rank 0, gets rank 0's abort note.
  const std::vector<std::string> errors = on_ranks(3, [&](int r, Communicator& comm) {
    if (r == 2) return;  // the communicator is destroyed: its connections close
    float v = 1;
    if (r == 0) comm.all_reduce(r, {0, 2}, &v, &v, 1, DType::Float32);
    comm.all_reduce(r, {0, 1}, &v, &v, 1, DType::Float32);
  });
  EXPECT_EQ(errors[2], "");
  EXPECT_NE(errors[0].find("rank 2 closed its connection"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("aborted: rank 0: rank 2 closed its connection"), std::string::npos) << errors[1];
}

TEST(TcpCommunicator, RanksRunningDifferentProgramsGetAnErrorNotMixedData) {
  const std::vector<std::string> errors = on_ranks(2, [&](int r, Communicator& comm) {
    std::vector<char> send(32), recv(64);
    comm.all_gather(r, iota(2), send.data(), recv.data(), r == 0 ? 16 : 32);
  });
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("the ranks are not running the same program"), std::string::npos) << e;
    EXPECT_NE(e.find("all_gather of 32 bytes"), std::string::npos) << e;
  }
}

TEST(TcpCommunicator, ACollectiveThatWaitsTooLongTimesOut) {
  const std::vector<std::string> errors = on_ranks(
      2,
      [&](int r, Communicator& comm) {
        if (r == 1) {  // rank 1 is busy well past rank 0's timeout, then joins late
          std::this_thread::sleep_for(std::chrono::milliseconds(1500));
          comm.barrier(r, iota(2));
          return;
        }
        comm.barrier(r, iota(2));
      },
      /*timeout_s=*/0.3);
  EXPECT_NE(errors[0].find("barrier on devices [0, 1] timed out after 0.3 s waiting for rank(s) 1"), std::string::npos)
      << errors[0];
  EXPECT_NE(errors[1].find("aborted: rank 0: barrier"), std::string::npos) << errors[1];
}

TEST(TcpCommunicator, RendezvousErrorsSayWhatDisagrees) {
  // Two ranks with different world sizes: both fail, naming both sizes.
  const int port = free_port();
  std::string e0, e1;
  std::thread t0([&] {
    try {
      make_tcp_communicator(options(port, 0, 2));
    } catch (const std::exception& e) {
      e0 = e.what();
    }
  });
  std::thread t1([&] {
    try {
      make_tcp_communicator(options(port, 1, 3));
    } catch (const std::exception& e) {
      e1 = e.what();
    }
  });
  t0.join();
  t1.join();
  EXPECT_NE(e0.find("rank 1 says the job has 3 ranks, rank 0 says 2"), std::string::npos) << e0;
  EXPECT_NE(e1.find("rank 1 says the job has 3 ranks"), std::string::npos) << e1;

  // A coordinator whose peers never come: a timeout naming the missing ranks.
  TcpOptions alone = options(free_port(), 0, 3);
  alone.rendezvous_timeout_s = 0.5;
  try {
    make_tcp_communicator(alone);
    ADD_FAILURE() << "no error";
  } catch (const IOError& e) {
    EXPECT_NE(std::string(e.what()).find("rank(s) 1, 2 never connected"), std::string::npos) << e.what();
  }
  // A rank whose coordinator never comes.
  TcpOptions orphan = options(free_port(), 1, 2);
  orphan.rendezvous_timeout_s = 0.5;
  try {
    make_tcp_communicator(orphan);
    ADD_FAILURE() << "no error";
  } catch (const IOError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 reaching the coordinator: cannot connect to 127.0.0.1:"),
              std::string::npos)
        << e.what();
  }
  // Endpoints.
  EXPECT_EQ(tcp::parse_endpoint("pod-0.job:29500", "X").host, "pod-0.job");
  EXPECT_EQ(tcp::parse_endpoint("[::1]:7", "X").port, 7);
  EXPECT_EQ(tcp::parse_endpoint("[::1]:7", "X").text(), "[::1]:7");
  for (const char* bad : {"pod-0", "pod-0:", ":29500", "pod:0", "pod:65536", "pod:29x", "::1:29500", "[::1]29500"})
    EXPECT_THROW(tcp::parse_endpoint(bad, "TESSERA_COORDINATOR"), ValueError) << bad;
}

}  // namespace
}  // namespace tessera::spmd
