// allreduce against plain MPI_Allreduce, element by element, within the documented bound (p times
// the bound per rank, or the bound itself in total) plus the summation error, bit-identical on
// every rank, in every form: blocking and nonblocking, in place, pipelined, persistent
// (allreduce_init), small raw calls carried inside the agreement (bit for bit, with the MPI
// calls counted), on the execution space's memory direct and staged, with the ratio codec on the
// wire, and with the homomorphic reduction (where every message carried codes, bit for bit the
// exact integer sum of every rank's codes) and measure_error. A bad call is in agreement.cpp,
// several requests in flight in requests.cpp, failures mid-flight in faults.cpp. Run under
// mpiexec -n 1, 2, 3 and 4; the cases of test suite "slow" are registered apart
// (tests/CMakeLists.txt).

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

/// A one-shot allreduce (in place or not) against MPI_Allreduce: within p times the bound (the
/// bound itself with allreduce_bound::total) plus the summation error, bit-identical on every
/// rank.
template <class T>
void check_allreduce_against_mpi(std::size_t n, const kompress::collective_options& options, bool in_place) {
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
  const double e = options.codec.bound.mode == kompress::bound_mode::absolute
                       ? options.codec.bound.value
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

/// A pipelined (i)allreduce against MPI_Allreduce within its reported bound, at most p times
/// pipelined_abs_bound, plus the summation error; bit-identical on every rank.
template <class T>
void check_pipelined_allreduce(std::size_t n, const kompress::collective_options& options, bool nonblocking) {
  const int p = size_of(), me = rank_of();
  auto send = make_data<T>(n, me + 3);
  host_view<T> expected("expected", n), magnitude("magnitude", n), abs_send("abs", n), got("got", n);
  MPI_Allreduce(send.data(), expected.data(), int(n), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
  for (std::size_t i = 0; i < n; ++i) abs_send(i) = std::fabs(send(i));
  MPI_Allreduce(abs_send.data(), magnitude.data(), int(n), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
  const auto report = finish<T>(
      nonblocking, [&] { return kompress::allreduce(host{}, send, got, MPI_COMM_WORLD, options); },
      [&] { return kompress::iallreduce(host{}, send, got, MPI_COMM_WORLD, options); });
  const bool ring = p > 1 && n > 0;
  CHECK(report.absolute_bound <= (ring ? p * pipelined_abs_bound : 0.0) * (1 + 1e-12));
  constexpr double eps = std::numeric_limits<T>::epsilon();
  std::size_t violations = 0;
  for (std::size_t i = 0; i < n; ++i)
    violations += !(std::fabs(double(got(i)) - double(expected(i))) <=
                    report.absolute_bound + 2.0 * p * eps * double(magnitude(i)));
  CHECK(violations == 0);
  CHECK(identical_on_every_rank(got.data(), n * sizeof(T)));
}

/// allreduce_init (in place or not) against MPI_Allreduce, persistent_rounds rounds on new values
/// each: within p times the bound plus the summation error, bit-identical on every rank.
template <class T>
void check_allreduce_init(std::size_t n, const kompress::collective_options& options, bool in_place) {
  const int p = size_of(), me = rank_of();
  host_view<T> send("send", n), got("got", n), expected("expected", n), magnitude("magnitude", n), abs_send("abs", n);
  const host_view<T> out = in_place ? send : got;
  auto request = kompress::allreduce_init(host{}, send, out, MPI_COMM_WORLD, options);
  constexpr double eps = std::numeric_limits<T>::epsilon();
  for (int round = 0; round < persistent_rounds; ++round) {
    refill(send, me + 5, round);
    MPI_Allreduce(send.data(), expected.data(), int(n), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
    for (std::size_t i = 0; i < n; ++i) abs_send(i) = std::fabs(send(i));
    MPI_Allreduce(abs_send.data(), magnitude.data(), int(n), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
    const double e = agreed_bound(send, options.codec.bound);
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

struct run_kind {
  bool nonblocking = false;
  bool in_place = false;
};

/// A homomorphic (i)allreduce, in place or not, against MPI_Allreduce within p * e, bit-identical
/// on every rank and, where every message carried codes and `expect_exact_codes`, the exact sum
/// of every rank's codes. Returns whether every rank sent every message as codes.
template <class T>
bool check_homomorphic_allreduce(const host_view<T>& send, const kompress::collective_options& options, run_kind kind,
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
  CHECK(homomorphic_violations(got, expected, magnitude, report.absolute_bound) == 0);
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

}  // namespace

// --- one-shot calls -------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("allreduce matches MPI_Allreduce within p times the bound, bit-identical on every rank", T, float,
                   double) {
  for (const std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(3), std::size_t(1001), std::size_t(123457)}) {
    CAPTURE(n);
    check_allreduce_against_mpi<T>(n, {.codec = {.bound = kompress::absolute(1e-3)}}, false);
    check_allreduce_against_mpi<T>(n, {.codec = {.bound = kompress::relative(1e-3)}}, true);
    check_allreduce_against_mpi<T>(
        n, {.codec = {.bound = kompress::absolute(1e-2)}, .reduction_bound = kompress::allreduce_bound::total}, false);
  }
  check_allreduce_against_mpi<T>(
      50000, {.codec = {.bound = kompress::absolute(1e-3)}, .mode = kompress::transfer_mode::raw}, true);
  check_allreduce_against_mpi<T>(
      500000, {.codec = {.bound = kompress::absolute(1e-3)}, .mode = kompress::transfer_mode::automatic}, false);
}

TEST_CASE_TEMPLATE("both schedules, ring and halving-doubling, match MPI_Allreduce within p times the bound", T, float,
                   double) {
  for (const auto schedule : {kompress::collective_schedule::ring, kompress::collective_schedule::halving_doubling}) {
    CAPTURE(int(schedule));
    for (const std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(3), std::size_t(1001), std::size_t(98765)}) {
      CAPTURE(n);
      check_allreduce_against_mpi<T>(n, {.codec = {.bound = kompress::absolute(1e-3)}, .schedule = schedule}, false);
      check_allreduce_against_mpi<T>(n, {.codec = {.bound = kompress::relative(1e-3)}, .schedule = schedule}, true);
      check_allreduce_against_mpi<T>(n,
                                     {.codec = {.bound = kompress::absolute(1e-2)},
                                      .reduction_bound = kompress::allreduce_bound::total,
                                      .schedule = schedule},
                                     false);
    }
    for_each_pipelined_case({0, 1, 1023, 60001}, 1023, [&](std::size_t n, auto options, bool nonblocking) {
      options.schedule = schedule;
      check_pipelined_allreduce<T>(n, options, nonblocking);
    });
  }
}

TEST_CASE_TEMPLATE("both schedules: where a decompression costs more than its bytes, final streams are decoded "
                   "together per step, the same values",
                   T, float, double) {
  const int p = size_of(), me = rank_of();
  const std::size_t n = 98765;
  const auto values = make_data<T>(n, me + 3);
  kompress::collective_options options{.codec = {.bound = kompress::relative(1e-3)},
                                       .schedule = kompress::collective_schedule::halving_doubling};
  options.cost.fixed_chunk_bytes = 16384;  // many pieces per final block, the same cut in both runs
  kompress::collective_options together = options;
  together.cost.decompress_call_seconds = 1.0;
  REQUIRE(together.cost.batches_decodes(16384.0));
  REQUIRE_FALSE(options.cost.batches_decodes(16384.0));
  for (const auto transport : transports) {
    CAPTURE(int(transport));
    options.transport = together.transport = transport;
    const auto send = to_device(values);
    device_view<T> one_by_one("one_by_one", n), batched("batched", n);
    codec_call_counter calls;
    kompress::allreduce(exec_space{}, send, one_by_one, MPI_COMM_WORLD, options);
    const int alone = calls.take_decompressions();
    kompress::allreduce(exec_space{}, send, batched, MPI_COMM_WORLD, together);
    const int batches = calls.take_decompressions();
    const auto a = to_host(one_by_one), b = to_host(batched);
    CHECK(std::memcmp(a.data(), b.data(), n * sizeof(T)) == 0);
    // A core rank decodes its final pieces once per doubling step instead of once each.
    if (p > 1) CHECK(batches < alone);
  }
  together.transport = kompress::transport_mode::automatic;
  check_allreduce_against_mpi<T>(n, together, false);
  check_allreduce_against_mpi<T>(1001, together, true);
}

TEST_CASE("automatic schedule: the one the cost model predicts faster runs, one message per step") {
  const int p = size_of(), me = rank_of();
  const std::size_t n = 20000;
  auto send = make_data<float>(n, me + 9);
  host_view<float> got("got", n);
  // Messages per rank: the ring's 2 (p-1) steps; halving and doubling's 2 log2 p', one more on
  // a rank that hands the result to a folded rank, one in all on a folded rank.
  const int core = int(std::bit_floor(unsigned(p))), k = std::countr_zero(unsigned(core));
  const bool folds = me < 2 * (p - core), folded_out = folds && me % 2 == 0;
  const std::uint64_t ring_messages = 2 * std::uint64_t(p - 1);
  const std::uint64_t butterfly_messages = folded_out ? 1 : 2 * std::uint64_t(k) + (folds ? 1 : 0);
  for (const double latency : {1.0, 0.0}) {
    CAPTURE(latency);
    kompress::collective_options options{.codec = {.bound = kompress::absolute(1e-3)}};
    options.cost.latency_seconds = latency;
    const bool predicted = kompress::detail::takes_halving_doubling(
        kompress::collective_schedule::automatic, {kompress::transfer_mode::compressed, options.cost},
        n * sizeof(float), p);
    // Seconds per step: fewer steps at a power of two from 4 ranks on; bytes alone on 3.
    if (p == 4 && latency > 0) CHECK(predicted);
    if (p == 3 && latency == 0) CHECK_FALSE(predicted);
    const auto report = kompress::allreduce(host{}, send, got, MPI_COMM_WORLD, options);
    if (p > 1) CHECK(report.messages == (predicted ? butterfly_messages : ring_messages));
  }
}

TEST_CASE("allreduce of 64 MiB" * doctest::test_suite("slow")) {
  const std::size_t n = (64u << 20) / sizeof(float);
  check_allreduce_against_mpi<float>(n, {.codec = {.bound = kompress::relative(1e-3)}}, false);
}

TEST_CASE("one rank: allreduce is the identity, as in plain MPI") {
  auto data = make_data<double>(1000, rank_of());
  host_view<double> out("out", 1000), expected("expected", 1000);
  for (const auto mode : {kompress::transfer_mode::compressed, kompress::transfer_mode::raw}) {
    const kompress::collective_options options{.codec = {.bound = kompress::absolute(1e-3)}, .mode = mode};
    MPI_Allreduce(data.data(), expected.data(), 1000, MPI_DOUBLE, MPI_SUM, MPI_COMM_SELF);
    kompress::allreduce(host{}, data, out, MPI_COMM_SELF, options);
    CHECK(std::memcmp(out.data(), expected.data(), 1000 * sizeof(double)) == 0);
  }
}

// --- pipelined ------------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("pipelined allreduce matches MPI_Allreduce within its bound", T, float, double) {
  const auto check = [](std::size_t n, const auto& options, bool nonblocking) {
    check_pipelined_allreduce<T>(n, options, nonblocking);
  };
  for_each_pipelined_case({0, 1, 250, 1023, 5000, 60001}, 1023, check);
}

TEST_CASE_TEMPLATE("pipelined homomorphic allreduce: codes added piece by piece", T, float, double) {
  for_each_pipelined_homomorphic_case([](std::size_t n, const auto& options, bool nonblocking) {
    check_pipelined_allreduce<T>(n, options, nonblocking);
  });
}

TEST_CASE_TEMPLATE("the ratio codec on the wire: allreduce, whole and pipelined, any block size option", T, float,
                   double) {
  for_each_ratio_codec_case([](std::size_t n, const auto& options, bool nonblocking) {
    check_pipelined_allreduce<T>(n, options, nonblocking);
  });
}

// --- persistent -----------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("allreduce_init matches MPI_Allreduce round after round, bit-identical on every rank", T, float,
                   double) {
  for (const auto& options : persistent_option_sets)
    for (const std::size_t n : persistent_sizes) {
      CAPTURE(n);
      CAPTURE(int(options.mode));
      check_allreduce_init<T>(n, options, false);
      check_allreduce_init<T>(n, options, true);
    }
  kompress::collective_options homomorphic{.codec = {.bound = kompress::absolute(1e-3)},
                                           .reduction = kompress::reduction_method::homomorphic};
  check_allreduce_init<T>(5000, homomorphic, false);
}

// --- raw calls carried inside the agreement (comm/carried.hpp) -------------------------------------

TEST_CASE_TEMPLATE("raw allreduce matches plain MPI bit for bit, inside the agreement, after it and beyond it", T,
                   float, double) {
  const int me = rank_of();
  for (const std::size_t n : counts_around_limits<T>()) {
    CAPTURE(n);
    const auto bytes = n * sizeof(T);
    // n values, out of place, in place, and nonblocking
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

// --- the execution space's memory (support/device_views.hpp) ---------------------------------------

TEST_CASE_TEMPLATE("allreduce on the execution space's memory, direct and staged", T, float, double) {
  const int p = size_of(), me = rank_of();
  const double e = 1e-3;
  for (const std::size_t n : {std::size_t(0), std::size_t(5), std::size_t(40003)}) {
    const std::size_t total = n * std::size_t(p);
    const auto values = make_data<T>(total, me + 3);
    host_view<T> sum("sum", total), magnitude("magnitude", total), abs_values("abs", total);
    for (std::size_t i = 0; i < total; ++i) abs_values(i) = std::fabs(values(i));
    MPI_Allreduce(values.data(), sum.data(), int(total), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(abs_values.data(), magnitude.data(), int(total), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
    const auto send = to_device(values);
    for (const auto mode : {kompress::transfer_mode::compressed, kompress::transfer_mode::raw}) {
      for (const form how : {form::blocking, form::nonblocking, form::persistent}) {
        std::vector<host_view<T>> sums;
        for (const auto transport : transports) {
          kompress::collective_options options{.codec = {.bound = kompress::absolute(e)}, .mode = mode};
          options.transport = transport;
          const auto comm = MPI_COMM_WORLD;
          sums.push_back(run_ring<T>(
              how, send, total, [&](auto& in, auto& out) { kompress::allreduce(exec_space{}, in, out, comm, options); },
              [&](auto& in, auto& out) { return kompress::iallreduce(exec_space{}, in, out, comm, options); },
              [&](auto& in, auto& out) { return kompress::allreduce_init(exec_space{}, in, out, comm, options); }));
        }
        CAPTURE(n);
        CAPTURE(int(mode));
        CAPTURE(int(how));
        const bool compressed = mode == kompress::transfer_mode::compressed;
        for (std::size_t t = 0; t < sums.size(); ++t) {
          CAPTURE(t);
          CHECK(count_beyond(sums[t], sum, magnitude, compressed ? p * e : 0.0) == 0);
          CHECK(identical_on_every_rank(sums[t]));
        }
        // Compressed, both transports run the ring: the same bytes, the same sums.
        if (compressed) CHECK(same_bytes(sums[0], sums[1]));
      }
    }
  }
}

TEST_CASE("allreduce in place, staged; the homomorphic reduction staged on host memory, refused on a device") {
  const int p = size_of(), me = rank_of();
  const std::size_t n = 30011;
  const auto values = make_data<double>(n, me + 5);
  host_view<double> sum("sum", n);
  MPI_Allreduce(values.data(), sum.data(), int(n), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  for (const auto reduction : {kompress::reduction_method::recompress, kompress::reduction_method::homomorphic}) {
    std::vector<host_view<double>> results;
    std::vector<kompress::collective_report> reports;
    for (const auto transport : transports) {
      kompress::collective_options options{.codec = {.bound = kompress::relative(1e-3)},
                                           .reduction = reduction,
                                           .measure_error = true};
      options.transport = transport;
      auto data = to_device(values);
      const bool device = !kompress::detail::host_memory_space<exec_space::memory_space>;
      if (device && reduction == kompress::reduction_method::homomorphic) {
        CHECK_THROWS_AS(kompress::allreduce(exec_space{}, data, MPI_COMM_WORLD, options), kompress::invalid_argument);
        continue;
      }
      reports.push_back(kompress::allreduce(exec_space{}, data, MPI_COMM_WORLD, options));
      results.push_back(to_host(data));
    }
    CAPTURE(int(reduction));
    for (std::size_t t = 0; t < results.size(); ++t) {
      CHECK(count_beyond(results[t], sum, host_view<double>(), reports[t].absolute_bound + 1e-9) == 0);
      if (p > 1) CHECK(reports[t].max_error <= reports[t].absolute_bound / p * (1 + 1e-12));
    }
    if (results.size() == 2) CHECK(same_bytes(results[0], results[1]));
  }
}

// --- the homomorphic reduction (comm/homomorphic_checks.hpp) ---------------------------------------

TEST_CASE_TEMPLATE("homomorphic allreduce: within p * e of MPI_Allreduce, the exact code sum, bit-identical" *
                       doctest::test_suite("slow"),
                   T, float, double) {
  for (const std::size_t n : homomorphic_sizes)
    for (std::size_t k = 0; k < std::size(homomorphic_option_sets); ++k)
      for (const run_kind kind : {run_kind{}, run_kind{true, false}, run_kind{false, true}}) {
        CAPTURE(n);
        CAPTURE(k);
        CAPTURE(kind.nonblocking);
        CAPTURE(kind.in_place);
        const bool all_codes =
            check_homomorphic_allreduce<T>(make_data<T>(n, rank_of() + 3), homomorphic_option_sets[k], kind, true);
        // Smooth data: every hop carries codes, so the exact code-sum comparison ran.
        if (n >= 5000 && size_of() > 1 && homomorphic_option_sets[k].mode == kompress::transfer_mode::compressed)
          CHECK(all_codes);
      }
}

TEST_CASE_TEMPLATE("homomorphic allreduce: NaN, infinities, -0.0 and values off the grid are added in floating point",
                   T, float, double) {
  const int me = rank_of();
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
  for (const bool nonblocking : {false, true}) {
    CAPTURE(nonblocking);
    check_homomorphic_allreduce<T>(send, options, run_kind{nonblocking, false}, false);
  }
}

TEST_CASE_TEMPLATE("homomorphic allreduce: codes that do not compress travel raw and are still within the bound", T,
                   float, double) {
  // Uniform noise over +-1e4 at e = 1e-6 (float: its ulp there is 1e-3, so quantized codes span
  // 2^34 per block): every code message would be longer than the raw values.
  const int me = rank_of();
  const std::size_t n = 10000;
  host_view<T> send("send", n);
  std::mt19937 rng(me + 51);
  std::uniform_real_distribution<double> uniform(-1e4, 1e4);
  for (std::size_t i = 0; i < n; ++i) send(i) = T(uniform(rng));
  const auto options = homomorphic({.codec = {.bound = kompress::absolute(1e-6)}});
  CHECK(!check_homomorphic_allreduce<T>(send, options, run_kind{}, false));
}

TEST_CASE("homomorphic: code sums near the overflow guard stay exact") {
  // e = 1: s = 2, so codes of values near 2^51 are near the per-rank limit (2^50 for p <= 8);
  // p of them sum near 2^52 without wrapping. Doubles: every such value is on the grid.
  const int me = rank_of();
  const std::size_t n = 4096;
  host_view<double> send("send", n);
  for (std::size_t i = 0; i < n; ++i) send(i) = (i < n / 2 ? 1.0 : -1.0) * (0x1p51 - double(i) * 1024.0 - 2.0 * me);
  const auto options = homomorphic({.codec = {.bound = kompress::absolute(1.0)}});
  const bool all_codes = check_homomorphic_allreduce<double>(send, options, run_kind{}, true);
  if (size_of() > 1) CHECK(all_codes);
}

TEST_CASE("measure_error: allreduce reports the largest error this rank's compressions introduced") {
  const int p = size_of(), me = rank_of();
  const std::size_t n = 6000;
  const double e = 1e-3;
  auto send = make_data<double>(n * std::size_t(p), me + 61);
  host_view<double> sum("sum", n * std::size_t(p));
  for (const auto method : {kompress::reduction_method::recompress, kompress::reduction_method::homomorphic}) {
    CAPTURE(int(method));
    const kompress::collective_options options{
        .codec = {.bound = kompress::absolute(e)}, .reduction = method, .measure_error = true};
    const auto report = kompress::allreduce(host{}, send, sum, MPI_COMM_WORLD, options);
    CHECK(report.max_error >= 0.0);  // not NaN
    CHECK(report.max_error <= e);    // one compression (or one quantization) at a time
    if (p > 1) CHECK(report.max_error > 0.0);
  }
  // Without measure_error: NaN.
  const kompress::collective_options quiet{.codec = {.bound = kompress::absolute(e)}};
  CHECK(std::isnan(kompress::allreduce(host{}, send, sum, MPI_COMM_WORLD, quiet).max_error));
}
