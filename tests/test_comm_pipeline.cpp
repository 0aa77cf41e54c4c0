// Pipelined messages (comm/detail/pipeline.hpp): every collective with its messages cut into
// chunks -- one chunk, a size that is not a multiple of the chunk, many chunks, chunks from the
// cost model -- blocking and nonblocking, against plain MPI element by element within the
// documented bound, exactly. Also the chunk plan and the cost model's chunk count, and the
// agreement on the cost model that the chunking depends on. Run under mpiexec -n 1, 2, 3, 4.

#include <kompress/comm.hpp>

#include "support/mpi_checks.hpp"

#include <doctest/doctest.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace kompress::test;  // support/mpi_checks.hpp

constexpr double abs_bound = 1e-3;

/// Compressed mode with chunks of `chunk_bytes` (0: the cost model's own chunks, made small
/// enough to cut test-sized messages).
kompress::collective_options chunked(std::size_t chunk_bytes) {
  kompress::collective_options o{.codec = {.bound = kompress::absolute(abs_bound)}};
  if (chunk_bytes > 0) {
    o.cost.fixed_chunk_bytes = chunk_bytes;
  } else {
    o.cost.min_chunk_bytes = 4096;
    o.cost.chunk_seconds = 1e-6;
  }
  return o;
}

template <class T>
kompress::collective_report finish(bool nonblocking, auto&& blocking, auto&& start) {
  if (!nonblocking) return blocking();
  kompress::request r = start();
  while (!r.test()) {
  }
  return r.wait();
}

template <class T>
void check_alltoall(std::size_t per_peer, const kompress::collective_options& options, bool nonblocking) {
  const int p = size_of(), me = rank_of();
  auto send = make_data<T>(per_peer * std::size_t(p), me + 1);
  host_view<T> expected("expected", send.size()), got("got", send.size());
  MPI_Alltoall(send.data(), int(per_peer), mpi_type<T>(), expected.data(), int(per_peer), mpi_type<T>(),
               MPI_COMM_WORLD);
  const auto report = finish<T>(
      nonblocking, [&] { return kompress::alltoall(host{}, send, got, MPI_COMM_WORLD, options); },
      [&] { return kompress::ialltoall(host{}, send, got, MPI_COMM_WORLD, options); });
  std::size_t violations = 0;
  for (std::size_t k = 0; k < send.size(); ++k) {
    const double e = k / per_peer == std::size_t(me) ? 0.0 : abs_bound;  // the block to itself is exact
    violations += !(std::fabs(double(got(k)) - double(expected(k))) <= e);
  }
  CHECK(violations == 0);
  CHECK(report.messages == std::uint64_t(per_peer && p > 1 ? p - 1 : 0));
  if (per_peer > 0 && p > 1) {
    const std::size_t chunk = options.cost.fixed_chunk_bytes / sizeof(T);
    if (chunk > 0) CHECK(report.chunks == std::uint64_t(p - 1) * ((per_peer + chunk - 1) / chunk));
    CHECK(report.absolute_bound <= abs_bound);
  }
}

template <class T>
void check_allreduce(std::size_t n, const kompress::collective_options& options, bool nonblocking) {
  const int p = size_of(), me = rank_of();
  auto send = make_data<T>(n, me + 3);
  host_view<T> expected("expected", n), magnitude("magnitude", n), abs_send("abs", n), got("got", n);
  MPI_Allreduce(send.data(), expected.data(), int(n), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
  for (std::size_t i = 0; i < n; ++i) abs_send(i) = std::fabs(send(i));
  MPI_Allreduce(abs_send.data(), magnitude.data(), int(n), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
  const auto report = finish<T>(
      nonblocking, [&] { return kompress::allreduce(host{}, send, got, MPI_COMM_WORLD, options); },
      [&] { return kompress::iallreduce(host{}, send, got, MPI_COMM_WORLD, options); });
  const bool ring = p > 1 && n > 0;
  CHECK(report.absolute_bound <= (ring ? p * abs_bound : 0.0) * (1 + 1e-12));
  constexpr double eps = std::numeric_limits<T>::epsilon();
  std::size_t violations = 0;
  for (std::size_t i = 0; i < n; ++i)
    violations += !(std::fabs(double(got(i)) - double(expected(i))) <=
                    report.absolute_bound + 2.0 * p * eps * double(magnitude(i)));
  CHECK(violations == 0);
  CHECK(identical_on_every_rank(got.data(), n * sizeof(T)));
}

template <class T>
void check_allgather(std::size_t n, const kompress::collective_options& options, bool nonblocking) {
  const int p = size_of(), me = rank_of();
  auto send = make_data<T>(n, me + 5);
  host_view<T> expected("expected", n * std::size_t(p)), got("got", n * std::size_t(p));
  MPI_Allgather(send.data(), int(n), mpi_type<T>(), expected.data(), int(n), mpi_type<T>(), MPI_COMM_WORLD);
  const auto report = finish<T>(
      nonblocking, [&] { return kompress::allgather(host{}, send, got, MPI_COMM_WORLD, options); },
      [&] { return kompress::iallgather(host{}, send, got, MPI_COMM_WORLD, options); });
  CHECK(report.absolute_bound <= abs_bound);
  std::size_t violations = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    violations += !(std::fabs(double(got(i)) - double(expected(i))) <= report.absolute_bound);
  CHECK(violations == 0);
  CHECK(identical_on_every_rank(got.data(), got.size() * sizeof(T)));
}

template <class T>
void check_reduce_scatter(std::size_t n, const kompress::collective_options& options, bool nonblocking) {
  const int p = size_of(), me = rank_of();
  auto send = make_data<T>(n * std::size_t(p), me + 7);
  host_view<T> expected("expected", n), magnitude("magnitude", n), abs_send("abs", n * std::size_t(p)), got("got", n);
  MPI_Reduce_scatter_block(send.data(), expected.data(), int(n), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
  for (std::size_t i = 0; i < abs_send.size(); ++i) abs_send(i) = std::fabs(send(i));
  MPI_Reduce_scatter_block(abs_send.data(), magnitude.data(), int(n), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
  const auto report = finish<T>(
      nonblocking, [&] { return kompress::reduce_scatter(host{}, send, got, MPI_COMM_WORLD, options); },
      [&] { return kompress::ireduce_scatter(host{}, send, got, MPI_COMM_WORLD, options); });
  const bool ring = p > 1 && n > 0;
  // Homomorphic: every rank's own quantization counts, the owner's too (docs/collectives.md).
  const int roundings = options.reduction == kompress::reduction_method::homomorphic ? p : p - 1;
  CHECK(report.absolute_bound <= (ring ? roundings * abs_bound : 0.0) * (1 + 1e-12));
  constexpr double eps = std::numeric_limits<T>::epsilon();
  std::size_t violations = 0;
  for (std::size_t i = 0; i < n; ++i)
    violations += !(std::fabs(double(got(i)) - double(expected(i))) <=
                    report.absolute_bound + 2.0 * p * eps * double(magnitude(i)));
  CHECK(violations == 0);
}

/// Chunk sizes in bytes: one value, a chunk that is no multiple of the codec's block, one of
/// exactly 1024 values, and the cost model's own (0).
constexpr std::size_t chunk_sizes[] = {sizeof(double), 1000, 4096, 0};

}  // namespace

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

TEST_CASE_TEMPLATE("pipelined alltoall matches MPI_Alltoall within the bound", T, float, double) {
  for (const std::size_t chunk : chunk_sizes)
    for (const std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(125), std::size_t(1024), std::size_t(4099),
                                std::size_t(40000)})
      for (const bool nonblocking : {false, true}) {
        CAPTURE(chunk);
        CAPTURE(n);
        CAPTURE(nonblocking);
        if (chunk == sizeof(double) && n > 1024) continue;  // thousands of one-value messages: slow, not new
        check_alltoall<T>(n, chunked(chunk), nonblocking);
      }
}

TEST_CASE_TEMPLATE("pipelined alltoallv with zero and uneven counts", T, float, double) {
  const uneven_layout layout;
  const auto& [send_counts, send_displs, recv_counts, recv_displs] = layout;
  const std::size_t total_recv = layout.recv_total();
  auto send = make_data<T>(layout.send_total(), rank_of() + 7);
  host_view<T> got("got", total_recv), expected("expected", total_recv);
  layout.mpi_alltoallv(send.data(), expected.data());
  for (const std::size_t chunk : {std::size_t(1000), std::size_t(0)})
    for (const bool nonblocking : {false, true}) {
      CAPTURE(chunk);
      CAPTURE(nonblocking);
      std::fill_n(got.data(), total_recv, T(NAN));
      const auto options = chunked(chunk);
      finish<T>(
          nonblocking,
          [&] {
            return kompress::alltoallv(host{}, send, send_counts, send_displs, got, recv_counts, recv_displs,
                                       MPI_COMM_WORLD, options);
          },
          [&] {
            return kompress::ialltoallv(host{}, send, send_counts, send_displs, got, recv_counts, recv_displs,
                                        MPI_COMM_WORLD, options);
          });
      std::size_t violations = 0;
      for (std::size_t k = 0; k < total_recv; ++k)
        violations += !(std::fabs(double(got(k)) - double(expected(k))) <= abs_bound);
      CHECK(violations == 0);
    }
}

TEST_CASE_TEMPLATE("pipelined allreduce, allgather and reduce_scatter match plain MPI within their bounds", T, float,
                   double) {
  for (const std::size_t chunk : chunk_sizes)
    for (const std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(250), std::size_t(1023),
                                std::size_t(5000), std::size_t(60001)})
      for (const bool nonblocking : {false, true}) {
        CAPTURE(chunk);
        CAPTURE(n);
        CAPTURE(nonblocking);
        if (chunk == sizeof(double) && n > 1023) continue;  // likewise
        const auto options = chunked(chunk);
        check_allreduce<T>(n, options, nonblocking);
        check_allgather<T>(n, options, nonblocking);
        check_reduce_scatter<T>(n, options, nonblocking);
      }
}

TEST_CASE_TEMPLATE("pipelined homomorphic allreduce and reduce_scatter: codes added piece by piece", T, float,
                   double) {
  // Pieces that are no multiple of a block (1000 bytes) and many pieces per hop: the codes of
  // one chunk's pieces are sent while the next chunk's pieces arrive and are added.
  for (const std::size_t chunk : {std::size_t(1000), std::size_t(4096), std::size_t(0)})
    for (const std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(1023), std::size_t(60001)})
      for (const bool nonblocking : {false, true}) {
        CAPTURE(chunk);
        CAPTURE(n);
        CAPTURE(nonblocking);
        auto options = chunked(chunk);
        options.reduction = kompress::reduction_method::homomorphic;
        check_allreduce<T>(n, options, nonblocking);
        check_reduce_scatter<T>(n, options, nonblocking);
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
  for (std::size_t i = 0; i < a.size(); ++i) violations += !(std::fabs(a_got(i) - a_want(i)) <= abs_bound);
  for (std::size_t i = 0; i < n; ++i)
    violations += !(std::fabs(b_got(i) - b_want(i)) <= second_report.absolute_bound + 2.0 * p * 1.2e-7 * 20.0 * p);
  CHECK(violations == 0);
}

TEST_CASE("compressed mode: ranks that disagree on the cost model (the chunking) are an error on every rank") {
  const int p = size_of(), me = rank_of();
  if (p < 2) return;
  const std::size_t n = 4096;
  auto send = make_data<float>(n * std::size_t(p), me + 1);
  host_view<float> got("got", send.size());
  auto options = chunked(1000);
  if (me == p - 1) options.cost.fixed_chunk_bytes = 2000;
  CHECK_THROWS_AS(kompress::alltoall(host{}, send, got, MPI_COMM_WORLD, options), kompress::invalid_argument);
  CHECK_THROWS_AS(kompress::allreduce(host{}, send, got, MPI_COMM_WORLD, options), kompress::invalid_argument);
  // The communicator is usable afterwards.
  options.cost.fixed_chunk_bytes = 1000;
  check_alltoall<float>(n, options, false);
}

TEST_CASE_TEMPLATE("the ratio codec on the wire: every collective, whole and pipelined, any block size option", T,
                   float, double) {
  // The ratio codec's streams have their own worst case (block size 32 whatever block_size
  // says): the staging of every path must be sized for it, not for the fast codec's block.
  constexpr std::size_t whole = std::size_t(-1);
  for (const int block_size : {32, 128})
    for (const std::size_t chunk : {std::size_t(1000), whole})
      for (const std::size_t n : {std::size_t(1), std::size_t(4099)})
        for (const bool nonblocking : {false, true}) {
          CAPTURE(block_size);
          CAPTURE(chunk);
          CAPTURE(n);
          CAPTURE(nonblocking);
          auto options = chunked(chunk == whole ? 0 : chunk);
          options.cost.pipeline = chunk != whole;
          options.codec.codec = kompress::codec_mode::ratio;
          options.codec.block_size = block_size;
          check_alltoall<T>(n, options, nonblocking);
          check_allgather<T>(n, options, nonblocking);
          check_allreduce<T>(n, options, nonblocking);
          check_reduce_scatter<T>(n, options, nonblocking);
        }
}
