// Several nonblocking and persistent requests in flight at once, one-shot, pipelined and on a
// workspace, completed in any order (by wait() and by test()), against plain MPI; and the
// persistent request's lifecycle: start on an active request, wait or test before any start,
// moved-from and empty requests, a request destroyed while active; automatic mode's timed choice
// between a raw and a compressed round at init. Run under mpiexec -n 1, 2, 3 and 4.

#include <kompress/comm.hpp>

#include "comm/checks.hpp"
#include "support/mpi_checks.hpp"

#include <doctest/doctest.h>
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <thread>
#include <vector>

using namespace kompress::test;  // support/mpi_checks.hpp, comm/checks.hpp

TEST_CASE("two nonblocking collectives in flight, completed in reverse order") {
  const int p = size_of();
  const std::size_t n = 50000;
  auto a = make_data<float>(n * p, rank_of() + 11);
  auto b = make_data<double>(n, rank_of() + 13);
  host_view<float> a_out("a_out", n * p), a_expected("a_expected", n * p);
  host_view<double> b_out("b_out", n), b_expected("b_expected", n);
  auto first = kompress::ialltoall(host{}, a, a_out, MPI_COMM_WORLD, {.codec = {.bound = kompress::absolute(1e-3)}});
  auto second = kompress::iallreduce(host{}, b, b_out, MPI_COMM_WORLD, {.codec = {.bound = kompress::absolute(1e-6)}});
  while (!second.test()) {
  }
  first.wait();
  MPI_Alltoall(a.data(), int(n * sizeof(float)), MPI_BYTE, a_expected.data(), int(n * sizeof(float)), MPI_BYTE,
               MPI_COMM_WORLD);
  MPI_Allreduce(b.data(), b_expected.data(), int(n), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  std::size_t violations = 0;
  for (std::size_t i = 0; i < n * p; ++i) violations += !(std::fabs(a_out(i) - a_expected(i)) <= 1e-3);
  for (std::size_t i = 0; i < n; ++i) violations += !(std::fabs(b_out(i) - b_expected(i)) <= p * 1e-6 + 1e-9);
  CHECK(violations == 0);
  CHECK(first.report().compressed_messages == std::uint64_t(p - 1));
}

TEST_CASE("iallgather and ireduce_scatter in flight together on a workspace, completed in reverse order") {
  const int p = size_of(), me = rank_of();
  const std::size_t n = 5000;
  kompress::comm_workspace workspace(MPI_COMM_WORLD);
  const kompress::collective_options options{.codec = {.bound = kompress::absolute(1e-4)}};
  auto gather_send = make_data<float>(n, me + 21);
  auto scatter_send = make_data<double>(n * p, me + 23);
  host_view<float> gathered("gathered", n * p), gather_expected("gather_expected", n * p);
  host_view<double> scattered("scattered", n), scatter_expected("scatter_expected", n);
  MPI_Allgather(gather_send.data(), int(n), MPI_FLOAT, gather_expected.data(), int(n), MPI_FLOAT, MPI_COMM_WORLD);
  MPI_Reduce_scatter_block(scatter_send.data(), scatter_expected.data(), int(n), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  for (int round = 0; round < 2; ++round) {  // the second round reuses the workspace's slots
    CAPTURE(round);
    auto first = kompress::iallgather(host{}, gather_send, gathered, MPI_COMM_WORLD, options, &workspace);
    auto second = kompress::ireduce_scatter(host{}, scatter_send, scattered, MPI_COMM_WORLD, options, &workspace);
    while (!second.test()) {
    }
    first.wait();
    CHECK(first.report().absolute_bound <= (p > 1 ? 1e-4 : 0.0));
    CHECK(second.report().absolute_bound <= (p - 1) * 1e-4);
    std::size_t violations = 0;
    for (std::size_t i = 0; i < n * p; ++i)
      violations += !(std::fabs(double(gathered(i)) - double(gather_expected(i))) <= first.report().absolute_bound);
    constexpr double eps = std::numeric_limits<double>::epsilon();
    for (std::size_t i = 0; i < n; ++i)  // |values| <= 10.1: the summation slack of allreduce.cpp
      violations += !(std::fabs(scattered(i) - scatter_expected(i)) <=
                      second.report().absolute_bound + 2.0 * p * eps * 10.1 * p);
    CHECK(violations == 0);
    CHECK(identical_on_every_rank(gathered));
  }
}

TEST_CASE("pipelined: several nonblocking collectives in flight on a workspace, completed in reverse order") {
  const int p = size_of(), me = rank_of();
  kompress::comm_workspace workspace(MPI_COMM_WORLD, 3);
  const auto options = chunked(1000);
  const std::size_t n = 3001;
  auto a = make_data<float>(n * std::size_t(p), me + 11);
  auto b = make_data<float>(n, me + 12);
  host_view<float> a_got("a_got", a.size()), a_want("a_want", a.size()), b_got("b_got", n), b_want("b_want", n);
  MPI_Alltoall(a.data(), int(n), MPI_FLOAT, a_want.data(), int(n), MPI_FLOAT, MPI_COMM_WORLD);
  MPI_Allreduce(b.data(), b_want.data(), int(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  auto first = kompress::ialltoall(host{}, a, a_got, MPI_COMM_WORLD, options, &workspace);
  auto second = kompress::iallreduce(host{}, b, b_got, MPI_COMM_WORLD, options, &workspace);
  const auto second_report = second.wait();
  first.wait();
  std::size_t violations = 0;
  for (std::size_t i = 0; i < a.size(); ++i) violations += !(std::fabs(a_got(i) - a_want(i)) <= pipelined_abs_bound);
  for (std::size_t i = 0; i < n; ++i)
    violations += !(std::fabs(b_got(i) - b_want(i)) <= second_report.absolute_bound + 2.0 * p * 1.2e-7 * 20.0 * p);
  CHECK(violations == 0);
}

TEST_CASE("persistent requests: several in flight, completed in any order") {
  const int p = size_of(), me = rank_of();
  const std::size_t n = 4000;
  const kompress::collective_options options{.codec = {.bound = kompress::absolute(1e-3)}};
  host_view<double> a("a", n), a_sum("a_sum", n), b("b", n * p), b_all("b_all", n * p * p);
  auto sum = kompress::allreduce_init(host{}, a, a_sum, MPI_COMM_WORLD, options);
  auto gather = kompress::allgather_init(host{}, b, b_all, MPI_COMM_WORLD, options);
  host_view<double> expected_sum("es", n), expected_all("ea", n * p * p);
  for (int round = 0; round < persistent_rounds; ++round) {
    refill(a, me, round);
    refill(b, me + 50, round);
    MPI_Allreduce(a.data(), expected_sum.data(), int(n), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allgather(b.data(), int(n * p), MPI_DOUBLE, expected_all.data(), int(n * p), MPI_DOUBLE, MPI_COMM_WORLD);
    sum.start();
    gather.start();
    const auto gathered = gather.wait();  // the other order
    const auto summed = sum.wait();
    std::size_t violations = 0;
    for (std::size_t i = 0; i < n; ++i)
      violations += !(std::fabs(a_sum(i) - expected_sum(i)) <= summed.absolute_bound + 1e-9);
    for (std::size_t i = 0; i < n * p * p; ++i)
      violations += !(std::fabs(b_all(i) - expected_all(i)) <= gathered.absolute_bound);
    CHECK(violations == 0);
  }
}

TEST_CASE("persistent requests: start on an active request, wait or test before any start, empty requests") {
  const int p = size_of();
  host_view<float> send("send", 100 * p), got("got", 100 * p);
  for (const auto mode : {kompress::transfer_mode::raw, kompress::transfer_mode::compressed}) {
    const kompress::collective_options options{.codec = {.bound = kompress::absolute(1e-3)}, .mode = mode};
    auto request = kompress::alltoall_init(host{}, send, got, MPI_COMM_WORLD, options);
    CHECK(request.valid());
    CHECK(!request.active());
    CHECK_THROWS_WITH_AS(request.wait(), doctest::Contains("never started"), kompress::invalid_argument);
    CHECK_THROWS_WITH_AS(request.test(), doctest::Contains("never started"), kompress::invalid_argument);
    request.start();
    CHECK_THROWS_WITH_AS(request.start(), doctest::Contains("active"), kompress::invalid_argument);
    CHECK_THROWS_WITH_AS(request.run(), doctest::Contains("active"), kompress::invalid_argument);
    request.wait();
    CHECK(!request.active());
    request.wait();  // completed: returns at once
    CHECK(request.test());

    // Moved from: empty. Moving an active request moves its round.
    request.start();
    kompress::persistent_request moved = std::move(request);
    CHECK(!request.valid());
    CHECK(moved.active());
    CHECK_THROWS_WITH_AS(request.start(), doctest::Contains("empty request"), kompress::invalid_argument);
    CHECK_THROWS_WITH_AS(request.wait(), doctest::Contains("empty request"), kompress::invalid_argument);
    moved.wait();

    // Destroyed while active: the destructor completes the round first; the next call works.
    {
      auto doomed = kompress::allreduce_init(host{}, send, got, MPI_COMM_WORLD, options);
      doomed.start();
    }
    const auto again = kompress::allreduce(host{}, send, got, MPI_COMM_WORLD, options);
    CHECK(again.absolute_bound >= 0.0);
  }
  kompress::persistent_request empty;
  CHECK(!empty.valid());
  CHECK_THROWS_AS(empty.report(), kompress::invalid_argument);
}

namespace {

/// A round that takes `seconds` on this rank (a sleep), and counts its rounds: the candidates
/// faster_of times, with times chosen per rank.
class timed_round final : public kompress::detail::persistent_operation {
 public:
  timed_round(double seconds, int* rounds) : seconds_(seconds), rounds_(rounds) {}
  void start() override {}
  bool progress(bool) override { return true; }
  void run() override {
    ++*rounds_;
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds_));
  }
  const kompress::collective_report& report() const override { return report_; }

 private:
  double seconds_;
  int* rounds_;
  kompress::collective_report report_;
};

/// Which candidate faster_of keeps (true: the compressed one) where this rank's raw and
/// compressed rounds take these times; every candidate's rounds are counted.
bool keeps_compressed(double raw_seconds, double compressed_seconds, int& raw_rounds, int& compressed_rounds) {
  auto raw = std::make_unique<timed_round>(raw_seconds, &raw_rounds);
  auto compressed = std::make_unique<timed_round>(compressed_seconds, &compressed_rounds);
  const kompress::detail::persistent_operation* compressed_op = compressed.get();
  const auto kept = kompress::detail::faster_of(std::move(raw), std::move(compressed), MPI_COMM_WORLD, "test");
  return kept.get() == compressed_op;
}

}  // namespace

TEST_CASE("persistent requests: automatic mode keeps the faster round, as the slowest rank timed it") {
  const int me = rank_of();
  int raw_rounds = 0, compressed_rounds = 0;
  // Everywhere faster compressed: kept, after one untimed and eight timed rounds of each.
  CHECK(keeps_compressed(0.012, 0.002, raw_rounds, compressed_rounds));
  CHECK(raw_rounds == 9);
  CHECK(compressed_rounds == 9);
  // Everywhere faster raw, and a tie within the 5% margin: raw.
  CHECK_FALSE(keeps_compressed(0.002, 0.012, raw_rounds, compressed_rounds));
  CHECK_FALSE(keeps_compressed(0.010, 0.0098, raw_rounds, compressed_rounds));
  // Faster compressed on every rank but the last, where it is slow: the slowest rank's times
  // decide, and every rank keeps raw.
  const bool last = me == size_of() - 1;
  CHECK_FALSE(keeps_compressed(0.010, last ? 0.030 : 0.001, raw_rounds, compressed_rounds));
  // Rounds past half a second in all: the pairs stop after that, on every rank alike.
  raw_rounds = compressed_rounds = 0;
  CHECK(keeps_compressed(me == 0 ? 0.3 : 0.15, 0.02, raw_rounds, compressed_rounds));
  CHECK(raw_rounds == 3);  // untimed, then pairs to 0.32 s and 0.64 s (rank 0's times decide)
  CHECK(compressed_rounds == 3);
}
