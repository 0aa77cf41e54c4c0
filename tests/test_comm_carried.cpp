// A small raw call sends its data with the agreement (docs/collectives.md, "Two ranks: the data
// rides the agreement" and "Three and four ranks"): every collective on two ranks, alltoall and
// allgather on three and four. These tests check that every such call matches plain MPI bit for
// bit, inside the agreement message and after it, at the limits and beyond them; that it really
// is one round of messages between pairs (MPI calls are counted through MPI's profiling
// interface); and that a rejected call, whichever rank offered its data, throws on every rank,
// writes nothing of a peer's into any receive View (a rank's own block may hold its own values)
// and leaves nothing for the next call to match. Run under mpiexec -n 1, 2, 3 and 4 (allreduce
// and reduce_scatter on more than two ranks take MPI's own collective after the agreement and
// must give the same results).

#include <kompress/comm.hpp>

#include "support/counted_collectives.hpp"
#include "support/mpi_checks.hpp"

#include <doctest/doctest.h>
#include <mpi.h>

#include <numeric>
#include <string>
#include <vector>

namespace {

/// Point-to-point calls kompress made while `counting` (the test's own state: the library holds
/// none); its collectives are counted by support/counted_collectives.hpp.
struct mpi_calls {
  bool counting = false;
  long agreement_messages = 0;  ///< sends on the agreement tag
  long agreement_bytes = 0;
  long data_messages = 0;       ///< sends on the collectives' data tag (the engine, the ring)
};
mpi_calls calls;

}  // namespace

extern "C" {
int MPI_Isend(const void* buffer, int count, MPI_Datatype type, int peer, int tag, MPI_Comm comm,
              MPI_Request* request) {
  if (calls.counting && type == MPI_BYTE) {
    if (tag == kompress::detail::agreement_tag) {
      ++calls.agreement_messages;
      calls.agreement_bytes += count;
    }
    if (tag == kompress::detail::collective_tag) ++calls.data_messages;
  }
  return PMPI_Isend(buffer, count, type, peer, tag, comm, request);
}
}

namespace {

using kompress::test::collective_calls;  // support/counted_collectives.hpp
using kompress::test::host;
using kompress::test::host_view;
using kompress::test::make_data;
using kompress::test::mpi_type;
using kompress::test::rank_of;
using kompress::test::same_bytes;
using kompress::test::size_of;

const kompress::collective_options raw{.mode = kompress::transfer_mode::raw};

/// Element counts per message around the limits: empty, one value, inside the agreement message
/// (on three and four ranks up to and at pairwise_inline_bytes, on two inline_payload_bytes),
/// just after it, at and after the limit of three and four ranks, and at and beyond
/// max_carried_bytes.
template <class T>
std::vector<std::size_t> counts_around_limits() {
  using kompress::detail::inline_payload_bytes;
  using kompress::detail::max_carried_bytes;
  using kompress::detail::max_pairwise_carried_bytes;
  using kompress::detail::pairwise_inline_bytes;
  return {0,
          1,
          1000,
          pairwise_inline_bytes / sizeof(T),
          pairwise_inline_bytes / sizeof(T) + 1,
          inline_payload_bytes / sizeof(T),
          inline_payload_bytes / sizeof(T) + 1,
          max_pairwise_carried_bytes / sizeof(T),
          max_pairwise_carried_bytes / sizeof(T) + 1,
          20000,
          max_carried_bytes / sizeof(T),
          max_carried_bytes / sizeof(T) + 1};
}

/// Which calls carry their data: every raw call of up to 1 MiB per message on two ranks, and
/// alltoall and allgather of up to 16 KiB on three and four, as docs/collectives.md promises
/// (stated here, not read from the library, so that a change of the library's limits shows).
enum class carried_on { two_ranks, up_to_pairwise_ranks };
constexpr int pairwise_ranks = 4;
constexpr std::size_t carried_up_to(int ranks) { return ranks == 2 ? std::size_t(1) << 20 : 16 * 1024; }

/// Runs `call` with MPI calls counted; checks that a payload of `payload_bytes` per message rode
/// the agreement where it may (a header and, unless inline on two ranks, one payload message to
/// each peer, and nothing else moved), and beyond that it did not.
template <class Call>
void check_carried(std::size_t payload_bytes, carried_on where, Call&& call) {
  calls = {};
  collective_calls = {};
  calls.counting = collective_calls.counting = true;
  call();
  calls.counting = collective_calls.counting = false;
  const int p = size_of();
  if (p == 1 || p > pairwise_ranks) return;
  const long peers = p - 1;
  constexpr long header_bytes = 64;
  const bool rides = payload_bytes <= carried_up_to(p) && (p == 2 || where == carried_on::up_to_pairwise_ranks);
  if (rides) {
    const bool one_message = payload_bytes <= (p == 2 ? kompress::detail::inline_payload_bytes : 4096);
    CHECK(collective_calls.count == 0);
    CHECK(calls.data_messages == 0);
    CHECK(calls.agreement_messages == peers * (one_message ? 1 : 2));
    CHECK(calls.agreement_bytes == peers * (header_bytes + long(payload_bytes)));
  } else {
    CHECK(calls.agreement_bytes == peers * header_bytes);  // the agreement alone, then the data
    if (payload_bytes > 0) CHECK(collective_calls.count + calls.data_messages > 0);
  }
}

}  // namespace

TEST_CASE_TEMPLATE("raw calls match plain MPI bit for bit, inside the agreement, after it and beyond it", T, float,
                   double) {
  const int p = size_of(), me = rank_of();
  for (const std::size_t n : counts_around_limits<T>()) {
    CAPTURE(n);
    const auto bytes = n * sizeof(T);
    {  // allgather: n values from each rank
      const auto send = make_data<T>(n, me + 1);
      host_view<T> got("got", n * p), expected("expected", n * p);
      check_carried(bytes, carried_on::up_to_pairwise_ranks, [&] {
        kompress::allgather(host{}, send, got, MPI_COMM_WORLD, raw);
      });
      PMPI_Allgather(send.data(), int(n), mpi_type<T>(), expected.data(), int(n), mpi_type<T>(), MPI_COMM_WORLD);
      CHECK(same_bytes(got, expected));
    }
    {  // reduce_scatter: n values per rank's block
      const auto send = make_data<T>(n * p, me + 2);
      host_view<T> got("got", n), expected("expected", n);
      check_carried(bytes, carried_on::two_ranks, [&] {
        kompress::reduce_scatter(host{}, send, got, MPI_COMM_WORLD, raw);
      });
      PMPI_Reduce_scatter_block(send.data(), expected.data(), int(n), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
      CHECK(same_bytes(got, expected));
    }
    {  // alltoall: n values per peer
      const auto send = make_data<T>(n * p, me + 3);
      host_view<T> got("got", n * p), expected("expected", n * p);
      check_carried(bytes, carried_on::up_to_pairwise_ranks, [&] {
        kompress::alltoall(host{}, send, got, MPI_COMM_WORLD, raw);
      });
      PMPI_Alltoall(send.data(), int(n), mpi_type<T>(), expected.data(), int(n), mpi_type<T>(), MPI_COMM_WORLD);
      CHECK(same_bytes(got, expected));
    }
    {  // allreduce: n values, out of place, in place, and nonblocking
      const auto send = make_data<T>(n, me + 4);
      host_view<T> got("got", n), expected("expected", n), in_place("in place", n);
      check_carried(bytes, carried_on::two_ranks, [&] { kompress::allreduce(host{}, send, got, MPI_COMM_WORLD, raw); });
      PMPI_Allreduce(send.data(), expected.data(), int(n), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
      CHECK(same_bytes(got, expected));
      Kokkos::deep_copy(in_place, send);
      check_carried(bytes, carried_on::two_ranks, [&] { kompress::allreduce(host{}, in_place, MPI_COMM_WORLD, raw); });
      CHECK(same_bytes(in_place, expected));
      host_view<T> later("later", n);
      kompress::request r;
      check_carried(bytes, carried_on::two_ranks, [&] {
        r = kompress::iallreduce(host{}, send, later, MPI_COMM_WORLD, raw);
      });
      r.wait();
      CHECK(same_bytes(later, expected));
    }
  }
}

TEST_CASE("alltoallv: a small message one way and a large one the other") {
  // Rank r sends 100 values to the rank after it and 30000 to the one before (at two ranks: 100
  // from rank 0 to rank 1 inside the agreement message, 30000 back after it).
  const int p = size_of(), me = rank_of();
  std::vector<int> send_counts(p), recv_counts(p), send_displs(p), recv_displs(p);
  for (int j = 0; j < p; ++j) {
    send_counts[j] = j == (me + 1) % p ? 100 : 30000 + j;
    recv_counts[j] = me == (j + 1) % p ? 100 : 30000 + me;
  }
  std::exclusive_scan(send_counts.begin(), send_counts.end(), send_displs.begin(), 0);
  std::exclusive_scan(recv_counts.begin(), recv_counts.end(), recv_displs.begin(), 0);
  const auto send = make_data<float>(std::size_t(send_displs.back() + send_counts.back()), me + 5);
  const std::size_t received = std::size_t(recv_displs.back() + recv_counts.back());
  host_view<float> got("got", received), expected("expected", received);
  calls = {};
  collective_calls = {};
  calls.counting = collective_calls.counting = true;
  kompress::alltoallv(host{}, send, send_counts, send_displs, got, recv_counts, recv_displs, MPI_COMM_WORLD, raw);
  calls.counting = collective_calls.counting = false;
  if (p == 2) CHECK(collective_calls.count + calls.data_messages == 0);
  // On more ranks alltoallv's data does not ride (blocks of any size in any order): the
  // agreement between pairs is headers alone.
  if (p > 2 && p <= pairwise_ranks) CHECK(calls.agreement_bytes == (p - 1) * 64);
  PMPI_Alltoallv(send.data(), send_counts.data(), send_displs.data(), MPI_FLOAT, expected.data(), recv_counts.data(),
                 recv_displs.data(), MPI_FLOAT, MPI_COMM_WORLD);
  CHECK(same_bytes(got, expected));
}

namespace {

/// A View filled with a value no call writes, to see that a rejected call wrote nothing.
host_view<float> untouched(std::size_t n) {
  host_view<float> v("untouched", n);
  Kokkos::deep_copy(v, -12345.0f);
  return v;
}
bool still_untouched(const host_view<float>& v) {
  for (std::size_t i = 0; i < v.size(); ++i)
    if (v(i) != -12345.0f) return false;
  return true;
}
/// The same, but for this rank's own block (`count` values at `at`), which a call on two ranks
/// copies from `own` while its messages travel: untouched or this rank's own values.
bool untouched_but_own_block(const host_view<float>& v, std::size_t at, std::size_t count, const float* own) {
  for (std::size_t i = 0; i < v.size(); ++i) {
    const bool in_own = i >= at && i < at + count;
    if (v(i) != -12345.0f && !(in_own && v(i) == own[i - at])) return false;
  }
  return true;
}

/// A correct raw allgather of `n` values: nothing of a rejected call is left to be matched.
void allgather_still_works(std::size_t n) {
  const int p = size_of();
  const auto send = make_data<float>(n, rank_of() + 9);
  host_view<float> got("got", n * p), expected("expected", n * p);
  kompress::allgather(host{}, send, got, MPI_COMM_WORLD, raw);
  PMPI_Allgather(send.data(), int(n), MPI_FLOAT, expected.data(), int(n), MPI_FLOAT, MPI_COMM_WORLD);
  CHECK(same_bytes(got, expected));
}

}  // namespace

TEST_CASE("a rejected call throws on every rank and moves nothing, whichever rank offered its data") {
  const int p = size_of(), me = rank_of();
  const bool last = me == p - 1;
  if (p == 1) return;  // nothing to disagree with
  // Sizes inside the agreement message and after it: on two ranks 1000 values inside, 2000 and
  // 20000 after; on three and four 1000 inside, 2000 after, 20000 not riding.
  for (const std::size_t n : {std::size_t(1000), std::size_t(2000), std::size_t(20000)}) {
    CAPTURE(n);
    {  // allgather: one rank passes more values (both offer, of different sizes)
      const std::size_t mine = last ? n + 1 : n;
      const auto send = make_data<float>(mine, me);
      auto got = untouched(mine * p);
      CHECK_THROWS_WITH_AS(kompress::allgather(host{}, send, got, MPI_COMM_WORLD, raw),
                           doctest::Contains("disagree on the element count"), kompress::invalid_argument);
      CHECK(untouched_but_own_block(got, mine * me, mine, send.data()));
      allgather_still_works(n);
    }
    {  // allgather: the last rank's arguments fail its own checks (it offers nothing); the others offer
      kompress::collective_options options = raw;
      if (last) options.codec.bound = kompress::absolute(-1.0);
      const auto send = make_data<float>(n, me);
      auto got = untouched(n * p);
      CHECK_THROWS_WITH_AS(kompress::allgather(host{}, send, got, MPI_COMM_WORLD, options),
                           doctest::Contains(last ? "error bound" : "rejected its arguments"),
                           kompress::invalid_argument);
      CHECK(untouched_but_own_block(got, n * me, n, send.data()));
      allgather_still_works(n);
    }
    {  // allreduce: the last rank compresses (offers nothing), the others send raw (offer)
      kompress::collective_options options = raw;
      if (last) options.mode = kompress::transfer_mode::compressed;
      const auto send = make_data<float>(n, me);
      auto got = untouched(n);
      CHECK_THROWS_WITH_AS(kompress::allreduce(host{}, send, got, MPI_COMM_WORLD, options),
                           doctest::Contains("disagree"), kompress::invalid_argument);
      CHECK(still_untouched(got));
      allgather_still_works(n);
    }
    {  // reduce_scatter: the last rank's arguments fail its own checks; the others offer
      kompress::collective_options options = raw;
      if (last) options.codec.bound = kompress::absolute(-1.0);
      const auto send = make_data<float>(n * p, me);
      auto got = untouched(n);
      if (last)
        CHECK_THROWS_WITH_AS(kompress::reduce_scatter(host{}, send, got, MPI_COMM_WORLD, options),
                             doctest::Contains("error bound"), kompress::invalid_argument);
      else
        CHECK_THROWS_WITH_AS(kompress::reduce_scatter(host{}, send, got, MPI_COMM_WORLD, options),
                             doctest::Contains("rejected its arguments"), kompress::invalid_argument);
      CHECK(still_untouched(got));
      allgather_still_works(n);
    }
    {  // alltoallv: the last rank expects one value more from rank 0 than rank 0 sends
      std::vector<int> counts(p, int(n)), displs(p), recv_counts(p, int(n));
      std::exclusive_scan(counts.begin(), counts.end(), displs.begin(), 0);
      if (last) recv_counts[0] += 1;
      std::vector<int> recv_displs(p);
      std::exclusive_scan(recv_counts.begin(), recv_counts.end(), recv_displs.begin(), 0);
      const auto send = make_data<float>(n * p, me);
      auto got = untouched(n * p + 1);
      CHECK_THROWS_WITH_AS(kompress::alltoallv(host{}, send, counts, displs, got, recv_counts, recv_displs,
                                               MPI_COMM_WORLD, raw),
                           doctest::Contains("do not match"), kompress::invalid_argument);
      CHECK(untouched_but_own_block(got, recv_displs[me], n, send.data() + displs[me]));
      allgather_still_works(n);
    }
  }
}
