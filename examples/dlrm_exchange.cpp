// The DLRM embedding all-to-all: this rank's tables pooled over the whole batch in, every
// table for this rank's slice of the batch out; the gradients go back the same way.
//   mpiexec -n 2 kompress_dlrm_example
#include <kompress/dlrm.hpp>

#include <cstdio>
#include <vector>

int main(int argc, char* argv[]) {
  MPI_Init(&argc, &argv);
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    int ranks = 1, rank = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    // The collectives take host memory (a CUDA build too: docs/gpu.md).
    using exec = Kokkos::DefaultHostExecutionSpace;
    using matrix = Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::HostSpace>;

    // Five tables of dimension 64, dealt round-robin to the ranks; built once per model.
    std::vector<kompress::dlrm::table> tables;
    for (int t = 0; t < 5; ++t) tables.push_back({.owner = t % ranks, .dim = 64});
    kompress::dlrm::embedding_exchange exchange(
        MPI_COMM_WORLD, tables, /*local_batch=*/256,
        {.forward = {.bound = kompress::relative(1e-2)}, .backward = {.bound = kompress::relative(1e-3)}});

    matrix pooled("pooled", exchange.global_batch(), exchange.local_width());
    matrix batch("batch", exchange.local_batch(), exchange.total_width());
    Kokkos::deep_copy(pooled, 0.5f + rank);
    const auto forward = exchange.forward(exec{}, pooled, batch);  // model parallel -> data parallel

    matrix grads("grads", exchange.global_batch(), exchange.local_width());
    kompress::request backward = exchange.ibackward(exec{}, batch, grads);  // the reverse, nonblocking
    backward.wait();

    if (rank == 0) std::printf("forward: %.1fx fewer bytes, within %g\n", forward.ratio(), forward.absolute_bound);
  }
  MPI_Finalize();
}
