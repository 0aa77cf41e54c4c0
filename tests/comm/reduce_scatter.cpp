// reduce_scatter against plain MPI_Reduce_scatter_block, element by element, within the
// documented bound ((p - 1) times the bound per rank, or the bound itself in total) plus the
// summation error, in every form: blocking and nonblocking, pipelined, persistent
// (reduce_scatter_init), small raw calls carried inside the agreement (bit for bit, with the MPI
// calls counted), on the execution space's memory direct and staged, with NaN and infinities,
// with the ratio codec on the wire, and with the homomorphic reduction (where every message
// carried codes, bit for bit the exact integer sum of every rank's codes) and measure_error. A bad
// call is in agreement.cpp, several requests in flight in requests.cpp, failures mid-flight in
// faults.cpp. Run under mpiexec -n 1, 2, 3 and 4; the cases of test suite "slow" are registered
// apart (tests/CMakeLists.txt).

#include <kompress/comm.hpp>

#include "comm/carried.hpp"
#include "comm/checks.hpp"
#include "comm/homomorphic_checks.hpp"
#include "support/device_views.hpp"
#include "support/mpi_checks.hpp"

#include <doctest/doctest.h>
#include <mpi.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace {

using namespace kompress::test;  // support/mpi_checks.hpp, support/device_views.hpp, comm/*.hpp

/// A one-shot (i)reduce_scatter against MPI_Reduce_scatter_block within (p - 1) times the bound
/// (the bound itself with allreduce_bound::total) plus the summation error; MPI's own values
/// where no ring compresses.
template <class T>
void check_reduce_scatter_against_mpi(std::size_t n, const kompress::collective_options& options, bool nonblocking) {
  const int p = size_of(), me = rank_of();
  auto send = make_data<T>(n * p, me + 7);
  host_view<T> expected("expected", n), magnitude("magnitude", n), abs_send("abs", n * p), got("got", n);
  MPI_Reduce_scatter_block(send.data(), expected.data(), int(n), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
  for (std::size_t i = 0; i < n * p; ++i) abs_send(i) = std::fabs(send(i));
  MPI_Reduce_scatter_block(abs_send.data(), magnitude.data(), int(n), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
  const double e = agreed_bound(send, options.codec.bound);
  // p - 1 compressions on the way to each block; p with recursive halving where p is no power of
  // two (a folded rank's block is compressed once more to reach it); none in raw mode, with one
  // rank or no values.
  const bool halving =
      butterfly_runs(options, n * p * sizeof(T), kompress::detail::butterfly_collective::reduce_scatter);
  const int compressions = halving && !std::has_single_bit(unsigned(p)) ? p : p - 1;
  const double hop = options.reduction_bound == kompress::allreduce_bound::total && p > 1 ? e / compressions : e;
  kompress::collective_report report;
  if (nonblocking) {
    auto r = kompress::ireduce_scatter(host{}, send, got, MPI_COMM_WORLD, options);
    report = r.wait();
  } else {
    report = kompress::reduce_scatter(host{}, send, got, MPI_COMM_WORLD, options);
  }
  const bool ring = may_compress(options) && p > 1 && n > 0;
  const double result_bound = ring ? compressions * hop : 0.0;
  CHECK(report.absolute_bound <= result_bound * (1 + 1e-12));
  if (options.reduction_bound == kompress::allreduce_bound::total) CHECK(report.absolute_bound <= e * (1 + 1e-12));
  if (ring && n >= 5000 && options.mode == kompress::transfer_mode::compressed) {
    CHECK(report.messages == one_phase_messages(halving));
    CHECK(report.compressed_messages == report.messages);
  }
  std::size_t violations = 0;
  constexpr double eps = std::numeric_limits<T>::epsilon();
  for (std::size_t i = 0; i < n; ++i) {
    // Plus the floating-point summation error of two different summation orders (as in
    // allreduce.cpp's check_allreduce_against_mpi).
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

/// A pipelined (i)reduce_scatter against MPI_Reduce_scatter_block within its reported bound, at
/// most (p - 1) (homomorphic: p) times pipelined_abs_bound, plus the summation error.
template <class T>
void check_pipelined_reduce_scatter(std::size_t n, const kompress::collective_options& options, bool nonblocking) {
  const int p = size_of(), me = rank_of();
  auto send = make_data<T>(n * std::size_t(p), me + 7);
  host_view<T> expected("expected", n), magnitude("magnitude", n), abs_send("abs", n * std::size_t(p)), got("got", n);
  MPI_Reduce_scatter_block(send.data(), expected.data(), int(n), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
  for (std::size_t i = 0; i < abs_send.size(); ++i) abs_send(i) = std::fabs(send(i));
  MPI_Reduce_scatter_block(abs_send.data(), magnitude.data(), int(n), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
  const auto report = finish<T>(
      nonblocking, [&] { return kompress::reduce_scatter(host{}, send, got, MPI_COMM_WORLD, options); },
      [&] { return kompress::ireduce_scatter(host{}, send, got, MPI_COMM_WORLD, options); });
  const bool ring = p > 1 && n > 0;
  // Homomorphic: every rank's own quantization counts, the owner's too (docs/collectives.md);
  // recursive halving where p is no power of two: a folded rank's block once more.
  const bool halving = butterfly_runs(options, n * std::size_t(p) * sizeof(T),
                                      kompress::detail::butterfly_collective::reduce_scatter);
  const bool homomorphic = options.reduction == kompress::reduction_method::homomorphic;
  const int roundings = homomorphic || (halving && !std::has_single_bit(unsigned(p))) ? p : p - 1;
  CHECK(report.absolute_bound <= (ring ? roundings * pipelined_abs_bound : 0.0) * (1 + 1e-12));
  constexpr double eps = std::numeric_limits<T>::epsilon();
  std::size_t violations = 0;
  for (std::size_t i = 0; i < n; ++i)
    violations += !(std::fabs(double(got(i)) - double(expected(i))) <=
                    report.absolute_bound + 2.0 * p * eps * double(magnitude(i)));
  CHECK(violations == 0);
}

/// reduce_scatter_init against MPI_Reduce_scatter_block, persistent_rounds rounds on new values
/// each, within (p - 1) times the agreed bound plus the summation error.
template <class T>
void check_reduce_scatter_init(std::size_t n, const kompress::collective_options& options) {
  const int p = size_of(), me = rank_of();
  host_view<T> send("send", n * p), got("got", n), expected("expected", n), magnitude("magnitude", n),
      abs_send("abs", n * p);
  auto request = kompress::reduce_scatter_init(host{}, send, got, MPI_COMM_WORLD, options);
  constexpr double eps = std::numeric_limits<T>::epsilon();
  for (int round = 0; round < persistent_rounds; ++round) {
    refill(send, me + 9, round);
    MPI_Reduce_scatter_block(send.data(), expected.data(), int(n), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
    for (std::size_t i = 0; i < n * p; ++i) abs_send(i) = std::fabs(send(i));
    MPI_Reduce_scatter_block(abs_send.data(), magnitude.data(), int(n), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
    const double e = agreed_bound(send, options.codec.bound);
    const auto report = run_round(request, round);
    const bool halving = butterfly_runs(options, send.size() * sizeof(T),
                                        kompress::detail::butterfly_collective::reduce_scatter);
    const int compressions = halving && !std::has_single_bit(unsigned(p)) ? p : p - 1;
    CHECK(report.absolute_bound <= (may_compress(options) ? compressions * e * (1 + 1e-12) : 0.0));
    std::size_t violations = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const double tolerance = report.absolute_bound + 2.0 * p * eps * double(magnitude(i));
      violations += !(std::fabs(double(got(i)) - double(expected(i))) <= tolerance);
    }
    CHECK(violations == 0);
  }
}

/// A homomorphic (i)reduce_scatter against MPI_Reduce_scatter_block within p * e and, where every
/// message carried codes and `expect_exact_codes`, the exact sum of every rank's codes. Returns
/// whether every rank sent every message as codes.
template <class T>
bool check_homomorphic_reduce_scatter(const host_view<T>& send, const kompress::collective_options& options,
                                      bool nonblocking, bool expect_exact_codes) {
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
  CHECK(homomorphic_violations(got, expected, magnitude, report.absolute_bound) == 0);
  const bool all_codes = on_every_rank(ring && report.compressed_messages == report.messages);
  if (expect_exact_codes && all_codes) {
    const double step = grid_step(e);
    std::size_t differ = 0;
    for (std::size_t i = 0; i < n; ++i)
      differ += got(i) != code_sum_value(all, send.size(), std::size_t(me) * n + i, step);
    CHECK(differ == 0);
  }
  return all_codes;
}

}  // namespace

// --- one-shot calls -------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("reduce_scatter matches MPI_Reduce_scatter_block within (p - 1) times the bound", T, float, double) {
  for (const std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(33), std::size_t(5000)})
    for (std::size_t k = 0; k < std::size(ring_option_sets); ++k)
      for (const bool nonblocking : {false, true}) {
        CAPTURE(n);
        CAPTURE(k);
        CAPTURE(nonblocking);
        check_reduce_scatter_against_mpi<T>(n, ring_option_sets[k], nonblocking);
      }
}

TEST_CASE_TEMPLATE("both schedules, ring and recursive halving, match MPI_Reduce_scatter_block within their bounds",
                   T, float, double) {
  for_each_schedule_case(
      [](std::size_t n, const auto& options, bool nonblocking) {
        check_reduce_scatter_against_mpi<T>(n, options, nonblocking);
      },
      [](std::size_t n, const auto& options, bool nonblocking) {
        check_pipelined_reduce_scatter<T>(n, options, nonblocking);
      },
      [](std::size_t n, const auto& options) { check_reduce_scatter_init<T>(n, options); });
}

TEST_CASE_TEMPLATE("reduce_scatter sums NaN and infinities as MPI does", T, float, double) {
  // A sum: NaN where MPI's sum is NaN, the same infinity where it is infinite.
  const int p = size_of(), me = rank_of();
  const std::size_t n = 1000;
  const kompress::collective_options options{.codec = {.bound = kompress::relative(1e-3)}};
  auto summands = make_data<T>(n * p, me + 37);
  sprinkle_special_values(summands);
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
    else
      wrong += !(std::fabs(double(sum(i)) - double(sum_expected(i))) <=
                 sum_report.absolute_bound + 2.0 * p * eps * double(magnitude(i)));
  }
  CHECK(wrong == 0);
}

// --- pipelined ------------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("pipelined reduce_scatter matches MPI_Reduce_scatter_block within its bound", T, float, double) {
  const auto check = [](std::size_t n, const auto& options, bool nonblocking) {
    check_pipelined_reduce_scatter<T>(n, options, nonblocking);
  };
  for_each_pipelined_case({0, 1, 250, 1023, 5000, 60001}, 1023, check);
}

TEST_CASE_TEMPLATE("pipelined homomorphic reduce_scatter: codes added piece by piece", T, float, double) {
  for_each_pipelined_homomorphic_case([](std::size_t n, const auto& options, bool nonblocking) {
    check_pipelined_reduce_scatter<T>(n, options, nonblocking);
  });
}

TEST_CASE_TEMPLATE("the ratio codec on the wire: reduce_scatter, whole and pipelined, any block size option", T, float,
                   double) {
  for_each_ratio_codec_case([](std::size_t n, const auto& options, bool nonblocking) {
    check_pipelined_reduce_scatter<T>(n, options, nonblocking);
  });
}

// --- persistent -----------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("reduce_scatter_init matches MPI_Reduce_scatter_block round after round", T, float, double) {
  for (const auto& options : persistent_option_sets)
    for (const std::size_t n : persistent_sizes) {
      CAPTURE(n);
      CAPTURE(int(options.mode));
      check_reduce_scatter_init<T>(n, options);
    }
}

// --- raw calls carried inside the agreement (comm/carried.hpp) -------------------------------------

TEST_CASE_TEMPLATE("raw reduce_scatter matches plain MPI bit for bit, inside the agreement, after it and beyond it", T,
                   float, double) {
  const int p = size_of(), me = rank_of();
  for (const std::size_t n : counts_around_limits<T>()) {
    CAPTURE(n);
    const auto bytes = n * sizeof(T);
    // n values per rank's block
    const auto send = make_data<T>(n * p, me + 2);
    host_view<T> got("got", n), expected("expected", n);
    check_carried(bytes, carried_on::two_ranks, [&] {
      kompress::reduce_scatter(host{}, send, got, MPI_COMM_WORLD, raw);
    });
    PMPI_Reduce_scatter_block(send.data(), expected.data(), int(n), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
    CHECK(same_bytes(got, expected));
  }
}

// --- the execution space's memory (support/device_views.hpp) ---------------------------------------

TEST_CASE_TEMPLATE("reduce_scatter on the execution space's memory, direct and staged", T, float, double) {
  const int p = size_of(), me = rank_of();
  const double e = 1e-3;
  for (const std::size_t n : {std::size_t(0), std::size_t(5), std::size_t(40003)}) {
    const std::size_t total = n * std::size_t(p);
    const auto values = make_data<T>(total, me + 3);
    host_view<T> sum("sum", total), magnitude("magnitude", total), abs_values("abs", total);
    for (std::size_t i = 0; i < total; ++i) abs_values(i) = std::fabs(values(i));
    MPI_Allreduce(values.data(), sum.data(), int(total), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(abs_values.data(), magnitude.data(), int(total), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
    host_view<T> block_sum("block_sum", n), block_magnitude("block_magnitude", n);
    for (std::size_t i = 0; i < n; ++i) {
      block_sum(i) = sum(std::size_t(me) * n + i);
      block_magnitude(i) = magnitude(std::size_t(me) * n + i);
    }
    const auto send = to_device(values);
    for (const auto mode : {kompress::transfer_mode::compressed, kompress::transfer_mode::raw}) {
      for (const form how : {form::blocking, form::nonblocking, form::persistent}) {
        std::vector<host_view<T>> scatters;
        for (const auto transport : transports) {
          kompress::collective_options options{.codec = {.bound = kompress::absolute(e)}, .mode = mode};
          options.transport = transport;
          const auto comm = MPI_COMM_WORLD;
          scatters.push_back(run_ring<T>(
              how, send, n,
              [&](auto& in, auto& out) { kompress::reduce_scatter(exec_space{}, in, out, comm, options); },
              [&](auto& in, auto& out) { return kompress::ireduce_scatter(exec_space{}, in, out, comm, options); },
              [&](auto& in, auto& out) {
                return kompress::reduce_scatter_init(exec_space{}, in, out, comm, options);
              }));
        }
        CAPTURE(n);
        CAPTURE(int(mode));
        CAPTURE(int(how));
        const bool compressed = mode == kompress::transfer_mode::compressed;
        for (std::size_t t = 0; t < scatters.size(); ++t) {
          CAPTURE(t);
          CHECK(count_beyond(scatters[t], block_sum, block_magnitude, compressed ? (p - 1) * e : 0.0) == 0);
        }
        // Compressed, both transports run the ring: the same bytes, the same sums.
        if (compressed) CHECK(same_bytes(scatters[0], scatters[1]));
      }
    }
  }
}

// --- the homomorphic reduction (comm/homomorphic_checks.hpp) ---------------------------------------

TEST_CASE_TEMPLATE("homomorphic reduce_scatter: within p * e of MPI_Reduce_scatter_block, the exact code sum" *
                       doctest::test_suite("slow"),
                   T, float, double) {
  for (const std::size_t n : homomorphic_sizes)
    for (std::size_t k = 0; k < std::size(homomorphic_option_sets); ++k)
      for (const bool nonblocking : {false, true}) {
        CAPTURE(n);
        CAPTURE(k);
        CAPTURE(nonblocking);
        const bool all_codes = check_homomorphic_reduce_scatter<T>(
            make_data<T>(n * std::size_t(size_of()), rank_of() + 5), homomorphic_option_sets[k], nonblocking, true);
        if (n >= 5000 && size_of() > 1 && homomorphic_option_sets[k].mode == kompress::transfer_mode::compressed)
          CHECK(all_codes);
      }
}

TEST_CASE_TEMPLATE(
    "homomorphic reduce_scatter: NaN, infinities, -0.0 and values off the grid are added in floating point", T, float,
    double) {
  const int me = rank_of(), p = size_of();
  const std::size_t n = 20000;
  const auto options = homomorphic({.codec = {.bound = kompress::absolute(1e-3)}});
  // Off the grid: |x / s| beyond 2^50 (s = 2^-10 here), on some ranks only.
  const T off_grid = T(1e15 * (me + 1));
  auto send = make_data<T>(n, me + 41);
  for (std::size_t i = std::size_t(me) * 7; i < n; i += 97) send(i) = std::numeric_limits<T>::quiet_NaN();
  for (std::size_t i = 13; i < n; i += 211)
    send(i) = (i / 211 + std::size_t(me)) % 2 ? std::numeric_limits<T>::infinity()
                                              : -std::numeric_limits<T>::infinity();
  for (std::size_t i = 50; i < n; i += 301) send(i) = T(-0.0);
  for (std::size_t i = std::size_t(me) * 3 + 100; i < n; i += 499) send(i) = off_grid;
  host_view<T> summands("summands", n * std::size_t(p));
  for (int r = 0; r < p; ++r)
    for (std::size_t i = 0; i < n; ++i) summands(std::size_t(r) * n + i) = send((i + std::size_t(r) * 31) % n);
  check_homomorphic_reduce_scatter<T>(summands, options, false, false);
}

TEST_CASE_TEMPLATE("homomorphic reduce_scatter: codes that do not compress travel raw and are still within the bound",
                   T, float, double) {
  // Uniform noise over +-1e4 at e = 1e-6 (float: its ulp there is 1e-3, so quantized codes span
  // 2^34 per block): every code message would be longer than the raw values.
  const int me = rank_of(), p = size_of();
  const std::size_t n = 10000;
  std::mt19937 rng(me + 51);
  std::uniform_real_distribution<double> uniform(-1e4, 1e4);
  const auto options = homomorphic({.codec = {.bound = kompress::absolute(1e-6)}});
  host_view<T> summands("summands", n * std::size_t(p));
  for (std::size_t i = 0; i < summands.size(); ++i) summands(i) = T(uniform(rng));
  CHECK(!check_homomorphic_reduce_scatter<T>(summands, options, true, false));
}

// --- measure_error --------------------------------------------------------------------------------

TEST_CASE("measure_error: reduce_scatter reports the largest error this rank's compressions introduced") {
  const int p = size_of(), me = rank_of();
  const std::size_t n = 6000;
  const double e = 1e-3;
  auto send = make_data<double>(n * std::size_t(p), me + 61);
  host_view<double> scattered("scattered", n);
  for (const auto method : {kompress::reduction_method::recompress, kompress::reduction_method::homomorphic}) {
    CAPTURE(int(method));
    const kompress::collective_options options{
        .codec = {.bound = kompress::absolute(e)}, .reduction = method, .measure_error = true};
    const auto report = kompress::reduce_scatter(host{}, send, scattered, MPI_COMM_WORLD, options);
    CHECK(report.max_error >= 0.0);  // not NaN
    CHECK(report.max_error <= e);    // one compression (or one quantization) at a time
    if (p > 1) CHECK(report.max_error > 0.0);
  }
}
