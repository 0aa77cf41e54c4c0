// The recursive halving and doubling schedule, run symbolically for p = 1 .. 70 ranks: every
// message one rank sends is the one its peer expects at that point (same ranges, same order);
// a partial sum is read only once formed; every rank's contribution reaches every value exactly
// once; the final block a rank compresses holds every contribution; every rank ends holding the
// final streams of every block. And the cost model's choice between the two schedules. No MPI
// runs here: tests/comm/allreduce.cpp checks the values under mpiexec.

#include <kompress/comm.hpp>

#include <doctest/doctest.h>

#include <bit>
#include <bitset>
#include <cstdint>
#include <deque>
#include <map>
#include <utility>
#include <vector>

namespace {

using kompress::detail::butterfly_geometry;
using kompress::detail::butterfly_step;
using contributions = std::bitset<128>;  ///< which ranks' values a partial sum holds

/// One message in flight: the range it covers and, per value (reduce) or block (final), what it
/// carries.
struct symbolic_message {
  bool reduces = true;
  std::size_t begin = 0, end = 0;
  std::vector<contributions> carried;
};

/// Runs every rank's steps, each step's sends first, then its receives once they are there.
void run_symbolically(int p, std::size_t count) {
  CAPTURE(p);
  CAPTURE(count);
  std::vector<std::vector<butterfly_step>> steps;
  for (int rank = 0; rank < p; ++rank)
    steps.push_back(kompress::detail::butterfly_steps(butterfly_geometry{{rank, p}, count}));
  const butterfly_geometry shape{{0, p}, count};
  const int blocks = shape.core_size();
  // A core rank compresses its own block in the one final step that sends a single block.
  for (int rank = 0; rank < p; ++rank) {
    int single = 0;
    for (const butterfly_step& step : steps[std::size_t(rank)])
      if (!step.reduces && step.send_peer >= 0 && step.send_end - step.send_begin == 1) {
        ++single;
        CHECK(int(step.send_begin) == shape.core_rank(rank));
      }
    CHECK(single == (p > 1 && !shape.folded_out(rank) ? 1 : 0));
  }
  auto sums = std::vector(std::size_t(p), std::vector<contributions>(count));
  auto formed = std::vector(std::size_t(p), std::vector<bool>(count, false));
  // The final streams a rank holds, per block: the contributions they carry (none: not held).
  auto finals = std::vector(std::size_t(p), std::vector<contributions>(std::size_t(blocks)));
  std::map<std::pair<int, int>, std::deque<symbolic_message>> wire;  // (from, to) -> in order
  std::vector<std::size_t> next(std::size_t(p), 0);
  std::vector<bool> sent(std::size_t(p), false);
  const auto own = [](int rank) {
    contributions c;
    c.set(std::size_t(rank));
    return c;
  };
  const auto all = [&] {
    contributions c;
    for (int r = 0; r < p; ++r) c.set(std::size_t(r));
    return c;
  }();

  for (bool progress = true; progress;) {
    progress = false;
    for (int rank = 0; rank < p; ++rank) {
      const std::size_t r = std::size_t(rank);
      if (next[r] == steps[r].size()) continue;
      const butterfly_step& step = steps[r][next[r]];
      if (!sent[r]) {
        sent[r] = progress = true;
        if (step.send_peer >= 0) {
          REQUIRE(step.send_peer != rank);
          symbolic_message m{step.reduces, step.send_begin, step.send_end, {}};
          for (std::size_t i = step.send_begin; i < step.send_end; ++i) {
            if (!step.reduces) {
              REQUIRE(finals[r][i].any());  // a final stream this rank holds
              m.carried.push_back(finals[r][i]);
            } else if (step.reads_input) {
              m.carried.push_back(own(rank));
            } else {
              REQUIRE(formed[r][i]);  // a partial sum read only once formed
              m.carried.push_back(sums[r][i]);
            }
          }
          wire[{rank, step.send_peer}].push_back(std::move(m));
        }
      }
      if (step.receive_peer >= 0) {
        auto& queue = wire[{step.receive_peer, rank}];
        if (queue.empty()) continue;
        const symbolic_message m = std::move(queue.front());
        queue.pop_front();
        REQUIRE(m.reduces == step.reduces);
        REQUIRE(m.begin == step.receive_begin);
        REQUIRE(m.end == step.receive_end);
        for (std::size_t i = m.begin; i < m.end; ++i) {
          const contributions& came = m.carried[i - m.begin];
          if (step.reduces) {
            const contributions mine = step.reads_input ? own(rank) : sums[r][i];
            if (!step.reads_input) REQUIRE(formed[r][i]);
            REQUIRE((mine & came).none());  // no contribution counted twice
            sums[r][i] = mine | came;
            formed[r][i] = true;
          } else {
            finals[r][i] = came;
          }
        }
      }
      ++next[r];
      sent[r] = false;
      progress = true;
      // Before its first final step a core rank compresses its own block's sum.
      if (!shape.folded_out(rank) && next[r] < steps[r].size() && !steps[r][next[r]].reduces &&
          steps[r][next[r] - 1].reduces) {
        const int block = shape.core_rank(rank);
        for (std::size_t i = shape.block_begin(block); i < shape.block_begin(block + 1); ++i) {
          REQUIRE(formed[r][i]);
          REQUIRE(sums[r][i] == all);  // every contribution, once
        }
        finals[r][std::size_t(block)] = all;
      }
    }
  }
  for (int rank = 0; rank < p; ++rank) {
    CAPTURE(rank);
    CHECK(next[std::size_t(rank)] == steps[std::size_t(rank)].size());  // no rank left waiting
    if (p == 1) continue;
    for (int block = 0; block < blocks; ++block) CHECK(finals[std::size_t(rank)][std::size_t(block)] == all);
  }
  for (const auto& [pair, queue] : wire) CHECK(queue.empty());  // every message received
}

}  // namespace

TEST_CASE("halving and doubling: every message matched, every contribution once, every block everywhere") {
  for (int p = 1; p <= 70; ++p)
    for (const std::size_t count : {std::size_t(0), std::size_t(3), std::size_t(257)}) run_symbolically(p, count);
}

TEST_CASE("halving and doubling: 2 log2 p steps, 2 more where p is no power of two, the folded ranks 2 in all") {
  for (const int p : {2, 4, 16, 1024}) {
    const int k = std::countr_zero(unsigned(p));
    for (const int rank : {0, p - 1}) CHECK(kompress::detail::butterfly_steps({{rank, p}, 100}).size() == 2u * k);
  }
  // 6 ranks: the core of 4, ranks 0 and 2 folded into 1 and 3.
  CHECK(kompress::detail::butterfly_steps({{0, 6}, 100}).size() == 2u);
  CHECK(kompress::detail::butterfly_steps({{1, 6}, 100}).size() == 6u);
  CHECK(kompress::detail::butterfly_steps({{5, 6}, 100}).size() == 4u);
}

TEST_CASE("the cost model chooses the schedule: halving and doubling where steps cost, the ring where folding does") {
  using kompress::collective_schedule;
  using kompress::detail::takes_halving_doubling;
  kompress::detail::wire_rule rule{kompress::transfer_mode::compressed, {}};
  const std::uint64_t mib = 1 << 20;
  // As stated: whatever the model says.
  CHECK(takes_halving_doubling(collective_schedule::halving_doubling, rule, 64 * mib, 3));
  CHECK_FALSE(takes_halving_doubling(collective_schedule::ring, rule, 1024, 1024));
  // A power of two: the same bytes in fewer steps.
  CHECK(takes_halving_doubling(collective_schedule::automatic, rule, 64 * mib, 64));
  CHECK(takes_halving_doubling(collective_schedule::automatic, rule, 4096, 1024));
  // Two ranks: the same steps; the ring.
  CHECK_FALSE(takes_halving_doubling(collective_schedule::automatic, rule, 64 * mib, 2));
  // No power of two: folding moves the whole vector twice more. Large vectors take the ring,
  // small ones (where the ring's 2 (p-1) latencies dominate) halving and doubling.
  CHECK_FALSE(takes_halving_doubling(collective_schedule::automatic, rule, 64 * mib, 3));
  CHECK_FALSE(takes_halving_doubling(collective_schedule::automatic, rule, 64 * mib, 1000));
  CHECK(takes_halving_doubling(collective_schedule::automatic, rule, 4096, 7));
  CHECK(takes_halving_doubling(collective_schedule::automatic, rule, 64 * 1024, 1000));
  // Without latency, the ring wins even a small vector where folding costs.
  rule.cost.latency_seconds = 0.0;
  CHECK_FALSE(takes_halving_doubling(collective_schedule::automatic, rule, 4096, 7));
}
