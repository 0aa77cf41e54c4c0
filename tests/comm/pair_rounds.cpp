// Persistent raw rounds on two ranks are one exchange with the peer (docs/collectives.md,
// "Persistent collectives"): allreduce_init, allgather_init and reduce_scatter_init set up one
// persistent send and one receive at init and start both each round, with no MPI collective
// call (run() may take MPI's blocking collective instead, where init timed it faster), up to
// the size a one-shot call carries with its agreement; above it, and on other rank counts,
// MPI's own collective. The results are MPI's bit for bit (on two ranks the sum has one
// order: IEEE addition commutes), in place too, round after round on new values, whether a
// round completes by wait(), test() or run(). MPI calls are counted through MPI's profiling
// interface. Run under mpiexec -n 1, 2 and 3.

#include <kompress/comm.hpp>

#include "support/counted_collectives.hpp"
#include "support/mpi_checks.hpp"

#include <doctest/doctest.h>
#include <mpi.h>

#include <vector>

namespace {

/// Point-to-point calls kompress made while `counting` (the test's own state: the library holds
/// none); its collectives are counted by support/counted_collectives.hpp.
struct mpi_calls {
  bool counting = false;
  long send_inits = 0;  ///< MPI_Send_init on the collectives' tag
  long startalls = 0;
};
mpi_calls calls;

}  // namespace

extern "C" {
int MPI_Send_init(const void* buffer, int count, MPI_Datatype type, int peer, int tag, MPI_Comm comm,
                  MPI_Request* request) {
  if (calls.counting && tag == kompress::detail::collective_tag) ++calls.send_inits;
  return PMPI_Send_init(buffer, count, type, peer, tag, comm, request);
}
int MPI_Startall(int count, MPI_Request requests[]) {
  if (calls.counting) ++calls.startalls;
  return PMPI_Startall(count, requests);
}
}

namespace {

using namespace kompress::test;  // support/mpi_checks.hpp, support/counted_collectives.hpp

constexpr int rounds = 4;
const kompress::collective_options raw{.mode = kompress::transfer_mode::raw};
/// The one-shot calls carry up to this many bytes per message on two ranks; the persistent
/// rounds are one exchange up to the same size (the test's own literal).
constexpr std::size_t pair_limit_bytes = std::size_t(1) << 20;

/// New values in the same View for each round.
template <class T>
void refill(const host_view<T>& view, int round) {
  Kokkos::deep_copy(view, make_data<T>(view.size(), 17 * rank_of() + 1000 * round, 10.0 + round));
}

/// Counts (or stops counting) both kinds of MPI calls.
void counting(bool on) { calls.counting = collective_calls.counting = on; }

/// Rounds completed by run() (the others by wait() or test()).
constexpr int run_rounds = rounds / 3;  // round % 3 == 2

/// One round of `request`, completed a different way each round.
void run_round(kompress::persistent_request& request, int round) {
  if (round % 3 == 0) {
    request.start();
    request.wait();
  } else if (round % 3 == 1) {
    request.start();
    while (!request.test()) {
    }
  } else {
    request.run();
  }
}

/// Counts the MPI calls of `init` and of the rounds `rounds_of(request)` runs, and checks that
/// on two ranks up to the limit every round was the exchange (one MPI_Startall), but for run(),
/// which may be MPI's blocking collective instead (timed faster at init): one or the other, never
/// both. Every other case calls MPI's collective.
template <class Init, class Rounds>
void check_path(std::size_t message_bytes, Init&& init, Rounds&& rounds_of) {
  calls = {};
  collective_calls = {};
  counting(true);
  auto request = init();
  const mpi_calls at_init = calls;
  const long collectives_at_init = collective_calls.count;
  rounds_of(request);
  counting(false);
  const long startalls = calls.startalls - at_init.startalls;
  const long collectives = collective_calls.count - collectives_at_init;
  const bool pair = size_of() == 2 && message_bytes <= pair_limit_bytes;
  CAPTURE(message_bytes);
  CAPTURE(startalls);
  CAPTURE(collectives);
  if (pair && message_bytes > 0) {
    CHECK(at_init.send_inits == 1);
    CHECK(startalls + collectives == rounds);
    CHECK(startalls >= rounds - run_rounds);
  } else if (pair) {
    CHECK(at_init.send_inits == 0);  // nothing to send: no message at all
    CHECK(startalls == 0);
  } else {
    CHECK(calls.send_inits == 0);
    if (size_of() > 1) CHECK(collectives > 0);
  }
}

const std::size_t counts[] = {0, 1, 1000, pair_limit_bytes / sizeof(float), pair_limit_bytes / sizeof(float) + 1};

}  // namespace

TEST_CASE_TEMPLATE("allreduce_init on two ranks: one exchange per round, MPI's sum bit for bit", T, float, double) {
  for (const std::size_t n : counts) {
    for (const bool in_place : {false, true}) {
      host_view<T> send("send", n), got("got", n), expected("expected", n);
      const host_view<T> out = in_place ? send : got;
      check_path(
          n * sizeof(T), [&] { return kompress::allreduce_init(host{}, send, out, MPI_COMM_WORLD, raw); },
          [&](kompress::persistent_request& request) {
            for (int round = 0; round < rounds; ++round) {
              refill(send, round);
              counting(false);
              MPI_Allreduce(send.data(), expected.data(), int(n), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
              counting(true);
              run_round(request, round);
              CHECK(same_bytes(out, expected));
            }
          });
    }
  }
}

TEST_CASE_TEMPLATE("allgather_init on two ranks: one exchange per round, MPI's result bit for bit", T, float, double) {
  const int p = size_of();
  for (const std::size_t n : counts) {
    host_view<T> send("send", n), got("got", n * p), expected("expected", n * p);
    check_path(
        n * sizeof(T), [&] { return kompress::allgather_init(host{}, send, got, MPI_COMM_WORLD, raw); },
        [&](kompress::persistent_request& request) {
          for (int round = 0; round < rounds; ++round) {
            refill(send, round);
            counting(false);
            MPI_Allgather(send.data(), int(n), mpi_type<T>(), expected.data(), int(n), mpi_type<T>(), MPI_COMM_WORLD);
            counting(true);
            run_round(request, round);
            CHECK(same_bytes(got, expected));
          }
        });
  }
}

TEST_CASE_TEMPLATE("reduce_scatter_init on two ranks: one exchange per round, MPI's sum bit for bit", T, float,
                   double) {
  const int p = size_of();
  for (const std::size_t n : counts) {
    host_view<T> send("send", n * p), got("got", n), expected("expected", n);
    check_path(
        n * sizeof(T), [&] { return kompress::reduce_scatter_init(host{}, send, got, MPI_COMM_WORLD, raw); },
        [&](kompress::persistent_request& request) {
          for (int round = 0; round < rounds; ++round) {
            refill(send, round);
            counting(false);
            MPI_Reduce_scatter_block(send.data(), expected.data(), int(n), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
            counting(true);
            run_round(request, round);
            CHECK(same_bytes(got, expected));
          }
        });
  }
}

TEST_CASE("persistent pair rounds: a request destroyed mid-round completes it; several in flight") {
  const int p = size_of();
  host_view<float> a("a", 5000), b("b", 5000), c("c", 5000 * p), sum("sum", 5000);
  refill(a, 0);
  refill(b, 1);
  auto first = kompress::allreduce_init(host{}, a, sum, MPI_COMM_WORLD, raw);
  auto second = kompress::allgather_init(host{}, b, c, MPI_COMM_WORLD, raw);
  first.start();
  second.start();
  second.wait();
  first.wait();
  host_view<float> expected("expected", 5000), gathered("gathered", 5000 * p);
  MPI_Allreduce(a.data(), expected.data(), 5000, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allgather(b.data(), 5000, MPI_FLOAT, gathered.data(), 5000, MPI_FLOAT, MPI_COMM_WORLD);
  CHECK(same_bytes(sum, expected));
  CHECK(same_bytes(c, gathered));
  {
    auto abandoned = kompress::allreduce_init(host{}, a, sum, MPI_COMM_WORLD, raw);
    abandoned.start();
  }  // the destructor completes the round
  CHECK(same_bytes(sum, expected));
}
