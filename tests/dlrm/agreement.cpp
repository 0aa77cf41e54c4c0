// The DLRM exchange's agreement: a bad call on one rank, before and while other calls are in
// flight, and a NaN, negative or infinite table weight or bound_schedule value, are an error on
// every rank before data moves; no rank hangs, a rejected call is no iteration, and the exchange
// still works. Run under mpiexec -n 1, 2, 3 and 4 (and in the sanitizer pass).

#include <kompress/dlrm.hpp>

#include "support/mpi_checks.hpp"

#include <doctest/doctest.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <vector>

namespace {

using host = Kokkos::DefaultHostExecutionSpace;
using matrix = Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::HostSpace>;

using kompress::test::rank_of;
using kompress::test::size_of;
bool last_rank() { return rank_of() == size_of() - 1; }

}  // namespace

TEST_CASE("dlrm exchange: a bad call on one rank, before and while others are in flight, is an error everywhere") {
  const int p = size_of();
  std::vector<kompress::dlrm::table> tables;
  for (int t = 0; t < 2 * p; ++t) tables.push_back({t % p, std::size_t(8 + 8 * (t % 3))});
  kompress::dlrm::exchange_options options;
  bool fail_here = false;
  options.bound_schedule = [&](std::uint64_t, int, kompress::dlrm::direction) -> double {
    if (fail_here) throw std::runtime_error("schedule failed on purpose");
    return 1.0;
  };
  const std::size_t batch = 16;
  kompress::dlrm::embedding_exchange exchange(MPI_COMM_WORLD, tables, batch, options);
  matrix in("in", exchange.global_batch(), exchange.local_width()), out("out", batch, exchange.total_width());
  matrix grad_in("grad_in", batch, exchange.total_width());
  matrix grad_out("grad_out", exchange.global_batch(), exchange.local_width());
  for (std::size_t r = 0; r < in.extent(0); ++r)
    for (std::size_t c = 0; c < in.extent(1); ++c) in(r, c) = float(std::sin(0.1 * double(r * 7 + c)));
  for (std::size_t r = 0; r < grad_in.extent(0); ++r)
    for (std::size_t c = 0; c < grad_in.extent(1); ++c) grad_in(r, c) = float(1e-3 * std::cos(double(r + c)));
  const std::uint64_t iteration = exchange.iteration();

  // Before: the user's bound schedule throws on the last rank only.
  fail_here = last_rank();
  if (last_rank())
    CHECK_THROWS_AS(exchange.forward(host{}, in, out), std::runtime_error);
  else
    CHECK_THROWS_WITH_AS(exchange.forward(host{}, in, out), doctest::Contains("rejected its arguments"),
                         kompress::invalid_argument);
  fail_here = false;
  CHECK(exchange.iteration() == iteration);  // a failed call is no iteration

  // While a forward is in flight everywhere, a backward with a wrong shape on the last rank.
  auto forward = exchange.iforward(host{}, in, out);
  matrix wrong("wrong", batch + 1, exchange.total_width());
  CHECK_THROWS_AS(exchange.backward(host{}, last_rank() ? wrong : grad_in, grad_out), kompress::invalid_argument);
  // And an ibackward with its output overlapping its input on the last rank.
  matrix alias("alias", std::max(grad_in.extent(0) * grad_in.extent(1), grad_out.extent(0) * grad_out.extent(1)), 1);
  matrix alias_in(alias.data(), batch, exchange.total_width());
  matrix alias_out(alias.data(), exchange.global_batch(), exchange.local_width());
  if (last_rank() && exchange.local_width() > 0)
    CHECK_THROWS_WITH_AS(exchange.ibackward(host{}, alias_in, alias_out), doctest::Contains("overlap"),
                         kompress::invalid_argument);
  else if (last_rank())
    CHECK_THROWS_AS(exchange.ibackward(host{}, wrong, grad_out), kompress::invalid_argument);
  else
    CHECK_THROWS_AS(exchange.ibackward(host{}, grad_in, grad_out), kompress::invalid_argument);
  forward.wait();
  // The exchange still works: forward done, backward within the bound.
  const auto report = exchange.backward(host{}, grad_in, grad_out);
  CHECK(report.messages <= std::uint64_t(p - 1));
  for (std::size_t r = 0; r < batch; ++r)  // own tables' rows from this rank come back exactly
    for (std::size_t t = 0, local = 0, global = 0; t < tables.size(); global += tables[t].dim, ++t) {
      if (tables[t].owner != rank_of()) continue;
      for (std::size_t c = 0; c < tables[t].dim; ++c)
        CHECK(grad_out(rank_of() * batch + r, local + c) == grad_in(r, global + c));
      local += tables[t].dim;
    }
}

TEST_CASE("dlrm exchange: a NaN, negative or infinite table weight or bound_schedule value is an error everywhere") {
  const int p = size_of();
  std::vector<kompress::dlrm::table> tables;
  for (int t = 0; t < 2 * p; ++t) tables.push_back({t % p, 16});
  const std::size_t batch = 8;
  const double bad_values[] = {NAN, -1.0, INFINITY, -INFINITY};

  // Table weights are checked when the exchange is built: the constructor's agreement.
  for (const double bad : bad_values) {
    CAPTURE(bad);
    kompress::dlrm::exchange_options options;
    options.table_weights.assign(tables.size(), 1.0);
    if (last_rank()) options.table_weights[tables.size() - 1] = bad;
    if (last_rank())
      CHECK_THROWS_WITH_AS(kompress::dlrm::embedding_exchange(MPI_COMM_WORLD, tables, batch, options),
                           doctest::Contains("weight of table"), kompress::invalid_argument);
    else
      CHECK_THROWS_WITH_AS(kompress::dlrm::embedding_exchange(MPI_COMM_WORLD, tables, batch, options),
                           doctest::Contains("rejected its arguments"), kompress::invalid_argument);
  }

  // bound_schedule values are computed per call, among the call's local checks.
  double scheduled = 1.0;
  kompress::dlrm::exchange_options options;
  options.bound_schedule = [&](std::uint64_t, int, kompress::dlrm::direction) { return scheduled; };
  kompress::dlrm::embedding_exchange exchange(MPI_COMM_WORLD, tables, batch, options);
  matrix in("in", exchange.global_batch(), exchange.local_width()), out("out", batch, exchange.total_width());
  matrix grad_in("grad_in", batch, exchange.total_width());
  matrix grad_out("grad_out", exchange.global_batch(), exchange.local_width());
  for (std::size_t i = 0; i < in.size(); ++i) in.data()[i] = float(std::sin(0.1 * double(i)));
  for (std::size_t i = 0; i < grad_in.size(); ++i) grad_in.data()[i] = float(1e-3 * std::cos(double(i)));
  const std::uint64_t iteration = exchange.iteration();
  for (const double bad : bad_values) {
    CAPTURE(bad);
    scheduled = last_rank() ? bad : 1.0;
    for (const bool forward : {true, false}) {
      const auto call = [&] {
        if (forward) exchange.forward(host{}, in, out);
        else exchange.backward(host{}, grad_in, grad_out);
      };
      if (last_rank())
        CHECK_THROWS_WITH_AS(call(), doctest::Contains("bound_schedule"), kompress::invalid_argument);
      else
        CHECK_THROWS_WITH_AS(call(), doctest::Contains("rejected its arguments"), kompress::invalid_argument);
    }
    CHECK(exchange.iteration() == iteration);  // a rejected call is no iteration
  }
  // A weight or schedule value of 0 still means lossless on purpose: the values come back exact.
  scheduled = 0.0;
  exchange.forward(host{}, in, out);
  exchange.backward(host{}, grad_in, grad_out);
  for (std::size_t r = 0; r < batch; ++r)
    for (std::size_t t = 0, local = 0, global = 0; t < tables.size(); global += tables[t].dim, ++t) {
      if (tables[t].owner != rank_of()) continue;
      for (std::size_t c = 0; c < tables[t].dim; ++c)
        CHECK(grad_out(rank_of() * batch + r, local + c) == grad_in(r, global + c));
      local += tables[t].dim;
    }
  // Forward: every table's values exact. Owner t % p holds table t at local column (t / p) * 16
  // of its input, whose value at (row, column) is sin(0.1 * (row * local width + column)).
  std::size_t inexact = 0;
  const std::size_t width = exchange.local_width();  // 2 tables of 16 on every rank
  for (std::size_t r = 0; r < batch; ++r)
    for (std::size_t t = 0, global = 0; t < tables.size(); global += tables[t].dim, ++t)
      for (std::size_t c = 0; c < tables[t].dim; ++c) {
        const std::size_t row = std::size_t(rank_of()) * batch + r, column = t / std::size_t(p) * 16 + c;
        inexact += out(r, global + c) != float(std::sin(0.1 * double(row * width + column)));
      }
  CHECK(inexact == 0);
}
