// The compressed collectives against plain MPI, element by element, within the documented
// bound; run under mpiexec -n 1, 2, 3 and 4.

#include "data_sample.hpp"

#include <kompress/comm.hpp>

#include "support/mpi_checks.hpp"

#include <doctest/doctest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

namespace {

using namespace kompress::test;  // support/mpi_checks.hpp

/// The absolute bound a sender applies: ABS as given, REL over its whole send View.
template <class T>
double sender_bound(const host_view<T>& send, const kompress::error_bound& bound) {
  if (bound.mode == kompress::bound_mode::absolute) return bound.value;
  double lo = INFINITY, hi = -INFINITY;
  for (std::size_t i = 0; i < send.size(); ++i)
    if (std::isfinite(send(i))) {
      lo = std::min(lo, double(send(i)));
      hi = std::max(hi, double(send(i)));
    }
  return lo <= hi ? bound.value * (hi - lo) : 0.0;
}

/// Every rank's sender bound, indexed by rank.
std::vector<double> all_bounds(double mine) {
  std::vector<double> bounds(size_of());
  MPI_Allgather(&mine, 1, MPI_DOUBLE, bounds.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD);
  return bounds;
}

template <class T>
void check_alltoall(std::size_t per_peer, const kompress::collective_options& options) {
  const int p = size_of(), me = rank_of();
  auto send = make_data<T>(per_peer * p, me + 1);
  host_view<T> expected("expected", send.size()), got("got", send.size());
  const int bytes = int(per_peer * sizeof(T));
  MPI_Alltoall(send.data(), bytes, MPI_BYTE, expected.data(), bytes, MPI_BYTE, MPI_COMM_WORLD);
  const auto report = kompress::alltoall(host{}, send, got, MPI_COMM_WORLD, options);
  const auto bounds = all_bounds(sender_bound(send, options.codec.bound));
  std::size_t violations = 0;
  for (int source = 0; source < p; ++source)
    for (std::size_t i = 0; i < per_peer; ++i) {
      const std::size_t k = std::size_t(source) * per_peer + i;
      const double e = source == me ? 0.0 : bounds[source];
      violations += !(std::fabs(double(got(k)) - double(expected(k))) <= e);
    }
  CHECK(violations == 0);
  CHECK(report.messages == std::uint64_t(per_peer ? p - 1 : 0));
  if (options.mode == kompress::transfer_mode::compressed && options.codec.bound.value > 0 && per_peer >= 4096 && p > 1)
    CHECK(report.ratio() > 1.5);
}

}  // namespace

TEST_CASE_TEMPLATE("alltoall matches MPI_Alltoall within the bound", T, float, double) {
  for (const std::size_t per_peer : {std::size_t(0), std::size_t(1), std::size_t(31), std::size_t(1000),
                                     std::size_t(33 * 64 + 5), std::size_t(70001)}) {
    for (const auto bound : {kompress::absolute(1e-3), kompress::relative(1e-2), kompress::lossless()}) {
      CAPTURE(per_peer);
      check_alltoall<T>(per_peer, {.codec = {.bound = bound}});
    }
  }
  check_alltoall<T>(20000, {.codec = {.bound = kompress::absolute(1e-3)}, .mode = kompress::transfer_mode::raw});
  check_alltoall<T>(200000, {.codec = {.bound = kompress::absolute(1e-3)}, .mode = kompress::transfer_mode::automatic});
  check_alltoall<T>(100, {.codec = {.bound = kompress::absolute(1e-3)}, .mode = kompress::transfer_mode::automatic});
}

TEST_CASE_TEMPLATE("alltoall: a REL bound resolves over the blocks to other ranks, not the block to itself", T, float,
                   double) {
  // The block to itself spans a range 1000x wider than the rest: it is copied exactly, so it
  // must not widen the bound of the blocks that are compressed.
  const int p = size_of(), me = rank_of();
  const std::size_t per_peer = 5000;
  auto send = make_data<T>(per_peer * std::size_t(p), me + 1, 1.0);
  for (std::size_t i = 0; i < per_peer; ++i) send(std::size_t(me) * per_peer + i) *= T(1000);
  host_view<T> expected("expected", send.size()), got("got", send.size());
  const int bytes = int(per_peer * sizeof(T));
  MPI_Alltoall(send.data(), bytes, MPI_BYTE, expected.data(), bytes, MPI_BYTE, MPI_COMM_WORLD);
  for (const auto mode : {kompress::transfer_mode::compressed, kompress::transfer_mode::automatic}) {
    kompress::collective_options options{.codec = {.bound = kompress::relative(1e-2)}, .mode = mode};
    options.cost.link_bytes_per_second = 1e6;  // automatic mode compresses these 20-40 KB blocks
    options.cost.min_message_bytes = 1;
    double lo = INFINITY, hi = -INFINITY;  // over the values this rank sends to others
    for (std::size_t k = 0; k < send.size(); ++k)
      if (k / per_peer != std::size_t(me)) {
        lo = std::min(lo, double(send(k)));
        hi = std::max(hi, double(send(k)));
      }
    const auto bounds = all_bounds(lo <= hi ? 1e-2 * (hi - lo) : 0.0);
    const auto report = kompress::alltoall(host{}, send, got, MPI_COMM_WORLD, options);
    double promised = 0.0;
    std::size_t violations = 0;
    for (std::size_t k = 0; k < send.size(); ++k) {
      const int source = int(k / per_peer);
      const double e = source == me ? 0.0 : bounds[std::size_t(source)];
      if (source != me) promised = std::max(promised, e);
      violations += !(std::fabs(double(got(k)) - double(expected(k))) <= e);
    }
    CAPTURE(int(mode));
    CHECK(violations == 0);
    // Resolved over the block to itself too, the bound would be about 1000x this.
    CHECK(report.absolute_bound <= promised * (1 + 1e-12));
    if (p > 1) CHECK(report.compressed_messages == std::uint64_t(p - 1));
  }
}

TEST_CASE("alltoall of real embedding rows and activations") {
  const int p = size_of(), me = rank_of();
  for (const char* stem : {"dlrm_flights_lookup_fwd", "act_mlp_relu2_out"}) {
    const std::string file = kompress::test::find_array(stem).name;
    const auto all = kompress::test::read_raw<float>(file);
    const std::size_t per_rank = all.size() / std::size_t(p) / std::size_t(p) * std::size_t(p);
    host_view<float> send("send", per_rank), got("got", per_rank), expected("expected", per_rank);
    std::memcpy(send.data(), all.data() + std::size_t(me) * per_rank, per_rank * sizeof(float));
    const auto options = kompress::collective_options{.codec = {.bound = kompress::relative(1e-2)}, .measure_error = true};
    const auto report = kompress::alltoall(host{}, send, got, MPI_COMM_WORLD, options);
    const int bytes = int(per_rank / p * sizeof(float));
    MPI_Alltoall(send.data(), bytes, MPI_BYTE, expected.data(), bytes, MPI_BYTE, MPI_COMM_WORLD);
    const auto bounds = all_bounds(sender_bound(send, options.codec.bound));
    const std::size_t per_peer = per_rank / p;
    std::size_t violations = 0;
    for (std::size_t k = 0; k < per_rank; ++k)
      violations += !(std::fabs(double(got(k)) - double(expected(k))) <= bounds[k / per_peer]);
    CAPTURE(file);
    CHECK(violations == 0);
    CHECK(report.max_error <= bounds[me]);
    if (p > 1) CHECK(report.ratio() > 3.0);
  }
}

TEST_CASE_TEMPLATE("alltoallv with zero and uneven counts", T, float, double) {
  const uneven_layout layout;  // some counts are zero
  const std::size_t total_recv = layout.recv_total();
  auto send = make_data<T>(layout.send_total(), rank_of() + 7);
  host_view<T> got("got", total_recv + 3), expected("expected", total_recv + 3);
  for (const auto mode : {kompress::transfer_mode::compressed, kompress::transfer_mode::raw, kompress::transfer_mode::automatic}) {
    const auto options = kompress::collective_options{.codec = {.bound = kompress::absolute(1e-4)}, .mode = mode};
    kompress::alltoallv(host{}, send, layout.send_counts, layout.send_displs, got, layout.recv_counts,
                        layout.recv_displs, MPI_COMM_WORLD, options);
    layout.mpi_alltoallv(send.data(), expected.data());
    std::size_t violations = 0;
    for (std::size_t k = 0; k < total_recv; ++k) violations += !(std::fabs(double(got(k)) - double(expected(k))) <= 1e-4);
    CHECK(violations == 0);
  }
}

namespace {

template <class T>
void check_allreduce(std::size_t n, const kompress::collective_options& options, bool in_place) {
  const int p = size_of(), me = rank_of();
  auto send = make_data<T>(n, me + 3);
  host_view<T> expected("expected", n), magnitude("magnitude", n), abs_send("abs", n);
  MPI_Allreduce(send.data(), expected.data(), int(n), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
  for (std::size_t i = 0; i < n; ++i) abs_send(i) = std::fabs(send(i));
  MPI_Allreduce(abs_send.data(), magnitude.data(), int(n), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
  // The bound each compression used: ABS as given, REL over all ranks' inputs.
  double lo = INFINITY, hi = -INFINITY;
  for (std::size_t i = 0; i < n; ++i) {
    lo = std::min(lo, double(send(i)));
    hi = std::max(hi, double(send(i)));
  }
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  const double e = options.codec.bound.mode == kompress::bound_mode::absolute ? options.codec.bound.value
                                                                      : (n ? options.codec.bound.value * (hi - lo) : 0.0);
  const double result_bound = options.reduction_bound == kompress::allreduce_bound::total ? e : p * e;

  host_view<T> got("got", n);
  kompress::collective_report report;
  if (in_place) {
    std::memcpy(got.data(), send.data(), n * sizeof(T));
    report = kompress::allreduce(host{}, got, MPI_COMM_WORLD, options);
  } else {
    report = kompress::allreduce(host{}, send, got, MPI_COMM_WORLD, options);
  }
  if (options.mode == kompress::transfer_mode::compressed) CHECK(report.absolute_bound <= result_bound * (1 + 1e-12));
  std::size_t violations = 0;
  constexpr double eps = std::numeric_limits<T>::epsilon();
  for (std::size_t i = 0; i < n; ++i) {
    // Plus the floating-point summation error of two different summation orders.
    const double tolerance = result_bound + 2.0 * p * eps * double(magnitude(i));
    violations += !(std::fabs(double(got(i)) - double(expected(i))) <= tolerance);
  }
  CHECK(violations == 0);
  // Bit-identical on every rank: compare with rank 0's result.
  host_view<T> root("root", n);
  std::memcpy(root.data(), got.data(), n * sizeof(T));
  MPI_Bcast(root.data(), int(n * sizeof(T)), MPI_BYTE, 0, MPI_COMM_WORLD);
  int identical = n == 0 || std::memcmp(root.data(), got.data(), n * sizeof(T)) == 0;
  MPI_Allreduce(MPI_IN_PLACE, &identical, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  CHECK(identical == 1);
}

}  // namespace

TEST_CASE_TEMPLATE("allreduce matches MPI_Allreduce within p times the bound, bit-identical on every rank", T, float,
                   double) {
  for (const std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(3), std::size_t(1001), std::size_t(123457)}) {
    CAPTURE(n);
    check_allreduce<T>(n, {.codec = {.bound = kompress::absolute(1e-3)}}, false);
    check_allreduce<T>(n, {.codec = {.bound = kompress::relative(1e-3)}}, true);
    check_allreduce<T>(n, {.codec = {.bound = kompress::absolute(1e-2)}, .reduction_bound = kompress::allreduce_bound::total}, false);
  }
  check_allreduce<T>(50000, {.codec = {.bound = kompress::absolute(1e-3)}, .mode = kompress::transfer_mode::raw}, true);
  check_allreduce<T>(500000, {.codec = {.bound = kompress::absolute(1e-3)}, .mode = kompress::transfer_mode::automatic}, false);
}

TEST_CASE("allreduce and alltoall of 64 MiB") {
  const std::size_t n = (64u << 20) / sizeof(float);
  check_allreduce<float>(n, {.codec = {.bound = kompress::relative(1e-3)}}, false);
  check_alltoall<float>(n / std::size_t(size_of()), {.codec = {.bound = kompress::relative(1e-3)}});
}

TEST_CASE("two nonblocking collectives in flight, completed in reverse order") {
  const int p = size_of();
  const std::size_t n = 50000;
  auto a = make_data<float>(n * p, rank_of() + 11);
  auto b = make_data<double>(n, rank_of() + 13);
  host_view<float> a_out("a_out", n * p), a_expected("a_expected", n * p);
  host_view<double> b_out("b_out", n), b_expected("b_expected", n);
  auto first = kompress::ialltoall(host{}, a, a_out, MPI_COMM_WORLD, {.codec = {.bound = kompress::absolute(1e-3)}});
  auto second = kompress::iallreduce(host{}, b, b_out, MPI_COMM_WORLD, {.codec = {.bound = kompress::absolute(1e-6)}});
  while (!second.test()) {
  }
  first.wait();
  MPI_Alltoall(a.data(), int(n * sizeof(float)), MPI_BYTE, a_expected.data(), int(n * sizeof(float)), MPI_BYTE,
               MPI_COMM_WORLD);
  MPI_Allreduce(b.data(), b_expected.data(), int(n), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  std::size_t violations = 0;
  for (std::size_t i = 0; i < n * p; ++i) violations += !(std::fabs(a_out(i) - a_expected(i)) <= 1e-3);
  for (std::size_t i = 0; i < n; ++i) violations += !(std::fabs(b_out(i) - b_expected(i)) <= p * 1e-6 + 1e-9);
  CHECK(violations == 0);
  CHECK(first.report().compressed_messages == std::uint64_t(p - 1));
}

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
  CHECK_THROWS_WITH_AS(
      kompress::alltoallv(host{}, data, counts, too_far, out, counts, displs, MPI_COMM_WORLD), doctest::Contains("overflows"),
      kompress::invalid_argument);
  // Ranks passing different sizes: every rank gets the error, none hangs.
  host_view<float> uneven("uneven", 100 + rank_of());
  if (p > 1)
    CHECK_THROWS_WITH_AS(kompress::allreduce(host{}, uneven, uneven, MPI_COMM_WORLD), doctest::Contains("disagree on the element count"),
                       kompress::invalid_argument);
}

TEST_CASE("measure_cost_model gives every rank the same positive rates") {
  const auto model = kompress::measure_cost_model(host{}, MPI_COMM_WORLD, 1u << 20);
  double rates[3] = {model.link_bytes_per_second, model.compress_bytes_per_second, model.decompress_bytes_per_second};
  for (const double rate : rates) CHECK((std::isfinite(rate) && rate > 0.0));
  double highest[3];
  MPI_Allreduce(rates, highest, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  for (int i = 0; i < 3; ++i) CHECK(highest[i] == rates[i]);
}

TEST_CASE("measure_cost_model agrees on its probe size: a mismatch or a rejected size fails on every rank") {
  if (size_of() > 1)
    CHECK_THROWS_WITH_AS(kompress::measure_cost_model(host{}, MPI_COMM_WORLD, (1u << 16) + 4 * unsigned(rank_of())),
                         doctest::Contains("ranks disagree on probe_bytes"), kompress::invalid_argument);
  // More than one MPI message holds, on the last rank only: nothing allocated, no rank waits.
  const bool last = rank_of() == size_of() - 1;
  CHECK_THROWS_AS(kompress::measure_cost_model(host{}, MPI_COMM_WORLD, last ? std::size_t(3) << 30 : 1u << 16),
                  kompress::invalid_argument);
  // The next call matches on every rank.
  CHECK(kompress::measure_cost_model(host{}, MPI_COMM_WORLD, 1u << 16).compress_bytes_per_second > 0.0);
}

TEST_CASE("one rank: every collective is the identity or a local copy, as in plain MPI") {
  auto data = make_data<double>(1000, rank_of());
  host_view<double> out("out", 1000), expected("expected", 1000);
  for (const auto mode : {kompress::transfer_mode::compressed, kompress::transfer_mode::raw}) {
    const kompress::collective_options options{.codec = {.bound = kompress::absolute(1e-3)}, .mode = mode};
    MPI_Allreduce(data.data(), expected.data(), 1000, MPI_DOUBLE, MPI_SUM, MPI_COMM_SELF);
    kompress::allreduce(host{}, data, out, MPI_COMM_SELF, options);
    CHECK(std::memcmp(out.data(), expected.data(), 1000 * sizeof(double)) == 0);
    Kokkos::deep_copy(out, 0.0);
    const auto report = kompress::alltoall(host{}, data, out, MPI_COMM_SELF, options);
    CHECK(std::memcmp(out.data(), data.data(), 1000 * sizeof(double)) == 0);
    CHECK(report.messages == 0);
    Kokkos::deep_copy(out, 0.0);
    std::vector<int> counts{600}, displs{100};
    auto request = kompress::ialltoallv(host{}, data, counts, displs, out, counts, displs, MPI_COMM_SELF, options);
    request.wait();
    CHECK(std::memcmp(out.data() + 100, data.data() + 100, 600 * sizeof(double)) == 0);
  }
}
