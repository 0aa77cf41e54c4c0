// alltoall and allreduce compressed within a bound, where the code called MPI's; then the
// allreduce over nodes, compressing only between them.
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
    // The collectives take host memory (a CUDA build too: docs/gpu.md).
    using exec = Kokkos::DefaultHostExecutionSpace;

    const int block = 1 << 16;  // values to each rank
    using host_vector = Kokkos::View<float*, Kokkos::HostSpace>;
    host_vector send("send", std::size_t(block) * ranks), recv("recv", send.size());
    Kokkos::parallel_for(Kokkos::RangePolicy<exec>(0, send.size()),
                         [=](std::size_t i) { send(i) = std::sin(float(i) * 1e-4f + float(rank)); });

    // MPI_Alltoall, with every value delivered within 1e-3 of the sent values' range.
    const kompress::collective_options options{.codec = {.bound = kompress::relative(1e-3)}};
    const auto sent = kompress::alltoall(exec{}, send, recv, MPI_COMM_WORLD, options);

    // MPI_Allreduce (sum), nonblocking: the request owns its buffers until wait().
    host_vector sum("sum", send.size());
    kompress::request request = kompress::iallreduce(exec{}, send, sum, MPI_COMM_WORLD, options);
    const kompress::collective_report reduced = request.wait();

    // Ranks that share memory are a node: raw within it, compressed between nodes, within
    // (nodes) times the bound instead of (ranks) times. The workspace keeps the scratch.
    const kompress::node_groups nodes(MPI_COMM_WORLD);
    kompress::hierarchical_workspace workspace(nodes);
    const auto summed = kompress::allreduce(exec{}, send, sum, nodes, options, &workspace);

    if (rank == 0)
      std::printf("alltoall: %.1fx fewer bytes, within %g; allreduce: within %g; over %d node(s): within %g\n",
                  sent.ratio(), sent.absolute_bound, reduced.absolute_bound, nodes.nodes(), summed.absolute_bound);
  }
  MPI_Finalize();
}
