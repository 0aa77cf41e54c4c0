// A bad call on one rank is an exception on every rank, before any data moves, with requests
// of earlier calls still in flight; no rank hangs, nothing is written into freed memory (this
// test runs in the sanitizer pass), and the next call on the same communicator is correct.
// Run under mpiexec -n 1, 2, 3 and 4.

#include <kompress/comm.hpp>
#include <kompress/dlrm.hpp>

#include "support/mpi_checks.hpp"

#include <doctest/doctest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <vector>

namespace {

using host = Kokkos::DefaultHostExecutionSpace;
using view = Kokkos::View<float*, Kokkos::HostSpace>;
using matrix = Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::HostSpace>;

using kompress::test::rank_of;
using kompress::test::size_of;
bool last_rank() { return rank_of() == size_of() - 1; }

view make_data(std::size_t n, int seed) {
  view v("data", n);
  for (std::size_t i = 0; i < n; ++i) v(i) = float(std::sin(0.01 * double(i) + seed) * 5.0);
  return v;
}

const kompress::collective_options abs_options{.codec = {.bound = kompress::absolute(1e-3)}};

/// A correct alltoall after a failure: matches MPI_Alltoall within the bound.
void alltoall_still_works() {
  const int p = size_of();
  const std::size_t per_peer = 5000;
  auto send = make_data(per_peer * p, rank_of());
  view got("got", send.size()), expected("expected", send.size());
  kompress::alltoall(host{}, send, got, MPI_COMM_WORLD, abs_options);
  MPI_Alltoall(send.data(), int(per_peer), MPI_FLOAT, expected.data(), int(per_peer), MPI_FLOAT, MPI_COMM_WORLD);
  std::size_t violations = 0;
  for (std::size_t i = 0; i < send.size(); ++i) violations += !(std::fabs(got(i) - expected(i)) <= 1e-3);
  CHECK(violations == 0);
}

/// Counts of an alltoallv where rank i sends 1000 + i + j values to rank j.
struct uneven {
  std::vector<int> send_counts, send_displs, recv_counts, recv_displs;
  std::size_t send_total = 0, recv_total = 0;
  uneven() {
    const int p = size_of(), me = rank_of();
    for (int j = 0; j < p; ++j) {
      send_counts.push_back(1000 + me + j);
      recv_counts.push_back(1000 + j + me);
    }
    send_displs.resize(p);
    recv_displs.resize(p);
    std::exclusive_scan(send_counts.begin(), send_counts.end(), send_displs.begin(), 0);
    std::exclusive_scan(recv_counts.begin(), recv_counts.end(), recv_displs.begin(), 0);
    send_total = std::size_t(send_displs.back() + send_counts.back());
    recv_total = std::size_t(recv_displs.back() + recv_counts.back());
  }
};

}  // namespace

TEST_CASE("alltoallv: a receive count that disagrees with the sender is an error on every rank") {
  uneven c;
  auto send = make_data(c.send_total, rank_of());
  view got("got", c.recv_total);
  // Rank 0 expects 1 value less from itself than it sends itself.
  auto recv_counts = c.recv_counts;
  if (rank_of() == 0) recv_counts[0] -= 1;
  CHECK_THROWS_WITH_AS(kompress::alltoallv(host{}, send, c.send_counts, c.send_displs, got, recv_counts, c.recv_displs,
                                           MPI_COMM_WORLD, abs_options),
                       doctest::Contains("do not match"), kompress::invalid_argument);
  // A pair between two ranks: the last rank expects one value more from rank 0 than it sends.
  recv_counts = c.recv_counts;
  if (last_rank()) recv_counts[0] += 1;
  view roomy("roomy", c.recv_total + 1);
  try {
    kompress::alltoallv(host{}, send, c.send_counts, c.send_displs, roomy, recv_counts, c.recv_displs, MPI_COMM_WORLD,
                        abs_options);
    CHECK(false);
  } catch (const kompress::invalid_argument& e) {
    const std::string what = e.what();
    CHECK(what.find("do not match") != std::string::npos);
    if (last_rank()) CHECK(what.find("expects " + std::to_string(c.recv_counts[0] + 1) + " values from rank 0") != std::string::npos);
  }
  alltoall_still_works();
}

TEST_CASE("alltoall: a bad argument on one rank, with nothing in flight, is an error on every rank") {
  const int p = size_of();
  auto send = make_data(100 * p, rank_of());
  view got("got", 100 * p);
  kompress::collective_options options = abs_options;
  if (last_rank()) options.codec.bound = kompress::absolute(-1.0);
  if (last_rank())
    CHECK_THROWS_WITH_AS(kompress::alltoall(host{}, send, got, MPI_COMM_WORLD, options),
                         doctest::Contains("error bound"), kompress::invalid_argument);
  else
    CHECK_THROWS_WITH_AS(kompress::alltoall(host{}, send, got, MPI_COMM_WORLD, options),
                         doctest::Contains("rejected its arguments"), kompress::invalid_argument);
  // Ranks in different modes: compressed on some, raw on others.
  options = abs_options;
  if (last_rank()) options.mode = kompress::transfer_mode::raw;
  if (p > 1)
    CHECK_THROWS_WITH_AS(kompress::alltoall(host{}, send, got, MPI_COMM_WORLD, options),
                         doctest::Contains("disagree on the element type, transfer mode"), kompress::invalid_argument);
  // Raw mode below: different per-peer counts on one rank.
  options.mode = kompress::transfer_mode::raw;
  view bigger_send = make_data(std::size_t(101 * p), 3), bigger_got("bigger", std::size_t(101 * p));
  if (p > 1)
    CHECK_THROWS_AS(kompress::alltoall(host{}, last_rank() ? bigger_send : send, last_rank() ? bigger_got : got,
                                       MPI_COMM_WORLD, options),
                    kompress::invalid_argument);
  // Overlapping send and receive Views (MPI forbids aliasing) on one rank.
  view both("both", 200 * p);
  auto first = Kokkos::subview(both, std::pair<std::size_t, std::size_t>(0, 100 * p));
  auto shifted = Kokkos::subview(both, std::pair<std::size_t, std::size_t>(50, 50 + 100 * p));
  if (last_rank())
    CHECK_THROWS_WITH_AS(kompress::alltoall(host{}, first, shifted, MPI_COMM_WORLD, abs_options),
                         doctest::Contains("overlap"), kompress::invalid_argument);
  else
    CHECK_THROWS_AS(kompress::alltoall(host{}, send, got, MPI_COMM_WORLD, abs_options), kompress::invalid_argument);
  alltoall_still_works();
}

TEST_CASE("alltoall: a bad call on one rank while peers have receives posted is an error on every rank") {
  const int p = size_of();
  const std::size_t per_peer = 20000;
  auto send = make_data(per_peer * p, rank_of() + 5);
  view got("got", send.size()), expected("expected", send.size());
  // Every rank has an exchange in flight: its receives are posted, peers' messages arrive.
  auto in_flight = kompress::ialltoall(host{}, send, got, MPI_COMM_WORLD, abs_options);
  // Then the last rank passes a View that does not split among the ranks.
  // (With one rank everything splits: its receive View is one element short too.)
  view odd = make_data(per_peer * p + 1, 1), odd_out("odd_out", per_peer * p);
  view fine = make_data(per_peer * p, 2), fine_out("fine_out", per_peer * p);
  if (last_rank())
    CHECK_THROWS_WITH_AS(kompress::alltoall(host{}, odd, odd_out, MPI_COMM_WORLD, abs_options),
                         doctest::Contains(p > 1 ? "split evenly" : "must match"), kompress::invalid_argument);
  else
    CHECK_THROWS_AS(kompress::alltoall(host{}, fine, fine_out, MPI_COMM_WORLD, abs_options), kompress::invalid_argument);
  in_flight.wait();
  MPI_Alltoall(send.data(), int(per_peer), MPI_FLOAT, expected.data(), int(per_peer), MPI_FLOAT, MPI_COMM_WORLD);
  std::size_t violations = 0;
  for (std::size_t i = 0; i < send.size(); ++i) violations += !(std::fabs(got(i) - expected(i)) <= 1e-3);
  CHECK(violations == 0);
  alltoall_still_works();
}

TEST_CASE("allreduce: different bounds, counts or a bad argument on one rank are an error on every rank") {
  const std::size_t n = 30000;
  auto data = make_data(n, rank_of());
  view out("out", n), expected("expected", n);
  // One rank asks for a tighter bound than the others: rejected everywhere.
  kompress::collective_options options = abs_options;
  if (last_rank()) options.codec.bound = kompress::absolute(1e-6);
  if (size_of() > 1)
    CHECK_THROWS_WITH_AS(kompress::allreduce(host{}, data, out, MPI_COMM_WORLD, options), doctest::Contains("bound"),
                         kompress::invalid_argument);
  // Raw mode with different counts (plain MPI would abort).
  view longer = make_data(n + 1, 1), longer_out("longer_out", n + 1);
  options = abs_options;
  options.mode = kompress::transfer_mode::raw;
  if (size_of() > 1)
    CHECK_THROWS_WITH_AS(kompress::allreduce(host{}, last_rank() ? longer : data, last_rank() ? longer_out : out,
                                             MPI_COMM_WORLD, options),
                         doctest::Contains("element count"), kompress::invalid_argument);
  // A bad bound on one rank while an allreduce is in flight everywhere.
  auto in_flight = kompress::iallreduce(host{}, data, out, MPI_COMM_WORLD, abs_options);
  options = abs_options;
  if (last_rank()) options.codec.bound = kompress::absolute(NAN);
  view other("other", n);
  CHECK_THROWS_AS(kompress::allreduce(host{}, data, other, MPI_COMM_WORLD, options), kompress::invalid_argument);
  // Overlap on one rank; and a fill value, which a sum cannot honour.
  auto shifted = Kokkos::subview(longer, std::pair<std::size_t, std::size_t>(1, n + 1));
  auto head = Kokkos::subview(longer, std::pair<std::size_t, std::size_t>(0, n));
  if (last_rank())
    CHECK_THROWS_WITH_AS(kompress::allreduce(host{}, head, shifted, MPI_COMM_WORLD, abs_options),
                         doctest::Contains("overlap"), kompress::invalid_argument);
  else
    CHECK_THROWS_AS(kompress::allreduce(host{}, data, other, MPI_COMM_WORLD, abs_options), kompress::invalid_argument);
  options = abs_options;
  options.codec.fill_value = -999.0;
  CHECK_THROWS_WITH_AS(kompress::allreduce(host{}, data, other, MPI_COMM_WORLD, options), doctest::Contains("fill"),
                       kompress::invalid_argument);
  in_flight.wait();
  MPI_Allreduce(data.data(), expected.data(), int(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  const double bound = size_of() * 1e-3;
  std::size_t violations = 0;
  for (std::size_t i = 0; i < n; ++i)
    violations += !(std::fabs(double(out(i)) - double(expected(i))) <=
                    bound + 2.0 * size_of() * 1.2e-7 * 5.0 * size_of());
  CHECK(violations == 0);
  alltoall_still_works();
}

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
  matrix grad_in("grad_in", batch, exchange.total_width()), grad_out("grad_out", exchange.global_batch(), exchange.local_width());
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

TEST_CASE("homomorphic reductions: ranks passing different block sizes are an error on every rank, up front") {
  const int p = size_of();
  const std::size_t n = 40000;  // per rank and per block of reduce_scatter: many code blocks per hop
  auto send = make_data(n * std::size_t(p), rank_of());
  view sum("sum", send.size()), scattered("scattered", n);
  kompress::collective_options options = abs_options;
  options.reduction = kompress::reduction_method::homomorphic;
  kompress::collective_options mismatched = options;
  if (last_rank()) mismatched.codec.block_size = 64;
  if (p > 1) {
    // Every rank, the one case per form: invalid_argument naming the block size, no data moved.
    const auto rejected = [](auto&& call) {
      CHECK_THROWS_WITH_AS(call(), doctest::Contains("block size"), kompress::invalid_argument);
    };
    rejected([&] { kompress::allreduce(host{}, send, sum, MPI_COMM_WORLD, mismatched); });
    rejected([&] { kompress::reduce_scatter(host{}, send, scattered, MPI_COMM_WORLD, mismatched); });
    rejected([&] { kompress::iallreduce(host{}, send, sum, MPI_COMM_WORLD, mismatched).wait(); });
    rejected([&] { kompress::ireduce_scatter(host{}, send, scattered, MPI_COMM_WORLD, mismatched).wait(); });
    rejected([&] { kompress::allreduce_init(host{}, send, sum, MPI_COMM_WORLD, mismatched); });
    rejected([&] { kompress::reduce_scatter_init(host{}, send, scattered, MPI_COMM_WORLD, mismatched); });
  }
  // The recompressing reduction sends streams, which carry their block size: it may differ.
  kompress::collective_options recompress = mismatched;
  recompress.reduction = kompress::reduction_method::recompress;
  view expected("expected", send.size());
  MPI_Allreduce(send.data(), expected.data(), int(send.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  const auto off_by = [&](double bound) {
    std::size_t violations = 0;
    for (std::size_t i = 0; i < send.size(); ++i)
      violations += !(std::fabs(double(sum(i)) - double(expected(i))) <= bound + 2.0 * p * 1.2e-7 * 5.0 * p);
    return violations;
  };
  CHECK_NOTHROW(kompress::allreduce(host{}, send, sum, MPI_COMM_WORLD, recompress));
  CHECK(off_by(p * 1e-3) == 0);
  // Nothing was left in flight: the homomorphic call with matching block sizes is correct.
  CHECK_NOTHROW(kompress::allreduce(host{}, send, sum, MPI_COMM_WORLD, options));
  CHECK(off_by(p * 1e-3) == 0);
  alltoall_still_works();
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

TEST_CASE("posted messages: an exception cancels the receives before their buffer goes") {
  if (size_of() < 2) return;
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  const int me = rank_of();
  std::vector<float> late(4096, 1.0f);
  if (me == 0) {
    try {
      auto buffer = std::make_unique<float[]>(4096);
      kompress::detail::posted_messages posted;
      posted.receive(buffer.get(), 4096 * sizeof(float), 1, comm, "test");
      throw std::runtime_error("fails after posting");
      // posted (declared after buffer) cancels the receive before buffer is freed
    } catch (const std::runtime_error&) {
    }
  }
  MPI_Barrier(comm);
  // Rank 1's message arrives after rank 0's buffer is gone: it must not land there.
  if (me == 1) MPI_Send(late.data(), 4096, MPI_FLOAT, 0, kompress::detail::collective_tag, comm);
  if (me == 0) {
    std::vector<float> drained(4096, 0.0f);
    MPI_Recv(drained.data(), 4096, MPI_FLOAT, 1, kompress::detail::collective_tag, comm, MPI_STATUS_IGNORE);
    CHECK(drained[4095] == 1.0f);
  }
  MPI_Comm_free(&comm);
}

TEST_CASE("workspace: reused across calls without growing, slots taken in turn, misuse rejected everywhere") {
  const int p = size_of();
  const std::size_t per_peer = 3000, n = per_peer * std::size_t(p);
  auto send = make_data(n, rank_of() + 9);
  view got("got", n), expected("expected", n), sum("sum", n), sum_expected("sum_expected", n);
  MPI_Alltoall(send.data(), int(per_peer), MPI_FLOAT, expected.data(), int(per_peer), MPI_FLOAT, MPI_COMM_WORLD);
  MPI_Allreduce(send.data(), sum_expected.data(), int(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  kompress::comm_workspace workspace(MPI_COMM_WORLD, 2);
  std::size_t held = 0;
  for (int iteration = 0; iteration < 3; ++iteration) {
    kompress::alltoall(host{}, send, got, MPI_COMM_WORLD, abs_options, &workspace);
    auto a = kompress::ialltoall(host{}, send, got, MPI_COMM_WORLD, abs_options, &workspace);
    auto b = kompress::iallreduce(host{}, send, sum, MPI_COMM_WORLD, abs_options, &workspace);
    // Both slots are in flight: a third nonblocking call is refused on every rank.
    view other("other", n);
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
