// alltoall and allreduce compressed within a bound, where the code called MPI's.
//   mpiexec -n 2 kompress_collectives_example
#include <kompress/comm.hpp>

#include <cmath>
#include <cstdio>

int main(int argc, char* argv[]) {
  MPI_Init(&argc, &argv);
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    int ranks = 1, rank = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    using exec = Kokkos::DefaultExecutionSpace;

    const int block = 1 << 16;  // values to each rank
    Kokkos::View<float*> send("send", std::size_t(block) * ranks), recv("recv", send.size());
    Kokkos::parallel_for(send.size(), KOKKOS_LAMBDA(int i) { send(i) = std::sin(i * 1e-4f + rank); });

    // MPI_Alltoall, with every value delivered within 1e-3 of the sent values' range.
    const kompress::collective_options options{.codec = {.bound = kompress::relative(1e-3)}};
    const auto sent = kompress::alltoall(exec{}, send, recv, MPI_COMM_WORLD, options);

    // MPI_Allreduce (sum), nonblocking: the request owns its buffers until wait().
    Kokkos::View<float*> sum("sum", send.size());
    kompress::request request = kompress::iallreduce(exec{}, send, sum, MPI_COMM_WORLD, options);
    const kompress::collective_report reduced = request.wait();

    if (rank == 0)
      std::printf("alltoall: %.1fx fewer bytes, within %g; allreduce: within %g\n", sent.ratio(),
                  sent.absolute_bound, reduced.absolute_bound);
  }
  MPI_Finalize();
}
