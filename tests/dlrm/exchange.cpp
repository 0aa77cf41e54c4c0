// The DLRM embedding exchange against the exact exchange, element by element, within each
// table's bound; uneven table ownership, a rank without tables, per-table dimensions.

#include <kompress/dlrm.hpp>

#include "support/mpi_checks.hpp"

#include <doctest/doctest.h>
#include <mpi.h>

#include <cmath>
#include <vector>

namespace {

using host = Kokkos::DefaultHostExecutionSpace;
using matrix = Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::HostSpace>;

using kompress::test::rank_of;
using kompress::test::size_of;

// Every rank can compute every value, so the exact result needs no communication.
float pooled(int table, std::size_t row, std::size_t col) {
  return float(std::sin(0.37 * double(row) + 1.3 * table) * (0.5 + 0.1 * table) + 0.01 * std::cos(double(col * 7 + row)));
}
float gradient(int table, std::size_t row, std::size_t col) {
  return float(1e-4 * std::cos(0.11 * double(row) * (table + 1) + 0.5 * double(col)));
}

std::vector<kompress::dlrm::table> make_tables(int p) {
  // Five tables of different widths; with 4 ranks, rank 2 owns none.
  const std::vector<std::size_t> dims = {16, 32, 8, 64, 24};
  const std::vector<int> owners = {0, 0, 1 % p, 3 % p, 3 % p};
  std::vector<kompress::dlrm::table> tables;
  for (std::size_t t = 0; t < dims.size(); ++t) tables.push_back({owners[t], dims[t]});
  return tables;
}

double range_over(int table, std::size_t first_row, std::size_t rows, std::size_t dim, float (*f)(int, std::size_t, std::size_t)) {
  double lo = INFINITY, hi = -INFINITY;
  for (std::size_t r = first_row; r < first_row + rows; ++r)
    for (std::size_t c = 0; c < dim; ++c) {
      lo = std::min(lo, double(f(table, r, c)));
      hi = std::max(hi, double(f(table, r, c)));
    }
  return hi - lo;
}

void round_trip(const kompress::dlrm::exchange_options& options, bool async) {
  const int p = size_of(), me = rank_of();
  const std::size_t local_batch = 97;
  kompress::dlrm::embedding_exchange exchange(MPI_COMM_WORLD, make_tables(p), local_batch, options);
  const auto& tables = exchange.tables();

  // Forward input: my tables, whole batch.
  matrix in("in", exchange.global_batch(), exchange.local_width());
  std::vector<std::size_t> global_col, local_col;
  std::size_t g = 0, l = 0;
  for (std::size_t t = 0; t < tables.size(); ++t) {
    global_col.push_back(g);
    local_col.push_back(tables[t].owner == me ? l : std::size_t(-1));
    g += tables[t].dim;
    if (tables[t].owner == me) l += tables[t].dim;
  }
  for (std::size_t t = 0; t < tables.size(); ++t)
    if (tables[t].owner == me)
      for (std::size_t r = 0; r < exchange.global_batch(); ++r)
        for (std::size_t c = 0; c < tables[t].dim; ++c) in(r, local_col[t] + c) = pooled(int(t), r, c);
  matrix out("out", local_batch, exchange.total_width());
  if (async) {
    auto request = exchange.iforward(host{}, in, out);
    request.wait();
  } else {
    exchange.forward(host{}, in, out);
  }
  std::size_t violations = 0;
  for (std::size_t t = 0; t < tables.size(); ++t) {
    const auto& bound = options.forward.bound;
    double e = bound.mode == kompress::bound_mode::absolute ? bound.value
                                                           : bound.value * range_over(int(t), 0, exchange.global_batch(), tables[t].dim, pooled);
    if (!options.table_weights.empty()) e *= options.table_weights[t];
    if (!options.compress_forward || tables[t].owner == me) e = 0.0;
    for (std::size_t b = 0; b < local_batch; ++b)
      for (std::size_t c = 0; c < tables[t].dim; ++c)
        violations += !(std::fabs(double(out(b, global_col[t] + c)) - double(pooled(int(t), me * local_batch + b, c))) <= e);
  }
  CHECK(violations == 0);

  // Backward: my batch slice of every table's gradient -> my tables, whole batch.
  matrix grad_in("grad_in", local_batch, exchange.total_width());
  for (std::size_t t = 0; t < tables.size(); ++t)
    for (std::size_t b = 0; b < local_batch; ++b)
      for (std::size_t c = 0; c < tables[t].dim; ++c) grad_in(b, global_col[t] + c) = gradient(int(t), me * local_batch + b, c);
  matrix grad_out("grad_out", exchange.global_batch(), exchange.local_width());
  if (async) {
    auto request = exchange.ibackward(host{}, grad_in, grad_out);
    while (!request.test()) {
    }
  } else {
    exchange.backward(host{}, grad_in, grad_out);
  }
  violations = 0;
  for (std::size_t t = 0; t < tables.size(); ++t) {
    if (tables[t].owner != me) continue;
    for (int peer = 0; peer < p; ++peer) {
      const auto& bound = options.backward.bound;
      double e = bound.mode == kompress::bound_mode::absolute
                     ? bound.value
                     : bound.value * range_over(int(t), peer * local_batch, local_batch, tables[t].dim, gradient);
      if (!options.table_weights.empty()) e *= options.table_weights[t];
      if (!options.compress_backward || peer == me) e = 0.0;
      for (std::size_t b = 0; b < local_batch; ++b)
        for (std::size_t c = 0; c < tables[t].dim; ++c) {
          const std::size_t row = peer * local_batch + b;
          violations += !(std::fabs(double(grad_out(row, local_col[t] + c)) - double(gradient(int(t), row, c))) <= e);
        }
    }
  }
  CHECK(violations == 0);
}

}  // namespace

TEST_CASE("dlrm exchange: forward and backward within each table's bound") {
  round_trip({}, false);
  round_trip({.forward = {.bound = kompress::absolute(1e-3)}, .backward = {.bound = kompress::absolute(1e-7)}}, true);
  round_trip({.compress_forward = false, .compress_backward = false}, false);
  round_trip({.forward = {.bound = kompress::relative(1e-3), .block_size = 64}, .table_weights = {1.0, 2.0, 0.5, 4.0, 1.0}}, true);
}

TEST_CASE("dlrm exchange: a window of one peer's messages at a time, blocking and not") {
  for (const bool async : {false, true}) round_trip({.window = 1}, async);
}

TEST_CASE("dlrm exchange: the ratio codec, with any block size option") {
  // Ratio streams have their own worst case: the segments' staging must be sized for it.
  for (const int block_size : {32, 128})
    for (const bool async : {false, true}) {
      CAPTURE(block_size);
      round_trip({.forward = {.bound = kompress::relative(1e-2), .block_size = block_size,
                              .codec = kompress::codec_mode::ratio},
                  .backward = {.bound = kompress::absolute(1e-4), .block_size = block_size,
                               .codec = kompress::codec_mode::ratio}},
                 async);
    }
}

TEST_CASE("dlrm exchange: a bound schedule per iteration and table") {
  kompress::dlrm::exchange_options options;
  std::vector<std::uint64_t> seen;
  options.bound_schedule = [&](std::uint64_t iteration, int, kompress::dlrm::direction) {
    seen.push_back(iteration);
    return 1.0 / double(iteration + 1);
  };
  kompress::dlrm::embedding_exchange exchange(MPI_COMM_WORLD, make_tables(size_of()), 8, options);
  matrix in("in", exchange.global_batch(), exchange.local_width()), out("out", 8, exchange.total_width());
  matrix grad_in("grad_in", 8, exchange.total_width()), grad_out("grad_out", exchange.global_batch(), exchange.local_width());
  exchange.forward(host{}, in, out);
  exchange.backward(host{}, grad_in, grad_out);
  exchange.forward(host{}, in, out);
  seen.clear();
  exchange.backward(host{}, grad_in, grad_out);  // the backward of iteration 1
  CHECK(exchange.iteration() == 2);
  CHECK(!seen.empty());
  for (const auto iteration : seen) CHECK(iteration == 1);
}

TEST_CASE("dlrm exchange: mismatched shapes and bad tables are rejected") {
  const int p = size_of();
  kompress::dlrm::embedding_exchange exchange(MPI_COMM_WORLD, make_tables(p), 10);
  matrix wrong_batch("in", exchange.global_batch() + 1, exchange.local_width());
  matrix out("out", 10, exchange.total_width());
  CHECK_THROWS_WITH_AS(exchange.forward(host{}, wrong_batch, out), doctest::Contains("batch x width"), kompress::invalid_argument);
  matrix narrow("out", 10, exchange.total_width() - 1);
  matrix in("in", exchange.global_batch(), exchange.local_width());
  CHECK_THROWS_AS(exchange.forward(host{}, in, narrow), kompress::invalid_argument);
  CHECK_THROWS_WITH_AS(kompress::dlrm::embedding_exchange(MPI_COMM_WORLD, {{p, 8}}, 10), doctest::Contains("outside"),
                       kompress::invalid_argument);
  CHECK_THROWS_AS(kompress::dlrm::embedding_exchange(MPI_COMM_WORLD, {{0, 0}}, 10), kompress::invalid_argument);
  CHECK_THROWS_AS(kompress::dlrm::embedding_exchange(MPI_COMM_WORLD, make_tables(p), 0), kompress::invalid_argument);
  // Ranks disagreeing on the model: every rank gets the error.
  if (p > 1)
    CHECK_THROWS_WITH_AS(kompress::dlrm::embedding_exchange(MPI_COMM_WORLD, make_tables(p), 10 + std::size_t(rank_of() % 2)),
                       doctest::Contains("disagree on the model"), kompress::invalid_argument);
}
