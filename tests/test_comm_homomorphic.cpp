// The homomorphic reduction (collective_options::reduction = reduction_method::homomorphic) of
// allreduce and reduce_scatter against plain MPI_Allreduce / MPI_Reduce_scatter_block, element by
// element, within the documented p * e; where every message carried codes, bit for bit the
// value of the exact integer sum of every rank's codes; NaN, infinities and off-grid values;
// options that differ on one rank; measure_error of the ring collectives. Run under
// mpiexec -n 1, 2, 3 and 4.

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
#include <vector>

namespace {

using namespace kompress::test;  // support/mpi_checks.hpp
using kompress::reduction_method;

/// The per-rank bound e: ABS as given, REL over all ranks' values; total divides it p ways.
template <class T>
double per_rank_bound(const host_view<T>& send, const kompress::collective_options& options) {
  double e = options.codec.bound.value;
  if (options.codec.bound.mode == kompress::bound_mode::relative) {
    double lo = INFINITY, hi = -INFINITY;
    for (std::size_t i = 0; i < send.size(); ++i)
      if (std::isfinite(send(i))) {
        lo = std::min(lo, double(send(i)));
        hi = std::max(hi, double(send(i)));
      }
    MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    e = lo <= hi ? e * (hi - lo) : 0.0;
  }
  return options.reduction_bound == kompress::allreduce_bound::total ? e / size_of() : e;
}

/// The grid step the documentation promises: the largest power of two <= 2e.
double grid_step(double e) {
  int exponent = 0;
  std::frexp(2.0 * e, &exponent);
  return std::ldexp(1.0, exponent - 1);
}

bool on_every_rank(bool b) {
  int v = b;
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  return v != 0;
}

/// Every rank's send View, concatenated in rank order.
template <class T>
std::vector<T> gather_all(const host_view<T>& send) {
  std::vector<T> all(send.size() * std::size_t(size_of()));
  MPI_Allgather(send.data(), int(send.size()), mpi_type<T>(), all.data(), int(send.size()), mpi_type<T>(),
                MPI_COMM_WORLD);
  return all;
}

/// The value of the exact integer sum of the ranks' codes for element i of a `count`-value
/// send View: T(sum_r round(x_r / s) * s).
template <class T>
T code_sum_value(const std::vector<T>& all, std::size_t count, std::size_t i, double step) {
  std::int64_t sum = 0;
  for (int r = 0; r < size_of(); ++r) sum += std::int64_t(std::nearbyint(double(all[std::size_t(r) * count + i]) / step));
  return T(double(sum) * step);
}

/// Compares `got` with MPI's `expected` within the bound plus floating-point summation error
/// (two summation orders, and the result's rounding to T; test_comm.cpp's allowance), NaN where
/// MPI has NaN, the same infinity where it has one.
template <class T>
std::size_t violations(const host_view<T>& got, const host_view<T>& expected, const host_view<T>& magnitude,
                       double bound) {
  constexpr double eps = std::numeric_limits<T>::epsilon();
  const int p = size_of();
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(expected(i))) wrong += !std::isnan(got(i));
    else if (std::isinf(expected(i))) wrong += got(i) != expected(i);
    else
      wrong += !(std::fabs(double(got(i)) - double(expected(i))) <=
                 bound + 2.0 * p * eps * (double(magnitude(i)) + bound));
  }
  return wrong;
}

template <class T>
host_view<T> magnitudes(const host_view<T>& send) {
  host_view<T> m("magnitude", send.size());
  for (std::size_t i = 0; i < send.size(); ++i) m(i) = std::isfinite(send(i)) ? std::fabs(send(i)) : T(0);
  return m;
}

struct run_kind {
  bool nonblocking = false;
  bool in_place = false;
};

/// Returns whether every rank sent every message as codes.
template <class T>
bool check_allreduce(const host_view<T>& send, const kompress::collective_options& options, run_kind kind,
                     bool expect_exact_codes) {
  const int p = size_of();
  const std::size_t n = send.size();
  host_view<T> expected("expected", n), magnitude("magnitude", n), got("got", n);
  MPI_Allreduce(send.data(), expected.data(), int(n), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
  const auto abs_send = magnitudes(send);
  MPI_Allreduce(abs_send.data(), magnitude.data(), int(n), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
  const double e = per_rank_bound(send, options);
  const std::vector<T> all = gather_all(send);
  host_view<T> in = send;
  if (kind.in_place) {
    Kokkos::deep_copy(got, send);
    in = got;
  }
  kompress::collective_report report;
  if (kind.nonblocking) {
    auto r = kompress::iallreduce(host{}, in, got, MPI_COMM_WORLD, options);
    report = r.wait();
  } else {
    report = kompress::allreduce(host{}, in, got, MPI_COMM_WORLD, options);
  }
  const bool ring = options.mode != kompress::transfer_mode::raw && p > 1 && n > 0 && report.messages > 0;
  const double bound = ring ? p * e : 0.0;
  CHECK(report.absolute_bound <= bound * (1 + 1e-12));
  CHECK(violations(got, expected, magnitude, report.absolute_bound) == 0);
  CHECK(identical_on_every_rank(got));
  // Every message carried codes: the result is the exact integer sum of the codes, times s.
  const bool all_codes = on_every_rank(ring && report.compressed_messages == report.messages);
  if (expect_exact_codes && all_codes) {
    const double step = grid_step(e);
    std::size_t differ = 0;
    for (std::size_t i = 0; i < n; ++i) differ += got(i) != code_sum_value(all, n, i, step);
    CHECK(differ == 0);
  }
  if (!ring && options.mode == kompress::transfer_mode::raw) CHECK(report.compressed_messages == 0);
  return all_codes;
}

template <class T>
bool check_reduce_scatter(const host_view<T>& send, const kompress::collective_options& options, bool nonblocking,
                          bool expect_exact_codes) {
  const int p = size_of(), me = rank_of();
  const std::size_t n = send.size() / std::size_t(p);
  host_view<T> expected("expected", n), magnitude("magnitude", n), got("got", n);
  MPI_Reduce_scatter_block(send.data(), expected.data(), int(n), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
  const auto abs_send = magnitudes(send);
  MPI_Reduce_scatter_block(abs_send.data(), magnitude.data(), int(n), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
  const double e = per_rank_bound(send, options);
  const std::vector<T> all = gather_all(send);
  kompress::collective_report report;
  if (nonblocking) {
    auto r = kompress::ireduce_scatter(host{}, send, got, MPI_COMM_WORLD, options);
    report = r.wait();
  } else {
    report = kompress::reduce_scatter(host{}, send, got, MPI_COMM_WORLD, options);
  }
  // p quantizations, one per rank: p * e (total: the caller's bound).
  const bool ring = options.mode != kompress::transfer_mode::raw && p > 1 && n > 0 && report.messages > 0;
  const double bound = ring ? p * e : 0.0;
  CHECK(report.absolute_bound <= bound * (1 + 1e-12));
  CHECK(violations(got, expected, magnitude, report.absolute_bound) == 0);
  const bool all_codes = on_every_rank(ring && report.compressed_messages == report.messages);
  if (expect_exact_codes && all_codes) {
    const double step = grid_step(e);
    std::size_t differ = 0;
    for (std::size_t i = 0; i < n; ++i) differ += got(i) != code_sum_value(all, send.size(), std::size_t(me) * n + i, step);
    CHECK(differ == 0);
  }
  return all_codes;
}

kompress::collective_options homomorphic(kompress::collective_options options) {
  options.reduction = reduction_method::homomorphic;
  return options;
}

const kompress::collective_options option_sets[] = {
    homomorphic({.codec = {.bound = kompress::absolute(1e-3)}}),
    homomorphic({.codec = {.bound = kompress::relative(1e-3)}}),
    homomorphic({.codec = {.bound = kompress::absolute(1e-2), .block_size = 64},
                 .reduction_bound = kompress::allreduce_bound::total}),
    homomorphic({.codec = {.bound = kompress::absolute(3e-3), .block_size = 128}}),
    homomorphic({.codec = {.bound = kompress::absolute(1e-3)}, .mode = kompress::transfer_mode::automatic}),
    homomorphic({.codec = {.bound = kompress::absolute(1e-3)}, .mode = kompress::transfer_mode::raw}),
};

const std::size_t sizes[] = {0, 1, 33, 5000, 300001};

}  // namespace

TEST_CASE_TEMPLATE("homomorphic allreduce: within p * e of MPI_Allreduce, the exact code sum, bit-identical", T, float,
                   double) {
  for (const std::size_t n : sizes)
    for (std::size_t k = 0; k < std::size(option_sets); ++k)
      for (const run_kind kind : {run_kind{}, run_kind{true, false}, run_kind{false, true}}) {
        CAPTURE(n);
        CAPTURE(k);
        CAPTURE(kind.nonblocking);
        CAPTURE(kind.in_place);
        const bool all_codes = check_allreduce<T>(make_data<T>(n, rank_of() + 3), option_sets[k], kind, true);
        // Smooth data: every hop carries codes, so the exact code-sum comparison ran.
        if (n >= 5000 && size_of() > 1 && option_sets[k].mode == kompress::transfer_mode::compressed)
          CHECK(all_codes);
      }
}

TEST_CASE_TEMPLATE("homomorphic reduce_scatter: within p * e of MPI_Reduce_scatter_block, the exact code sum", T,
                   float, double) {
  for (const std::size_t n : sizes)
    for (std::size_t k = 0; k < std::size(option_sets); ++k)
      for (const bool nonblocking : {false, true}) {
        CAPTURE(n);
        CAPTURE(k);
        CAPTURE(nonblocking);
        const bool all_codes = check_reduce_scatter<T>(make_data<T>(n * std::size_t(size_of()), rank_of() + 5),
                                                       option_sets[k], nonblocking, true);
        if (n >= 5000 && size_of() > 1 && option_sets[k].mode == kompress::transfer_mode::compressed)
          CHECK(all_codes);
      }
}

TEST_CASE_TEMPLATE("homomorphic: NaN, infinities, -0.0 and values off the grid are added in floating point", T, float,
                   double) {
  const int me = rank_of(), p = size_of();
  const std::size_t n = 20000;
  const auto options = homomorphic({.codec = {.bound = kompress::absolute(1e-3)}});
  // Off the grid: |x / s| beyond 2^50 (s = 2^-10 here), on some ranks only.
  const T off_grid = T(1e15 * (me + 1));
  auto send = make_data<T>(n, me + 41);
  for (std::size_t i = std::size_t(me) * 7; i < n; i += 97) send(i) = std::numeric_limits<T>::quiet_NaN();
  for (std::size_t i = 13; i < n; i += 211)
    send(i) = (i / 211 + std::size_t(me)) % 2 ? std::numeric_limits<T>::infinity() : -std::numeric_limits<T>::infinity();
  for (std::size_t i = 50; i < n; i += 301) send(i) = T(-0.0);
  for (std::size_t i = std::size_t(me) * 3 + 100; i < n; i += 499) send(i) = off_grid;
  for (const bool nonblocking : {false, true}) {
    CAPTURE(nonblocking);
    check_allreduce<T>(send, options, run_kind{nonblocking, false}, false);
  }
  host_view<T> summands("summands", n * std::size_t(p));
  for (int r = 0; r < p; ++r)
    for (std::size_t i = 0; i < n; ++i) summands(std::size_t(r) * n + i) = send((i + std::size_t(r) * 31) % n);
  check_reduce_scatter<T>(summands, options, false, false);
}

TEST_CASE_TEMPLATE("homomorphic: codes that do not compress travel raw and are still within the bound", T, float,
                   double) {
  // Uniform noise over +-1e4 at e = 1e-6 (float: its ulp there is 1e-3, so quantized codes span
  // 2^34 per block): every code message would be longer than the raw values.
  const int me = rank_of(), p = size_of();
  const std::size_t n = 10000;
  host_view<T> send("send", n);
  std::mt19937 rng(me + 51);
  std::uniform_real_distribution<double> uniform(-1e4, 1e4);
  for (std::size_t i = 0; i < n; ++i) send(i) = T(uniform(rng));
  const auto options = homomorphic({.codec = {.bound = kompress::absolute(1e-6)}});
  CHECK(!check_allreduce<T>(send, options, run_kind{}, false));
  host_view<T> summands("summands", n * std::size_t(p));
  for (std::size_t i = 0; i < summands.size(); ++i) summands(i) = T(uniform(rng));
  CHECK(!check_reduce_scatter<T>(summands, options, true, false));
}

TEST_CASE("homomorphic: code sums near the overflow guard stay exact") {
  // e = 1: s = 2, so codes of values near 2^51 are near the per-rank limit (2^50 for p <= 8);
  // p of them sum near 2^52 without wrapping. Doubles: every such value is on the grid.
  const int me = rank_of();
  const std::size_t n = 4096;
  host_view<double> send("send", n);
  for (std::size_t i = 0; i < n; ++i) send(i) = (i < n / 2 ? 1.0 : -1.0) * (0x1p51 - double(i) * 1024.0 - 2.0 * me);
  const auto options = homomorphic({.codec = {.bound = kompress::absolute(1.0)}});
  const bool all_codes = check_allreduce<double>(send, options, run_kind{}, true);
  if (size_of() > 1) CHECK(all_codes);
}

TEST_CASE("homomorphic: a reduction method that differs on one rank is an error on every rank, before data moves") {
  const int p = size_of();
  const bool last = rank_of() == p - 1;
  auto send = make_data<float>(1000 * p, rank_of());
  host_view<float> sum("sum", 1000 * p), scattered("scattered", 1000);
  kompress::collective_options options{.codec = {.bound = kompress::absolute(1e-3)}};
  if (last) options.reduction = reduction_method::homomorphic;
  if (p > 1) {
    CHECK_THROWS_WITH_AS(kompress::allreduce(host{}, send, sum, MPI_COMM_WORLD, options),
                         doctest::Contains("ranks disagree on"), kompress::invalid_argument);
    CHECK_THROWS_WITH_AS(kompress::reduce_scatter(host{}, send, scattered, MPI_COMM_WORLD, options),
                         doctest::Contains("reduction method"), kompress::invalid_argument);
    auto r = [&] { return kompress::iallreduce(host{}, send, sum, MPI_COMM_WORLD, options); };
    CHECK_THROWS_AS(r(), kompress::invalid_argument);
  }
  // Nothing left in flight: the next call works.
  options.reduction = reduction_method::homomorphic;
  CHECK_NOTHROW(kompress::allreduce(host{}, send, sum, MPI_COMM_WORLD, options));
}

TEST_CASE("measure_error: the ring collectives report the largest error this rank's compressions introduced") {
  const int p = size_of(), me = rank_of();
  const std::size_t n = 6000;
  const double e = 1e-3;
  auto send = make_data<double>(n * std::size_t(p), me + 61);
  host_view<double> sum("sum", n * std::size_t(p)), gathered("gathered", n * std::size_t(p) * std::size_t(p)),
      scattered("scattered", n);
  for (const auto method : {reduction_method::recompress, reduction_method::homomorphic}) {
    CAPTURE(int(method));
    const kompress::collective_options options{
        .codec = {.bound = kompress::absolute(e)}, .reduction = method, .measure_error = true};
    const auto reports = {kompress::allreduce(host{}, send, sum, MPI_COMM_WORLD, options),
                          kompress::reduce_scatter(host{}, send, scattered, MPI_COMM_WORLD, options),
                          kompress::allgather(host{}, send, gathered, MPI_COMM_WORLD, options)};
    for (const auto& report : reports) {
      CHECK(report.max_error >= 0.0);  // not NaN
      CHECK(report.max_error <= e);    // one compression (or one quantization) at a time
      if (p > 1) CHECK(report.max_error > 0.0);
    }
  }
  // Without measure_error: NaN.
  const kompress::collective_options quiet{.codec = {.bound = kompress::absolute(e)}};
  CHECK(std::isnan(kompress::allreduce(host{}, send, sum, MPI_COMM_WORLD, quiet).max_error));
  // allgather's measured error is the largest |decoded - sent| of this rank's own block.
  const kompress::collective_options measured{.codec = {.bound = kompress::absolute(e)}, .measure_error = true};
  const auto report = kompress::allgather(host{}, send, gathered, MPI_COMM_WORLD, measured);
  double own = 0.0;
  for (std::size_t i = 0; i < send.size(); ++i)
    own = std::max(own, std::fabs(gathered(std::size_t(me) * send.size() + i) - send(i)));
  CHECK(report.max_error == own);
}
