// comm_workspace: staging reused across calls without growing, its slots taken in turn, misuse
// rejected on every rank; and the staging of a persistent request and of one-shot calls on a
// workspace, on the execution space's memory, reused round after round. Run under mpiexec -n 1,
// 2, 3 and 4.

#include <kompress/comm.hpp>

#include "comm/checks.hpp"
#include "support/device_views.hpp"
#include "support/mpi_checks.hpp"

#include <doctest/doctest.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <vector>

using namespace kompress::test;  // support/mpi_checks.hpp, support/device_views.hpp, comm/checks.hpp

TEST_CASE("workspace: reused across calls without growing, slots taken in turn, misuse rejected everywhere") {
  const int p = size_of();
  const std::size_t per_peer = 3000, n = per_peer * std::size_t(p);
  auto send = sine_values(n, rank_of() + 9);
  host_view<float> got("got", n), expected("expected", n), sum("sum", n), sum_expected("sum_expected", n);
  MPI_Alltoall(send.data(), int(per_peer), MPI_FLOAT, expected.data(), int(per_peer), MPI_FLOAT, MPI_COMM_WORLD);
  MPI_Allreduce(send.data(), sum_expected.data(), int(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  kompress::comm_workspace workspace(MPI_COMM_WORLD, 2);
  std::size_t held = 0;
  for (int iteration = 0; iteration < 3; ++iteration) {
    kompress::alltoall(host{}, send, got, MPI_COMM_WORLD, abs_options, &workspace);
    auto a = kompress::ialltoall(host{}, send, got, MPI_COMM_WORLD, abs_options, &workspace);
    auto b = kompress::iallreduce(host{}, send, sum, MPI_COMM_WORLD, abs_options, &workspace);
    // Both slots are in flight: a third nonblocking call is refused on every rank.
    host_view<float> other("other", n);
    CHECK_THROWS_WITH_AS(kompress::ialltoall(host{}, send, other, MPI_COMM_WORLD, abs_options, &workspace),
                         doctest::Contains("slots"), kompress::invalid_argument);
    b.wait();
    a.wait();
    std::size_t violations = 0;
    for (std::size_t i = 0; i < n; ++i) {
      violations += !(std::fabs(got(i) - expected(i)) <= 1e-3);
      violations += !(std::fabs(double(sum(i)) - double(sum_expected(i))) <= p * 1e-3 + 1e-4 * p);
    }
    CHECK(violations == 0);
    if (iteration == 0) held = workspace.staging_bytes();
    CHECK(workspace.staging_bytes() == held);  // same shapes: nothing grows after the first round
  }
  CHECK((p == 1 || held > 0));  // one rank: nothing to stage
  // A workspace built for another communicator (with one rank, MPI_COMM_SELF is another handle too).
  CHECK_THROWS_WITH_AS(kompress::alltoall(host{}, send, got, MPI_COMM_SELF, abs_options, &workspace),
                       doctest::Contains("another communicator"), kompress::invalid_argument);
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
