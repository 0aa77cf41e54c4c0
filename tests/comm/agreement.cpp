// A bad call on one rank is an exception on every rank, before any data moves (the agreement,
// docs/collectives.md), with requests of earlier calls still in flight; no rank hangs, nothing is
// written into freed memory (this test runs in the sanitizer pass), and the next call on the same
// communicator is correct: bad arguments, options, counts, bounds, reduction methods, block
// sizes, cost models and transports that differ between ranks, in one-shot, nonblocking and
// persistent calls, and a rejected raw call whichever rank offered its data inside the agreement.
// The DLRM exchange's agreement is checked in tests/dlrm/agreement.cpp. Run under mpiexec -n 1, 2,
// 3 and 4.

#include <kompress/comm.hpp>

#include "comm/checks.hpp"
#include "support/device_views.hpp"
#include "support/mpi_checks.hpp"

#include <doctest/doctest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using namespace kompress::test;  // support/mpi_checks.hpp, support/device_views.hpp, comm/checks.hpp

bool last_rank() { return rank_of() == size_of() - 1; }

/// A correct alltoall after a failure: matches MPI_Alltoall within the bound.
void alltoall_still_works() {
  const int p = size_of();
  const std::size_t per_peer = 5000;
  auto send = sine_values(per_peer * p, rank_of());
  host_view<float> got("got", send.size()), expected("expected", send.size());
  kompress::alltoall(host{}, send, got, MPI_COMM_WORLD, abs_options);
  MPI_Alltoall(send.data(), int(per_peer), MPI_FLOAT, expected.data(), int(per_peer), MPI_FLOAT, MPI_COMM_WORLD);
  std::size_t violations = 0;
  for (std::size_t i = 0; i < send.size(); ++i) violations += !(std::fabs(got(i) - expected(i)) <= 1e-3);
  CHECK(violations == 0);
}

/// Counts of an alltoallv where rank i sends 1000 + i + j values to rank j.
struct offset_counts {
  std::vector<int> send_counts, send_displs, recv_counts, recv_displs;
  std::size_t send_total = 0, recv_total = 0;
  offset_counts() {
    const int p = size_of(), me = rank_of();
    for (int j = 0; j < p; ++j) {
      send_counts.push_back(1000 + me + j);
      recv_counts.push_back(1000 + j + me);
    }
    send_displs.resize(p);
    recv_displs.resize(p);
    std::exclusive_scan(send_counts.begin(), send_counts.end(), send_displs.begin(), 0);
    std::exclusive_scan(recv_counts.begin(), recv_counts.end(), recv_displs.begin(), 0);
    send_total = std::size_t(send_displs.back() + send_counts.back());
    recv_total = std::size_t(recv_displs.back() + recv_counts.back());
  }
};

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

// --- bad arguments --------------------------------------------------------------------------------

TEST_CASE("collectives reject bad arguments with a clear error") {
  const int p = size_of();
  auto data = make_data<float>(10 * p, rank_of());
  host_view<float> out("out", 10 * p);
  CHECK_THROWS_AS(kompress::alltoall(host{}, data, out, MPI_COMM_WORLD, {.codec = {.bound = kompress::absolute(-1.0)}}),
                  kompress::invalid_argument);
  host_view<float> short_out("short", 10 * p - 1);
  CHECK_THROWS_WITH_AS(kompress::alltoall(host{}, data, short_out, MPI_COMM_WORLD), doctest::Contains("receive View"),
                       kompress::invalid_argument);
  std::vector<int> counts(p, 10), displs(p, 0), too_far(p, 10 * p - 5);
  CHECK_THROWS_WITH_AS(kompress::alltoallv(host{}, data, counts, too_far, out, counts, displs, MPI_COMM_WORLD),
                       doctest::Contains("overflows"), kompress::invalid_argument);
  // Ranks passing different sizes: every rank gets the error, none hangs.
  host_view<float> uneven("uneven", 100 + rank_of());
  if (p > 1)
    CHECK_THROWS_WITH_AS(kompress::allreduce(host{}, uneven, uneven, MPI_COMM_WORLD),
                         doctest::Contains("disagree on the element count"), kompress::invalid_argument);
}

TEST_CASE("alltoallv: a receive count that disagrees with the sender is an error on every rank") {
  offset_counts c;
  auto send = sine_values(c.send_total, rank_of());
  host_view<float> got("got", c.recv_total);
  // Rank 0 expects 1 value less from itself than it sends itself.
  auto recv_counts = c.recv_counts;
  if (rank_of() == 0) recv_counts[0] -= 1;
  CHECK_THROWS_WITH_AS(kompress::alltoallv(host{}, send, c.send_counts, c.send_displs, got, recv_counts, c.recv_displs,
                                           MPI_COMM_WORLD, abs_options),
                       doctest::Contains("do not match"), kompress::invalid_argument);
  // A pair between two ranks: the last rank expects one value more from rank 0 than it sends.
  recv_counts = c.recv_counts;
  if (last_rank()) recv_counts[0] += 1;
  host_view<float> roomy("roomy", c.recv_total + 1);
  try {
    kompress::alltoallv(host{}, send, c.send_counts, c.send_displs, roomy, recv_counts, c.recv_displs, MPI_COMM_WORLD,
                        abs_options);
    CHECK(false);
  } catch (const kompress::invalid_argument& e) {
    const std::string what = e.what();
    CHECK(what.find("do not match") != std::string::npos);
    if (last_rank())
      CHECK(what.find("expects " + std::to_string(c.recv_counts[0] + 1) + " values from rank 0") != std::string::npos);
  }
  alltoall_still_works();
}

TEST_CASE("alltoall: a bad argument on one rank, with nothing in flight, is an error on every rank") {
  const int p = size_of();
  auto send = sine_values(100 * p, rank_of());
  host_view<float> got("got", 100 * p);
  kompress::collective_options options = abs_options;
  if (last_rank()) options.codec.bound = kompress::absolute(-1.0);
  if (last_rank())
    CHECK_THROWS_WITH_AS(kompress::alltoall(host{}, send, got, MPI_COMM_WORLD, options),
                         doctest::Contains("error bound"), kompress::invalid_argument);
  else
    CHECK_THROWS_WITH_AS(kompress::alltoall(host{}, send, got, MPI_COMM_WORLD, options),
                         doctest::Contains("rejected its arguments"), kompress::invalid_argument);
  // Ranks in different modes: compressed on some, raw on others.
  options = abs_options;
  if (last_rank()) options.mode = kompress::transfer_mode::raw;
  if (p > 1)
    CHECK_THROWS_WITH_AS(kompress::alltoall(host{}, send, got, MPI_COMM_WORLD, options),
                         doctest::Contains("disagree on the element type, transfer mode"), kompress::invalid_argument);
  // Raw mode below: different per-peer counts on one rank.
  options.mode = kompress::transfer_mode::raw;
  host_view<float> bigger_send = sine_values(std::size_t(101 * p), 3), bigger_got("bigger", std::size_t(101 * p));
  if (p > 1)
    CHECK_THROWS_AS(kompress::alltoall(host{}, last_rank() ? bigger_send : send, last_rank() ? bigger_got : got,
                                       MPI_COMM_WORLD, options),
                    kompress::invalid_argument);
  // Overlapping send and receive Views (MPI forbids aliasing) on one rank.
  host_view<float> both("both", 200 * p);
  auto first = Kokkos::subview(both, std::pair<std::size_t, std::size_t>(0, 100 * p));
  auto shifted = Kokkos::subview(both, std::pair<std::size_t, std::size_t>(50, 50 + 100 * p));
  if (last_rank())
    CHECK_THROWS_WITH_AS(kompress::alltoall(host{}, first, shifted, MPI_COMM_WORLD, abs_options),
                         doctest::Contains("overlap"), kompress::invalid_argument);
  else
    CHECK_THROWS_AS(kompress::alltoall(host{}, send, got, MPI_COMM_WORLD, abs_options), kompress::invalid_argument);
  alltoall_still_works();
}

TEST_CASE("alltoall: a bad call on one rank while peers have receives posted is an error on every rank") {
  const int p = size_of();
  const std::size_t per_peer = 20000;
  auto send = sine_values(per_peer * p, rank_of() + 5);
  host_view<float> got("got", send.size()), expected("expected", send.size());
  // Every rank has an exchange in flight: its receives are posted, peers' messages arrive.
  auto in_flight = kompress::ialltoall(host{}, send, got, MPI_COMM_WORLD, abs_options);
  // Then the last rank passes a View that does not split among the ranks.
  // (With one rank everything splits: its receive View is one element short too.)
  host_view<float> odd = sine_values(per_peer * p + 1, 1), odd_out("odd_out", per_peer * p);
  host_view<float> fine = sine_values(per_peer * p, 2), fine_out("fine_out", per_peer * p);
  if (last_rank())
    CHECK_THROWS_WITH_AS(kompress::alltoall(host{}, odd, odd_out, MPI_COMM_WORLD, abs_options),
                         doctest::Contains(p > 1 ? "split evenly" : "must match"), kompress::invalid_argument);
  else
    CHECK_THROWS_AS(kompress::alltoall(host{}, fine, fine_out, MPI_COMM_WORLD, abs_options),
                    kompress::invalid_argument);
  in_flight.wait();
  MPI_Alltoall(send.data(), int(per_peer), MPI_FLOAT, expected.data(), int(per_peer), MPI_FLOAT, MPI_COMM_WORLD);
  std::size_t violations = 0;
  for (std::size_t i = 0; i < send.size(); ++i) violations += !(std::fabs(got(i) - expected(i)) <= 1e-3);
  CHECK(violations == 0);
  alltoall_still_works();
}

TEST_CASE("allreduce: different bounds, counts or a bad argument on one rank are an error on every rank") {
  const std::size_t n = 30000;
  auto data = sine_values(n, rank_of());
  host_view<float> out("out", n), expected("expected", n);
  // One rank asks for a tighter bound than the others: rejected everywhere.
  kompress::collective_options options = abs_options;
  if (last_rank()) options.codec.bound = kompress::absolute(1e-6);
  if (size_of() > 1)
    CHECK_THROWS_WITH_AS(kompress::allreduce(host{}, data, out, MPI_COMM_WORLD, options), doctest::Contains("bound"),
                         kompress::invalid_argument);
  // Raw mode with different counts (plain MPI would abort).
  host_view<float> longer = sine_values(n + 1, 1), longer_out("longer_out", n + 1);
  options = abs_options;
  options.mode = kompress::transfer_mode::raw;
  if (size_of() > 1)
    CHECK_THROWS_WITH_AS(kompress::allreduce(host{}, last_rank() ? longer : data, last_rank() ? longer_out : out,
                                             MPI_COMM_WORLD, options),
                         doctest::Contains("element count"), kompress::invalid_argument);
  // A bad bound on one rank while an allreduce is in flight everywhere.
  auto in_flight = kompress::iallreduce(host{}, data, out, MPI_COMM_WORLD, abs_options);
  options = abs_options;
  if (last_rank()) options.codec.bound = kompress::absolute(NAN);
  host_view<float> other("other", n);
  CHECK_THROWS_AS(kompress::allreduce(host{}, data, other, MPI_COMM_WORLD, options), kompress::invalid_argument);
  // Overlap on one rank; and a fill value, which a sum cannot honour.
  auto shifted = Kokkos::subview(longer, std::pair<std::size_t, std::size_t>(1, n + 1));
  auto head = Kokkos::subview(longer, std::pair<std::size_t, std::size_t>(0, n));
  if (last_rank())
    CHECK_THROWS_WITH_AS(kompress::allreduce(host{}, head, shifted, MPI_COMM_WORLD, abs_options),
                         doctest::Contains("overlap"), kompress::invalid_argument);
  else
    CHECK_THROWS_AS(kompress::allreduce(host{}, data, other, MPI_COMM_WORLD, abs_options), kompress::invalid_argument);
  options = abs_options;
  options.codec.fill_value = -999.0;
  CHECK_THROWS_WITH_AS(kompress::allreduce(host{}, data, other, MPI_COMM_WORLD, options), doctest::Contains("fill"),
                       kompress::invalid_argument);
  in_flight.wait();
  MPI_Allreduce(data.data(), expected.data(), int(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  const double bound = size_of() * 1e-3;
  std::size_t violations = 0;
  for (std::size_t i = 0; i < n; ++i)
    violations += !(std::fabs(double(out(i)) - double(expected(i))) <=
                    bound + 2.0 * size_of() * 1.2e-7 * 5.0 * size_of());
  CHECK(violations == 0);
  alltoall_still_works();
}

TEST_CASE("allgather: a count that differs on one rank is an error on every rank, before data moves") {
  const int p = size_of();
  const bool last = rank_of() == p - 1;
  const kompress::collective_options options{.codec = {.bound = kompress::absolute(1e-3)}};
  if (p > 1) {  // consistent Views on each rank, but the last rank contributes 12 values, the others 10
    const std::size_t n = last ? 12 : 10;
    auto send = make_data<float>(n, rank_of());
    host_view<float> got("got", n * p);
    CHECK_THROWS_WITH_AS(kompress::allgather(host{}, send, got, MPI_COMM_WORLD, options),
                         doctest::Contains("ranks disagree on the element count"), kompress::invalid_argument);
  }
  // A receive View of the wrong size on the last rank: its own error there, every other rank told.
  auto send = make_data<float>(10, rank_of());
  host_view<float> got("got", last ? 10 * p - 1 : 10 * p);
  CHECK_THROWS_WITH_AS(kompress::allgather(host{}, send, got, MPI_COMM_WORLD, options),
                       doctest::Contains(last ? "the receive View has" : "rejected its arguments"),
                       kompress::invalid_argument);
  // Nothing left in flight: the next call works.
  host_view<float> fine("fine", 10 * p);
  CHECK_NOTHROW(kompress::allgather(host{}, send, fine, MPI_COMM_WORLD, options));
}

TEST_CASE("reduce_scatter: a bound that differs on one rank is an error on every rank, before data moves") {
  const int p = size_of();
  const bool last = rank_of() == p - 1;
  auto send = make_data<double>(10 * p, rank_of());
  host_view<double> got("got", 10);
  if (p > 1) {
    const kompress::collective_options options{.codec = {.bound = kompress::absolute(last ? 1e-2 : 1e-3)}};
    CHECK_THROWS_WITH_AS(kompress::reduce_scatter(host{}, send, got, MPI_COMM_WORLD, options),
                         doctest::Contains("ranks disagree on"), kompress::invalid_argument);
    auto r = [&] { return kompress::ireduce_scatter(host{}, send, got, MPI_COMM_WORLD, options); };
    CHECK_THROWS_AS(r(), kompress::invalid_argument);
  }
  // Overlapping send and receive Views on the last rank.
  const kompress::collective_options options{.codec = {.bound = kompress::absolute(1e-3)}};
  auto overlapping = Kokkos::subview(send, std::make_pair(std::size_t(0), std::size_t(10)));
  if (last)
    CHECK_THROWS_WITH_AS(kompress::reduce_scatter(host{}, send, overlapping, MPI_COMM_WORLD, options),
                         doctest::Contains("overlap"), kompress::invalid_argument);
  else
    CHECK_THROWS_WITH_AS(kompress::reduce_scatter(host{}, send, got, MPI_COMM_WORLD, options),
                         doctest::Contains("rejected its arguments"), kompress::invalid_argument);
  CHECK_NOTHROW(kompress::reduce_scatter(host{}, send, got, MPI_COMM_WORLD, options));
}

// --- options that differ between ranks ------------------------------------------------------------

TEST_CASE("homomorphic: a reduction method that differs on one rank is an error on every rank, before data moves") {
  const int p = size_of();
  const bool last = rank_of() == p - 1;
  auto send = make_data<float>(1000 * p, rank_of());
  host_view<float> sum("sum", 1000 * p), scattered("scattered", 1000);
  kompress::collective_options options{.codec = {.bound = kompress::absolute(1e-3)}};
  if (last) options.reduction = kompress::reduction_method::homomorphic;
  if (p > 1) {
    CHECK_THROWS_WITH_AS(kompress::allreduce(host{}, send, sum, MPI_COMM_WORLD, options),
                         doctest::Contains("ranks disagree on"), kompress::invalid_argument);
    CHECK_THROWS_WITH_AS(kompress::reduce_scatter(host{}, send, scattered, MPI_COMM_WORLD, options),
                         doctest::Contains("reduction method"), kompress::invalid_argument);
    auto r = [&] { return kompress::iallreduce(host{}, send, sum, MPI_COMM_WORLD, options); };
    CHECK_THROWS_AS(r(), kompress::invalid_argument);
  }
  // Nothing left in flight: the next call works.
  options.reduction = kompress::reduction_method::homomorphic;
  CHECK_NOTHROW(kompress::allreduce(host{}, send, sum, MPI_COMM_WORLD, options));
}

TEST_CASE("homomorphic reductions: ranks passing different block sizes are an error on every rank, up front") {
  const int p = size_of();
  const std::size_t n = 40000;  // per rank and per block of reduce_scatter: many code blocks per hop
  auto send = sine_values(n * std::size_t(p), rank_of());
  host_view<float> sum("sum", send.size()), scattered("scattered", n);
  kompress::collective_options options = abs_options;
  options.reduction = kompress::reduction_method::homomorphic;
  kompress::collective_options mismatched = options;
  if (last_rank()) mismatched.codec.block_size = 64;
  if (p > 1) {
    // Every rank, the one case per form: invalid_argument naming the block size, no data moved.
    const auto rejected = [](auto&& call) {
      CHECK_THROWS_WITH_AS(call(), doctest::Contains("block size"), kompress::invalid_argument);
    };
    rejected([&] { kompress::allreduce(host{}, send, sum, MPI_COMM_WORLD, mismatched); });
    rejected([&] { kompress::reduce_scatter(host{}, send, scattered, MPI_COMM_WORLD, mismatched); });
    rejected([&] { kompress::iallreduce(host{}, send, sum, MPI_COMM_WORLD, mismatched).wait(); });
    rejected([&] { kompress::ireduce_scatter(host{}, send, scattered, MPI_COMM_WORLD, mismatched).wait(); });
    rejected([&] { kompress::allreduce_init(host{}, send, sum, MPI_COMM_WORLD, mismatched); });
    rejected([&] { kompress::reduce_scatter_init(host{}, send, scattered, MPI_COMM_WORLD, mismatched); });
  }
  // The recompressing reduction sends streams, which carry their block size: it may differ.
  kompress::collective_options recompress = mismatched;
  recompress.reduction = kompress::reduction_method::recompress;
  host_view<float> expected("expected", send.size());
  MPI_Allreduce(send.data(), expected.data(), int(send.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  const auto off_by = [&](double bound) {
    std::size_t violations = 0;
    for (std::size_t i = 0; i < send.size(); ++i)
      violations += !(std::fabs(double(sum(i)) - double(expected(i))) <= bound + 2.0 * p * 1.2e-7 * 5.0 * p);
    return violations;
  };
  CHECK_NOTHROW(kompress::allreduce(host{}, send, sum, MPI_COMM_WORLD, recompress));
  CHECK(off_by(p * 1e-3) == 0);
  // Nothing was left in flight: the homomorphic call with matching block sizes is correct.
  CHECK_NOTHROW(kompress::allreduce(host{}, send, sum, MPI_COMM_WORLD, options));
  CHECK(off_by(p * 1e-3) == 0);
  alltoall_still_works();
}

TEST_CASE("compressed mode: ranks that disagree on the cost model (the chunking) are an error on every rank") {
  const int p = size_of(), me = rank_of();
  if (p < 2) return;
  const std::size_t n = 4096;
  auto send = make_data<float>(n * std::size_t(p), me + 1);
  host_view<float> got("got", send.size());
  auto options = chunked(1000);
  if (me == p - 1) options.cost.fixed_chunk_bytes = 2000;
  CHECK_THROWS_AS(kompress::alltoall(host{}, send, got, MPI_COMM_WORLD, options), kompress::invalid_argument);
  CHECK_THROWS_AS(kompress::allreduce(host{}, send, got, MPI_COMM_WORLD, options), kompress::invalid_argument);
  // The communicator is usable afterwards.
  options.cost.fixed_chunk_bytes = 1000;
  check_pipelined_alltoall<float>(n, options, false);
}

TEST_CASE("alltoall: ranks that differ on staging fail on every rank before any data moves") {
  const int p = size_of(), me = rank_of();
  if (p < 2) return;
  device_view<double> send("send", 64 * std::size_t(p)), got("got", send.size());
  kompress::collective_options options{.codec = {.bound = kompress::absolute(1e-3)}};
  options.transport = me == p - 1 ? kompress::transport_mode::staged : kompress::transport_mode::direct;
  if constexpr (!kompress::detail::host_memory_space<exec_space::memory_space>)
    options.transport = me == p - 1 ? kompress::transport_mode::staged : kompress::transport_mode::automatic;
  const bool differs = kompress::detail::transport_for<exec_space, exec_space::memory_space>(options.transport).staged;
  int staged_ranks = differs ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &staged_ranks, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (staged_ranks == p) return;  // every rank stages anyway (a device without a device-aware MPI)
  CHECK_THROWS_AS(kompress::alltoall(exec_space{}, send, got, MPI_COMM_WORLD, options), kompress::invalid_argument);
}

// --- persistent requests --------------------------------------------------------------------------

TEST_CASE("persistent requests: bad arguments at init are an error on every rank, no data moved") {
  const int p = size_of(), me = rank_of();
  const bool last = me == p - 1;
  host_view<float> send("send", 64 * p), got("got", 64 * p), shorter("shorter", 64 * p - 1);
  const kompress::collective_options options{.codec = {.bound = kompress::absolute(1e-3)}};
  kompress::collective_options bad = options;
  if (last) bad.codec.bound = kompress::absolute(-1.0);
  CHECK_THROWS_WITH_AS(kompress::alltoall_init(host{}, send, got, MPI_COMM_WORLD, bad),
                       doctest::Contains(last ? "error bound" : "rejected its arguments"), kompress::invalid_argument);
  CHECK_THROWS_WITH_AS(kompress::allreduce_init(host{}, send, last ? shorter : got, MPI_COMM_WORLD, options),
                       doctest::Contains(last ? "they must match" : "rejected its arguments"),
                       kompress::invalid_argument);
  CHECK_THROWS_AS(kompress::allgather_init(host{}, send, last ? shorter : got, MPI_COMM_WORLD, options),
                  kompress::invalid_argument);
  CHECK_THROWS_AS(kompress::reduce_scatter_init(host{}, send, send, MPI_COMM_WORLD, options),
                  kompress::invalid_argument);  // overlap, on every rank
  if (p > 1) {
    // Ranks that disagree on the mode, or one rank calling the one-shot form.
    kompress::collective_options other = options;
    if (last) other.mode = kompress::transfer_mode::raw;
    CHECK_THROWS_WITH_AS(kompress::allreduce_init(host{}, send, got, MPI_COMM_WORLD, other),
                         doctest::Contains("disagree"), kompress::invalid_argument);
    if (last)
      CHECK_THROWS_WITH_AS(kompress::iallreduce(host{}, send, got, MPI_COMM_WORLD, options),
                           doctest::Contains("disagree"), kompress::invalid_argument);
    else
      CHECK_THROWS_WITH_AS(kompress::allreduce_init(host{}, send, got, MPI_COMM_WORLD, options),
                           doctest::Contains("disagree"), kompress::invalid_argument);
    // alltoallv counts that disagree between two ranks.
    std::vector<int> counts(p, 64), displs(p), recv_counts(p, 64);
    for (int peer = 0; peer < p; ++peer) displs[peer] = 64 * peer;
    if (last) recv_counts[0] = 63;
    CHECK_THROWS_WITH_AS(
        kompress::alltoallv_init(host{}, send, counts, displs, got, recv_counts, displs, MPI_COMM_WORLD, options),
        doctest::Contains("do not match"), kompress::invalid_argument);
  }
  // The communicator still works, and so does a persistent request built after the errors.
  auto request = kompress::alltoall_init(host{}, send, got, MPI_COMM_WORLD, options);
  refill(send, me, 0);
  request.start();
  const auto report = request.wait();
  host_view<float> expected("expected", 64 * p);
  MPI_Alltoall(send.data(), 64, MPI_FLOAT, expected.data(), 64, MPI_FLOAT, MPI_COMM_WORLD);
  std::size_t violations = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    violations += !(std::fabs(got(i) - expected(i)) <= report.absolute_bound);
  CHECK(violations == 0);
}

// --- raw calls carried inside the agreement -------------------------------------------------------

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

// --- a receive posted before an exception ---------------------------------------------------------

TEST_CASE("posted messages: an exception cancels the receives before their buffer goes") {
  if (size_of() < 2) return;
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  const int me = rank_of();
  std::vector<float> late(4096, 1.0f);
  if (me == 0) {
    try {
      auto buffer = std::make_unique<float[]>(4096);
      kompress::detail::posted_messages posted;
      posted.receive(buffer.get(), 4096 * sizeof(float), 1, comm, "test");
      throw std::runtime_error("fails after posting");
      // posted (declared after buffer) cancels the receive before buffer is freed
    } catch (const std::runtime_error&) {
    }
  }
  MPI_Barrier(comm);
  // Rank 1's message arrives after rank 0's buffer is gone: it must not land there.
  if (me == 1) MPI_Send(late.data(), 4096, MPI_FLOAT, 0, kompress::detail::collective_tag, comm);
  if (me == 0) {
    std::vector<float> drained(4096, 0.0f);
    MPI_Recv(drained.data(), 4096, MPI_FLOAT, 1, kompress::detail::collective_tag, comm, MPI_STATUS_IGNORE);
    CHECK(drained[4095] == 1.0f);
  }
  MPI_Comm_free(&comm);
}
