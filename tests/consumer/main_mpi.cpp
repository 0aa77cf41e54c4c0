// A kompress::mpi user: MPI and Kokkos both come through the kompress::mpi target.
#include <kompress/kompress.hpp>

#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <cstdio>

int main(int argc, char** argv) {
  if (MPI_Init(&argc, &argv) != MPI_SUCCESS) return 1;
  int status = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    int rank = 0;
    int ranks = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    long local = 0;
    Kokkos::parallel_reduce(
        "consumer_mpi::sum", 100, KOKKOS_LAMBDA(int i, long& partial) { partial += i; }, local);
    long total = 0;
    if (MPI_Allreduce(&local, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS ||
        total != 4950L * ranks) {
      std::printf("consumer_mpi: rank %d: wrong total %ld\n", rank, total);
      status = 1;
    } else if (rank == 0) {
      std::printf("consumer_mpi: kompress %d.%d.%d on %d ranks: ok\n", kompress::version.major,
                  kompress::version.minor, kompress::version.patch, ranks);
    }
  }
  MPI_Finalize();
  return status;
}
