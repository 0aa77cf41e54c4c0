// The butterfly schedules (recursive halving and doubling: allreduce's two phases,
// reduce_scatter's halving, allgather's doubling) run symbolically for p = 1 .. 70 ranks: every
// message one rank sends is the one its peer expects at that point (same ranges, same order); a
// partial sum is read only once formed; every rank's contribution reaches every value exactly
// once; a final stream is compressed once, by the rank the schedule says, from what it should
// hold, and no rank receives one it holds; every rank ends holding what the collective
// delivers. And the cost model's choice between the schedules. No MPI runs here:
// tests/comm/{allreduce,allgather,reduce_scatter}.cpp check the values under mpiexec.

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

using kompress::detail::butterfly_collective;
using kompress::detail::butterfly_geometry;
using kompress::detail::butterfly_step;
using contributions = std::bitset<128>;  ///< which ranks' values a partial sum holds

// Checked per value and per block: doctest's assertions cost more than the symbolic run itself
// (minutes under the sanitizers), so they are reached only when the condition fails, and then
// report it as usual.
#define REQUIRE_EACH(...) do { if (!(__VA_ARGS__)) REQUIRE(__VA_ARGS__); } while (false)
#define CHECK_EACH(...) do { if (!(__VA_ARGS__)) CHECK(__VA_ARGS__); } while (false)

/// One message in flight: the range it covers and, per value (reduce) or block (final, in the
/// order final_blocks gives), what it carries.
struct symbolic_message {
  bool reduces = true;
  std::size_t begin = 0, end = 0;
  int skip = -1;
  std::vector<int> blocks;
  std::vector<contributions> carried;
};

/// The block whose final stream `rank` compresses (-1: none), as the schedule's description
/// says: allreduce's core rank the block at its position, allgather's rank its own,
/// reduce_scatter's folding core rank the block of the rank folded into it.
int compressed_block(const butterfly_geometry& shape, int rank) {
  switch (shape.collective) {
    case butterfly_collective::allreduce:
      return shape.folded_out(rank) ? -1 : shape.position_of(shape.core_rank(rank));
    case butterfly_collective::allgather: return rank;
    case butterfly_collective::reduce_scatter: return shape.folds(rank) && !shape.folded_out(rank) ? rank - 1 : -1;
  }
  return -1;
}

/// Runs every rank's steps of `collective` on `count` values (allreduce), or `count` per rank
/// (the others), each step's sends first, then its receives once they are there.
void run_symbolically(int p, std::size_t count, butterfly_collective collective) {
  CAPTURE(p);
  CAPTURE(count);
  CAPTURE(int(collective));
  const std::size_t values = collective == butterfly_collective::allreduce ? count : count * std::size_t(p);
  std::vector<std::vector<butterfly_step>> steps;
  for (int rank = 0; rank < p; ++rank)
    steps.push_back(kompress::detail::butterfly_steps(butterfly_geometry{{rank, p}, values, collective}));
  const butterfly_geometry shape{{0, p}, values, collective};
  const int blocks = shape.block_count();
  auto sums = std::vector(std::size_t(p), std::vector<contributions>(values));
  auto formed = std::vector(std::size_t(p), std::vector<bool>(values, false));
  // The final streams a rank holds, per block: the contributions they carry (none: not held).
  auto finals = std::vector(std::size_t(p), std::vector<contributions>(std::size_t(blocks)));
  std::vector<int> compressed(std::size_t(p), 0);
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
  // Rank `rank` compresses block `block` the first time it sends it: the block the schedule
  // names, holding every contribution (a sum) or its own values (allgather).
  const auto compress_final = [&](int rank, int block) {
    const std::size_t r = std::size_t(rank);
    REQUIRE_EACH(block == compressed_block(shape, rank));
    ++compressed[r];
    if (collective == butterfly_collective::allgather) {
      finals[r][std::size_t(block)] = own(rank);
      return;
    }
    for (std::size_t i = shape.block_begin(block); i < shape.block_begin(block + 1); ++i) {
      REQUIRE_EACH(formed[r][i]);
      REQUIRE_EACH(sums[r][i] == all);  // every contribution, once
    }
    finals[r][std::size_t(block)] = all;
  };

  for (bool progress = true; progress;) {
    progress = false;
    for (int rank = 0; rank < p; ++rank) {
      const std::size_t r = std::size_t(rank);
      if (next[r] == steps[r].size()) continue;
      const butterfly_step& step = steps[r][next[r]];
      if (!sent[r]) {
        sent[r] = progress = true;
        if (step.send_peer >= 0) {
          REQUIRE_EACH(step.send_peer != rank);
          symbolic_message m{step.reduces, step.send_begin, step.send_end, step.skip, {}, {}};
          if (!step.reduces) {
            m.blocks = shape.final_blocks(step.send_begin, step.send_end, step.skip);
            for (const int block : m.blocks) {
              REQUIRE_EACH(block != step.skip);
              if (finals[r][std::size_t(block)].none()) compress_final(rank, block);
              m.carried.push_back(finals[r][std::size_t(block)]);
            }
          }
          for (std::size_t i = step.send_begin; i < step.send_end && step.reduces; ++i) {
            if (step.reads_input) {
              m.carried.push_back(own(rank));
            } else {
              REQUIRE_EACH(formed[r][i]);  // a partial sum read only once formed
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
        REQUIRE_EACH(m.reduces == step.reduces);
        REQUIRE_EACH(m.begin == step.receive_begin);
        REQUIRE_EACH(m.end == step.receive_end);
        REQUIRE_EACH(m.skip == step.skip);
        if (!step.reduces) {
          REQUIRE_EACH(m.blocks == shape.final_blocks(step.receive_begin, step.receive_end, step.skip));
          for (std::size_t k = 0; k < m.blocks.size(); ++k) {
            const std::size_t block = std::size_t(m.blocks[k]);
            REQUIRE_EACH(finals[r][block].none());  // never a stream this rank holds
            finals[r][block] = m.carried[k];
          }
        }
        for (std::size_t i = m.begin; i < m.end && step.reduces; ++i) {
          const contributions& came = m.carried[i - m.begin];
          const contributions mine = step.reads_input ? own(rank) : sums[r][i];
          if (!step.reads_input) REQUIRE_EACH(formed[r][i]);
          REQUIRE_EACH((mine & came).none());  // no contribution counted twice
          sums[r][i] = mine | came;
          formed[r][i] = true;
        }
      }
      ++next[r];
      sent[r] = false;
      progress = true;
    }
  }
  for (int rank = 0; rank < p; ++rank) {
    CAPTURE(rank);
    const std::size_t r = std::size_t(rank);
    CHECK_EACH(next[r] == steps[r].size());  // no rank left waiting
    if (p == 1) continue;
    CHECK_EACH(compressed[r] == (compressed_block(shape, rank) >= 0 ? 1 : 0));  // each final compressed once
    switch (collective) {
      case butterfly_collective::allreduce:
        for (int block = 0; block < blocks; ++block) CHECK_EACH(finals[r][std::size_t(block)] == all);
        break;
      case butterfly_collective::allgather:
        for (int block = 0; block < blocks; ++block) CHECK_EACH(finals[r][std::size_t(block)] == own(block));
        break;
      case butterfly_collective::reduce_scatter:
        if (shape.folded_out(rank)) {
          CHECK_EACH(finals[r][r] == all);
        } else {
          for (std::size_t i = shape.block_begin(rank); i < shape.block_begin(rank + 1); ++i) {
            CHECK_EACH(formed[r][i]);
            CHECK_EACH(sums[r][i] == all);
          }
        }
        break;
    }
  }
  for (const auto& [pair, queue] : wire) CHECK_EACH(queue.empty());  // every message received
}

constexpr butterfly_collective every_collective[] = {butterfly_collective::allreduce,
                                                     butterfly_collective::reduce_scatter,
                                                     butterfly_collective::allgather};
constexpr butterfly_collective one_phase_collectives[] = {butterfly_collective::reduce_scatter,
                                                          butterfly_collective::allgather};

}  // namespace

TEST_CASE("halving and doubling: every message matched, every contribution once, every block where it belongs") {
  for (const butterfly_collective collective : every_collective)
    for (int p = 1; p <= 70; ++p) {
      // allreduce's count is the whole vector, cut into uneven blocks; the others' is per rank.
      const std::size_t larger = collective == butterfly_collective::allreduce ? 257 : 19;
      for (const std::size_t count : {std::size_t(0), std::size_t(3), larger}) run_symbolically(p, count, collective);
    }
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
  // reduce_scatter and allgather: one phase, log2 p steps; on 6 ranks the fold and the unfold.
  for (const butterfly_collective collective : one_phase_collectives) {
    for (const int p : {2, 4, 16, 1024}) {
      const int k = std::countr_zero(unsigned(p));
      for (const int rank : {0, p - 1})
        CHECK(kompress::detail::butterfly_steps({{rank, p}, std::size_t(p) * 10, collective}).size() == std::size_t(k));
    }
    CHECK(kompress::detail::butterfly_steps({{0, 6}, 60, collective}).size() == 2u);
    CHECK(kompress::detail::butterfly_steps({{1, 6}, 60, collective}).size() == 4u);
    CHECK(kompress::detail::butterfly_steps({{5, 6}, 60, collective}).size() == 2u);
  }
}

TEST_CASE("halving and doubling: allreduce's largest messages between neighbouring ranks, the smallest far apart") {
  // Launchers place consecutive ranks on one node: allreduce's halving pairs neighbours first
  // (half the vector), each later step a partner twice as far with half as much; the doubling
  // undoes it, the farthest partner first with the least, as does allgather's. 16 ranks, 4 to a
  // node: only the steps of an eighth and a sixteenth of the vector leave a node.
  // reduce_scatter pairs the farthest first, so that each rank ends with its own block.
  for (const butterfly_collective collective : every_collective) {
    CAPTURE(int(collective));
    const std::size_t count = 16 * 64;
    for (const int rank : {0, 5, 15}) {
      CAPTURE(rank);
      const auto steps = kompress::detail::butterfly_steps({{rank, 16}, count, collective});
      const bool reduces = collective != butterfly_collective::allgather;
      const bool gathers = collective != butterfly_collective::reduce_scatter;
      REQUIRE(steps.size() == std::size_t(4 * (int(reduces) + int(gathers))));
      for (std::size_t j = 0; j < steps.size(); ++j) {
        CAPTURE(j);
        const bool halving = reduces && j < 4;
        const bool nearest_first = collective == butterfly_collective::allreduce;
        // the partner's distance 2^level; halving sends count >> (step + 1) values, doubling
        // 8 >> level positions (one block each)
        const int step = halving ? int(j) : int(j) - (reduces ? 4 : 0);
        const int level = halving && nearest_first ? step : 3 - step;
        CHECK(steps[j].send_peer == (rank ^ (1 << level)));
        const std::size_t sent = steps[j].send_end - steps[j].send_begin;
        CHECK(sent == (halving ? count >> (step + 1) : std::size_t(8 >> level)));
      }
    }
  }
  // The position a core rank ends allreduce's halving with: its bits reversed.
  const butterfly_geometry sixteen{{0, 16}, 1600};
  CHECK(sixteen.position_of(1) == 8);
  CHECK(sixteen.position_of(6) == 6);
  CHECK(sixteen.position_of(11) == 13);
  for (int c = 0; c < 16; ++c) CHECK(sixteen.position_of(sixteen.position_of(c)) == c);
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

TEST_CASE("the cost model chooses reduce_scatter's and allgather's schedule as allreduce's, phase by phase") {
  using kompress::collective_schedule;
  using kompress::detail::takes_halving_doubling;
  kompress::detail::wire_rule rule{kompress::transfer_mode::compressed, {}};
  const std::uint64_t mib = 1 << 20;
  for (const butterfly_collective collective : one_phase_collectives) {
    CAPTURE(int(collective));
    CHECK(takes_halving_doubling(collective_schedule::halving_doubling, rule, 64 * mib, 3, collective));
    CHECK_FALSE(takes_halving_doubling(collective_schedule::ring, rule, 1024, 1024, collective));
    // A power of two from 4 ranks on: the same bytes in log2 p steps instead of p - 1.
    CHECK(takes_halving_doubling(collective_schedule::automatic, rule, 64 * mib, 64, collective));
    CHECK(takes_halving_doubling(collective_schedule::automatic, rule, 4096, 1024, collective));
    CHECK(takes_halving_doubling(collective_schedule::automatic, rule, 64 * mib, 4, collective));
    CHECK_FALSE(takes_halving_doubling(collective_schedule::automatic, rule, 64 * mib, 2, collective));
    // Three ranks: the fold and the unfold add steps and bytes; the ring.
    CHECK_FALSE(takes_halving_doubling(collective_schedule::automatic, rule, 64 * mib, 3, collective));
    CHECK_FALSE(takes_halving_doubling(collective_schedule::automatic, rule, 4096, 3, collective));
    // Many ranks, no power of two: the ring's p - 1 latencies against the fold's extra bytes.
    CHECK(takes_halving_doubling(collective_schedule::automatic, rule, 64 * 1024, 1000, collective));
    kompress::detail::wire_rule no_latency = rule;
    no_latency.cost.latency_seconds = 0.0;
    CHECK_FALSE(takes_halving_doubling(collective_schedule::automatic, no_latency, 64 * 1024, 1000, collective));
  }
}
