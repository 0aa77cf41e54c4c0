// alltoall and alltoallv against plain MPI, element by element, within the documented bound, in
// every form: blocking and nonblocking, pipelined, persistent (alltoall_init, alltoallv_init),
// small raw calls carried inside the agreement (bit for bit, with the MPI calls counted), on the
// execution space's memory direct and staged, on real data, and with the ratio codec on the wire.
// A bad call is in agreement.cpp, several requests in flight in requests.cpp, failures mid-flight
// in faults.cpp. Run under mpiexec -n 1, 2, 3 and 4; the cases of test suite "slow" are
// registered apart (tests/CMakeLists.txt).

#include "data_sample.hpp"

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
#include <numeric>
#include <string>
#include <vector>

namespace {

using namespace kompress::test;  // support/mpi_checks.hpp, support/device_views.hpp, comm/*.hpp

/// A one-shot alltoall against MPI_Alltoall: the block to itself exact, each other block within
/// its sender's bound; compressed messages at least 1.5x smaller where they may be.
template <class T>
void check_alltoall_against_mpi(std::size_t per_peer, const kompress::collective_options& options) {
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
  if (options.mode == kompress::transfer_mode::compressed && options.codec.bound.value > 0 && per_peer >= 4096 &&
      p > 1)
    CHECK(report.ratio() > 1.5);
}

/// alltoall_init against MPI_Alltoall, persistent_rounds rounds on new values each.
template <class T>
void check_alltoall_init(std::size_t per_peer, const kompress::collective_options& options) {
  const int p = size_of(), me = rank_of();
  host_view<T> send("send", per_peer * p), got("got", per_peer * p), expected("expected", per_peer * p);
  auto request = kompress::alltoall_init(host{}, send, got, MPI_COMM_WORLD, options);
  for (int round = 0; round < persistent_rounds; ++round) {
    refill(send, me + 1, round);
    MPI_Alltoall(send.data(), int(per_peer), mpi_type<T>(), expected.data(), int(per_peer), mpi_type<T>(),
                 MPI_COMM_WORLD);
    const auto report = run_round(request, round);
    const double e = may_compress(options) ? max_over_ranks(sender_bound(send, options.codec.bound)) : 0.0;
    CHECK(report.absolute_bound <= e * (1 + 1e-12));
    std::size_t violations = 0;
    for (std::size_t i = 0; i < got.size(); ++i)
      violations += !(std::fabs(double(got(i)) - double(expected(i))) <= report.absolute_bound);
    CHECK(violations == 0);
    if (!may_compress(options)) CHECK(report.compressed_messages == 0);
  }
}

/// alltoallv_init against MPI_Alltoallv, persistent_rounds rounds on new values each.
template <class T>
void check_alltoallv_init(std::size_t scale, const kompress::collective_options& options) {
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
  for (int round = 0; round < persistent_rounds; ++round) {
    refill(send, me + 3, round);
    MPI_Alltoallv(send.data(), sc.data(), sd.data(), mpi_type<T>(), expected.data(), rc.data(), rd.data(),
                  mpi_type<T>(), MPI_COMM_WORLD);
    const auto report = run_round(request, round);
    const double e = may_compress(options) ? max_over_ranks(sender_bound(send, options.codec.bound)) : 0.0;
    CHECK(report.absolute_bound <= e * (1 + 1e-12));
    std::size_t violations = 0;
    for (std::size_t i = 0; i < got.size(); ++i)
      violations += !(std::fabs(double(got(i)) - double(expected(i))) <= report.absolute_bound);
    CHECK(violations == 0);
  }
}

}  // namespace

// --- one-shot calls -------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("alltoall matches MPI_Alltoall within the bound", T, float, double) {
  for (const std::size_t per_peer : {std::size_t(0), std::size_t(1), std::size_t(31), std::size_t(1000),
                                     std::size_t(33 * 64 + 5), std::size_t(70001)}) {
    for (const auto bound : {kompress::absolute(1e-3), kompress::relative(1e-2), kompress::lossless()}) {
      CAPTURE(per_peer);
      check_alltoall_against_mpi<T>(per_peer, {.codec = {.bound = bound}});
    }
  }
  check_alltoall_against_mpi<T>(20000,
                                {.codec = {.bound = kompress::absolute(1e-3)}, .mode = kompress::transfer_mode::raw});
  const kompress::collective_options automatic{.codec = {.bound = kompress::absolute(1e-3)},
                                               .mode = kompress::transfer_mode::automatic};
  check_alltoall_against_mpi<T>(200000, automatic);
  check_alltoall_against_mpi<T>(100, automatic);
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
    const auto options =
        kompress::collective_options{.codec = {.bound = kompress::relative(1e-2)}, .measure_error = true};
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

TEST_CASE("alltoall of 64 MiB" * doctest::test_suite("slow")) {
  const std::size_t n = (64u << 20) / sizeof(float);
  check_alltoall_against_mpi<float>(n / std::size_t(size_of()), {.codec = {.bound = kompress::relative(1e-3)}});
}

TEST_CASE_TEMPLATE("alltoallv with zero and uneven counts", T, float, double) {
  const uneven_layout layout;  // some counts are zero
  const std::size_t total_recv = layout.recv_total();
  auto send = make_data<T>(layout.send_total(), rank_of() + 7);
  host_view<T> got("got", total_recv + 3), expected("expected", total_recv + 3);
  for (const auto mode :
       {kompress::transfer_mode::compressed, kompress::transfer_mode::raw, kompress::transfer_mode::automatic}) {
    const auto options = kompress::collective_options{.codec = {.bound = kompress::absolute(1e-4)}, .mode = mode};
    kompress::alltoallv(host{}, send, layout.send_counts, layout.send_displs, got, layout.recv_counts,
                        layout.recv_displs, MPI_COMM_WORLD, options);
    layout.mpi_alltoallv(send.data(), expected.data());
    std::size_t violations = 0;
    for (std::size_t k = 0; k < total_recv; ++k)
      violations += !(std::fabs(double(got(k)) - double(expected(k))) <= 1e-4);
    CHECK(violations == 0);
  }
}

TEST_CASE("one rank: alltoall and alltoallv are a local copy, as in plain MPI") {
  auto data = make_data<double>(1000, rank_of());
  host_view<double> out("out", 1000);
  for (const auto mode : {kompress::transfer_mode::compressed, kompress::transfer_mode::raw}) {
    const kompress::collective_options options{.codec = {.bound = kompress::absolute(1e-3)}, .mode = mode};
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

// --- pipelined ------------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("pipelined alltoall matches MPI_Alltoall within the bound", T, float, double) {
  const auto check = [](std::size_t n, const auto& options, bool nonblocking) {
    check_pipelined_alltoall<T>(n, options, nonblocking);
  };
  for_each_pipelined_case({0, 1, 125, 1024, 4099, 40000}, 1024, check);
}

TEST_CASE_TEMPLATE("pipelined alltoallv with zero and uneven counts", T, float, double) {
  const uneven_layout layout;
  const auto& [send_counts, send_displs, recv_counts, recv_displs] = layout;
  const std::size_t total_recv = layout.recv_total();
  auto send = make_data<T>(layout.send_total(), rank_of() + 7);
  host_view<T> got("got", total_recv), expected("expected", total_recv);
  layout.mpi_alltoallv(send.data(), expected.data());
  for (const std::size_t chunk : {std::size_t(1000), std::size_t(0)})
    for (const bool nonblocking : {false, true}) {
      CAPTURE(chunk);
      CAPTURE(nonblocking);
      std::fill_n(got.data(), total_recv, T(NAN));
      const auto options = chunked(chunk);
      finish<T>(
          nonblocking,
          [&] {
            return kompress::alltoallv(host{}, send, send_counts, send_displs, got, recv_counts, recv_displs,
                                       MPI_COMM_WORLD, options);
          },
          [&] {
            return kompress::ialltoallv(host{}, send, send_counts, send_displs, got, recv_counts, recv_displs,
                                        MPI_COMM_WORLD, options);
          });
      std::size_t violations = 0;
      for (std::size_t k = 0; k < total_recv; ++k)
        violations += !(std::fabs(double(got(k)) - double(expected(k))) <= pipelined_abs_bound);
      CHECK(violations == 0);
    }
}

TEST_CASE_TEMPLATE("the ratio codec on the wire: alltoall, whole and pipelined, any block size option", T, float,
                   double) {
  for_each_ratio_codec_case([](std::size_t n, const auto& options, bool nonblocking) {
    check_pipelined_alltoall<T>(n, options, nonblocking);
  });
}

// --- persistent -----------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("alltoall_init and alltoallv_init match MPI round after round, within the bound", T, float,
                   double) {
  for (const auto& options : persistent_option_sets)
    for (const std::size_t n : persistent_sizes) {
      CAPTURE(n);
      CAPTURE(int(options.mode));
      check_alltoall_init<T>(n, options);
      check_alltoallv_init<T>(n, options);
    }
}

// --- raw calls carried inside the agreement (comm/carried.hpp) -------------------------------------

TEST_CASE_TEMPLATE("raw alltoall matches plain MPI bit for bit, inside the agreement, after it and beyond it", T, float,
                   double) {
  const int p = size_of(), me = rank_of();
  for (const std::size_t n : counts_around_limits<T>()) {
    CAPTURE(n);
    const auto bytes = n * sizeof(T);
    // n values per peer
    const auto send = make_data<T>(n * p, me + 3);
    host_view<T> got("got", n * p), expected("expected", n * p);
    check_carried(bytes, carried_on::up_to_pairwise_ranks, [&] {
      kompress::alltoall(host{}, send, got, MPI_COMM_WORLD, raw);
    });
    PMPI_Alltoall(send.data(), int(n), mpi_type<T>(), expected.data(), int(n), mpi_type<T>(), MPI_COMM_WORLD);
    CHECK(same_bytes(got, expected));
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
  p2p_calls = {};
  collective_calls = {};
  p2p_calls.counting = collective_calls.counting = true;
  kompress::alltoallv(host{}, send, send_counts, send_displs, got, recv_counts, recv_displs, MPI_COMM_WORLD, raw);
  p2p_calls.counting = collective_calls.counting = false;
  if (p == 2) CHECK(collective_calls.count + p2p_calls.data_messages == 0);
  // On more ranks alltoallv's data does not ride (blocks of any size in any order): the
  // agreement between pairs is headers alone.
  if (p > 2 && p <= pairwise_ranks) CHECK(p2p_calls.agreement_bytes == (p - 1) * 64);
  PMPI_Alltoallv(send.data(), send_counts.data(), send_displs.data(), MPI_FLOAT, expected.data(), recv_counts.data(),
                 recv_displs.data(), MPI_FLOAT, MPI_COMM_WORLD);
  CHECK(same_bytes(got, expected));
}

// --- the execution space's memory (support/device_views.hpp) ---------------------------------------

TEST_CASE_TEMPLATE("alltoall on the execution space's memory, direct and staged, matches MPI_Alltoall", T, float,
                   double) {
  const int p = size_of(), me = rank_of();
  for (const std::size_t per_peer : {std::size_t(0), std::size_t(1), std::size_t(1000), std::size_t(70001)}) {
    for (const auto mode : {kompress::transfer_mode::compressed, kompress::transfer_mode::raw,
                            kompress::transfer_mode::automatic}) {
      const auto bound = kompress::relative(1e-2);
      const auto values = make_data<T>(per_peer * std::size_t(p), me + 1);
      host_view<T> expected("expected", values.size());
      const int bytes = int(per_peer * sizeof(T));
      MPI_Alltoall(values.data(), bytes, MPI_BYTE, expected.data(), bytes, MPI_BYTE, MPI_COMM_WORLD);
      const auto bounds = bounds_over_blocks_to_others(values, std::max<std::size_t>(per_peer, 1), bound);
      const auto send = to_device(values);
      std::vector<host_view<T>> results;
      std::vector<kompress::collective_report> reports;
      for (const auto transport : transports) {
        kompress::collective_options options{.codec = {.bound = bound}, .mode = mode, .measure_error = true};
        options.transport = transport;
        options.cost.min_message_bytes = 1;  // automatic mode weighs even the small blocks
        device_view<T> got("got", values.size());
        reports.push_back(kompress::alltoall(exec_space{}, send, got, MPI_COMM_WORLD, options));
        results.push_back(to_host(got));
      }
      CAPTURE(per_peer);
      CAPTURE(int(mode));
      std::size_t violations = 0;
      for (std::size_t k = 0; k < values.size(); ++k) {
        const std::size_t source = k / per_peer;
        const double e = int(source) == me ? 0.0 : bounds[source];
        violations += !(std::fabs(double(results[0](k)) - double(expected(k))) <= e);
      }
      CHECK(violations == 0);
      CHECK(same_bytes(results[0], results[1]));
      CHECK(reports[0].wire_bytes == reports[1].wire_bytes);
      CHECK(reports[1].max_error <= bounds[std::size_t(me)]);
      if (mode == kompress::transfer_mode::compressed && per_peer >= 1000 && p > 1)
        CHECK(reports[1].ratio() > 1.5);
    }
  }
}

TEST_CASE_TEMPLATE("where a codec call costs more than a chunk's bytes, chunks are compressed round by round and "
                   "decoded in one batch, the same values",
                   T, float, double) {
  const int p = size_of(), me = rank_of();
  kompress::collective_options options{.codec = {.bound = kompress::relative(1e-2)}};
  options.cost.fixed_chunk_bytes = 16384;  // several chunks per peer, the same cut in every run
  const std::size_t per_peer = 20011;
  const int chunks = int((per_peer * sizeof(T) + 16383) / 16384);
  const auto values = make_data<T>(per_peer * std::size_t(p), me + 1);
  host_view<T> expected("expected", values.size());
  const int bytes = int(per_peer * sizeof(T));
  MPI_Alltoall(values.data(), bytes, MPI_BYTE, expected.data(), bytes, MPI_BYTE, MPI_COMM_WORLD);
  const auto bounds = bounds_over_blocks_to_others(values, per_peer, options.codec.bound);
  const uneven_layout layout;  // alltoallv: some counts are zero
  const auto uneven = make_data<T>(layout.send_total(), me + 7);
  for (const auto transport : transports) {
    options.transport = transport;
    const auto send = to_device(values);
    const auto uneven_send = to_device(uneven);
    codec_call_counter calls;
    device_view<T> one_by_one("one_by_one", values.size());
    device_view<T> v_one_by_one("v_one_by_one", layout.recv_total() + 3);
    kompress::alltoall(exec_space{}, send, one_by_one, MPI_COMM_WORLD, options);
    CHECK(calls.take_compressions() == (p - 1) * chunks);  // one per chunk of every peer's block
    CHECK(calls.take_decompressions() == (p - 1) * chunks);
    kompress::alltoallv(exec_space{}, uneven_send, layout.send_counts, layout.send_displs, v_one_by_one,
                        layout.recv_counts, layout.recv_displs, MPI_COMM_WORLD, options);
    const auto a = to_host(one_by_one), v = to_host(v_one_by_one);
    // Each side batched alone, then both (and the measured error with the batched encode).
    for (const auto& [encode_seconds, decode_seconds] : {std::pair{0.0, 1.0}, {1.0, 0.0}, {1.0, 1.0}}) {
      CAPTURE(int(transport));
      CAPTURE(encode_seconds);
      CAPTURE(decode_seconds);
      kompress::collective_options together = options;
      together.cost.compress_call_seconds = encode_seconds;
      together.cost.decompress_call_seconds = decode_seconds;
      together.measure_error = encode_seconds > 0.0 && decode_seconds > 0.0;
      device_view<T> batched("batched", values.size());
      calls.take_compressions();
      calls.take_decompressions();
      const auto report = kompress::alltoall(exec_space{}, send, batched, MPI_COMM_WORLD, together);
      const int compressions = calls.take_compressions(), decompressions = calls.take_decompressions();
      const auto b = to_host(batched);
      CHECK(same_bytes(a, b));
      std::size_t violations = 0;
      for (std::size_t k = 0; k < values.size(); ++k) {
        const std::size_t source = k / per_peer;
        violations += !(std::fabs(double(b(k)) - double(expected(k))) <= (int(source) == me ? 0.0 : bounds[source]));
      }
      CHECK(violations == 0);
      if (p > 1) {
        CHECK(report.absolute_bound > 0.0);
        CHECK(report.compressed_messages == std::uint64_t(p - 1));
        // A batch per round of chunks; one decompression for everything that arrived. Measuring
        // the error decodes every stream sent once more, one by one.
        const int measured = together.measure_error ? (p - 1) * chunks : 0;
        CHECK(compressions == (encode_seconds > 0.0 ? chunks : (p - 1) * chunks));
        CHECK(decompressions == (decode_seconds > 0.0 ? 1 : (p - 1) * chunks) + measured);
        if (together.measure_error) CHECK(report.max_error <= bounds[std::size_t(me)]);
      }
      device_view<T> v_batched("v_batched", layout.recv_total() + 3);
      kompress::alltoallv(exec_space{}, uneven_send, layout.send_counts, layout.send_displs, v_batched,
                          layout.recv_counts, layout.recv_displs, MPI_COMM_WORLD, together);
      CHECK(same_bytes(v, to_host(v_batched)));
    }
  }
}

TEST_CASE_TEMPLATE("alltoallv staged: zero and uneven counts, blocking and nonblocking", T, float, double) {
  const uneven_layout layout;
  const auto& [send_counts, send_displs, recv_counts, recv_displs] = layout;
  const auto values = make_data<T>(layout.send_total(), rank_of() + 7);
  const std::size_t total = layout.recv_total();
  host_view<T> expected("expected", total);
  layout.mpi_alltoallv(values.data(), expected.data());
  const auto send = to_device(values);
  for (const auto mode : {kompress::transfer_mode::compressed, kompress::transfer_mode::raw}) {
    for (const bool nonblocking : {false, true}) {
      kompress::collective_options options{.codec = {.bound = kompress::absolute(1e-4)}, .mode = mode};
      options.transport = kompress::transport_mode::staged;
      device_view<T> got("got", total);
      if (nonblocking)
        kompress::ialltoallv(exec_space{}, send, send_counts, send_displs, got, recv_counts, recv_displs,
                             MPI_COMM_WORLD, options)
            .wait();
      else
        kompress::alltoallv(exec_space{}, send, send_counts, send_displs, got, recv_counts, recv_displs,
                            MPI_COMM_WORLD, options);
      const auto result = to_host(got);
      std::size_t violations = 0;
      for (std::size_t k = 0; k < total; ++k)
        violations += !(std::fabs(double(result(k)) - double(expected(k))) <= 1e-4);
      CAPTURE(int(mode));
      CAPTURE(nonblocking);
      CHECK(violations == 0);
      if (mode == kompress::transfer_mode::raw) CHECK(same_bytes(result, expected));
    }
  }
}
