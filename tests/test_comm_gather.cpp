// allgather and reduce_scatter against plain MPI_Allgather / MPI_Reduce_scatter_block, element
// by element, within the reported bound; allgather bit-identical on every rank; a mismatched
// argument an invalid_argument on every rank. Run under mpiexec -n 1, 2, 3 and 4.

#include <kompress/comm.hpp>

#include "support/mpi_checks.hpp"

#include <doctest/doctest.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>

namespace {

using namespace kompress::test;  // support/mpi_checks.hpp

/// The absolute bound of every compression: ABS as given, REL over all ranks' send Views.
template <class T>
double agreed_bound(const host_view<T>& send, const kompress::error_bound& bound) {
  if (bound.mode == kompress::bound_mode::absolute) return bound.value;
  double lo = INFINITY, hi = -INFINITY;
  for (std::size_t i = 0; i < send.size(); ++i) {
    lo = std::min(lo, double(send(i)));
    hi = std::max(hi, double(send(i)));
  }
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return lo <= hi ? bound.value * (hi - lo) : 0.0;
}

bool compressed(const kompress::collective_options& options) {
  return options.mode != kompress::transfer_mode::raw;
}

template <class T>
void check_allgather(std::size_t n, const kompress::collective_options& options, bool nonblocking) {
  const int p = size_of(), me = rank_of();
  auto send = make_data<T>(n, me + 5);
  host_view<T> expected("expected", n * p), got("got", n * p);
  MPI_Allgather(send.data(), int(n), mpi_type<T>(), expected.data(), int(n), mpi_type<T>(), MPI_COMM_WORLD);
  const double e = agreed_bound(send, options.codec.bound);
  kompress::collective_report report;
  if (nonblocking) {
    auto r = kompress::iallgather(host{}, send, got, MPI_COMM_WORLD, options);
    report = r.wait();
  } else {
    report = kompress::allgather(host{}, send, got, MPI_COMM_WORLD, options);
  }
  // Raw, one rank and empty blocks are MPI_Allgather itself: exact.
  const bool ring = compressed(options) && p > 1 && n > 0;
  const double bound = ring ? e : 0.0;
  CHECK(report.absolute_bound <= bound * (1 + 1e-12));
  if (!ring) CHECK(report.compressed_messages == 0);
  if (ring && n >= 5000 && options.mode == kompress::transfer_mode::compressed)
    CHECK(report.compressed_messages == std::uint64_t(p - 1));
  std::size_t violations = 0;
  for (std::size_t i = 0; i < n * p; ++i)
    violations += !(std::fabs(double(got(i)) - double(expected(i))) <= report.absolute_bound);
  CHECK(violations == 0);
  CHECK(identical_on_every_rank(got));
}

template <class T>
void check_reduce_scatter(std::size_t n, const kompress::collective_options& options, bool nonblocking) {
  const int p = size_of(), me = rank_of();
  auto send = make_data<T>(n * p, me + 7);
  host_view<T> expected("expected", n), magnitude("magnitude", n), abs_send("abs", n * p), got("got", n);
  MPI_Reduce_scatter_block(send.data(), expected.data(), int(n), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
  for (std::size_t i = 0; i < n * p; ++i) abs_send(i) = std::fabs(send(i));
  MPI_Reduce_scatter_block(abs_send.data(), magnitude.data(), int(n), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
  const double e = agreed_bound(send, options.codec.bound);
  const double hop = options.reduction_bound == kompress::allreduce_bound::total && p > 1 ? e / (p - 1) : e;
  kompress::collective_report report;
  if (nonblocking) {
    auto r = kompress::ireduce_scatter(host{}, send, got, MPI_COMM_WORLD, options);
    report = r.wait();
  } else {
    report = kompress::reduce_scatter(host{}, send, got, MPI_COMM_WORLD, options);
  }
  // p - 1 compressions on the way to each block; none in raw mode, with one rank or no values.
  const bool ring = compressed(options) && p > 1 && n > 0;
  const double result_bound = ring ? (p - 1) * hop : 0.0;
  CHECK(report.absolute_bound <= result_bound * (1 + 1e-12));
  if (options.reduction_bound == kompress::allreduce_bound::total) CHECK(report.absolute_bound <= e * (1 + 1e-12));
  if (ring && n >= 5000 && options.mode == kompress::transfer_mode::compressed)
    CHECK(report.compressed_messages == std::uint64_t(p - 1));
  std::size_t violations = 0;
  constexpr double eps = std::numeric_limits<T>::epsilon();
  for (std::size_t i = 0; i < n; ++i) {
    // Plus the floating-point summation error of two different summation orders (as in
    // test_comm.cpp's allreduce check).
    const double tolerance = report.absolute_bound + 2.0 * p * eps * double(magnitude(i));
    violations += !(std::fabs(double(got(i)) - double(expected(i))) <= tolerance);
  }
  CHECK(violations == 0);
  if (!ring) {  // MPI itself: the same values
    std::size_t differ = 0;
    for (std::size_t i = 0; i < n; ++i) differ += got(i) != expected(i);
    CHECK(differ == 0);
  }
}

const kompress::collective_options option_sets[] = {
    {.codec = {.bound = kompress::relative(1e-3)}},
    {.codec = {.bound = kompress::absolute(1e-3)}},
    {.codec = {.bound = kompress::absolute(1e-2)}, .reduction_bound = kompress::allreduce_bound::total},
    {.codec = {.bound = kompress::absolute(1e-3)}, .mode = kompress::transfer_mode::raw},
    {.codec = {.bound = kompress::absolute(1e-3)}, .mode = kompress::transfer_mode::automatic},
};

}  // namespace

TEST_CASE_TEMPLATE("allgather matches MPI_Allgather within the bound, bit-identical on every rank", T, float, double) {
  for (const std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(33), std::size_t(5000)})
    for (std::size_t k = 0; k < std::size(option_sets); ++k)
      for (const bool nonblocking : {false, true}) {
        CAPTURE(n);
        CAPTURE(k);
        CAPTURE(nonblocking);
        check_allgather<T>(n, option_sets[k], nonblocking);
      }
}

TEST_CASE_TEMPLATE("reduce_scatter matches MPI_Reduce_scatter_block within (p - 1) times the bound", T, float, double) {
  for (const std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(33), std::size_t(5000)})
    for (std::size_t k = 0; k < std::size(option_sets); ++k)
      for (const bool nonblocking : {false, true}) {
        CAPTURE(n);
        CAPTURE(k);
        CAPTURE(nonblocking);
        check_reduce_scatter<T>(n, option_sets[k], nonblocking);
      }
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

TEST_CASE("iallgather and ireduce_scatter in flight together on a workspace, completed in reverse order") {
  const int p = size_of(), me = rank_of();
  const std::size_t n = 5000;
  kompress::comm_workspace workspace(MPI_COMM_WORLD);
  const kompress::collective_options options{.codec = {.bound = kompress::absolute(1e-4)}};
  auto gather_send = make_data<float>(n, me + 21);
  auto scatter_send = make_data<double>(n * p, me + 23);
  host_view<float> gathered("gathered", n * p), gather_expected("gather_expected", n * p);
  host_view<double> scattered("scattered", n), scatter_expected("scatter_expected", n);
  MPI_Allgather(gather_send.data(), int(n), MPI_FLOAT, gather_expected.data(), int(n), MPI_FLOAT, MPI_COMM_WORLD);
  MPI_Reduce_scatter_block(scatter_send.data(), scatter_expected.data(), int(n), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  for (int round = 0; round < 2; ++round) {  // the second round reuses the workspace's slots
    CAPTURE(round);
    auto first = kompress::iallgather(host{}, gather_send, gathered, MPI_COMM_WORLD, options, &workspace);
    auto second = kompress::ireduce_scatter(host{}, scatter_send, scattered, MPI_COMM_WORLD, options, &workspace);
    while (!second.test()) {
    }
    first.wait();
    CHECK(first.report().absolute_bound <= (p > 1 ? 1e-4 : 0.0));
    CHECK(second.report().absolute_bound <= (p - 1) * 1e-4);
    std::size_t violations = 0;
    for (std::size_t i = 0; i < n * p; ++i)
      violations += !(std::fabs(double(gathered(i)) - double(gather_expected(i))) <= first.report().absolute_bound);
    constexpr double eps = std::numeric_limits<double>::epsilon();
    for (std::size_t i = 0; i < n; ++i)  // |values| <= 10.1: the summation slack of test_comm.cpp
      violations += !(std::fabs(scattered(i) - scatter_expected(i)) <=
                      second.report().absolute_bound + 2.0 * p * eps * 10.1 * p);
    CHECK(violations == 0);
    CHECK(identical_on_every_rank(gathered));
  }
}

TEST_CASE_TEMPLATE("allgather and reduce_scatter carry NaN, infinities and -0.0 exactly", T, float, double) {
  const int p = size_of(), me = rank_of();
  const std::size_t n = 1000;
  const kompress::collective_options options{.codec = {.bound = kompress::relative(1e-3)}};
  const auto sprinkle = [&](host_view<T>& v) {
    for (std::size_t i = 0; i < v.size(); i += 97) v(i) = std::numeric_limits<T>::quiet_NaN();
    for (std::size_t i = 13; i < v.size(); i += 211) v(i) = (i / 211) % 2 ? std::numeric_limits<T>::infinity()
                                                                         : -std::numeric_limits<T>::infinity();
    for (std::size_t i = 50; i < v.size(); i += 301) v(i) = T(-0.0);
  };
  auto send = make_data<T>(n, me + 31);
  sprinkle(send);
  host_view<T> got("got", n * p), expected("expected", n * p);
  MPI_Allgather(send.data(), int(n), mpi_type<T>(), expected.data(), int(n), mpi_type<T>(), MPI_COMM_WORLD);
  const auto report = kompress::allgather(host{}, send, got, MPI_COMM_WORLD, options);
  std::size_t violations = 0;
  for (std::size_t i = 0; i < n * p; ++i) {
    if (std::isfinite(expected(i)) && !(expected(i) == 0 && std::signbit(expected(i))))
      violations += !(std::fabs(double(got(i)) - double(expected(i))) <= report.absolute_bound);
    else
      violations += std::memcmp(&got(i), &expected(i), sizeof(T)) != 0;  // the same bits
  }
  CHECK(violations == 0);
  CHECK(identical_on_every_rank(got));

  // A sum: NaN where MPI's sum is NaN, the same infinity where it is infinite.
  auto summands = make_data<T>(n * p, me + 37);
  sprinkle(summands);
  host_view<T> sum("sum", n), sum_expected("sum_expected", n);
  MPI_Reduce_scatter_block(summands.data(), sum_expected.data(), int(n), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
  host_view<T> abs_summands("abs", n * p), magnitude("magnitude", n);
  for (std::size_t i = 0; i < n * p; ++i) abs_summands(i) = std::isfinite(summands(i)) ? std::fabs(summands(i)) : T(0);
  MPI_Reduce_scatter_block(abs_summands.data(), magnitude.data(), int(n), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
  const auto sum_report = kompress::reduce_scatter(host{}, summands, sum, MPI_COMM_WORLD, options);
  constexpr double eps = std::numeric_limits<T>::epsilon();
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (std::isnan(sum_expected(i))) wrong += !std::isnan(sum(i));
    else if (std::isinf(sum_expected(i))) wrong += sum(i) != sum_expected(i);
    else wrong += !(std::fabs(double(sum(i)) - double(sum_expected(i))) <= sum_report.absolute_bound + 2.0 * p * eps * double(magnitude(i)));
  }
  CHECK(wrong == 0);
}
