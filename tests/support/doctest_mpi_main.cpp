// The main of every MPI test executable (kompress_add_test with MPI_RANKS).
//
// Every rank runs the same test cases. Rank 0 prints doctest's report; another rank's report
// is printed (to stderr, marked with its rank) only when a test failed there. The exit status
// is nonzero on every rank when any rank failed, so mpiexec and ctest see the failure.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <iostream>
#include <sstream>

namespace {

bool mpi_ok(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return true;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(rc, text, &length);
  std::cerr << "doctest_mpi_main: " << what << " failed: " << std::string(text, length) << '\n';
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (!mpi_ok(MPI_Init(&argc, &argv), "MPI_Init")) return 1;
  int rank = 0;
  int ranks = 1;
  if (!mpi_ok(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "MPI_Comm_rank") ||
      !mpi_ok(MPI_Comm_size(MPI_COMM_WORLD, &ranks), "MPI_Comm_size")) {
    MPI_Abort(MPI_COMM_WORLD, 1);
  }

  int local_failed = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    std::ostringstream rank_output;
    doctest::Context context(argc, argv);
    if (rank != 0) context.setCout(&rank_output);
    local_failed = context.run() != 0 ? 1 : 0;
    if (local_failed != 0 && rank != 0) {
      std::cerr << "---- doctest output of rank " << rank << " of " << ranks << " ----\n"
                << rank_output.str() << std::flush;
    }
  }

  int failed_ranks = 0;
  if (!mpi_ok(MPI_Allreduce(&local_failed, &failed_ranks, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD),
              "MPI_Allreduce")) {
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  if (rank == 0 && failed_ranks != 0) {
    // One write of the whole line, after doctest's report has gone out: mpiexec forwards each
    // rank's output as it reads it, and another rank's report must not land inside this line
    // (ctest matches it).
    std::ostringstream line;
    line << "doctest_mpi_main: tests failed on " << failed_ranks << " of " << ranks << " ranks\n";
    std::cout.flush();
    std::cout << line.str() << std::flush;
  }
  if (!mpi_ok(MPI_Finalize(), "MPI_Finalize")) return 1;
  return failed_ranks != 0 ? 1 : 0;
}
