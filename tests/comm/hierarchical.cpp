// The hierarchical collectives (kompress::allreduce, reduce_scatter and allgather over
// kompress::node_groups) against plain MPI_Allreduce, MPI_Reduce_scatter_block and
// MPI_Allgather, element by element, within the bound of the collective across nodes (q nodes'
// compressions, not p ranks') plus the summation error, bit-identical on every rank where MPI's
// result is; on the execution space's memory, in place or not, with a tail of n mod k values;
// node groups by shared memory, by runs of ranks and by named nodes (round-robin: the blocks'
// order differs from the ranks'), uniform or not; bad calls rejected on every rank. Run under
// mpiexec -n 1, 2, 3, 4 and 6 (two and three nodes of two, two of three ranks).

#include <kompress/comm.hpp>

#include "comm/checks.hpp"
#include "support/device_views.hpp"
#include "support/mpi_checks.hpp"

#include <doctest/doctest.h>
#include <mpi.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

namespace {

using namespace kompress::test;  // support/mpi_checks.hpp, support/device_views.hpp, comm/checks.hpp

/// Whether every rank's check passed.
bool on_every_rank(bool passed) {
  int all = passed ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  return all == 1;
}

/// How many compressions an element's sum goes through: those of the allreduce across q nodes
/// where the groups are uniform with more than one rank per node, else the flat allreduce's p.
int compressions(const kompress::node_groups& groups) {
  return groups.uniform() && groups.ranks_per_node() > 1 ? groups.nodes() : size_of();
}

/// One hierarchical allreduce on the execution space's memory against MPI_Allreduce.
template <class T>
void check_against_mpi(const kompress::node_groups& groups, std::size_t n, const kompress::collective_options& options,
                       bool in_place) {
  const int p = size_of(), me = rank_of();
  auto send = make_data<T>(n, me + 5);
  host_view<T> expected("expected", n), magnitude("magnitude", n), abs_send("abs", n);
  MPI_Allreduce(send.data(), expected.data(), int(n), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
  for (std::size_t i = 0; i < n; ++i) abs_send(i) = std::fabs(send(i));
  MPI_Allreduce(abs_send.data(), magnitude.data(), int(n), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
  const double e = agreed_bound(send, options.codec.bound);
  const bool compresses = options.mode != kompress::transfer_mode::raw;
  const double result_bound = !compresses ? 0.0
                              : options.reduction_bound == kompress::allreduce_bound::total ? e
                                                                                             : compressions(groups) * e;

  auto data = to_device(send);
  kompress::collective_report report;
  host_view<T> got;
  if (in_place) {
    report = kompress::allreduce(exec_space{}, data, groups, options);
    got = to_host(data);
  } else {
    device_view<T> result("result", n);
    report = kompress::allreduce(exec_space{}, data, result, groups, options);
    got = to_host(result);
  }
  CHECK(report.absolute_bound <= result_bound * (1 + 1e-12));
  std::size_t beyond = 0;
  constexpr double eps = std::numeric_limits<T>::epsilon();
  for (std::size_t i = 0; i < n; ++i) {
    const double tolerance = result_bound + 2.0 * p * eps * double(magnitude(i));
    beyond += !(std::fabs(double(got(i)) - double(expected(i))) <= tolerance);
  }
  CHECK(beyond == 0);
  CHECK(identical_on_every_rank(got));
}

/// Node groups of every kind this many ranks can form.
template <class Check>
void for_each_grouping(Check&& check) {
  {
    const kompress::node_groups by_memory(MPI_COMM_WORLD);
    check(by_memory);
  }
  for (int k : {1, 2, 3}) {
    const kompress::node_groups runs(MPI_COMM_WORLD, k);
    check(runs);
  }
  // Round-robin over two nodes: node 0 holds the even ranks, node 1 the odd ones.
  const auto round_robin = kompress::node_groups::by_node(MPI_COMM_WORLD, rank_of() % 2);
  check(round_robin);
}

/// How many compressions a reduce_scatter's sum goes through across `ranks` ranks by `schedule`:
/// the ring's ranks - 1; recursive halving's ranks where ranks is no power of two.
int reduce_scatter_compressions(int ranks, kompress::collective_schedule schedule) {
  const bool folds = schedule == kompress::collective_schedule::halving_doubling && !std::has_single_bit(unsigned(ranks));
  return folds ? ranks : ranks - 1;
}

/// The ranks of the collective that compresses: q nodes where the groups run their phases.
int compressing_ranks(const kompress::node_groups& groups) {
  return groups.uniform() && groups.ranks_per_node() > 1 ? groups.nodes() : size_of();
}

/// One hierarchical reduce_scatter on the execution space's memory against
/// MPI_Reduce_scatter_block, with the ring or recursive halving across nodes.
template <class T>
void check_reduce_scatter(const kompress::node_groups& groups, std::size_t m,
                          const kompress::collective_options& options) {
  const int p = size_of(), me = rank_of();
  auto send = make_data<T>(m * std::size_t(p), me + 3);
  host_view<T> expected("expected", m), magnitude("magnitude", m), abs_send("abs", send.size());
  MPI_Reduce_scatter_block(send.data(), expected.data(), int(m), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
  for (std::size_t i = 0; i < send.size(); ++i) abs_send(i) = std::fabs(send(i));
  MPI_Reduce_scatter_block(abs_send.data(), magnitude.data(), int(m), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
  const double e = agreed_bound(send, options.codec.bound);
  const double result_bound =
      options.mode == kompress::transfer_mode::raw                  ? 0.0
      : options.reduction_bound == kompress::allreduce_bound::total ? e
                                                                    : reduce_scatter_compressions(
                                                                          compressing_ranks(groups), options.schedule) *
                                                                          e;
  device_view<T> result("result", m);
  const auto report = kompress::reduce_scatter(exec_space{}, to_device(send), result, groups, options);
  const auto got = to_host(result);
  CHECK(report.absolute_bound <= result_bound * (1 + 1e-12));
  std::size_t beyond = 0;
  constexpr double eps = std::numeric_limits<T>::epsilon();
  for (std::size_t i = 0; i < m; ++i) {
    const double tolerance = result_bound + 2.0 * p * eps * double(magnitude(i));
    beyond += !(std::fabs(double(got(i)) - double(expected(i))) <= tolerance);
  }
  CHECK(beyond == 0);
}

/// One hierarchical allgather on the execution space's memory against MPI_Allgather: every block
/// where its owner is, within the bound, bit-identical on every rank.
template <class T>
void check_allgather(const kompress::node_groups& groups, std::size_t m, const kompress::collective_options& options) {
  const int p = size_of(), me = rank_of();
  auto send = make_data<T>(m, me + 7);
  host_view<T> expected("expected", m * std::size_t(p));
  MPI_Allgather(send.data(), int(m), mpi_type<T>(), expected.data(), int(m), mpi_type<T>(), MPI_COMM_WORLD);
  const double e = options.mode == kompress::transfer_mode::raw ? 0.0 : agreed_bound(send, options.codec.bound);
  device_view<T> result("result", expected.size());
  const auto report = kompress::allgather(exec_space{}, to_device(send), result, groups, options);
  const auto got = to_host(result);
  CHECK(report.absolute_bound <= e * (1 + 1e-12));
  std::size_t beyond = 0;
  for (std::size_t i = 0; i < got.size(); ++i) beyond += !(std::fabs(double(got(i)) - double(expected(i))) <= e);
  CHECK(beyond == 0);
  CHECK(identical_on_every_rank(got));
}

}  // namespace

TEST_CASE("node groups: by shared memory and by runs of ranks, their communicators and sizes") {
  const int p = size_of(), me = rank_of();
  {
    // Whatever the MPI calls a node (every rank of this machine, or each rank alone where it
    // offers no shared memory): the nodes partition the ranks, and across() has one rank of each.
    const kompress::node_groups groups(MPI_COMM_WORLD);
    int node_sizes = rank_of(groups.node()) == 0 ? size_of(groups.node()) : 0;
    MPI_Allreduce(MPI_IN_PLACE, &node_sizes, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    CHECK(node_sizes == p);
    CHECK(groups.ranks_per_node() >= size_of(groups.node()));
    if (groups.uniform()) {
      CHECK(groups.nodes() * groups.ranks_per_node() == p);
      CHECK(size_of(groups.across()) == groups.nodes());
    }
  }
  for (int k = 1; k <= 4; ++k) {
    CAPTURE(k);
    const kompress::node_groups groups(MPI_COMM_WORLD, k);
    CHECK(groups.comm() == MPI_COMM_WORLD);
    CHECK(groups.nodes() == (p + k - 1) / k);
    CHECK(groups.ranks_per_node() == std::min(k, p));
    CHECK(groups.uniform() == (p % k == 0 || p < k));
    CHECK(rank_of(groups.node()) == me % k);
    CHECK(size_of(groups.node()) == std::min(k, p - me / k * k));
    CHECK(rank_of(groups.across()) == me / k);
  }
  // Moved: the communicators go with it.
  kompress::node_groups first(MPI_COMM_WORLD, 2);
  const MPI_Comm node = first.node();
  kompress::node_groups second = std::move(first);
  CHECK(second.node() == node);
  CHECK(first.node() == MPI_COMM_NULL);
}

TEST_CASE("node groups: which rank sits at each place of each node") {
  const int p = size_of(), me = rank_of();
  for (int k = 1; k <= 3; ++k) {
    CAPTURE(k);
    const kompress::node_groups runs(MPI_COMM_WORLD, k);
    if (!runs.uniform()) {
      CHECK(runs.rank_at(0, 0) == -1);
      continue;
    }
    for (int node = 0; node < runs.nodes(); ++node)
      for (int place = 0; place < runs.ranks_per_node(); ++place)
        CHECK(runs.rank_at(node, place) == node * k + place);
    CHECK(runs.rank_at(runs.nodes(), 0) == -1);
    CHECK(runs.rank_at(0, runs.ranks_per_node()) == -1);
  }
  // Named nodes, round-robin: place j of node i is rank 2 j + i; odd p leaves them non-uniform.
  const auto round_robin = kompress::node_groups::by_node(MPI_COMM_WORLD, me % 2);
  CHECK(round_robin.nodes() == std::min(p, 2));
  CHECK(rank_of(round_robin.node()) == me / 2);
  CHECK(round_robin.uniform() == (p % 2 == 0 || p == 1));
  if (round_robin.uniform())
    for (int node = 0; node < round_robin.nodes(); ++node)
      for (int place = 0; place < round_robin.ranks_per_node(); ++place)
        CHECK(round_robin.rank_at(node, place) == 2 * place + node);
  CHECK_THROWS_WITH_AS(kompress::node_groups::by_node(MPI_COMM_WORLD, me == 0 ? -1 : 0),
                       doctest::Contains("numbered from 0"), kompress::invalid_argument);
}

TEST_CASE("node groups: ranks_per_node below 1 or different between ranks is rejected on every rank") {
  CHECK_THROWS_WITH_AS(kompress::node_groups(MPI_COMM_WORLD, 0), doctest::Contains("at least 1"),
                       kompress::invalid_argument);
  if (size_of() > 1)
    CHECK_THROWS_WITH_AS(kompress::node_groups(MPI_COMM_WORLD, rank_of() == 0 ? 2 : 1),
                         doctest::Contains("different ranks_per_node"), kompress::invalid_argument);
}

TEST_CASE_TEMPLATE("hierarchical allreduce matches MPI_Allreduce within q times the bound, bit-identical", T, float,
                   double) {
  for_each_grouping([](const kompress::node_groups& groups) {
    CAPTURE(groups.ranks_per_node());
    CAPTURE(groups.nodes());
    for (std::size_t n : {0, 1, 7, 1000, 20011}) {
      CAPTURE(n);
      for (bool in_place : {false, true}) {
        CAPTURE(in_place);
        check_against_mpi<T>(groups, n, {.codec = {.bound = kompress::absolute(1e-3)}}, in_place);
        check_against_mpi<T>(groups, n, {.codec = {.bound = kompress::relative(1e-3)}}, in_place);
      }
      check_against_mpi<T>(
          groups, n, {.codec = {.bound = kompress::relative(1e-2)}, .reduction_bound = kompress::allreduce_bound::total},
          false);
      check_against_mpi<T>(groups, n, {.codec = {.bound = kompress::absolute(1e-2)}, .mode = kompress::transfer_mode::raw},
                           false);
      check_against_mpi<T>(groups, n,
                           {.codec = {.bound = kompress::absolute(1e-2)}, .mode = kompress::transfer_mode::automatic},
                           false);
      check_against_mpi<T>(groups, n,
                           {.codec = {.bound = kompress::absolute(1e-3)},
                            .schedule = kompress::collective_schedule::halving_doubling},
                           true);
    }
  });
}

TEST_CASE("hierarchical allreduce: only the allreduce across nodes compresses, under q times the bound") {
  const int p = size_of();
  if (p % 2 != 0) return;
  const kompress::node_groups groups(MPI_COMM_WORLD, 2);
  const std::size_t n = 1 << 16;
  auto data = to_device(make_data<float>(n, rank_of() + 1));
  const kompress::collective_options options{.codec = {.bound = kompress::absolute(1e-2)}};
  const auto report = kompress::allreduce(exec_space{}, data, groups, options);
  const int q = p / 2;
  CHECK(report.absolute_bound == doctest::Approx(q > 1 ? q * 1e-2 : 0.0));
  // Across nodes every rank sends its block of n/2 values in 2 (q - 1) messages of n / 2q; the
  // phases within the node move raw bytes.
  CHECK(report.payload_bytes > 0);
  if (q > 1) CHECK(report.compressed_messages > 0);
  if (q > 1) CHECK(report.wire_bytes < report.payload_bytes);
  if (q == 1) CHECK(report.wire_bytes == report.payload_bytes);
}

TEST_CASE("hierarchical allreduce on host memory with the homomorphic reduction") {
  for_each_grouping([](const kompress::node_groups& groups) {
    CAPTURE(groups.ranks_per_node());
    const int p = size_of();
    const std::size_t n = 5003;
    auto send = make_data<double>(n, rank_of() + 9);  // |x| <= 10.1
    host_view<double> expected("expected", n), got("got", n);
    MPI_Allreduce(send.data(), expected.data(), int(n), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    const double summation = 2.0 * p * std::numeric_limits<double>::epsilon() * 10.1 * p;
    const kompress::collective_options options{.codec = {.bound = kompress::absolute(1e-4)},
                                               .reduction = kompress::reduction_method::homomorphic};
    const auto report = kompress::allreduce(host{}, send, got, groups, options);
    const double bound = compressions(groups) * 1e-4;
    CHECK(report.absolute_bound <= bound * (1 + 1e-12));
    std::size_t beyond = 0;
    for (std::size_t i = 0; i < n; ++i)
      beyond += !(std::fabs(got(i) - expected(i)) <= bound + summation);
    CHECK(beyond == 0);
    CHECK(identical_on_every_rank(got));
  });
}

TEST_CASE_TEMPLATE("hierarchical reduce_scatter matches MPI_Reduce_scatter_block within the q-rank bound", T, float,
                   double) {
  using kompress::collective_schedule;
  for_each_grouping([](const kompress::node_groups& groups) {
    CAPTURE(groups.ranks_per_node());
    CAPTURE(groups.nodes());
    for (std::size_t m : {0, 1, 7, 1000, 20011}) {
      CAPTURE(m);
      for (auto schedule : {collective_schedule::ring, collective_schedule::halving_doubling}) {
        check_reduce_scatter<T>(groups, m, {.codec = {.bound = kompress::absolute(1e-3)}, .schedule = schedule});
        check_reduce_scatter<T>(groups, m, {.codec = {.bound = kompress::relative(1e-3)}, .schedule = schedule});
      }
      check_reduce_scatter<T>(
          groups, m,
          {.codec = {.bound = kompress::relative(1e-2)}, .reduction_bound = kompress::allreduce_bound::total});
      check_reduce_scatter<T>(groups, m,
                              {.codec = {.bound = kompress::absolute(1e-2)}, .mode = kompress::transfer_mode::raw});
      check_reduce_scatter<T>(
          groups, m, {.codec = {.bound = kompress::absolute(1e-2)}, .mode = kompress::transfer_mode::automatic});
    }
  });
}

TEST_CASE_TEMPLATE("hierarchical allgather matches MPI_Allgather within the bound, bit-identical", T, float, double) {
  for_each_grouping([](const kompress::node_groups& groups) {
    CAPTURE(groups.ranks_per_node());
    CAPTURE(groups.nodes());
    for (std::size_t m : {0, 1, 7, 1000, 20011}) {
      CAPTURE(m);
      check_allgather<T>(groups, m, {.codec = {.bound = kompress::absolute(1e-3)}});
      check_allgather<T>(groups, m,
                         {.codec = {.bound = kompress::relative(1e-2)},
                          .schedule = kompress::collective_schedule::halving_doubling});
      check_allgather<T>(groups, m, {.codec = {.bound = kompress::absolute(1e-2)}, .mode = kompress::transfer_mode::raw});
      check_allgather<T>(groups, m,
                         {.codec = {.bound = kompress::absolute(1e-2)}, .mode = kompress::transfer_mode::automatic});
    }
  });
}

TEST_CASE("hierarchical reduce_scatter and allgather: only the phase across nodes compresses") {
  const int p = size_of();
  if (p % 2 != 0) return;
  const int q = p / 2;
  const std::size_t m = 1 << 14;
  const kompress::collective_options options{.codec = {.bound = kompress::absolute(1e-2)},
                                             .schedule = kompress::collective_schedule::ring};
  const auto check = [&](const kompress::node_groups& groups) {
    device_view<float> sums("sums", m), gathered("gathered", m * std::size_t(p));
    const auto scattered = kompress::reduce_scatter(exec_space{}, to_device(make_data<float>(m * p, rank_of())), sums,
                                                    groups, options);
    CHECK(scattered.absolute_bound == doctest::Approx((q - 1) * 1e-2));
    const auto all = kompress::allgather(exec_space{}, to_device(make_data<float>(m, rank_of())), gathered, groups,
                                         options);
    CHECK(all.absolute_bound == doctest::Approx(q > 1 ? 1e-2 : 0.0));
    for (const auto& report : {scattered, all}) {
      CHECK(report.payload_bytes > 0);
      CHECK((report.compressed_messages > 0) == (q > 1));
      if (q > 1) CHECK(report.wire_bytes < report.payload_bytes);
    }
  };
  check(kompress::node_groups(MPI_COMM_WORLD, 2));
  check(kompress::node_groups::by_node(MPI_COMM_WORLD, rank_of() % q));  // node i: ranks i and i + q
}

TEST_CASE("hierarchical reduce_scatter on host memory with the homomorphic reduction") {
  for_each_grouping([](const kompress::node_groups& groups) {
    CAPTURE(groups.ranks_per_node());
    const int p = size_of();
    const std::size_t m = 2003;
    auto send = make_data<double>(m * std::size_t(p), rank_of() + 9);  // |x| <= 10.1
    host_view<double> expected("expected", m), got("got", m);
    MPI_Reduce_scatter_block(send.data(), expected.data(), int(m), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    const double summation = 2.0 * p * std::numeric_limits<double>::epsilon() * 10.1 * p;
    const kompress::collective_options options{.codec = {.bound = kompress::absolute(1e-4)},
                                               .reduction = kompress::reduction_method::homomorphic};
    const auto report = kompress::reduce_scatter(host{}, send, got, groups, options);
    const double bound = compressing_ranks(groups) * 1e-4;  // one quantization per rank across
    CHECK(report.absolute_bound <= bound * (1 + 1e-12));
    std::size_t beyond = 0;
    for (std::size_t i = 0; i < m; ++i) beyond += !(std::fabs(got(i) - expected(i)) <= bound + summation);
    CHECK(beyond == 0);
  });
}

TEST_CASE("hierarchical reduce_scatter and allgather: a bad call on one rank is an invalid_argument on every rank") {
  const int me = rank_of(), p = size_of();
  const kompress::node_groups groups(MPI_COMM_WORLD, 2);
  if (p > 1) {
    device_view<float> send("send", (me == 0 ? 10 : 11) * std::size_t(p)), recv("recv", me == 0 ? 10 : 11);
    CHECK_THROWS_WITH_AS(kompress::reduce_scatter(exec_space{}, send, recv, groups), doctest::Contains("disagree"),
                         kompress::invalid_argument);
    device_view<float> mine("mine", me == 0 ? 10 : 11), all("all", (me == 0 ? 10 : 11) * std::size_t(p));
    CHECK_THROWS_WITH_AS(kompress::allgather(exec_space{}, mine, all, groups), doctest::Contains("disagree"),
                         kompress::invalid_argument);
  }
  // One rank's receive View has the wrong size: every rank throws.
  {
    device_view<float> send("send", 64 * std::size_t(p)), recv("recv", me == 0 ? 63 : 64);
    CHECK_THROWS_AS(kompress::reduce_scatter(exec_space{}, send, recv, groups), kompress::invalid_argument);
    device_view<float> mine("mine", 64), all("all", 64 * std::size_t(p) - (me == 0 ? 1 : 0));
    CHECK_THROWS_AS(kompress::allgather(exec_space{}, mine, all, groups), kompress::invalid_argument);
  }
  // Then good calls still work on every rank.
  const auto ones = filled(64 * std::size_t(p), 1.0f);
  device_view<float> sums("sums", 64);
  kompress::reduce_scatter(exec_space{}, ones, sums, groups, {.codec = {.bound = kompress::absolute(1e-3)}});
  CHECK(on_every_rank(std::fabs(to_host(sums)(0) - float(p)) <= 1e-3 * p));
}

TEST_CASE("hierarchical collectives with a workspace: the same values as without, calls of any size in turn") {
  for_each_grouping([](const kompress::node_groups& groups) {
    CAPTURE(groups.ranks_per_node());
    CAPTURE(groups.nodes());
    const int p = size_of();
    kompress::hierarchical_workspace workspace(groups);
    const kompress::collective_options options{.codec = {.bound = kompress::relative(1e-3)}};
    const auto same = [](const auto& a, const auto& b) {
      const auto x = to_host(a), y = to_host(b);
      return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
    };
    for (std::size_t m : {1000, 20011, 7, 20011}) {
      CAPTURE(m);
      const auto input = to_device(make_data<float>(m * std::size_t(p), rank_of() + 11));
      device_view<float> with("with", input.size()), without("without", input.size());
      kompress::allreduce(exec_space{}, input, with, groups, options, &workspace);
      kompress::allreduce(exec_space{}, input, without, groups, options);
      CHECK(same(with, without));
      device_view<float> sum_with("sum_with", m), sum_without("sum_without", m);
      kompress::reduce_scatter(exec_space{}, input, sum_with, groups, options, &workspace);
      kompress::reduce_scatter(exec_space{}, input, sum_without, groups, options);
      CHECK(same(sum_with, sum_without));
      const auto mine = Kokkos::subview(input, std::pair<std::size_t, std::size_t>(0, m));
      kompress::allgather(exec_space{}, mine, with, groups, options, &workspace);
      kompress::allgather(exec_space{}, mine, without, groups, options);
      CHECK(same(with, without));
    }
    // The phases' blocks stay in it (where there are phases).
    if (groups.uniform() && groups.ranks_per_node() > 1) CHECK(workspace.bytes() > 0);
  });
}

TEST_CASE("hierarchical collectives: a workspace built for other node groups is rejected on every rank") {
  const kompress::node_groups groups(MPI_COMM_WORLD, 2), others(MPI_COMM_WORLD, 2);
  kompress::hierarchical_workspace workspace(others);
  device_view<float> data("data", 64);
  if (groups.uniform() && groups.ranks_per_node() > 1)
    CHECK_THROWS_WITH_AS(kompress::allreduce(exec_space{}, data, groups, {}, &workspace),
                         doctest::Contains("other node groups"), kompress::invalid_argument);
  kompress::allreduce(exec_space{}, data, groups, {}, nullptr);  // then a good call
}

TEST_CASE("hierarchical allreduce: a bad call on one rank is an invalid_argument on every rank") {
  const int me = rank_of();
  const kompress::node_groups groups(MPI_COMM_WORLD, 2);
  // One rank passes a different count.
  {
    device_view<float> send("send", me == 0 ? 100 : 101), recv("recv", me == 0 ? 100 : 101);
    if (size_of() > 1)
      CHECK_THROWS_WITH_AS(kompress::allreduce(exec_space{}, send, recv, groups), doctest::Contains("disagree"),
                           kompress::invalid_argument);
  }
  // One rank's Views differ in size: its checks fail, every rank throws.
  {
    device_view<float> send("send", 64), recv("recv", me == 0 ? 63 : 64);
    CHECK_THROWS_AS(kompress::allreduce(exec_space{}, send, recv, groups), kompress::invalid_argument);
  }
  // One rank asks for another bound.
  {
    device_view<float> data("data", 64);
    const kompress::collective_options options{
        .codec = {.bound = kompress::absolute(me == 0 ? 1e-3 : 1e-2)}};
    if (size_of() > 1)
      CHECK_THROWS_WITH_AS(kompress::allreduce(exec_space{}, data, groups, options), doctest::Contains("disagree"),
                           kompress::invalid_argument);
  }
  // Then a good call still works on every rank.
  const auto data = filled(std::size_t(64), 1.0f);
  kompress::allreduce(exec_space{}, data, groups, {.codec = {.bound = kompress::absolute(1e-3)}});
  const auto got = to_host(data);
  CHECK(on_every_rank(std::fabs(got(0) - float(size_of())) <= 1e-3 * size_of()));
}
