// bench_exchange_overhead: what the exchange engine costs when it compresses nothing, against
// plain MPI_Alltoallv of the same bytes, measured in the same run: kompress::alltoallv in raw
// mode, and the DLRM embedding exchange's forward with compression off (one table of dim 128
// per rank; the local batch sets the bytes per peer). Per size: rounds of one call of each,
// after an MPI_Barrier; a call's time is the slowest rank's; the ratio is the median over
// rounds of (variant / plain) in the same round, so the machine's load cancels in part.
//
//   mpiexec -n 2 bench_exchange_overhead [--rounds N] [--calls N]
// Prints a table; docs/performance.md quotes it.

#include <kompress/dlrm.hpp>

#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

using host = Kokkos::DefaultHostExecutionSpace;
using matrix = Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::HostSpace>;

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

/// Seconds per call of `f` (`calls` back to back), the slowest rank's.
template <class F>
double timed(int calls, F&& f) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double start = now();
  for (int i = 0; i < calls; ++i) f();
  double seconds = (now() - start) / calls;
  MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return seconds;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    int rounds = 15, calls = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string arg = argv[i];
      if (arg == "--rounds") rounds = std::atoi(argv[i + 1]);
      else if (arg == "--calls") calls = std::atoi(argv[i + 1]);
    }
    int p = 1, me = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &p);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    const std::size_t dim = 128;
    if (me == 0)
      std::printf("%-10s %-28s %12s %12s %8s\n", "per peer", "variant", "median us", "plain us", "ratio");
    for (const std::size_t per_peer : {std::size_t(4) << 10, std::size_t(64) << 10, std::size_t(1) << 20}) {
      const std::size_t batch = per_peer / (dim * sizeof(float));  // rows of one table per peer
      std::vector<kompress::dlrm::table> tables;
      for (int r = 0; r < p; ++r) tables.push_back({r, dim});
      kompress::dlrm::exchange_options options;
      options.compress_forward = options.compress_backward = false;
      kompress::dlrm::embedding_exchange exchange(MPI_COMM_WORLD, tables, batch, options);
      matrix in("in", exchange.global_batch(), exchange.local_width()), out("out", batch, exchange.total_width());
      Kokkos::deep_copy(in, 1.0f);
      const std::size_t count = per_peer / sizeof(float);
      Kokkos::View<float*, Kokkos::HostSpace> send("send", count * p), recv("recv", count * p);
      std::vector<int> counts(p, int(count)), displs(p);
      for (int r = 0; r < p; ++r) displs[r] = r * int(count);
      kompress::collective_options raw;
      raw.mode = kompress::transfer_mode::raw;
      const auto plain = [&] {
        MPI_Alltoallv(send.data(), counts.data(), displs.data(), MPI_FLOAT, recv.data(), counts.data(), displs.data(),
                      MPI_FLOAT, MPI_COMM_WORLD);
      };
      const auto alltoallv = [&] {
        kompress::alltoallv(host{}, send, counts, displs, recv, counts, displs, MPI_COMM_WORLD, raw);
      };
      const auto forward = [&] { exchange.forward(host{}, in, out); };
      const int n = calls > 0 ? calls : int(std::max<std::size_t>(1, (std::size_t(4) << 20) / per_peer));
      plain(), alltoallv(), forward();  // warm-up: connections, first allocations
      std::vector<double> t_plain, t_alltoallv, t_forward, r_alltoallv, r_forward;
      for (int round = 0; round < rounds; ++round) {
        t_plain.push_back(timed(n, plain));
        t_alltoallv.push_back(timed(n, alltoallv));
        t_forward.push_back(timed(n, forward));
        r_alltoallv.push_back(t_alltoallv.back() / t_plain.back());
        r_forward.push_back(t_forward.back() / t_plain.back());
      }
      if (me == 0) {
        const std::string size = per_peer >= (1u << 20) ? std::to_string(per_peer >> 20) + " MiB"
                                                        : std::to_string(per_peer >> 10) + " KiB";
        std::printf("%-10s %-28s %12.1f %12.1f %8s\n", size.c_str(), "MPI_Alltoallv", 1e6 * median(t_plain),
                    1e6 * median(t_plain), "1.00");
        std::printf("%-10s %-28s %12.1f %12.1f %7.2fx\n", size.c_str(), "kompress::alltoallv raw",
                    1e6 * median(t_alltoallv), 1e6 * median(t_plain), median(r_alltoallv));
        std::printf("%-10s %-28s %12.1f %12.1f %7.2fx\n", size.c_str(), "dlrm forward, compression off",
                    1e6 * median(t_forward), 1e6 * median(t_plain), median(r_forward));
      }
    }
  }
  MPI_Finalize();
}
