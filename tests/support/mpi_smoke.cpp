// The MPI test harness works: every rank runs the test cases, collectives see all ranks, and
// Kokkos runs inside each rank.
#include <doctest/doctest.h>

#include <Kokkos_Core.hpp>
#include <mpi.h>

TEST_CASE("MPI_Allreduce sums the rank ids of all ranks") {
  int rank = -1;
  int ranks = 0;
  REQUIRE(MPI_Comm_rank(MPI_COMM_WORLD, &rank) == MPI_SUCCESS);
  REQUIRE(MPI_Comm_size(MPI_COMM_WORLD, &ranks) == MPI_SUCCESS);
  REQUIRE(ranks >= 1);
  int sum = -1;
  REQUIRE(MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD) == MPI_SUCCESS);
  CHECK(sum == ranks * (ranks - 1) / 2);
}

TEST_CASE("Kokkos parallel_reduce runs inside each rank") {
  int rank = 0;
  REQUIRE(MPI_Comm_rank(MPI_COMM_WORLD, &rank) == MPI_SUCCESS);
  REQUIRE(Kokkos::is_initialized());
  const long n = 10000 + rank;
  long sum = 0;
  Kokkos::parallel_reduce(
      "kompress::test::mpi_smoke", Kokkos::RangePolicy<>(0, n),
      KOKKOS_LAMBDA(long i, long& partial) { partial += i + rank; }, sum);
  CHECK(sum == n * (n - 1) / 2 + n * rank);

  // And the per-rank results agree across ranks with what each rank computed.
  long total = 0;
  REQUIRE(MPI_Allreduce(&sum, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD) == MPI_SUCCESS);
  int ranks = 0;
  REQUIRE(MPI_Comm_size(MPI_COMM_WORLD, &ranks) == MPI_SUCCESS);
  long expected = 0;
  for (long r = 0; r < ranks; ++r) expected += (10000 + r) * (9999 + r) / 2 + (10000 + r) * r;
  CHECK(total == expected);
}

// Skipped by default; tests/CMakeLists.txt runs it with --no-skip as the test
// mpi_smoke.failure_on_one_rank.np2 and expects rank 0 to report the failure of the last rank.
TEST_CASE("harness: a check that fails on the last rank only" * doctest::skip()) {
  int rank = 0;
  int ranks = 0;
  REQUIRE(MPI_Comm_rank(MPI_COMM_WORLD, &rank) == MPI_SUCCESS);
  REQUIRE(MPI_Comm_size(MPI_COMM_WORLD, &ranks) == MPI_SUCCESS);
  CHECK(rank != ranks - 1);
}
