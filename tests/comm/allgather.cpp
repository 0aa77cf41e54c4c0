// allgather against plain MPI_Allgather, element by element, within the reported bound,
// bit-identical on every rank, in every form: blocking and nonblocking, pipelined, persistent
// (allgather_init), small raw calls carried inside the agreement (bit for bit, with the MPI calls
// counted), on the execution space's memory direct and staged, with NaN, infinities and -0.0,
// with the ratio codec on the wire, and measure_error. A bad call is in agreement.cpp, several
// requests in flight in requests.cpp, failures mid-flight in faults.cpp. Run under mpiexec -n 1,
// 2, 3 and 4.

#include <kompress/comm.hpp>

#include "comm/carried.hpp"
#include "comm/checks.hpp"
#include "support/device_views.hpp"
#include "support/mpi_checks.hpp"

#include <doctest/doctest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

using namespace kompress::test;  // support/mpi_checks.hpp, support/device_views.hpp, comm/*.hpp

/// A one-shot (i)allgather against MPI_Allgather within the reported bound (exact where no ring
/// compresses), bit-identical on every rank.
template <class T>
void check_allgather_against_mpi(std::size_t n, const kompress::collective_options& options, bool nonblocking) {
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
  const bool ring = may_compress(options) && p > 1 && n > 0;
  const double bound = ring ? e : 0.0;
  CHECK(report.absolute_bound <= bound * (1 + 1e-12));
  if (!ring) CHECK(report.compressed_messages == 0);
  if (ring && n >= 5000 && options.mode == kompress::transfer_mode::compressed) {
    const bool doubling = butterfly_runs(options, n * p * sizeof(T), kompress::detail::butterfly_collective::allgather);
    CHECK(report.messages == one_phase_messages(doubling));
    CHECK(report.compressed_messages == report.messages);
  }
  std::size_t violations = 0;
  for (std::size_t i = 0; i < n * p; ++i)
    violations += !(std::fabs(double(got(i)) - double(expected(i))) <= report.absolute_bound);
  CHECK(violations == 0);
  CHECK(identical_on_every_rank(got));
}

/// A pipelined (i)allgather against MPI_Allgather within its reported bound, at most
/// pipelined_abs_bound; bit-identical on every rank.
template <class T>
void check_pipelined_allgather(std::size_t n, const kompress::collective_options& options, bool nonblocking) {
  const int p = size_of(), me = rank_of();
  auto send = make_data<T>(n, me + 5);
  host_view<T> expected("expected", n * std::size_t(p)), got("got", n * std::size_t(p));
  MPI_Allgather(send.data(), int(n), mpi_type<T>(), expected.data(), int(n), mpi_type<T>(), MPI_COMM_WORLD);
  const auto report = finish<T>(
      nonblocking, [&] { return kompress::allgather(host{}, send, got, MPI_COMM_WORLD, options); },
      [&] { return kompress::iallgather(host{}, send, got, MPI_COMM_WORLD, options); });
  CHECK(report.absolute_bound <= pipelined_abs_bound);
  std::size_t violations = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    violations += !(std::fabs(double(got(i)) - double(expected(i))) <= report.absolute_bound);
  CHECK(violations == 0);
  CHECK(identical_on_every_rank(got.data(), got.size() * sizeof(T)));
}

/// allgather_init against MPI_Allgather, persistent_rounds rounds on new values each, within the
/// agreed bound; bit-identical on every rank.
template <class T>
void check_allgather_init(std::size_t n, const kompress::collective_options& options) {
  const int p = size_of(), me = rank_of();
  host_view<T> send("send", n), got("got", n * p), expected("expected", n * p);
  auto request = kompress::allgather_init(host{}, send, got, MPI_COMM_WORLD, options);
  for (int round = 0; round < persistent_rounds; ++round) {
    refill(send, me + 7, round);
    MPI_Allgather(send.data(), int(n), mpi_type<T>(), expected.data(), int(n), mpi_type<T>(), MPI_COMM_WORLD);
    const double e = agreed_bound(send, options.codec.bound);
    const auto report = run_round(request, round);
    CHECK(report.absolute_bound <= (may_compress(options) ? e * (1 + 1e-12) : 0.0));
    std::size_t violations = 0;
    for (std::size_t i = 0; i < got.size(); ++i)
      violations += !(std::fabs(double(got(i)) - double(expected(i))) <= report.absolute_bound);
    CHECK(violations == 0);
    CHECK(identical_on_every_rank(got));
  }
}

}  // namespace

// --- one-shot calls -------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("allgather matches MPI_Allgather within the bound, bit-identical on every rank", T, float, double) {
  for (const std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(33), std::size_t(5000)})
    for (std::size_t k = 0; k < std::size(ring_option_sets); ++k)
      for (const bool nonblocking : {false, true}) {
        CAPTURE(n);
        CAPTURE(k);
        CAPTURE(nonblocking);
        check_allgather_against_mpi<T>(n, ring_option_sets[k], nonblocking);
      }
}

TEST_CASE_TEMPLATE("both schedules, ring and recursive doubling, match MPI_Allgather within the bound", T, float,
                   double) {
  for_each_schedule_case(
      [](std::size_t n, const auto& options, bool nonblocking) {
        check_allgather_against_mpi<T>(n, options, nonblocking);
      },
      [](std::size_t n, const auto& options, bool nonblocking) {
        check_pipelined_allgather<T>(n, options, nonblocking);
      },
      [](std::size_t n, const auto& options) { check_allgather_init<T>(n, options); });
}

TEST_CASE_TEMPLATE("both schedules: where a decompression costs more than its bytes, each step's blocks are decoded "
                   "together, the same values",
                   T, float, double) {
  const int p = size_of(), me = rank_of();
  const std::size_t n = 30011;
  kompress::collective_options options{.codec = {.bound = kompress::relative(1e-3)},
                                       .schedule = kompress::collective_schedule::halving_doubling};
  options.cost.fixed_chunk_bytes = 16384;
  kompress::collective_options together = options;
  together.cost.decompress_call_seconds = 1.0;
  for (const auto transport : transports) {
    CAPTURE(int(transport));
    options.transport = together.transport = transport;
    const auto send = to_device(make_data<T>(n, me + 5));
    device_view<T> one_by_one("one_by_one", n * std::size_t(p)), batched("batched", n * std::size_t(p));
    codec_call_counter calls;
    kompress::allgather(exec_space{}, send, one_by_one, MPI_COMM_WORLD, options);
    const int alone = calls.take_decompressions();
    kompress::allgather(exec_space{}, send, batched, MPI_COMM_WORLD, together);
    const int batches = calls.take_decompressions();
    const auto a = to_host(one_by_one), b = to_host(batched);
    CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
    if (p > 1) CHECK(batches < alone);
  }
  together.transport = kompress::transport_mode::automatic;
  check_allgather_against_mpi<T>(n, together, false);
  check_allgather_against_mpi<T>(33, together, true);  // nonblocking
}

TEST_CASE_TEMPLATE("allgather carries NaN, infinities and -0.0 exactly", T, float, double) {
  const int p = size_of(), me = rank_of();
  const std::size_t n = 1000;
  const kompress::collective_options options{.codec = {.bound = kompress::relative(1e-3)}};
  auto send = make_data<T>(n, me + 31);
  sprinkle_special_values(send);
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
}

// --- pipelined ------------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("pipelined allgather matches MPI_Allgather within its bound", T, float, double) {
  const auto check = [](std::size_t n, const auto& options, bool nonblocking) {
    check_pipelined_allgather<T>(n, options, nonblocking);
  };
  for_each_pipelined_case({0, 1, 250, 1023, 5000, 60001}, 1023, check);
}

TEST_CASE_TEMPLATE("the ratio codec on the wire: allgather, whole and pipelined, any block size option", T, float,
                   double) {
  for_each_ratio_codec_case([](std::size_t n, const auto& options, bool nonblocking) {
    check_pipelined_allgather<T>(n, options, nonblocking);
  });
}

// --- persistent -----------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("allgather_init matches MPI_Allgather round after round", T, float, double) {
  for (const auto& options : persistent_option_sets)
    for (const std::size_t n : persistent_sizes) {
      CAPTURE(n);
      CAPTURE(int(options.mode));
      check_allgather_init<T>(n, options);
    }
}

// --- raw calls carried inside the agreement (comm/carried.hpp) -------------------------------------

TEST_CASE_TEMPLATE("raw allgather matches plain MPI bit for bit, inside the agreement, after it and beyond it", T,
                   float, double) {
  const int p = size_of(), me = rank_of();
  for (const std::size_t n : counts_around_limits<T>()) {
    CAPTURE(n);
    const auto bytes = n * sizeof(T);
    // n values from each rank
    const auto send = make_data<T>(n, me + 1);
    host_view<T> got("got", n * p), expected("expected", n * p);
    check_carried(bytes, carried_on::up_to_pairwise_ranks, [&] {
      kompress::allgather(host{}, send, got, MPI_COMM_WORLD, raw);
    });
    PMPI_Allgather(send.data(), int(n), mpi_type<T>(), expected.data(), int(n), mpi_type<T>(), MPI_COMM_WORLD);
    CHECK(same_bytes(got, expected));
  }
}

// --- the execution space's memory (support/device_views.hpp) ---------------------------------------

TEST_CASE_TEMPLATE("allgather on the execution space's memory, direct and staged", T, float, double) {
  const int p = size_of(), me = rank_of();
  const double e = 1e-3;
  for (const std::size_t n : {std::size_t(0), std::size_t(5), std::size_t(40003)}) {
    const std::size_t total = n * std::size_t(p);
    const auto values = make_data<T>(total, me + 3);
    const auto send = to_device(values);
    const device_view<T> own(send.data(), n);  // allgather sends the first n values
    host_view<T> own_gathered("own_gathered", total);
    MPI_Allgather(values.data(), int(n), mpi_type<T>(), own_gathered.data(), int(n), mpi_type<T>(), MPI_COMM_WORLD);
    for (const auto mode : {kompress::transfer_mode::compressed, kompress::transfer_mode::raw}) {
      for (const form how : {form::blocking, form::nonblocking, form::persistent}) {
        std::vector<host_view<T>> gathers;
        for (const auto transport : transports) {
          kompress::collective_options options{.codec = {.bound = kompress::absolute(e)}, .mode = mode};
          options.transport = transport;
          const auto comm = MPI_COMM_WORLD;
          gathers.push_back(run_ring<T>(
              how, own, total,
              [&](auto& in, auto& out) { kompress::allgather(exec_space{}, in, out, comm, options); },
              [&](auto& in, auto& out) { return kompress::iallgather(exec_space{}, in, out, comm, options); },
              [&](auto& in, auto& out) { return kompress::allgather_init(exec_space{}, in, out, comm, options); }));
        }
        CAPTURE(n);
        CAPTURE(int(mode));
        CAPTURE(int(how));
        const bool compressed = mode == kompress::transfer_mode::compressed;
        for (std::size_t t = 0; t < gathers.size(); ++t) {
          CAPTURE(t);
          CHECK(count_beyond(gathers[t], own_gathered, host_view<T>(), compressed ? e : 0.0) == 0);
          CHECK(identical_on_every_rank(gathers[t]));
        }
        // Compressed, both transports run the ring: the same bytes, the same values.
        if (compressed) CHECK(same_bytes(gathers[0], gathers[1]));
      }
    }
  }
}

// --- measure_error --------------------------------------------------------------------------------

TEST_CASE("measure_error: allgather reports the largest error this rank's compressions introduced") {
  const int p = size_of(), me = rank_of();
  const std::size_t n = 6000;
  const double e = 1e-3;
  auto send = make_data<double>(n * std::size_t(p), me + 61);
  host_view<double> gathered("gathered", n * std::size_t(p) * std::size_t(p));
  for (const auto method : {kompress::reduction_method::recompress, kompress::reduction_method::homomorphic}) {
    CAPTURE(int(method));
    const kompress::collective_options options{
        .codec = {.bound = kompress::absolute(e)}, .reduction = method, .measure_error = true};
    const auto report = kompress::allgather(host{}, send, gathered, MPI_COMM_WORLD, options);
    CHECK(report.max_error >= 0.0);  // not NaN
    CHECK(report.max_error <= e);    // one compression (or one quantization) at a time
    if (p > 1) CHECK(report.max_error > 0.0);
  }
  // allgather's measured error is the largest |decoded - sent| of this rank's own block.
  const kompress::collective_options measured{.codec = {.bound = kompress::absolute(e)}, .measure_error = true};
  const auto report = kompress::allgather(host{}, send, gathered, MPI_COMM_WORLD, measured);
  double own = 0.0;
  for (std::size_t i = 0; i < send.size(); ++i)
    own = std::max(own, std::fabs(gathered(std::size_t(me) * send.size() + i) - send(i)));
  CHECK(report.max_error == own);
}
