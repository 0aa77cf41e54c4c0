// The cost model: measure_cost_model's rates, the same on every rank, and its agreement on the
// probe size; on a sample of the data, the ratio it measures; the chunk plan of pipelined messages and the model's chunk count; automatic
// mode's weighing of a staged call's copies on the execution space's memory, and of a stream
// compressed once and sent to several ranks (allgather); the codec's fixed cost per call, fitted
// and weighed. Run under mpiexec -n 1, 2, 3 and 4.

#include <kompress/comm.hpp>

#include "comm/checks.hpp"
#include "support/device_views.hpp"
#include "support/mpi_checks.hpp"

#include <doctest/doctest.h>
#include <mpi.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

using namespace kompress::test;  // support/mpi_checks.hpp, support/device_views.hpp, comm/checks.hpp

TEST_CASE("measure_cost_model gives every rank the same positive rates") {
  const auto model = kompress::measure_cost_model(host{}, MPI_COMM_WORLD, 1u << 20);
  double rates[3] = {model.link_bytes_per_second, model.compress_bytes_per_second, model.decompress_bytes_per_second};
  for (const double rate : rates) CHECK((std::isfinite(rate) && rate > 0.0));
  double highest[3];
  MPI_Allreduce(rates, highest, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  for (int i = 0; i < 3; ++i) CHECK(highest[i] == rates[i]);
  // The fixed costs per call: finite, not negative, the highest any rank measured, on every rank.
  double calls[2] = {model.compress_call_seconds, model.decompress_call_seconds};
  for (const double call : calls) CHECK((std::isfinite(call) && call >= 0.0 && call < 1.0));
  double lowest[2];
  MPI_Allreduce(calls, lowest, 2, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  for (int i = 0; i < 2; ++i) CHECK(lowest[i] == calls[i]);
}

TEST_CASE("measure_cost_model probes the codec where the build's default execution space computes") {
  const auto model = kompress::measure_cost_model(exec_space{}, MPI_COMM_WORLD, 1u << 18);
  CHECK((std::isfinite(model.compress_bytes_per_second) && model.compress_bytes_per_second > 0.0));
  CHECK((std::isfinite(model.decompress_call_seconds) && model.decompress_call_seconds >= 0.0));
}

TEST_CASE("measure_cost_model agrees on its probe size: a mismatch or a rejected size fails on every rank") {
  if (size_of() > 1)
    CHECK_THROWS_WITH_AS(kompress::measure_cost_model(host{}, MPI_COMM_WORLD, (1u << 16) + 4 * unsigned(rank_of())),
                         doctest::Contains("ranks disagree on probe_bytes"), kompress::invalid_argument);
  // More than one MPI message holds, on the last rank only: nothing allocated, no rank waits.
  const bool last = rank_of() == size_of() - 1;
  CHECK_THROWS_AS(kompress::measure_cost_model(host{}, MPI_COMM_WORLD, last ? std::size_t(3) << 30 : 1u << 16),
                  kompress::invalid_argument);
  // The next call matches on every rank.
  CHECK(kompress::measure_cost_model(host{}, MPI_COMM_WORLD, 1u << 16).compress_bytes_per_second > 0.0);
}

TEST_CASE("chunk plan: sizes, counts and the cost model's chunk count") {
  using kompress::detail::chunk_plan;
  const chunk_plan empty{0, 5};
  CHECK(empty.count() == 0);
  const chunk_plan plan{10, 4};
  CHECK(plan.count() == 3);
  CHECK(plan.begin(2) == 8);
  CHECK(plan.size(0) == 4);
  CHECK(plan.size(2) == 2);

  kompress::cost_model cost;
  cost.link_bytes_per_second = 0.125e9;  // 1 Gb/s
  CHECK(cost.chunks(0) == 1);
  CHECK(cost.chunks(64 * 1024) == 1);  // under two minimal chunks
  const std::uint64_t big = 16u << 20;
  CHECK(cost.chunks(big) > 1);
  CHECK(cost.chunks(big) <= cost.max_chunks);
  CHECK(cost.chunk_bytes(big) >= cost.min_chunk_bytes);
  // Pipelined, the model predicts less than the three stages one after the other.
  kompress::cost_model serial = cost;
  serial.pipeline = false;
  CHECK(serial.chunks(big) == 1);
  CHECK(cost.compressed_seconds(big, 4.0) < serial.compressed_seconds(big, 4.0));
  // A plan: raw messages go whole; fixed chunks as stated; model chunks a multiple of 1024 values.
  CHECK(kompress::detail::plan_chunks(cost, false, 1u << 22, 4, 16u << 20).count() == 1);
  kompress::cost_model fixed = cost;
  fixed.fixed_chunk_bytes = 1000;
  const auto f = kompress::detail::plan_chunks(fixed, true, 1001, 4, 4004);
  CHECK(f.chunk == 250);
  CHECK(f.count() == 5);
  const auto m = kompress::detail::plan_chunks(cost, true, (16u << 20) / 4, 4, 16u << 20);
  CHECK(m.chunk % kompress::detail::chunk_granule == 0);
  CHECK(m.count() == cost.chunks(big));
}

TEST_CASE("the chunk count is where the pipelined time is least, and a codec call's fixed cost makes chunks fewer") {
  // The 10 Gb/s link and this machine's codec rates; then a GPU's: fast, but ~90 us per call.
  kompress::cost_model cpu;
  cpu.link_bytes_per_second = 1.25e9;
  cpu.compress_bytes_per_second = 2e9;
  cpu.decompress_bytes_per_second = 6e9;
  cpu.expected_ratio = 6.0;
  kompress::cost_model gpu = cpu;
  gpu.link_bytes_per_second = 25e9;
  gpu.compress_bytes_per_second = 30e9;
  gpu.decompress_bytes_per_second = 115e9;
  gpu.compress_call_seconds = 90e-6;
  gpu.decompress_call_seconds = 90e-6;
  gpu.max_chunks = 4096;
  gpu.min_chunk_bytes = 4096;
  for (const auto& model : {cpu, gpu}) {
    for (const std::uint64_t bytes : {std::uint64_t(300) << 10, std::uint64_t(16) << 20, std::uint64_t(1) << 30}) {
      // Every admissible k, tried: the model's count is the first least one.
      const std::uint64_t admissible = std::max<std::uint64_t>(
          1, std::min(model.max_chunks, bytes / model.min_chunk_bytes));
      std::uint64_t best = 1;
      for (std::uint64_t k = 2; k <= admissible; ++k)
        if (model.pipelined_seconds(double(bytes), model.expected_ratio, k) <
            model.pipelined_seconds(double(bytes), model.expected_ratio, best))
          best = k;
      CAPTURE(bytes);
      CHECK(model.chunks(bytes) == best);
      CHECK(model.compressed_seconds(bytes, model.expected_ratio) ==
            model.pipelined_seconds(double(bytes), model.expected_ratio, best));
    }
  }
  // Without call costs the time is the closed form over the whole message's three stages.
  const double b = 16 << 20, c = b / 2e9, w = b / (6.0 * 1.25e9), d = b / 6e9;
  CHECK(cpu.pipelined_seconds(b, 6.0, 8) ==
        doctest::Approx((c + w + d) / 8 + 7.0 / 8 * std::max({c, w, d}) + 7 * cpu.chunk_seconds));
  // 64 MiB on the GPU: each chunk pays two calls, so far fewer chunks than without them.
  kompress::cost_model free_calls = gpu;
  free_calls.compress_call_seconds = free_calls.decompress_call_seconds = 0.0;
  CHECK(gpu.chunks(64u << 20) < free_calls.chunks(64u << 20));
  CHECK(gpu.chunks(64u << 20) <= 8);
  // A 64 KiB message costs a GPU two calls, 180 us, where the raw values take 2.6 us: never worth
  // compressing, and a stream already made loses to the raw values; free calls would pay.
  CHECK_FALSE(gpu.worth_compressing(64 * 1024));
  CHECK_FALSE(gpu.compressed_wins(64 * 1024, 1024));
  kompress::cost_model slow_link = free_calls;
  slow_link.link_bytes_per_second = 1.25e9;
  CHECK(slow_link.worth_compressing(64 * 1024));
  slow_link.compress_call_seconds = slow_link.decompress_call_seconds = 90e-6;
  CHECK_FALSE(slow_link.worth_compressing(64 * 1024));
}

TEST_CASE("a codec's fixed cost per call, fitted from two call sizes") {
  using kompress::detail::affine_codec_cost;
  // 16 KiB in 91 us and 64 MiB in 2,260 us (the H200's compression): ~90 us and ~31 GB/s.
  const auto [rate, call] = affine_codec_cost(16384.0, 91e-6, 67108864.0, 2260e-6);
  CHECK(call == doctest::Approx(90.5e-6).epsilon(0.01));
  CHECK(rate == doctest::Approx(30.9e9).epsilon(0.01));
  CHECK(call + 67108864.0 / rate == doctest::Approx(2260e-6));
  // The small call faster per byte (in cache): no fixed cost, the large call's rate.
  const auto [cached_rate, cached_call] = affine_codec_cost(16384.0, 1e-6, 4194304.0, 2e-3);
  CHECK(cached_call == 0.0);
  CHECK(cached_rate == doctest::Approx(4194304.0 / 2e-3));
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

namespace {

/// A link, a codec and data where one 256 KiB message compressed for one link does not pay by
/// min_gain, but one compressed for two or more links (decoded at each end) does.
kompress::cost_model forwarding_pays() {
  return {.link_bytes_per_second = 1e9,
          .compress_bytes_per_second = 2e9,
          .decompress_bytes_per_second = 10e9,
          .expected_ratio = 10.0};
}

}  // namespace

TEST_CASE("a stream compressed once and sent to several ranks: compressing pays sooner than for one link") {
  const kompress::cost_model model = forwarding_pays();
  const std::uint64_t block = 256 * 1024;
  CHECK_FALSE(model.worth_compressing(block));
  CHECK(model.worth_compressing_forwarded(block, 1) == model.worth_compressing(block));
  CHECK_FALSE(model.worth_compressing_forwarded(block, 0));
  for (const std::uint64_t sends : {2u, 3u, 63u, 1023u}) CHECK(model.worth_compressing_forwarded(block, sends));
  // Below min_message_bytes always raw; a link faster than decoding never pays.
  CHECK_FALSE(model.worth_compressing_forwarded(model.min_message_bytes - 1, 1023));
  kompress::cost_model fast_link = model;
  fast_link.link_bytes_per_second = 100e9;
  CHECK_FALSE(fast_link.worth_compressing_forwarded(block, 1023));
}

TEST_CASE("automatic allgather compresses every block where its stream reaches enough ranks to pay") {
  const int p = size_of(), me = rank_of();
  const std::size_t n = 256 * 1024 / sizeof(float);
  kompress::collective_options options{.codec = {.bound = kompress::absolute(1e-3)},
                                       .mode = kompress::transfer_mode::automatic,
                                       .cost = forwarding_pays()};
  auto send = make_data<float>(n, me + 41);
  host_view<float> got("got", n * std::size_t(p)), expected("expected", n * std::size_t(p));
  MPI_Allgather(send.data(), int(n), MPI_FLOAT, expected.data(), int(n), MPI_FLOAT, MPI_COMM_WORLD);
  for (const auto schedule : all_schedules) {
    CAPTURE(int(schedule));
    options.schedule = schedule;
    const auto report = kompress::allgather(host{}, send, got, MPI_COMM_WORLD, options);
    // Two ranks: one link per block, raw (MPI_Allgather itself); three or more: compressed.
    if (p >= 3) {
      CHECK(report.compressed_messages == report.messages);
      CHECK(report.messages > 0);
    } else {
      CHECK(report.compressed_messages == 0);
    }
    std::size_t violations = 0;
    for (std::size_t i = 0; i < got.size(); ++i)
      violations += !(std::fabs(got(i) - expected(i)) <= report.absolute_bound);
    CHECK(violations == 0);
    CHECK(identical_on_every_rank(got));
  }
}

namespace {

/// A GPU's codec as the H200 measured it (docs/performance.md: about 90 us per call, then 31 GB/s
/// compressing and 133 GB/s decoding), activations' ratio at REL 1e-2, a 100 Gb/s link.
kompress::cost_model gpu_at_100_gbps() {
  return {.link_bytes_per_second = 12.5e9,
          .compress_bytes_per_second = 30.94e9,
          .decompress_bytes_per_second = 133.16e9,
          .expected_ratio = 6.19,
          .compress_call_seconds = 90.5e-6,
          .decompress_call_seconds = 89.9e-6};
}

}  // namespace

TEST_CASE("streams that share a batched call pay a share of its fixed cost: an alltoall's blocks, the butterfly's "
          "final blocks") {
  const kompress::cost_model gpu = gpu_at_100_gbps();
  const kompress::cost_model shared = gpu.sharing_calls(0.5, 0.25);
  CHECK(shared.compress_call_seconds == doctest::Approx(gpu.compress_call_seconds * 0.5));
  CHECK(shared.decompress_call_seconds == doctest::Approx(gpu.decompress_call_seconds * 0.25));
  CHECK(shared.compress_bytes_per_second == gpu.compress_bytes_per_second);

  // alltoall at 64 ranks, 16 MiB per rank: a 256 KiB block does not pay a whole call each way,
  // but 1/63 of a batch's does, against MPI's pairwise steps (a latency each).
  const std::uint64_t block = 256 * 1024;
  CHECK_FALSE(gpu.worth_compressing(block));
  CHECK(gpu.worth_compressing_exchanged(block, 63));
  const kompress::cost_model exchange = gpu.exchange_model(block, 63);
  CHECK(exchange.compress_call_seconds == doctest::Approx(gpu.compress_call_seconds / 63));
  CHECK(exchange.decompress_call_seconds == doctest::Approx(gpu.decompress_call_seconds / 63));
  CHECK(gpu.worth_compressing_exchanged(block, 1) == gpu.worth_compressing(block));
  // At 200 Gb/s the codec (31 GB/s) takes most of what the link would: not by min_gain.
  kompress::cost_model fast_link = gpu;
  fast_link.link_bytes_per_second = 25e9;
  CHECK_FALSE(fast_link.worth_compressing_exchanged(block, 63));
  // A CPU core's calls cost less than a chunk's bytes: no batch, so no share.
  kompress::cost_model cpu = forwarding_pays();
  cpu.compress_call_seconds = cpu.decompress_call_seconds = 2e-6;
  const kompress::cost_model cpu_exchange = cpu.exchange_model(block, 63);
  CHECK(cpu_exchange.compress_call_seconds == cpu.compress_call_seconds);
  CHECK(cpu_exchange.decompress_call_seconds == cpu.decompress_call_seconds);

  // allreduce at 64 ranks, 64 MiB: 1 MiB final blocks (ratio 33), each crossing 63 links and
  // decoded in 6 batches (one per doubling step) rather than one call each.
  kompress::cost_model gradients = gpu;
  gradients.expected_ratio = 33.0;
  const std::uint64_t final_block = 1 << 20;
  CHECK_FALSE(gradients.worth_compressing(final_block));
  CHECK_FALSE(gradients.worth_compressing_forwarded(final_block, 63));
  CHECK(gradients.worth_compressing_forwarded(final_block, 63, 6.0 / 63.0));
  const kompress::detail::wire_rule automatic{kompress::transfer_mode::automatic, gradients};
  CHECK(kompress::detail::final_block_rule(automatic, final_block, 64).mode == kompress::transfer_mode::compressed);
  CHECK(kompress::detail::final_block_rule(automatic, final_block, 2).mode == kompress::transfer_mode::automatic);
  const kompress::detail::wire_rule raw{kompress::transfer_mode::raw, gradients};
  CHECK(kompress::detail::final_block_rule(raw, final_block, 64).mode == kompress::transfer_mode::raw);
  kompress::detail::wire_rule fast = automatic;
  fast.cost.link_bytes_per_second = 1e12;
  CHECK(kompress::detail::final_block_rule(fast, final_block, 64).mode == kompress::transfer_mode::automatic);
}

TEST_CASE("allreduce's final blocks are judged without the floor for a message alone where its halving compresses") {
  // A 2 MiB allreduce on 64 ranks (a hierarchical allreduce's rail at 256 ranks): 32 KiB final
  // blocks, below min_message_bytes, each crossing 63 links. Alone they keep the floor (the
  // schedule would run for them only); where the halving compresses, each crossing is priced
  // with its chunk's cost, and they pay.
  kompress::cost_model cpu = forwarding_pays();
  cpu.compress_call_seconds = cpu.decompress_call_seconds = 2e-6;  // a CPU core's, measured
  const std::uint64_t block = 32 * 1024;
  REQUIRE(block < cpu.min_message_bytes);
  const kompress::detail::wire_rule automatic{kompress::transfer_mode::automatic, cpu};
  CHECK(kompress::detail::final_block_rule(automatic, block, 64).mode == kompress::transfer_mode::automatic);
  CHECK(kompress::detail::final_block_rule(automatic, block, 64, true).mode == kompress::transfer_mode::compressed);
  // Still by the model: a block whose codec calls cost more than its crossings take raw, or a
  // link faster than the codec, stays raw.
  CHECK(kompress::detail::final_block_rule(automatic, 256, 64, true).mode == kompress::transfer_mode::automatic);
  kompress::detail::wire_rule fast = automatic;
  fast.cost.link_bytes_per_second = 1e12;
  CHECK(kompress::detail::final_block_rule(fast, block, 64, true).mode == kompress::transfer_mode::automatic);
}

TEST_CASE("automatic alltoall prices each block's share of a batched call: it compresses where one call per block "
          "would not pay") {
  const int p = size_of(), me = rank_of();
  kompress::collective_options options{.codec = {.bound = kompress::absolute(1e-3)},
                                       .mode = kompress::transfer_mode::automatic};
  // 1 MiB blocks over a 1 GB/s link (1.05 ms raw); a fast codec whose decompressions cost 1.1 ms
  // a call: one per block is more than the raw transfer, even for a stream already compressed;
  // a half or a third of one (2 or 3 peers) pays.
  options.cost.link_bytes_per_second = 1e9;
  options.cost.compress_bytes_per_second = options.cost.decompress_bytes_per_second = 100e9;
  options.cost.decompress_call_seconds = 1.1e-3;
  options.cost.expected_ratio = 20.0;
  const std::size_t per_peer = (1 << 20) / sizeof(float);
  const auto values = make_data<float>(per_peer * std::size_t(p), me + 5);
  host_view<float> expected("expected", values.size());
  MPI_Alltoall(values.data(), int(per_peer), MPI_FLOAT, expected.data(), int(per_peer), MPI_FLOAT, MPI_COMM_WORLD);
  device_view<float> got("got", values.size());
  const auto report = kompress::alltoall(exec_space{}, to_device(values), got, MPI_COMM_WORLD, options);
  // The blocks it compresses are those the model picks (exchanged_compressed_blocks, below).
  const std::uint64_t peers = std::uint64_t(p - 1);
  const std::uint64_t compressed = options.cost.exchanged_compressed_blocks(per_peer * sizeof(float), peers);
  CHECK(report.compressed_messages == (p >= 3 ? compressed : 0u));
  const auto h = to_host(got);
  std::size_t violations = 0;
  for (std::size_t k = 0; k < h.size(); ++k)
    violations += !(std::fabs(double(h(k)) - double(expected(k))) <= (int(k / per_peer) == me ? 0.0 : 1e-3));
  CHECK(violations == 0);
}

TEST_CASE("an alltoall's raw share: the count of blocks compressed is where the model's call is shortest") {
  kompress::cost_model model;
  model.link_bytes_per_second = 1.25e9;
  model.compress_bytes_per_second = 2.3e9;
  model.decompress_bytes_per_second = 5.8e9;
  model.expected_ratio = 6.0;
  const std::uint64_t bytes = 256 << 10;
  for (const std::uint64_t peers : {2u, 3u, 7u, 63u, 255u, 1023u}) {
    const std::uint64_t compressed = model.exchanged_compressed_blocks(bytes, peers);
    CAPTURE(peers);
    CHECK(compressed >= 1);
    CHECK(compressed <= peers);
    for (std::uint64_t other = 1; other <= peers; ++other)
      CHECK(model.exchanged_seconds(bytes, peers, compressed) <= model.exchanged_seconds(bytes, peers, other));
  }
  // The codec takes about 0.16 ms a block both ways, the link 0.21 ms raw and 0.035 ms as a
  // stream: the two meet near 40 of 63 blocks compressed, and that call beats raw by the margin.
  CHECK(model.exchanged_compressed_blocks(bytes, 63) >= 35);
  CHECK(model.exchanged_compressed_blocks(bytes, 63) <= 45);
  CHECK(model.worth_compressing_exchanged(bytes, 63));
  // One block per peer alone would not pay (its compression and decoding in series with it).
  CHECK_FALSE(model.worth_compressing(bytes));
  // A link far slower than the codec: every block compressed.
  kompress::cost_model slow_link = model;
  slow_link.link_bytes_per_second = 1e8;
  CHECK(slow_link.exchanged_compressed_blocks(bytes, 63) == 63);
  // Data that does not compress: nothing saved on the link, so the least codec work and no gain.
  kompress::cost_model incompressible = model;
  incompressible.expected_ratio = 1.0;
  CHECK(incompressible.exchanged_compressed_blocks(bytes, 63) == 1);
  CHECK_FALSE(incompressible.worth_compressing_exchanged(bytes, 63));
  // A link far faster than the codec: raw.
  kompress::cost_model fast_link = model;
  fast_link.link_bytes_per_second = 25e9;
  CHECK_FALSE(fast_link.worth_compressing_exchanged(bytes, 63));
}

TEST_CASE("an alltoall's raw share leaves spread among the compressed blocks, each group just ahead of the "
          "compression it overlaps") {
  using kompress::detail::spread_among;
  const auto order = [](std::vector<int> raw, std::vector<int> coded) { return spread_among(raw, coded); };
  // 22 raw and 41 compressed (64 ranks): one raw block ahead of each of the first 22 of
  // every 41 compressed ones, in proportion, every raw one out before the last compressed one.
  std::vector<int> raw, coded;
  for (int k = 0; k < 22; ++k) raw.push_back(k);
  for (int k = 22; k < 63; ++k) coded.push_back(k);
  const std::vector<int> spread = order(raw, coded);
  REQUIRE(spread.size() == 63);
  std::vector<int> sorted = spread, every(63);
  std::sort(sorted.begin(), sorted.end());
  std::iota(every.begin(), every.end(), 0);
  CHECK(sorted == every);  // every peer once
  std::size_t raw_sent = 0, coded_sent = 0;
  for (const int peer : spread) {
    if (peer < 22) {
      ++raw_sent;
      CHECK(peer == int(raw_sent) - 1);  // each kind in its own order
      // never more than one compressed block's share ahead
      CHECK(raw_sent * 41 <= (coded_sent + 1) * 22 + 40);
    } else {
      CHECK(peer == 22 + int(coded_sent));
      ++coded_sent;
      CHECK(raw_sent * 41 >= coded_sent * 22);  // the share due before it has left
    }
  }
  CHECK(spread.back() == 62);
  CHECK(order({0, 1}, {2, 3, 4}) == std::vector<int>{0, 2, 1, 3, 4});
  CHECK(order({0, 1, 2, 3}, {4, 5}) == std::vector<int>{0, 1, 4, 2, 3, 5});
  CHECK(order({0}, {1, 2, 3}) == std::vector<int>{0, 1, 2, 3});
  CHECK(order({}, {1, 2}) == std::vector<int>{1, 2});
  CHECK(order({0, 1}, {}) == std::vector<int>{0, 1});
}

TEST_CASE_TEMPLATE("automatic alltoall sends the link's share raw: the blocks of the first steps of the rotation, "
                   "exact, the rest within the bound", T, float, double) {
  const int p = size_of(), me = rank_of();
  kompress::collective_options options{.codec = {.bound = kompress::relative(1e-2)},
                                       .mode = kompress::transfer_mode::automatic, .measure_error = true};
  // 256 KiB blocks over a 1 GB/s link; a codec that takes 0.25 ns a byte each way against the
  // link's 1 ns: at 3 peers or more the codec would outlast the link with every block compressed.
  options.cost.link_bytes_per_second = 1e9;
  options.cost.compress_bytes_per_second = options.cost.decompress_bytes_per_second = 2.5e9;
  options.cost.expected_ratio = 4.0;
  options.cost.min_gain = 1.0;
  const std::size_t per_peer = (256 << 10) / sizeof(T);
  const std::uint64_t peers = std::uint64_t(p - 1);
  const bool compresses = p > 1 && options.cost.worth_compressing_exchanged(per_peer * sizeof(T), peers);
  const std::uint64_t raw = compresses ? peers - options.cost.exchanged_compressed_blocks(per_peer * sizeof(T), peers)
                                       : peers;
  if (p >= 4) CHECK((compresses && raw >= 1));
  const auto values = make_data<T>(per_peer * std::size_t(p), me + 3);
  host_view<T> expected("expected", values.size());
  const int bytes = int(per_peer * sizeof(T));
  MPI_Alltoall(values.data(), bytes, MPI_BYTE, expected.data(), bytes, MPI_BYTE, MPI_COMM_WORLD);
  const auto bounds = bounds_over_blocks_to_others(values, per_peer, options.codec.bound);
  for (const bool nonblocking : {false, true}) {
    device_view<T> got("got", values.size());
    const auto send = to_device(values);
    kompress::collective_report report;
    if (nonblocking) {
      auto request = kompress::ialltoall(exec_space{}, send, got, MPI_COMM_WORLD, options);
      report = request.wait();
    } else {
      report = kompress::alltoall(exec_space{}, send, got, MPI_COMM_WORLD, options);
    }
    const auto h = to_host(got);
    CAPTURE(nonblocking);
    CHECK(report.messages == peers);
    CHECK(report.compressed_messages == peers - raw);
    for (int source = 0; source < p; ++source) {
      const int step = (me - source + p) % p;  // the sender's step to this rank
      const bool exact = source == me || std::uint64_t(step) <= raw;
      std::size_t violations = 0, changed = 0;
      for (std::size_t k = std::size_t(source) * per_peer; k < std::size_t(source + 1) * per_peer; ++k) {
        violations += !(std::fabs(double(h(k)) - double(expected(k))) <= (exact ? 0.0 : bounds[std::size_t(source)]));
        changed += h(k) != expected(k);
      }
      CAPTURE(source);
      CHECK(violations == 0);
      if (!exact) CHECK(changed > 0);  // compressed: lossy somewhere
    }
  }
}

TEST_CASE("automatic allreduce on the butterfly compresses final blocks that cross enough links, where no halving "
          "message pays") {
  const int p = size_of(), me = rank_of();
  // forwarding_pays: a 256 KiB block does not pay over one link, but does over two or more; the
  // halving's messages (n/2, or the fold's n) do not pay either.
  kompress::collective_options options{.codec = {.bound = kompress::absolute(1e-3)},
                                       .mode = kompress::transfer_mode::automatic,
                                       .schedule = kompress::collective_schedule::halving_doubling,
                                       .cost = forwarding_pays()};
  const int core = int(std::bit_floor(unsigned(p)));
  const std::size_t n = std::size_t(core) * (256 * 1024 / sizeof(float));
  const auto values = make_data<float>(n, me + 3);
  host_view<float> expected("expected", n);
  MPI_Allreduce(values.data(), expected.data(), int(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  device_view<float> got("got", n);
  const auto report = kompress::allreduce(exec_space{}, to_device(values), got, MPI_COMM_WORLD, options);
  CAPTURE(report.messages);
  // Over all ranks (a rank folded out, where p is no power of two, sends only its raw fold).
  std::uint64_t compressed = report.compressed_messages;
  MPI_Allreduce(MPI_IN_PLACE, &compressed, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  if (p >= 3) {
    CHECK(compressed > 0);
    CHECK(report.compressed_messages < report.messages);  // the halving's messages raw
  } else {
    CHECK(compressed == 0);  // one link per block: MPI_Allreduce itself
  }
  const auto h = to_host(got);
  std::size_t violations = 0;
  // Within the bound, beyond float rounding of the sums (|values| <= 10 on each of p ranks).
  const double rounding = 2.0 * p * std::numeric_limits<float>::epsilon() * 10.0 * p;
  for (std::size_t k = 0; k < n; ++k)
    violations += !(std::fabs(double(h(k)) - double(expected(k))) <= report.absolute_bound + rounding);
  CHECK(violations == 0);
  CHECK(identical_on_every_rank(h));
}

TEST_CASE("measure_cost_model on a sample of the data: its ratio, the lowest over the ranks, agreed by every rank") {
  const int me = rank_of();
  const std::size_t n = 1 << 16;
  // Rank 0's sample is noise (it compresses little at a tight bound), the others' a smooth field.
  host_view<float> sample("sample", n);
  std::uint32_t state = 12345u + unsigned(me);
  for (std::size_t i = 0; i < n; ++i) {
    state = state * 1664525u + 1013904223u;
    sample(i) = me == 0 ? float(state >> 8) / float(1 << 24) : float(std::sin(1e-3 * double(i)));
  }
  const kompress::compress_options codec{.bound = kompress::relative(1e-3)};
  const auto model = kompress::measure_cost_model(host{}, MPI_COMM_WORLD, sample, codec, 1u << 16);
  CHECK((std::isfinite(model.expected_ratio) && model.expected_ratio > 0.0));
  CHECK(model.compress_bytes_per_second > 0.0);
  double highest = 0.0;
  MPI_Allreduce(&model.expected_ratio, &highest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  CHECK(highest == model.expected_ratio);
  // Noise at REL 1e-3 keeps about 10 of its 24 bits: the lowest ratio, rank 0's, is below 4.
  CHECK(model.expected_ratio < 4.0);
  if (size_of() == 1) return;
  // Without rank 0, the smooth field's ratio: more than the noise's.
  MPI_Comm smooth_ranks;
  MPI_Comm_split(MPI_COMM_WORLD, me == 0 ? MPI_UNDEFINED : 1, me, &smooth_ranks);
  if (smooth_ranks != MPI_COMM_NULL) {
    const double smooth = kompress::measure_cost_model(host{}, smooth_ranks, sample, codec, 1u << 16).expected_ratio;
    CHECK(smooth > 1.5 * model.expected_ratio);
    MPI_Comm_free(&smooth_ranks);
  }
}

TEST_CASE("measure_cost_model on a sample: a bound that differs, or an empty sample, fails on every rank") {
  if (size_of() == 1) return;
  const bool last = rank_of() == size_of() - 1;
  host_view<float> sample("sample", 4096), empty("empty", 0);
  const kompress::compress_options codec{.bound = kompress::relative(last ? 1e-2 : 1e-3)};
  CHECK_THROWS_WITH_AS(kompress::measure_cost_model(host{}, MPI_COMM_WORLD, sample, codec, 1u << 16),
                       doctest::Contains("ranks disagree on"), kompress::invalid_argument);
  const kompress::compress_options same{.bound = kompress::relative(1e-3)};
  CHECK_THROWS_AS(kompress::measure_cost_model(host{}, MPI_COMM_WORLD, last ? empty : sample, same, 1u << 16),
                  kompress::invalid_argument);
  CHECK(kompress::measure_cost_model(host{}, MPI_COMM_WORLD, sample, same, 1u << 16).expected_ratio > 0.0);
}
