// Every collective and the DLRM exchange on the default execution space's memory (device Views
// in a CUDA build), through each transport: automatic (device memory staged unless the MPI
// moves it itself) and staged, which CI forces on host memory so that the staging runs on
// every build. Checked against plain MPI on host copies, element by element within the bound,
// and the staged results against the direct ones bit for bit where both take the same
// algorithm (the same bytes cross the wire).

#include <kompress/comm.hpp>
#include <kompress/dlrm.hpp>

#include "support/mpi_checks.hpp"

#include <doctest/doctest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <vector>

namespace {

using namespace kompress::test;  // support/mpi_checks.hpp
using exec_space = Kokkos::DefaultExecutionSpace;
template <class T>
using device_view = Kokkos::View<T*, exec_space::memory_space>;

constexpr kompress::transport_mode transports[] = {kompress::transport_mode::automatic,
                                                   kompress::transport_mode::staged};

template <class T>
device_view<T> to_device(const host_view<T>& values) {
  device_view<T> view("device", values.size());
  Kokkos::deep_copy(view, values);
  return view;
}

/// The elements of a contiguous View of any rank and memory space, in memory order, on the host.
template <class View>
host_view<typename View::non_const_value_type> to_host(const View& view) {
  using T = typename View::non_const_value_type;
  host_view<T> values("host", view.size());
  Kokkos::deep_copy(values, Kokkos::View<const T*, typename View::memory_space, Kokkos::MemoryUnmanaged>(
                                view.data(), view.size()));
  return values;
}

/// Every rank's bound over its values to other ranks (REL resolves over those).
template <class T>
std::vector<double> sender_bounds(const host_view<T>& send, std::size_t per_peer, const kompress::error_bound& bound) {
  double mine = bound.value;
  if (bound.mode == kompress::bound_mode::relative) {
    double lo = INFINITY, hi = -INFINITY;
    for (std::size_t k = 0; k < send.size(); ++k)
      if (k / per_peer != std::size_t(rank_of())) {
        lo = std::min(lo, double(send(k)));
        hi = std::max(hi, double(send(k)));
      }
    mine = lo <= hi ? bound.value * (hi - lo) : 0.0;
  }
  std::vector<double> bounds(static_cast<std::size_t>(size_of()));
  MPI_Allgather(&mine, 1, MPI_DOUBLE, bounds.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD);
  return bounds;
}

}  // namespace

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
      const auto bounds = sender_bounds(values, std::max<std::size_t>(per_peer, 1), bound);
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

TEST_CASE("persistent alltoall staged, with a workspace for the one-shot calls: staging reused, not regrown") {
  const int p = size_of(), me = rank_of();
  const std::size_t per_peer = 20000;
  kompress::collective_options options{.codec = {.bound = kompress::absolute(1e-3)}};
  options.transport = kompress::transport_mode::staged;
  device_view<float> send("send", per_peer * std::size_t(p)), got("got", send.size());
  kompress::persistent_request rounds = kompress::alltoall_init(exec_space{}, send, got, MPI_COMM_WORLD, options);
  kompress::comm_workspace workspace(MPI_COMM_WORLD);
  device_view<float> once("once", send.size());
  std::size_t staged_after_first = 0;
  for (int round = 0; round < 3; ++round) {
    const auto values = make_data<float>(send.size(), me + 10 * round);
    Kokkos::deep_copy(send, values);
    host_view<float> expected("expected", values.size());
    const int bytes = int(per_peer * sizeof(float));
    MPI_Alltoall(values.data(), bytes, MPI_BYTE, expected.data(), bytes, MPI_BYTE, MPI_COMM_WORLD);
    rounds.start();
    rounds.wait();
    kompress::alltoall(exec_space{}, send, once, MPI_COMM_WORLD, options, &workspace);
    if (round == 0) staged_after_first = workspace.staging_bytes();
    CHECK(workspace.staging_bytes() == staged_after_first);
    const auto result = to_host(got);
    CHECK(same_bytes(result, to_host(once)));
    std::size_t violations = 0;
    for (std::size_t k = 0; k < result.size(); ++k) {
      const double e = k / per_peer == std::size_t(me) ? 0.0 : 1e-3;
      violations += !(std::fabs(double(result(k)) - double(expected(k))) <= e);
    }
    CHECK(violations == 0);
  }
  if (p > 1) CHECK(staged_after_first > 0);
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

namespace {

/// One forward and one backward of a small model on matrices in Exec's memory; returns both
/// outputs.
template <class Exec>
std::pair<host_view<float>, host_view<float>> exchange_round(kompress::transport_mode transport, bool nonblocking) {
  using matrix = Kokkos::View<float**, Kokkos::LayoutRight, typename Exec::memory_space>;
  const int p = size_of(), me = rank_of();
  std::vector<kompress::dlrm::table> tables;
  const std::size_t dims[] = {16, 40, 8};
  for (int t = 0; t < 3; ++t) tables.push_back({t % p, dims[t]});
  kompress::dlrm::exchange_options options;
  options.transport = transport;
  kompress::dlrm::embedding_exchange exchange(MPI_COMM_WORLD, tables, 211, options);
  matrix in("in", exchange.global_batch(), exchange.local_width());
  matrix out("out", exchange.local_batch(), exchange.total_width());
  matrix grad("grad", exchange.local_batch(), exchange.total_width());
  matrix grad_out("grad_out", exchange.global_batch(), exchange.local_width());
  const auto fill = [](const matrix& m, int seed) {
    const auto values = make_data<float>(m.size(), seed, 1.0);
    Kokkos::deep_copy(m, Kokkos::View<const float**, Kokkos::LayoutRight, Kokkos::HostSpace>(
                             values.data(), m.extent(0), m.extent(1)));
  };
  fill(in, me + 3);
  fill(grad, me + 30);
  if (nonblocking) {
    exchange.iforward(Exec{}, in, out).wait();
    exchange.ibackward(Exec{}, grad, grad_out).wait();
  } else {
    exchange.forward(Exec{}, in, out);
    exchange.backward(Exec{}, grad, grad_out);
  }
  return {to_host(out), to_host(grad_out)};
}

}  // namespace

TEST_CASE("DLRM exchange on the execution space's memory, staged or not, delivers the host exchange's values") {
  for (const bool nonblocking : {false, true}) {
    const auto reference = exchange_round<host>(kompress::transport_mode::direct, nonblocking);
    for (const auto transport : transports) {
      const auto got = exchange_round<exec_space>(transport, nonblocking);
      CAPTURE(nonblocking);
      CAPTURE(int(transport));
      CHECK(same_bytes(reference.first, got.first));
      CHECK(same_bytes(reference.second, got.second));
    }
  }
}

namespace {

enum class form { blocking, nonblocking, persistent };

/// Runs one ring collective (allreduce, allgather or reduce_scatter) on Views in the execution
/// space's memory in the given form; returns the result on the host.
template <class T, class Call, class ICall, class Init>
host_view<T> run_ring(form how, const device_view<T>& send, std::size_t out_size, Call&& call, ICall&& icall,
                      Init&& init) {
  device_view<T> got("got", out_size);
  switch (how) {
    case form::blocking: call(send, got); break;
    case form::nonblocking: icall(send, got).wait(); break;
    case form::persistent: {
      kompress::persistent_request rounds = init(send, got);
      for (int round = 0; round < 2; ++round) rounds.run();
    } break;
  }
  return to_host(got);
}

/// The largest |got - expected| allowed: `bound` plus the rounding of two summation orders.
template <class T>
std::size_t violations(const host_view<T>& got, const host_view<T>& expected, const host_view<T>& magnitude,
                       double bound) {
  std::size_t bad = 0;
  constexpr double eps = std::numeric_limits<T>::epsilon();
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double slack = magnitude.size() ? 2.0 * size_of() * eps * double(magnitude(i)) : 0.0;
    bad += !(std::fabs(double(got(i)) - double(expected(i))) <= bound + slack);
  }
  return bad;
}

}  // namespace

TEST_CASE_TEMPLATE("allreduce, allgather and reduce_scatter on the execution space's memory, direct and staged", T,
                   float, double) {
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
    const device_view<T> own(send.data(), n);  // allgather sends the first n values
    host_view<T> own_gathered("own_gathered", total);
    MPI_Allgather(values.data(), int(n), mpi_type<T>(), own_gathered.data(), int(n), mpi_type<T>(), MPI_COMM_WORLD);
    for (const auto mode : {kompress::transfer_mode::compressed, kompress::transfer_mode::raw}) {
      for (const form how : {form::blocking, form::nonblocking, form::persistent}) {
        std::vector<host_view<T>> sums, gathers, scatters;
        for (const auto transport : transports) {
          kompress::collective_options options{.codec = {.bound = kompress::absolute(e)}, .mode = mode};
          options.transport = transport;
          const auto comm = MPI_COMM_WORLD;
          sums.push_back(run_ring<T>(
              how, send, total, [&](auto& in, auto& out) { kompress::allreduce(exec_space{}, in, out, comm, options); },
              [&](auto& in, auto& out) { return kompress::iallreduce(exec_space{}, in, out, comm, options); },
              [&](auto& in, auto& out) { return kompress::allreduce_init(exec_space{}, in, out, comm, options); }));
          gathers.push_back(run_ring<T>(
              how, own, total, [&](auto& in, auto& out) { kompress::allgather(exec_space{}, in, out, comm, options); },
              [&](auto& in, auto& out) { return kompress::iallgather(exec_space{}, in, out, comm, options); },
              [&](auto& in, auto& out) { return kompress::allgather_init(exec_space{}, in, out, comm, options); }));
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
        for (std::size_t t = 0; t < sums.size(); ++t) {
          CAPTURE(t);
          CHECK(violations(sums[t], sum, magnitude, compressed ? p * e : 0.0) == 0);
          CHECK(violations(gathers[t], own_gathered, host_view<T>(), compressed ? e : 0.0) == 0);
          CHECK(violations(scatters[t], block_sum, block_magnitude, compressed ? (p - 1) * e : 0.0) == 0);
          CHECK(identical_on_every_rank(sums[t]));
          CHECK(identical_on_every_rank(gathers[t]));
        }
        // Compressed, both transports run the ring: the same bytes, the same sums.
        if (compressed) {
          CHECK(same_bytes(sums[0], sums[1]));
          CHECK(same_bytes(gathers[0], gathers[1]));
          CHECK(same_bytes(scatters[0], scatters[1]));
        }
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
      CHECK(violations(results[t], sum, host_view<double>(), reports[t].absolute_bound + 1e-9) == 0);
      if (p > 1) CHECK(reports[t].max_error <= reports[t].absolute_bound / p * (1 + 1e-12));
    }
    if (results.size() == 2) CHECK(same_bytes(results[0], results[1]));
  }
}

TEST_CASE("automatic mode counts a staged call's copies: compressing pays where the copies outweigh the link") {
  // A link far faster than the codec needs: raw wins when MPI reads the Views; staged through
  // copies of 1 GB/s each way, a stream half the size halves them, and compressing wins.
  const int p = size_of(), me = rank_of();
  if (p < 2) return;
  const std::size_t per_peer = 1 << 18;
  const auto values = make_data<float>(per_peer * std::size_t(p), me + 11);
  const auto send = to_device(values);
  kompress::collective_options options{.codec = {.bound = kompress::absolute(1e-3)},
                                       .mode = kompress::transfer_mode::automatic};
  options.cost.link_bytes_per_second = 1e12;
  options.cost.compress_bytes_per_second = 1e12;
  options.cost.decompress_bytes_per_second = 1e12;
  options.cost.staging_bytes_per_second = 1e9;
  for (const auto transport : {kompress::transport_mode::direct, kompress::transport_mode::staged}) {
    if (transport == kompress::transport_mode::direct && !kompress::detail::host_memory_space<exec_space::memory_space>)
      continue;  // a device without a device-aware MPI cannot be read directly
    options.transport = transport;
    device_view<float> got("got", send.size());
    const auto report = kompress::alltoall(exec_space{}, send, got, MPI_COMM_WORLD, options);
    device_view<float> sum("sum", send.size());
    const auto ring = kompress::allreduce(exec_space{}, send, sum, MPI_COMM_WORLD, options);
    CAPTURE(int(transport));
    const bool staged = transport == kompress::transport_mode::staged;
    CHECK(report.compressed_messages == (staged ? std::uint64_t(p - 1) : 0u));
    CHECK((ring.compressed_messages > 0) == staged);
  }
}
