// bench_poll_cost: what one MPI_Testany costs over k pending receives, the MPI library's own
// price for a poll, against the window kompress's collectives poll
// (detail::posted_messages::poll_window, docs/collectives.md, "Polling a window of receives").
// One rank posts 1,023 receives no message matches (an alltoall's on 1,024 ranks) and times
// MPI_Testany over the first k of them, k = 1, the window, 255 and 1,023, and over all 1,023 with
// every other one already done (MPI_REQUEST_NULL), as when an alltoall polls every receive
// halfway through; the best of five runs of 20,000 calls. Needs one rank; the receives are
// cancelled at the end.
//
//   mpiexec -n 1 bench_poll_cost
// Prints a table; docs/performance.md quotes it.

#include <kompress/comm.hpp>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  constexpr int pending = 1023;
  constexpr int unmatched_tag = 32000;  // nothing is sent with it
  std::vector<char> buffers(pending * 16);
  std::vector<MPI_Request> receives(pending);
  for (int i = 0; i < pending; ++i)
    MPI_Irecv(&buffers[std::size_t(i) * 16], 16, MPI_BYTE, MPI_ANY_SOURCE, unmatched_tag, MPI_COMM_SELF, &receives[i]);
  // The best of five runs of 20,000 calls over `requests`, in microseconds per call.
  const auto time_testany = [](std::vector<MPI_Request> requests) {
    double best = 1e30;
    for (int run = 0; run < 5; ++run) {
      constexpr int calls = 20000;
      int index = 0, flag = 0;
      const auto start = std::chrono::steady_clock::now();
      for (int c = 0; c < calls; ++c)
        MPI_Testany(int(requests.size()), requests.data(), &index, &flag, MPI_STATUS_IGNORE);
      best = std::min(best, std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() /
                                calls);
      if (flag && index != MPI_UNDEFINED) std::printf("a receive matched: the measurement is void\n");
    }
    return best;
  };
  std::printf("%-44s %12s\n", "MPI_Testany over k requests", "us per call");
  const int window = int(kompress::detail::posted_messages::poll_window);
  for (const int k : {1, window, 255, pending})
    std::printf("k = %-40d %12.3f%s\n", k,
                time_testany(std::vector<MPI_Request>(receives.begin(), receives.begin() + k)),
                k == window ? "   (kompress's poll window)" : "");
  // Half of an alltoall's receives completed on average while it polls them all: every other
  // request MPI_REQUEST_NULL.
  std::vector<MPI_Request> half_done(receives);
  for (std::size_t i = 1; i < half_done.size(); i += 2) half_done[i] = MPI_REQUEST_NULL;
  std::printf("k = %-40s %12.3f\n", "1023, every other one MPI_REQUEST_NULL", time_testany(half_done));
  for (MPI_Request& r : receives) MPI_Cancel(&r);
  MPI_Waitall(pending, receives.data(), MPI_STATUSES_IGNORE);
  MPI_Finalize();
  return 0;
}
