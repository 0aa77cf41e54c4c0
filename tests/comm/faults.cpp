// A failure after the agreement, mid-flight, never hangs a rank (docs/collectives.md, "Failure
// after the agreement"): the rank that fails throws its own error, a rank that receives an
// abort marker throws kompress::peer_error naming the failed rank, a rank untouched by the
// failure completes with a correct result, and the next call on the same communicator is
// correct. ctest runs this under a TIMEOUT, so a hang fails it; it is in the sanitizer pass.
//
// The failure is injected from outside the library, through MPI's profiling interface: this
// executable defines MPI_Isend (calling PMPI_Isend), and on one chosen rank either makes its
// k-th kompress message fail (MPI_ERR_OTHER, nothing sent: a local failure of the sender, as an
// MPI that returns errors reports it), sends it one byte short or with its last byte flipped
// (the receiver rejects it: a local failure of the receiver). k is the first, a middle or the
// last message of a clean run of the same call. The same injection fails the agreement's own
// messages (its tag), before any data moves. Run under mpiexec -n 2, 3 and 4; built a second
// time with KOMPRESS_TEST_STAGED, where the collectives' data go through the transport seam's
// host staging (transport_mode::staged), so the same failures are injected into staged calls.

#include <kompress/comm.hpp>
#include <kompress/dlrm.hpp>

#include "support/mpi_checks.hpp"

#include <doctest/doctest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

namespace {

/// What the interposed MPI_Isend does to one rank's kompress messages. The test's own state:
/// the library holds none.
struct isend_fault {
  enum class action { count, fail, truncate, flip };
  action what = action::count;
  int rank = -1;          ///< the rank whose messages are counted (and one damaged)
  long target = -1;       ///< which message (from 0) is damaged
  long seen = 0;          ///< kompress messages this rank posted since arm()
  bool fired = false;
  int tag = kompress::detail::collective_tag;  ///< the collectives' data messages, or the agreement's
};
isend_fault fault;
/// The damaged copy a flipped message is sent from: alive until the call that sent it completed.
std::vector<std::byte> flipped_copy;

using kompress::test::rank_of;
using kompress::test::size_of;

void arm(isend_fault::action what, int rank, long target, int tag = kompress::detail::collective_tag) {
  fault = {what, rank, target, 0, false, tag};
  flipped_copy.clear();
}

}  // namespace

extern "C" int MPI_Isend(const void* buffer, int count, MPI_Datatype type, int peer, int tag, MPI_Comm comm,
                         MPI_Request* request) {
  // Only the messages of the chosen tag (an abort marker, shorter, is neither counted nor damaged).
  if (tag == fault.tag && type == MPI_BYTE && std::size_t(count) >= kompress::detail::min_message_bytes &&
      rank_of() == fault.rank) {
    if (fault.what != isend_fault::action::count && !fault.fired && fault.seen == fault.target) {
      fault.fired = true;
      ++fault.seen;
      if (fault.what == isend_fault::action::fail) {
        *request = MPI_REQUEST_NULL;
        return MPI_ERR_OTHER;
      }
      if (fault.what == isend_fault::action::flip) {
        const auto* bytes = static_cast<const std::byte*>(buffer);
        flipped_copy.assign(bytes, bytes + count);
        flipped_copy.back() ^= std::byte(0xFF);
        return PMPI_Isend(flipped_copy.data(), count, type, peer, tag, comm, request);
      }
      return PMPI_Isend(buffer, count - 1, type, peer, tag, comm, request);  // one byte short
    }
    ++fault.seen;
  }
  return PMPI_Isend(buffer, count, type, peer, tag, comm, request);
}

namespace {

using host = Kokkos::DefaultHostExecutionSpace;
using view = Kokkos::View<float*, Kokkos::HostSpace>;
using matrix = Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::HostSpace>;

/// Values that compress about 3.3x at ABS 1e-3: a smooth wave plus hashed noise, so that a
/// 256 KiB chunk is a stream of ~80 KB (MPI's rendezvous range, not its eager one).
view make_data(std::size_t n, int seed) {
  view v("data", n);
  for (std::size_t i = 0; i < n; ++i) {
    std::uint64_t h = (std::uint64_t(i) + 1) * 0x9E3779B97F4A7C15ull ^ std::uint64_t(seed + 7) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    v(i) = float(std::sin(0.001 * double(i) + seed) * 5.0 + double(h % 1024) / 1024.0);
  }
  return v;
}

/// Per-peer (alltoall) or per-hop (ring) values of the large case, in 4 chunks (streams of
/// ~80 KB; ~10 KB in the sanitizer pass: both above MPICH's 8 KiB eager limit), and of the small
/// one, in one (~2.5 KB, eager). The sanitizer pass (Debug, ASan) runs an eighth of the large
/// size: at 1 MiB it took 76 s on 4 ranks, against 4 s in the release build.
#ifdef KOMPRESS_TEST_SANITIZED
const std::size_t large = 32 * 1024;
#else
const std::size_t large = 256 * 1024;
#endif
const std::size_t small = 2000;

#ifdef KOMPRESS_TEST_STAGED
constexpr auto test_transport = kompress::transport_mode::staged;
#else
constexpr auto test_transport = kompress::transport_mode::automatic;
#endif

kompress::collective_options options_for(double bound) {
  kompress::collective_options options{.codec = {.bound = kompress::absolute(bound)}};
  options.transport = test_transport;
  options.cost.fixed_chunk_bytes = large * sizeof(float) / 4;  // a large message in 4 chunks
  return options;
}

template <class Got, class Expected>
std::size_t violations(const Got& got, const Expected& expected, double tolerance) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) bad += !(std::fabs(double(got(i)) - double(expected(i))) <= tolerance);
  return bad;
}

/// One collective, callable again and again with the same arguments on every rank: `call`
/// runs it (it may throw), `wrong` counts the values of the last completed call that are not
/// within its bound of plain MPI's result.
struct collective_case {
  std::string name;
  std::function<void()> call;
  std::function<std::size_t()> wrong;
};

/// How a call ended on one rank.
struct outcome {
  enum kind : int { completed = 0, own_error = 1, peer_failed = 2 };
  int what = completed;
  int named = -1;           ///< peer_failed: the rank the error names
  int own_type = 0;         ///< own_error: 1 mpi_error, 2 format_error, 3 another error
  std::string message;
};

outcome attempt(const collective_case& c) {
  outcome o;
  try {
    c.call();
  } catch (const kompress::peer_error& e) {
    o = {outcome::peer_failed, e.failed_rank(), 0, e.what()};
  } catch (const kompress::mpi_error& e) {
    o = {outcome::own_error, -1, 1, e.what()};
  } catch (const kompress::format_error& e) {
    o = {outcome::own_error, -1, 2, e.what()};
  } catch (const kompress::error& e) {
    o = {outcome::own_error, -1, 3, e.what()};
  }
  return o;
}

/// Runs `c` with the fault armed (on messages of `tag`) and checks every rank's outcome; then a
/// clean call, which must match plain MPI.
void run_faulty(const collective_case& c, isend_fault::action what, int faulty_rank, long target,
                bool everyone_throws, int tag = kompress::detail::collective_tag) {
  const int p = size_of(), me = rank_of();
  arm(what, faulty_rank, target, tag);
  const outcome o = attempt(c);
  const bool fired = fault.fired;
  arm(isend_fault::action::count, -1, -1);
  const std::size_t wrong = o.what == outcome::completed ? c.wrong() : 0;

  // Every rank sees every rank's outcome, so rank 0 reports a failure anywhere.
  int mine[4] = {o.what, o.named, o.own_type, fired ? 1 : 0};
  std::vector<int> all(4 * std::size_t(p));
  MPI_Allgather(mine, 4, MPI_INT, all.data(), 4, MPI_INT, MPI_COMM_WORLD);
  int any_fired = 0, failed = -1, own_errors = 0;
  for (int r = 0; r < p; ++r) {
    any_fired |= all[4 * r + 3];
    if (all[4 * r] == outcome::own_error) {
      ++own_errors;
      failed = r;
    }
  }
  const std::string scenario = c.name +
                               (what == isend_fault::action::fail       ? ": send fails"
                                : what == isend_fault::action::truncate ? ": message one byte short"
                                                                        : ": message with its last byte flipped") +
                               (tag == kompress::detail::collective_tag ? "" : " (agreement)") +
                               " on rank " + std::to_string(faulty_rank) + ", message " + std::to_string(target) +
                               "; this rank: " + o.message;
  INFO(scenario);
  CHECK(wrong == 0);
  REQUIRE(any_fired);  // the target is one of the messages a clean run of the call sent
  REQUIRE(own_errors == 1);  // exactly one rank failed on its own
  if (what == isend_fault::action::fail) {
    CHECK(failed == faulty_rank);
    if (me == failed) CHECK(o.own_type == 1);
  } else {
    CHECK(failed != faulty_rank);  // the receiver fails, not the sender
    if (me == failed) CHECK(o.own_type == 2);
  }
  if (o.what == outcome::peer_failed) {
    CHECK(o.named == failed);
    CHECK(o.message.find("rank " + std::to_string(failed) + " failed during kompress::") == 0);
  }
  if (everyone_throws && me != failed) CHECK(o.what == outcome::peer_failed);
  // The communicator holds no stray message: the next call on it is correct everywhere.
  CHECK_NOTHROW(c.call());
  CHECK(c.wrong() == 0);
}

/// The scenarios for one collective: its message count in a clean run on the faulty rank, then
/// each of `actions` (by default a failed send and a short message) at the first, a middle and
/// the last of them, each followed (inside run_faulty) by checks and a clean call that must
/// match plain MPI.
void exercise(const collective_case& c,
              std::vector<isend_fault::action> actions = {isend_fault::action::fail, isend_fault::action::truncate}) {
  const int p = size_of();
  if (p < 2) return;
  const int faulty = p - 1;
  arm(isend_fault::action::count, faulty, -1);
  CHECK_NOTHROW(c.call());
  long messages = fault.seen;
  MPI_Bcast(&messages, 1, MPI_LONG, faulty, MPI_COMM_WORLD);
  CHECK(c.wrong() == 0);
  REQUIRE(messages > 0);
#ifdef KOMPRESS_TEST_SANITIZED
  std::vector<long> targets{0, messages - 1};
#else
  std::vector<long> targets{0, messages / 2, messages - 1};
#endif
  targets.erase(std::unique(targets.begin(), targets.end()), targets.end());
  for (const long target : targets)
    for (const auto what : actions)  // a send that fails on the first message: every other rank gets a marker
      run_faulty(c, what, faulty, target, what == isend_fault::action::fail && target == 0);
}

/// `window`: collective_options::exchange_window (0: automatic, every peer at these sizes).
collective_case alltoall_case(std::size_t per_peer, bool nonblocking, std::size_t window = 0) {
  const int p = size_of();
  auto send = make_data(per_peer * std::size_t(p), rank_of());
  view got("got", send.size()), expected("expected", send.size());
  MPI_Alltoall(send.data(), int(per_peer), MPI_FLOAT, expected.data(), int(per_peer), MPI_FLOAT, MPI_COMM_WORLD);
  auto options = options_for(1e-3);
  options.exchange_window = window;
  return {std::string(nonblocking ? "ialltoall" : "alltoall") + " of " + std::to_string(per_peer) + " per peer" +
              (window ? ", a window of " + std::to_string(window) : std::string()),
          [=] {
            if (nonblocking) {
              auto r = kompress::ialltoall(host{}, send, got, MPI_COMM_WORLD, options);
              while (!r.test()) {
              }
            } else {
              kompress::alltoall(host{}, send, got, MPI_COMM_WORLD, options);
            }
          },
          [=] { return violations(got, expected, 1e-3); }};
}

/// A persistent alltoall: each call is one round (start, then wait).
collective_case alltoall_init_case(std::size_t per_peer) {
  const int p = size_of();
  auto send = make_data(per_peer * std::size_t(p), rank_of() + 1);
  view got("got", send.size()), expected("expected", send.size());
  MPI_Alltoall(send.data(), int(per_peer), MPI_FLOAT, expected.data(), int(per_peer), MPI_FLOAT, MPI_COMM_WORLD);
  auto step = std::make_shared<kompress::persistent_request>(
      kompress::alltoall_init(host{}, send, got, MPI_COMM_WORLD, options_for(1e-3)));
  return {"alltoall_init of " + std::to_string(per_peer) + " per peer",
          [=] {
            step->start();
            step->wait();
          },
          [=] { return violations(got, expected, 1e-3); }};
}

collective_case alltoallv_case(std::size_t per_peer, std::size_t window = 0) {
  const int p = size_of(), me = rank_of();
  std::vector<int> sc(p), sd(p), rc(p), rd(p);
  for (int j = 0; j < p; ++j) {  // uneven, and one empty pair: rank 0 sends nothing to rank 1
    sc[j] = (me == 0 && j == 1) ? 0 : int(per_peer + 100 * std::size_t(me + j));
    rc[j] = (j == 0 && me == 1) ? 0 : int(per_peer + 100 * std::size_t(j + me));
  }
  std::exclusive_scan(sc.begin(), sc.end(), sd.begin(), 0);
  std::exclusive_scan(rc.begin(), rc.end(), rd.begin(), 0);
  auto send = make_data(std::size_t(sd.back() + sc.back()), me + 3);
  view got("got", std::size_t(rd.back() + rc.back())), expected("expected", got.size());
  MPI_Alltoallv(send.data(), sc.data(), sd.data(), MPI_FLOAT, expected.data(), rc.data(), rd.data(), MPI_FLOAT,
                MPI_COMM_WORLD);
  auto options = options_for(1e-3);
  options.exchange_window = window;
  return {"alltoallv of about " + std::to_string(per_peer) + " per peer" +
              (window ? ", a window of " + std::to_string(window) : std::string()),
          [=] { kompress::alltoallv(host{}, send, sc, sd, got, rc, rd, MPI_COMM_WORLD, options); },
          [=] { return violations(got, expected, 1e-3); }};
}

/// The tolerance of a sum over p ranks: the collective's guarantee plus float summation error.
double sum_tolerance(double guarantee) { return guarantee + 2.0 * size_of() * 1.2e-7 * 6.0 * size_of(); }

enum class form { blocking, nonblocking, persistent };

collective_case allreduce_case(std::size_t per_hop, kompress::reduction_method reduction,
                               form how = form::blocking) {
  const bool persistent = how == form::persistent;
  const int p = size_of();
  const std::size_t n = per_hop * std::size_t(p);
  auto send = make_data(n, rank_of());
  view got("got", n), expected("expected", n);
  MPI_Allreduce(send.data(), expected.data(), int(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  auto options = options_for(1e-3);
  options.reduction = reduction;
  std::string name = std::string(persistent ? "allreduce_init" : how == form::nonblocking ? "iallreduce" : "allreduce") +
                     (reduction == kompress::reduction_method::homomorphic ? " (homomorphic)" : "") + " of " +
                     std::to_string(per_hop) + " per hop";
  const double tolerance = sum_tolerance(p * 1e-3);
  if (persistent) {
    auto step = std::make_shared<kompress::persistent_request>(
        kompress::allreduce_init(host{}, send, got, MPI_COMM_WORLD, options));
    return {name, [=] {
              step->start();
              step->wait();
            },
            [=] { return violations(got, expected, tolerance); }};
  }
  if (how == form::nonblocking)
    return {name, [=] {
              auto r = kompress::iallreduce(host{}, send, got, MPI_COMM_WORLD, options);
              while (!r.test()) {
              }
            },
            [=] { return violations(got, expected, tolerance); }};
  return {name, [=] { kompress::allreduce(host{}, send, got, MPI_COMM_WORLD, options); },
          [=] { return violations(got, expected, tolerance); }};
}

/// The hierarchical allreduce over nodes of two ranks: only its allreduce across nodes sends
/// kompress messages, so the fault lands there; the ranks of the faulty rank's node that did not
/// take part learn of it between the phases.
collective_case hierarchical_allreduce_case(std::size_t per_hop) {
  const int p = size_of();
  const std::size_t n = per_hop * std::size_t(p);
  auto send = make_data(n, rank_of() + 2);
  view got("got", n), expected("expected", n);
  MPI_Allreduce(send.data(), expected.data(), int(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  const auto groups = std::make_shared<kompress::node_groups>(MPI_COMM_WORLD, 2);
  const auto options = options_for(1e-3);
  const double tolerance = sum_tolerance(groups->nodes() * 1e-3);
  return {"allreduce (hierarchical, nodes of 2) of " + std::to_string(per_hop) + " per hop",
          [=] { kompress::allreduce(host{}, send, got, *groups, options); },
          [=] { return violations(got, expected, tolerance); }};
}

/// The hierarchical reduce_scatter and allgather over nodes of two ranks, placed round-robin
/// (node i holds ranks i and i + p/2): only their phase across nodes sends kompress messages.
collective_case hierarchical_reduce_scatter_case(std::size_t per_rank) {
  const int p = size_of();
  auto send = make_data(per_rank * std::size_t(p), rank_of() + 4);
  view got("got", per_rank), expected("expected", per_rank);
  MPI_Reduce_scatter_block(send.data(), expected.data(), int(per_rank), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  const auto groups =
      std::make_shared<kompress::node_groups>(kompress::node_groups::by_node(MPI_COMM_WORLD, rank_of() % (p / 2)));
  auto options = options_for(1e-3);
  options.schedule = kompress::collective_schedule::ring;
  const double tolerance = sum_tolerance((groups->nodes() - 1) * 1e-3);
  return {"reduce_scatter (hierarchical, nodes of 2) of " + std::to_string(per_rank) + " per rank",
          [=] { kompress::reduce_scatter(host{}, send, got, *groups, options); },
          [=] { return violations(got, expected, tolerance); }};
}

collective_case hierarchical_allgather_case(std::size_t per_rank) {
  const int p = size_of();
  auto send = make_data(per_rank, rank_of() + 6);
  view got("got", per_rank * std::size_t(p)), expected("expected", got.size());
  MPI_Allgather(send.data(), int(per_rank), MPI_FLOAT, expected.data(), int(per_rank), MPI_FLOAT, MPI_COMM_WORLD);
  const auto groups =
      std::make_shared<kompress::node_groups>(kompress::node_groups::by_node(MPI_COMM_WORLD, rank_of() % (p / 2)));
  const auto options = options_for(1e-3);
  return {"allgather (hierarchical, nodes of 2) of " + std::to_string(per_rank) + " per rank",
          [=] { kompress::allgather(host{}, send, got, *groups, options); },
          [=] { return violations(got, expected, 1e-3); }};
}

collective_case allgather_case(std::size_t per_rank) {
  const int p = size_of();
  auto send = make_data(per_rank, rank_of());
  view got("got", per_rank * std::size_t(p)), expected("expected", got.size());
  MPI_Allgather(send.data(), int(per_rank), MPI_FLOAT, expected.data(), int(per_rank), MPI_FLOAT, MPI_COMM_WORLD);
  const auto options = options_for(1e-3);
  return {"allgather of " + std::to_string(per_rank) + " per rank",
          [=] { kompress::allgather(host{}, send, got, MPI_COMM_WORLD, options); },
          [=] { return violations(got, expected, 1e-3); }};
}

collective_case reduce_scatter_case(std::size_t per_rank,
                                    kompress::reduction_method reduction = kompress::reduction_method::recompress) {
  const int p = size_of();
  auto send = make_data(per_rank * std::size_t(p), rank_of());
  view got("got", per_rank), expected("expected", per_rank);
  MPI_Reduce_scatter_block(send.data(), expected.data(), int(per_rank), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  auto options = options_for(1e-3);
  options.reduction = reduction;
  const bool homomorphic = reduction == kompress::reduction_method::homomorphic;
  // The homomorphic reduction quantizes the owner's values too: p terms, recompress's p - 1.
  const double guarantee = (homomorphic ? p : p - 1) * 1e-3;
  return {"reduce_scatter" + std::string(homomorphic ? " (homomorphic)" : "") + " of " + std::to_string(per_rank) +
              " per rank",
          [=] { kompress::reduce_scatter(host{}, send, got, MPI_COMM_WORLD, options); },
          [=] { return violations(got, expected, sum_tolerance(guarantee)); }};
}

/// alltoall of one value per peer in compressed mode: every message is that value raw (4 bytes:
/// its stream would be longer), 2.5f + the sender's rank, whose first three bytes, read as an
/// abort marker, would name rank 2^21 or beyond.
collective_case single_value_alltoall_case() {
  const int p = size_of();
  view send("send", std::size_t(p)), got("got", std::size_t(p)), expected("expected", std::size_t(p));
  for (int j = 0; j < p; ++j) send(j) = 2.5f + float(rank_of());
  MPI_Alltoall(send.data(), 1, MPI_FLOAT, expected.data(), 1, MPI_FLOAT, MPI_COMM_WORLD);
  const auto options = options_for(1e-3);
  return {"alltoall of one value per peer", [=] { kompress::alltoall(host{}, send, got, MPI_COMM_WORLD, options); },
          [=] { return violations(got, expected, 0.0); }};
}

/// A raw alltoall: on two to four ranks its blocks ride the agreement (inside its message up to
/// the inline size, else in a message right behind it).
collective_case raw_alltoall_case(std::size_t per_peer) {
  const int p = size_of();
  auto send = make_data(per_peer * std::size_t(p), rank_of());
  view got("got", send.size()), expected("expected", send.size());
  MPI_Alltoall(send.data(), int(per_peer), MPI_FLOAT, expected.data(), int(per_peer), MPI_FLOAT, MPI_COMM_WORLD);
  kompress::collective_options options;
  options.mode = kompress::transfer_mode::raw;
  return {"raw alltoall of " + std::to_string(per_peer) + " per peer",
          [=] { kompress::alltoall(host{}, send, got, MPI_COMM_WORLD, options); },
          [=] { return violations(got, expected, 0.0); }};
}

/// A raw allreduce: on two ranks its whole input rides the agreement.
collective_case raw_allreduce_case(std::size_t n) {
  auto send = make_data(n, rank_of());
  view got("got", n), expected("expected", n);
  MPI_Allreduce(send.data(), expected.data(), int(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  kompress::collective_options options;
  options.mode = kompress::transfer_mode::raw;
  return {"raw allreduce of " + std::to_string(n),
          [=] { kompress::allreduce(host{}, send, got, MPI_COMM_WORLD, options); },
          [=] { return violations(got, expected, sum_tolerance(0.0)); }};
}

/// A persistent allreduce set up and run once per call: its init agrees.
collective_case allreduce_init_run_case(std::size_t per_hop) {
  const int p = size_of();
  const std::size_t n = per_hop * std::size_t(p);
  auto send = make_data(n, rank_of());
  view got("got", n), expected("expected", n);
  MPI_Allreduce(send.data(), expected.data(), int(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  const auto options = options_for(1e-3);
  return {"allreduce_init of " + std::to_string(per_hop) + " per hop, then run()",
          [=] { kompress::allreduce_init(host{}, send, got, MPI_COMM_WORLD, options).run(); },
          [=] { return violations(got, expected, sum_tolerance(p * 1e-3)); }};
}

}  // namespace

TEST_CASE("alltoall and alltoallv: a failure mid-flight hangs no rank; the next call is correct") {
  for (const std::size_t n : {large, small}) {
    exercise(alltoall_case(n, false));
    exercise(alltoallv_case(n));
  }
}

TEST_CASE("alltoall and alltoallv with a window of one peer: a failure mid-flight hangs no rank, before or after "
          "every receive is posted") {
  for (const std::size_t n : {large, small}) {
    exercise(alltoall_case(n, false, 1));
    exercise(alltoallv_case(n, 1));
  }
  exercise(alltoall_case(large, true, 1));
}

TEST_CASE("nonblocking alltoall and allreduce: a failure mid-flight surfaces from test(), after the drain") {
  exercise(alltoall_case(large, true));
  exercise(allreduce_case(large, kompress::reduction_method::recompress, form::nonblocking));
}

TEST_CASE("allreduce with both reductions: a failure mid-flight travels the ring hop by hop; no rank hangs") {
  for (const std::size_t n : {large, small}) {
    exercise(allreduce_case(n, kompress::reduction_method::recompress));
    exercise(allreduce_case(n, kompress::reduction_method::homomorphic));
  }
}

TEST_CASE("persistent allreduce and alltoall: a failed round throws from wait(); the next round is correct") {
  exercise(allreduce_case(large, kompress::reduction_method::recompress, form::persistent));
  exercise(alltoall_init_case(large));
}

TEST_CASE("a raw message of one value that arrives one byte short is a format_error, not an abort marker") {
  // Three bytes that name no rank of the communicator are a damaged message: the receiver fails
  // on its own (format_error), it does not blame a rank that does not exist.
  exercise(single_value_alltoall_case());
}

TEST_CASE("homomorphic reductions: a code message with a flipped byte is a format_error; no rank hangs") {
  // Code messages are checksummed: the receiver fails on its own, the others complete correctly
  // or get peer_error, and nothing beyond the bound is reported as a result.
  for (const std::size_t n : {large, small}) {
    exercise(allreduce_case(n, kompress::reduction_method::homomorphic), {isend_fault::action::flip});
    exercise(reduce_scatter_case(n, kompress::reduction_method::homomorphic), {isend_fault::action::flip});
  }
  exercise(allreduce_case(large, kompress::reduction_method::homomorphic, form::persistent),
           {isend_fault::action::flip});
}

TEST_CASE("the agreement: a send MPI rejects on one rank hangs no rank; it throws its error, its peers peer_error") {
  const int p = size_of();
  if (p < 2) return;
  const int faulty = p - 1;
  const int agreement = kompress::detail::agreement_tag;
  const auto fail = isend_fault::action::fail;
  // A header alone (a compressed call offers no payload): the abort marker goes in its place.
  run_faulty(alltoall_case(small, false), fail, faulty, 0, true, agreement);
  run_faulty(allreduce_init_run_case(small), fail, faulty, 0, true, agreement);
  // Raw blocks inside the header's message.
  run_faulty(raw_alltoall_case(100), fail, faulty, 0, true, agreement);
  // Raw blocks in a message of their own behind the header (beyond the inline room: 32 KiB on
  // two ranks, 8 KiB on three and four): the header fails, or the block behind it (which the
  // peer then receives as a marker).
  const std::size_t following = p == 2 ? 8192 : 2048;
  for (const long target : {0L, 1L}) run_faulty(raw_alltoall_case(following), fail, faulty, target, true, agreement);
  // Two ranks: a raw allreduce's whole input rides the agreement, behind the header at 32 KiB.
  // More ranks: it offers nothing, the header alone.
  run_faulty(raw_allreduce_case(8192), fail, faulty, 0, true, agreement);
  if (p == 2) run_faulty(raw_allreduce_case(8192), fail, faulty, 1, true, agreement);
  // Three and four ranks: the last header fails after the others left, each with its blocks
  // inside; the peers that received one complete the call with the right values, the last
  // peer gets the marker (docs/collectives.md, "What is not covered", for a call whose data
  // would follow the agreement).
  if (p > 2) run_faulty(raw_alltoall_case(100), fail, faulty, p - 2, false, agreement);
}

TEST_CASE("hierarchical allreduce: a failure across nodes stops every rank of every node, none hangs") {
  // Two nodes or more, so that messages cross between them.
  if (size_of() % 2 != 0 || size_of() < 4) return;
  for (const std::size_t n : {large, small}) exercise(hierarchical_allreduce_case(n));
}

TEST_CASE("hierarchical reduce_scatter and allgather: a failure across nodes stops the ranks that depend on it") {
  if (size_of() % 2 != 0 || size_of() < 4) return;
  for (const std::size_t n : {large, small}) {
    exercise(hierarchical_reduce_scatter_case(n));
    exercise(hierarchical_allgather_case(n));
  }
}

TEST_CASE("allgather and reduce_scatter: a failure mid-flight hangs no rank") {
  for (const std::size_t n : {large, small}) {
    exercise(allgather_case(n));
    exercise(reduce_scatter_case(n));
  }
}

TEST_CASE("dlrm exchange: a failure mid-flight hangs no rank; the next iteration is correct") {
  const int p = size_of();
  if (p < 2) return;
  for (const std::size_t batch : {large / 64, std::size_t(16)}) {
    std::vector<kompress::dlrm::table> tables;
    for (int t = 0; t < 2 * p; ++t) tables.push_back({t % p, 64});
    kompress::dlrm::exchange_options options;
    options.transport = test_transport;
    options.forward.bound = kompress::absolute(1e-3);
    auto exchange = std::make_shared<kompress::dlrm::embedding_exchange>(MPI_COMM_WORLD, tables, batch, options);
    matrix in("in", exchange->global_batch(), exchange->local_width());
    matrix out("out", batch, exchange->total_width());
    auto values = make_data(in.size(), rank_of());
    for (std::size_t i = 0; i < in.size(); ++i) in.data()[i] = values(i);
    // Plain MPI's answer: each owner's rows [r * batch, (r + 1) * batch) go to rank r.
    view expected("expected", out.size());
    {
      const int block = int(batch * exchange->local_width());
      std::vector<int> widths(p);
      const int mine = int(exchange->local_width());
      MPI_Allgather(&mine, 1, MPI_INT, widths.data(), 1, MPI_INT, MPI_COMM_WORLD);
      std::vector<int> rc(p), rd(p);
      for (int r = 0; r < p; ++r) rc[r] = int(batch) * widths[r];
      std::exclusive_scan(rc.begin(), rc.end(), rd.begin(), 0);
      view gathered("gathered", out.size());
      std::vector<int> sc(p, block), sd(p);
      for (int r = 0; r < p; ++r) sd[r] = r * block;
      MPI_Alltoallv(in.data(), sc.data(), sd.data(), MPI_FLOAT, gathered.data(), rc.data(), rd.data(), MPI_FLOAT,
                    MPI_COMM_WORLD);
      // gathered: per owner r, batch x widths[r]; out's columns: tables in order (owner t % p).
      std::vector<std::size_t> seen(p, 0);
      std::size_t column = 0;
      for (const auto& t : tables) {
        for (std::size_t row = 0; row < batch; ++row)
          for (std::size_t c = 0; c < t.dim; ++c)
            expected(row * exchange->total_width() + column + c) =
                gathered(std::size_t(rd[t.owner]) + row * std::size_t(widths[t.owner]) + seen[t.owner] + c);
        seen[t.owner] += t.dim;
        column += t.dim;
      }
    }
    const Kokkos::View<float*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged> got(out.data(), out.size());
    exercise({"dlrm forward of batch " + std::to_string(batch), [=] { exchange->forward(host{}, in, out); },
              [=] { return violations(got, expected, 1e-3); }});
  }
}
