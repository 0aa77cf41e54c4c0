// alltoall(v)'s window of peers (collective_options::exchange_window): a rank expects at most
// that many peers' messages at once, whatever the sizes, chunks and forms, and still receives
// everything within the bound. MPI_Irecv, MPI_Testany and MPI_Waitany are interposed through
// MPI's profiling interface to count the peers whose data receives are outstanding, the
// requests each poll tests (a window of the oldest, however many are outstanding) and the
// arrivals found beyond that window (the sweep). Failures mid-flight with a window of one are
// in faults.cpp. Run under mpiexec -n 1 to 4, and 6.

#include <kompress/comm.hpp>

#include "comm/checks.hpp"
#include "support/mpi_checks.hpp"

#include <doctest/doctest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <set>
#include <thread>
#include <vector>

namespace {

/// The data receives kompress has posted and not yet completed, and the most peers they
/// were ever from at once.
struct outstanding_receives {
  struct posted_receive {
    int peer;
    std::uint64_t number;  ///< its place in posting order
  };
  std::map<MPI_Request, posted_receive> pending;
  std::uint64_t posts = 0;
  std::size_t most_peers = 0;
  std::size_t most_requests = 0;  ///< the most data receives outstanding at once
  std::size_t widest_poll = 0;    ///< the most requests one MPI_Testany or MPI_Waitany was given
  std::size_t found_ahead = 0;    ///< arrivals an MPI_Testany found without the oldest receive

  void reset() {
    pending.clear();
    posts = most_peers = most_requests = widest_poll = found_ahead = 0;
  }
  void posted(MPI_Request r, int peer) {
    pending[r] = {peer, posts++};
    std::set<int> peers;
    for (const auto& [request, receive] : pending) peers.insert(receive.peer);
    most_peers = std::max(most_peers, peers.size());
    most_requests = std::max(most_requests, pending.size());
  }
  void polled(int count) { widest_poll = std::max(widest_poll, std::size_t(count)); }
  /// Whether `r` is the oldest data receive outstanding.
  bool oldest(MPI_Request r) const {
    const auto it = pending.find(r);
    if (it == pending.end()) return false;
    return std::none_of(pending.begin(), pending.end(),
                        [&](const auto& other) { return other.second.number < it->second.number; });
  }
  void completed(MPI_Request r) { pending.erase(r); }
} receives;

}  // namespace

extern "C" {
int MPI_Irecv(void* buffer, int count, MPI_Datatype type, int peer, int tag, MPI_Comm comm, MPI_Request* request) {
  const int rc = PMPI_Irecv(buffer, count, type, peer, tag, comm, request);
  if (rc == MPI_SUCCESS && tag == kompress::detail::collective_tag && type == MPI_BYTE) receives.posted(*request, peer);
  return rc;
}
int MPI_Testany(int count, MPI_Request* requests, int* index, int* flag, MPI_Status* status) {
  receives.polled(count);
  const std::vector<MPI_Request> before(requests, requests + count);
  const bool beyond_oldest = count > 0 && !receives.oldest(requests[0]);
  const int rc = PMPI_Testany(count, requests, index, flag, status);
  if (rc == MPI_SUCCESS && *flag && *index != MPI_UNDEFINED) {
    const MPI_Request done = before[std::size_t(*index)];
    receives.found_ahead += beyond_oldest && receives.pending.count(done) > 0;
    receives.completed(done);
  }
  return rc;
}
int MPI_Waitany(int count, MPI_Request* requests, int* index, MPI_Status* status) {
  receives.polled(count);
  const std::vector<MPI_Request> before(requests, requests + count);
  const int rc = PMPI_Waitany(count, requests, index, status);
  if (rc == MPI_SUCCESS && *index != MPI_UNDEFINED) receives.completed(before[std::size_t(*index)]);
  return rc;
}
}

namespace {

using namespace kompress::test;  // support/mpi_checks.hpp, comm/checks.hpp

/// The largest of a per-rank count on any rank.
std::size_t most_on_any_rank(std::size_t count) { return std::size_t(max_over_ranks(double(count))); }
/// The most peers any rank expected at once.
std::size_t most_peers_on_any_rank() { return most_on_any_rank(receives.most_peers); }

/// The peers a rank expects at once with `window` (0: all) on this communicator.
std::size_t expected_peers(std::size_t window) {
  const std::size_t others = std::size_t(size_of() - 1);
  return window > 0 ? std::min(window, others) : others;
}

/// Compressed mode, each message in 4 chunks of 4 KiB (about 16 KiB a peer below).
kompress::collective_options windowed(std::size_t window) {
  auto options = chunked(4096);
  options.exchange_window = window;
  return options;
}

}  // namespace

TEST_CASE_TEMPLATE("alltoall with a window of peers: at most that many expected at once, every value within the bound",
                   T, float, double) {
  const int p = size_of(), me = rank_of();
  const std::size_t per_peer = 16384 / sizeof(T);
  auto send = make_data<T>(per_peer * std::size_t(p), me + 1);
  host_view<T> got("got", send.size()), expected("expected", send.size());
  MPI_Alltoall(send.data(), int(per_peer), mpi_type<T>(), expected.data(), int(per_peer), mpi_type<T>(),
               MPI_COMM_WORLD);
  for (const std::size_t window : {std::size_t(1), std::size_t(2), std::size_t(0)})
    for (const bool nonblocking : {false, true}) {
      CAPTURE(window);
      CAPTURE(nonblocking);
      std::fill_n(got.data(), got.size(), T(NAN));
      receives.reset();
      const auto options = windowed(window);
      const auto report = finish<T>(
          nonblocking, [&] { return kompress::alltoall(host{}, send, got, MPI_COMM_WORLD, options); },
          [&] { return kompress::ialltoall(host{}, send, got, MPI_COMM_WORLD, options); });
      CHECK(most_peers_on_any_rank() == expected_peers(window));
      CHECK(report.messages == std::uint64_t(p - 1));
      CHECK(values_outside(got, expected, pipelined_abs_bound) == 0);
    }
}

TEST_CASE("alltoallv with a window of one peer: zero and uneven counts, every value within the bound") {
  const uneven_layout layout;
  const auto& [send_counts, send_displs, recv_counts, recv_displs] = layout;
  auto send = make_data<float>(layout.send_total(), rank_of() + 7);
  host_view<float> got("got", layout.recv_total()), expected("expected", layout.recv_total());
  layout.mpi_alltoallv(send.data(), expected.data());
  receives.reset();
  kompress::alltoallv(host{}, send, send_counts, send_displs, got, recv_counts, recv_displs, MPI_COMM_WORLD,
                      windowed(1));
  CHECK(most_peers_on_any_rank() <= 1);
  CHECK(values_outside(got, expected, pipelined_abs_bound) == 0);
}

TEST_CASE("persistent alltoall with a window of one peer: round after round") {
  const int p = size_of(), me = rank_of();
  const std::size_t per_peer = 4096;
  host_view<float> send("send", per_peer * std::size_t(p)), got("got", send.size()),
      expected("expected", send.size());
  auto request = kompress::alltoall_init(host{}, send, got, MPI_COMM_WORLD, windowed(1));
  for (int round = 0; round < persistent_rounds; ++round) {
    refill(send, me + 1, round);
    MPI_Alltoall(send.data(), int(per_peer), MPI_FLOAT, expected.data(), int(per_peer), MPI_FLOAT, MPI_COMM_WORLD);
    receives.reset();
    run_round(request, round);
    CHECK(most_peers_on_any_rank() == expected_peers(1));
    CHECK(values_outside(got, expected, pipelined_abs_bound) == 0);
  }
}

TEST_CASE("alltoall polls a window of its receives: more receives outstanding than one poll tests, every value "
          "within the bound") {
  const int p = size_of(), me = rank_of();
  if (p < 2) return;
  constexpr std::size_t window = kompress::detail::posted_messages::poll_window;
  const std::size_t per_peer = (window + 16) * 1024;  // window + 16 chunks of 4 KiB from each peer
  auto send = make_data<float>(per_peer * std::size_t(p), me + 3);
  host_view<float> got("got", send.size()), expected("expected", send.size());
  MPI_Alltoall(send.data(), int(per_peer), MPI_FLOAT, expected.data(), int(per_peer), MPI_FLOAT, MPI_COMM_WORLD);
  for (const bool nonblocking : {false, true}) {
    CAPTURE(nonblocking);
    std::fill_n(got.data(), got.size(), NAN);
    receives.reset();
    const auto options = windowed(0);
    const auto report = finish<float>(
        nonblocking, [&] { return kompress::alltoall(host{}, send, got, MPI_COMM_WORLD, options); },
        [&] { return kompress::ialltoall(host{}, send, got, MPI_COMM_WORLD, options); });
    CHECK(most_on_any_rank(receives.most_requests) > window);
    CHECK(most_on_any_rank(receives.widest_poll) == window);
    CHECK(report.chunks == std::uint64_t(p - 1) * (window + 16));
    CHECK(values_outside(got, expected, pipelined_abs_bound) == 0);
  }
}

TEST_CASE("persistent alltoall decodes messages that arrive ahead of their turn: a late peer's receives do not "
          "hold up the others'") {
  const int p = size_of(), me = rank_of();
  if (p < 3) return;
  constexpr std::size_t window = kompress::detail::posted_messages::poll_window;
  const std::size_t per_peer = (window + 16) * 1024;
  auto send = make_data<float>(per_peer * std::size_t(p), me + 5);
  host_view<float> got("got", send.size()), expected("expected", send.size());
  MPI_Alltoall(send.data(), int(per_peer), MPI_FLOAT, expected.data(), int(per_peer), MPI_FLOAT, MPI_COMM_WORLD);
  // The persistent form: a round starts without the one-shot call's agreement, so a rank that
  // starts late holds up no other rank's start.
  auto request = kompress::alltoall_init(host{}, send, got, MPI_COMM_WORLD, windowed(0));
  for (int round = 0; round < 2; ++round) {  // completed by wait(), then by test()
    CAPTURE(round);
    std::fill_n(got.data(), got.size(), NAN);
    receives.reset();
    MPI_Barrier(MPI_COMM_WORLD);
    // Rank 1 posts rank 0's receives first (peers in the order they send to it: rank - 1 first),
    // window + 16 of them. Rank 0 starts late and rank 1 after the others, whose messages to it
    // are there when it starts: its polls find none of the oldest arrived, and the sweep beyond
    // them must find those.
    if (me <= 1) std::this_thread::sleep_for(std::chrono::milliseconds(me == 0 ? 600 : 200));
    const auto& report = run_round(request, round);
    if (me == 1) CHECK(receives.found_ahead > 0);
    CHECK(report.chunks == std::uint64_t(p - 1) * (window + 16));
    CHECK(values_outside(got, expected, pipelined_abs_bound) == 0);
  }
}
