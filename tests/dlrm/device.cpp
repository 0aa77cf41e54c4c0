// The DLRM exchange on the default execution space's memory (device Views in a CUDA build),
// through each transport (support/device_views.hpp): automatic and staged, which the test forces
// on host memory so that the staging runs on every build; forward and backward, blocking and
// nonblocking, bit for bit the values of the exchange on host memory. Run under mpiexec -n 1, 2,
// 3 and 4.

#include <kompress/dlrm.hpp>

#include "support/device_views.hpp"
#include "support/mpi_checks.hpp"

#include <doctest/doctest.h>
#include <mpi.h>

#include <utility>
#include <vector>

namespace {

using namespace kompress::test;  // support/mpi_checks.hpp, support/device_views.hpp

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
