// The persistent collectives (alltoall_init, alltoallv_init, allreduce_init, allgather_init,
// reduce_scatter_init) against plain MPI, element by element, within the documented bound,
// over several rounds whose send values change between rounds (each round must read them
// again); bad arguments at init an invalid_argument on every rank; start/wait misuse rejected.
// Run under mpiexec -n 1, 2, 3 and 4.

#include <kompress/comm.hpp>

#include "support/mpi_checks.hpp"

#include <doctest/doctest.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace {

using namespace kompress::test;  // support/mpi_checks.hpp

constexpr int rounds = 3;

/// A sender's absolute bound: ABS as given, REL over `values`.
template <class T>
double bound_over(const host_view<T>& values, const kompress::error_bound& bound) {
  if (bound.mode == kompress::bound_mode::absolute) return bound.value;
  double lo = INFINITY, hi = -INFINITY;
  for (std::size_t i = 0; i < values.size(); ++i) {
    lo = std::min(lo, double(values(i)));
    hi = std::max(hi, double(values(i)));
  }
  return lo <= hi ? bound.value * (hi - lo) : 0.0;
}
double max_over_ranks(double value) {
  MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return value;
}
/// The REL bound of the ring collectives: against all ranks' values together.
template <class T>
double global_bound(const host_view<T>& values, const kompress::error_bound& bound) {
  if (bound.mode == kompress::bound_mode::absolute) return bound.value;
  double lo = INFINITY, hi = -INFINITY;
  for (std::size_t i = 0; i < values.size(); ++i) {
    lo = std::min(lo, double(values(i)));
    hi = std::max(hi, double(values(i)));
  }
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return lo <= hi ? bound.value * (hi - lo) : 0.0;
}

/// New values in the same View for each round (the point of a persistent request).
template <class T>
void refill(const host_view<T>& view, int seed, int round) {
  const auto fresh = make_data<T>(view.size(), seed + 1000 * round, 10.0 + 5.0 * round);
  Kokkos::deep_copy(view, fresh);
}

/// One round of `request`, completed three different ways over the rounds.
const kompress::collective_report& run_round(kompress::persistent_request& request, int round) {
  switch (round % 3) {
    case 0:
      request.start();
      CHECK(request.active());
      return request.wait();
    case 1:
      request.start();
      while (!request.test()) {
      }
      CHECK(!request.active());
      return request.report();
    default: return request.run();
  }
}

/// What the options mean for the transfer: raw (exact, MPI's own) or compressed.
bool may_compress(const kompress::collective_options& options) {
  return options.mode != kompress::transfer_mode::raw;
}

const kompress::collective_options option_sets[] = {
    {.codec = {.bound = kompress::relative(1e-3)}},
    {.codec = {.bound = kompress::absolute(1e-3)}},
    {.codec = {.bound = kompress::absolute(1e-3)}, .mode = kompress::transfer_mode::raw},
    // automatic at the default model: raw at these sizes
    {.codec = {.bound = kompress::absolute(1e-3)}, .mode = kompress::transfer_mode::automatic},
    // automatic over a slow link: compressed
    {.codec = {.bound = kompress::relative(1e-3)},
     .mode = kompress::transfer_mode::automatic,
     .cost = {.link_bytes_per_second = 1e5, .min_message_bytes = 0}},
};

const std::size_t sizes[] = {0, 1, 33, 5000};

template <class T>
void check_alltoall(std::size_t per_peer, const kompress::collective_options& options) {
  const int p = size_of(), me = rank_of();
  host_view<T> send("send", per_peer * p), got("got", per_peer * p), expected("expected", per_peer * p);
  auto request = kompress::alltoall_init(host{}, send, got, MPI_COMM_WORLD, options);
  for (int round = 0; round < rounds; ++round) {
    refill(send, me + 1, round);
    MPI_Alltoall(send.data(), int(per_peer), mpi_type<T>(), expected.data(), int(per_peer), mpi_type<T>(),
                 MPI_COMM_WORLD);
    const auto report = run_round(request, round);
    const double e = may_compress(options) ? max_over_ranks(bound_over(send, options.codec.bound)) : 0.0;
    CHECK(report.absolute_bound <= e * (1 + 1e-12));
    std::size_t violations = 0;
    for (std::size_t i = 0; i < got.size(); ++i)
      violations += !(std::fabs(double(got(i)) - double(expected(i))) <= report.absolute_bound);
    CHECK(violations == 0);
    if (!may_compress(options)) CHECK(report.compressed_messages == 0);
  }
}

template <class T>
void check_alltoallv(std::size_t scale, const kompress::collective_options& options) {
  const int p = size_of(), me = rank_of();
  // Rank r sends (r + peer) % 3 * scale values to each peer (zero counts included).
  std::vector<int> sc(p), sd(p), rc(p), rd(p);
  int send_total = 0, recv_total = 0;
  for (int peer = 0; peer < p; ++peer) {
    sc[peer] = int((me + peer) % 3 * scale);
    rc[peer] = int((peer + me) % 3 * scale);
    sd[peer] = send_total;
    rd[peer] = recv_total;
    send_total += sc[peer];
    recv_total += rc[peer];
  }
  host_view<T> send("send", std::size_t(send_total)), got("got", std::size_t(recv_total)),
      expected("expected", std::size_t(recv_total));
  auto request = kompress::alltoallv_init(host{}, send, sc, sd, got, rc, rd, MPI_COMM_WORLD, options);
  for (int round = 0; round < rounds; ++round) {
    refill(send, me + 3, round);
    MPI_Alltoallv(send.data(), sc.data(), sd.data(), mpi_type<T>(), expected.data(), rc.data(), rd.data(),
                  mpi_type<T>(), MPI_COMM_WORLD);
    const auto report = run_round(request, round);
    const double e = may_compress(options) ? max_over_ranks(bound_over(send, options.codec.bound)) : 0.0;
    CHECK(report.absolute_bound <= e * (1 + 1e-12));
    std::size_t violations = 0;
    for (std::size_t i = 0; i < got.size(); ++i)
      violations += !(std::fabs(double(got(i)) - double(expected(i))) <= report.absolute_bound);
    CHECK(violations == 0);
  }
}

template <class T>
void check_allreduce(std::size_t n, const kompress::collective_options& options, bool in_place) {
  const int p = size_of(), me = rank_of();
  host_view<T> send("send", n), got("got", n), expected("expected", n), magnitude("magnitude", n), abs_send("abs", n);
  const host_view<T> out = in_place ? send : got;
  auto request = kompress::allreduce_init(host{}, send, out, MPI_COMM_WORLD, options);
  constexpr double eps = std::numeric_limits<T>::epsilon();
  for (int round = 0; round < rounds; ++round) {
    refill(send, me + 5, round);
    MPI_Allreduce(send.data(), expected.data(), int(n), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
    for (std::size_t i = 0; i < n; ++i) abs_send(i) = std::fabs(send(i));
    MPI_Allreduce(abs_send.data(), magnitude.data(), int(n), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
    const double e = global_bound(send, options.codec.bound);
    const auto report = run_round(request, round);
    CHECK(report.absolute_bound <= (may_compress(options) ? p * e * (1 + 1e-12) : 0.0));
    std::size_t violations = 0;
    for (std::size_t i = 0; i < n; ++i) {
      // Plus the summation error of two summation orders (MPI's persistent and blocking
      // algorithms may differ too).
      const double tolerance = report.absolute_bound + 2.0 * p * eps * double(magnitude(i));
      violations += !(std::fabs(double(out(i)) - double(expected(i))) <= tolerance);
    }
    CHECK(violations == 0);
    CHECK(identical_on_every_rank(out));
  }
}

template <class T>
void check_allgather(std::size_t n, const kompress::collective_options& options) {
  const int p = size_of(), me = rank_of();
  host_view<T> send("send", n), got("got", n * p), expected("expected", n * p);
  auto request = kompress::allgather_init(host{}, send, got, MPI_COMM_WORLD, options);
  for (int round = 0; round < rounds; ++round) {
    refill(send, me + 7, round);
    MPI_Allgather(send.data(), int(n), mpi_type<T>(), expected.data(), int(n), mpi_type<T>(), MPI_COMM_WORLD);
    const double e = global_bound(send, options.codec.bound);
    const auto report = run_round(request, round);
    CHECK(report.absolute_bound <= (may_compress(options) ? e * (1 + 1e-12) : 0.0));
    std::size_t violations = 0;
    for (std::size_t i = 0; i < got.size(); ++i)
      violations += !(std::fabs(double(got(i)) - double(expected(i))) <= report.absolute_bound);
    CHECK(violations == 0);
    CHECK(identical_on_every_rank(got));
  }
}

template <class T>
void check_reduce_scatter(std::size_t n, const kompress::collective_options& options) {
  const int p = size_of(), me = rank_of();
  host_view<T> send("send", n * p), got("got", n), expected("expected", n), magnitude("magnitude", n),
      abs_send("abs", n * p);
  auto request = kompress::reduce_scatter_init(host{}, send, got, MPI_COMM_WORLD, options);
  constexpr double eps = std::numeric_limits<T>::epsilon();
  for (int round = 0; round < rounds; ++round) {
    refill(send, me + 9, round);
    MPI_Reduce_scatter_block(send.data(), expected.data(), int(n), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
    for (std::size_t i = 0; i < n * p; ++i) abs_send(i) = std::fabs(send(i));
    MPI_Reduce_scatter_block(abs_send.data(), magnitude.data(), int(n), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
    const double e = global_bound(send, options.codec.bound);
    const auto report = run_round(request, round);
    CHECK(report.absolute_bound <= (may_compress(options) ? (p - 1) * e * (1 + 1e-12) : 0.0));
    std::size_t violations = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const double tolerance = report.absolute_bound + 2.0 * p * eps * double(magnitude(i));
      violations += !(std::fabs(double(got(i)) - double(expected(i))) <= tolerance);
    }
    CHECK(violations == 0);
  }
}

}  // namespace

TEST_CASE_TEMPLATE("alltoall_init and alltoallv_init match MPI round after round, within the bound", T, float,
                   double) {
  for (const auto& options : option_sets)
    for (const std::size_t n : sizes) {
      CAPTURE(n);
      CAPTURE(int(options.mode));
      check_alltoall<T>(n, options);
      check_alltoallv<T>(n, options);
    }
}

TEST_CASE_TEMPLATE("allreduce_init matches MPI_Allreduce round after round, bit-identical on every rank", T, float,
                   double) {
  for (const auto& options : option_sets)
    for (const std::size_t n : sizes) {
      CAPTURE(n);
      CAPTURE(int(options.mode));
      check_allreduce<T>(n, options, false);
      check_allreduce<T>(n, options, true);
    }
  kompress::collective_options homomorphic{.codec = {.bound = kompress::absolute(1e-3)},
                                           .reduction = kompress::reduction_method::homomorphic};
  check_allreduce<T>(5000, homomorphic, false);
}

TEST_CASE_TEMPLATE("allgather_init and reduce_scatter_init match MPI round after round", T, float, double) {
  for (const auto& options : option_sets)
    for (const std::size_t n : sizes) {
      CAPTURE(n);
      CAPTURE(int(options.mode));
      check_allgather<T>(n, options);
      check_reduce_scatter<T>(n, options);
    }
}

TEST_CASE("persistent requests: several in flight, completed in any order") {
  const int p = size_of(), me = rank_of();
  const std::size_t n = 4000;
  const kompress::collective_options options{.codec = {.bound = kompress::absolute(1e-3)}};
  host_view<double> a("a", n), a_sum("a_sum", n), b("b", n * p), b_all("b_all", n * p * p);
  auto sum = kompress::allreduce_init(host{}, a, a_sum, MPI_COMM_WORLD, options);
  auto gather = kompress::allgather_init(host{}, b, b_all, MPI_COMM_WORLD, options);
  host_view<double> expected_sum("es", n), expected_all("ea", n * p * p);
  for (int round = 0; round < rounds; ++round) {
    refill(a, me, round);
    refill(b, me + 50, round);
    MPI_Allreduce(a.data(), expected_sum.data(), int(n), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allgather(b.data(), int(n * p), MPI_DOUBLE, expected_all.data(), int(n * p), MPI_DOUBLE, MPI_COMM_WORLD);
    sum.start();
    gather.start();
    const auto gathered = gather.wait();  // the other order
    const auto summed = sum.wait();
    std::size_t violations = 0;
    for (std::size_t i = 0; i < n; ++i)
      violations += !(std::fabs(a_sum(i) - expected_sum(i)) <= summed.absolute_bound + 1e-9);
    for (std::size_t i = 0; i < n * p * p; ++i)
      violations += !(std::fabs(b_all(i) - expected_all(i)) <= gathered.absolute_bound);
    CHECK(violations == 0);
  }
}

TEST_CASE("persistent requests: start on an active request, wait or test before any start, empty requests") {
  const int p = size_of();
  host_view<float> send("send", 100 * p), got("got", 100 * p);
  for (const auto mode : {kompress::transfer_mode::raw, kompress::transfer_mode::compressed}) {
    const kompress::collective_options options{.codec = {.bound = kompress::absolute(1e-3)}, .mode = mode};
    auto request = kompress::alltoall_init(host{}, send, got, MPI_COMM_WORLD, options);
    CHECK(request.valid());
    CHECK(!request.active());
    CHECK_THROWS_WITH_AS(request.wait(), doctest::Contains("never started"), kompress::invalid_argument);
    CHECK_THROWS_WITH_AS(request.test(), doctest::Contains("never started"), kompress::invalid_argument);
    request.start();
    CHECK_THROWS_WITH_AS(request.start(), doctest::Contains("active"), kompress::invalid_argument);
    CHECK_THROWS_WITH_AS(request.run(), doctest::Contains("active"), kompress::invalid_argument);
    request.wait();
    CHECK(!request.active());
    request.wait();  // completed: returns at once
    CHECK(request.test());

    // Moved from: empty. Moving an active request moves its round.
    request.start();
    kompress::persistent_request moved = std::move(request);
    CHECK(!request.valid());
    CHECK(moved.active());
    CHECK_THROWS_WITH_AS(request.start(), doctest::Contains("empty request"), kompress::invalid_argument);
    CHECK_THROWS_WITH_AS(request.wait(), doctest::Contains("empty request"), kompress::invalid_argument);
    moved.wait();

    // Destroyed while active: the destructor completes the round first; the next call works.
    {
      auto doomed = kompress::allreduce_init(host{}, send, got, MPI_COMM_WORLD, options);
      doomed.start();
    }
    const auto again = kompress::allreduce(host{}, send, got, MPI_COMM_WORLD, options);
    CHECK(again.absolute_bound >= 0.0);
  }
  kompress::persistent_request empty;
  CHECK(!empty.valid());
  CHECK_THROWS_AS(empty.report(), kompress::invalid_argument);
}

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
