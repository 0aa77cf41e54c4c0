#pragma once
// kompress::persistent_request: a collective set up once and run many times, like MPI-4's
// persistent collectives (MPI_Allreduce_init, MPI_Start, MPI_Wait). The *_init call checks
// the arguments, agrees on them across ranks and fixes the transfer (raw or compressed, the
// chunk plan) once; every start() then runs only the data collective on the values the send
// View holds at that moment. That is what removes the per-call agreement (one small
// MPI_Allreduce) from calls of 4-64 KiB, where it costs about as much as the data itself
// (docs/collectives.md, "Persistent collectives").
//
// Raw transfers (raw mode, automatic mode where MPI's round timed faster, one rank) run MPI's
// own collective on the caller's Views: the persistent form (MPI_Allreduce_init and its
// siblings) where the MPI library is MPI-4, else the nonblocking one (MPI_Iallreduce...) per
// start; on two ranks, up to 1 MiB, one exchange with the peer instead (persistent_pair_exchange;
// alltoall(v): the engine). Compressed transfers run kompress's engine on scratch and a
// duplicated communicator the request owns. Automatic mode times a few rounds of each at init
// and keeps the faster (faster_of below): a round measured, not the cost model's estimate.

#include <kompress/comm/options.hpp>
#include <kompress/comm/request.hpp>
#include <kompress/comm/workspace.hpp>
#include <kompress/detail/mpi.hpp>
#include <kompress/error.hpp>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace kompress {
inline namespace v0 {

namespace detail {

/// A persistent collective: start() begins one round, progress() advances it.
class persistent_operation {
 public:
  virtual ~persistent_operation() = default;
  /// Begins a round (the previous one completed). May throw; then no round is active.
  virtual void start() = 0;
  /// Advances the active round; blocks until done if `block`. True when done. If it throws,
  /// the round is over (its messages completed: docs/collectives.md, "Failure after the
  /// agreement") and none is active.
  virtual bool progress(bool block) = 0;
  virtual const collective_report& report() const = 0;
  /// A whole round, blocking: start() and progress(true) unless there is a faster blocking form.
  virtual void run() {
    start();
    progress(true);
  }
};

/// kompress's engine, one operation per round on scratch and a duplicated communicator of the
/// request's own. `launch(slot)` builds a round's operation (which posts its receives and
/// sends its first messages); it holds the Views.
template <class Exec>
class persistent_engine_collective final : public persistent_operation {
 public:
  using launcher = std::function<std::unique_ptr<operation>(workspace_slot&)>;

  persistent_engine_collective(const Exec& exec, MPI_Comm comm, launcher launch, const char* who)
      : exec_(exec), launch_(std::move(launch)), who_(who) {
    slot_.owned = owned_comm(comm, who);
    slot_.comm = slot_.owned.get();
  }
  ~persistent_engine_collective() override { round_.reset(); }  // before the slot it uses

  void start() override {
    exec_.fence("kompress: before MPI or the host reads a user View");
    round_.reset();
    round_ = launch_(slot_);
    active_ = true;
  }
  bool progress(bool block) override {
    if (!active_) return true;
    try {
      active_ = !round_->progress(block);
    } catch (...) {
      active_ = false;
      round_.reset();  // its messages completed before it threw (cancelled only if MPI failed)
      throw;
    }
    return !active_;
  }
  const collective_report& report() const override { return round_ ? round_->report() : empty_; }

 private:
  Exec exec_;
  launcher launch_;
  const char* who_;
  workspace_slot slot_;
  std::unique_ptr<operation> round_;  // after the slot: destroyed first
  collective_report empty_;
  bool active_ = false;
};

/// Whether automatic mode's init may time its two ways of running a round (MPI's own collective
/// on the Views, kompress's compressed engine) instead of trusting the cost model: where MPI
/// reads the Views (not staged) and on more than one rank. Agreed on every rank.
inline bool times_automatic_choice(const collective_options& options, const transport& how, comm_shape shape) {
  return options.mode == transfer_mode::automatic && !how.staged && shape.size > 1;
}

/// ... and whether a round is worth timing: at least a message's worth of bytes in
/// `largest_send_bytes`, the largest send buffer of any rank, so that every rank decides alike
/// (below the model's min_message_bytes latency decides, and MPI's call is kept).
inline bool worth_timing(const collective_options& options, std::uint64_t largest_send_bytes) {
  return largest_send_bytes > 0 && largest_send_bytes >= options.cost.min_message_bytes;
}

/// Automatic mode's choice for a persistent collective, by measurement: each candidate runs one
/// untimed round (scratch first touched, MPI's first messages), then up to eight timed pairs of
/// rounds, alternating, each after a barrier, while they take under half a second in all. The
/// slowest rank's time of each round decides (one MPI_Allreduce per pair, so every rank sees
/// the same times, stops after the same pair and keeps the same candidate): `compressed` where
/// its best round beat `raw`'s by 5%, else `raw`. The best of several, because a compressed
/// round's time varies by tens of percent from one to the next (docs/scale.md, "Automatic mode
/// set up once"). Collective over `comm`; the rounds read the send View and write the result,
/// as start() would. The cost model misjudges where MPI's own algorithm is far from the link's
/// rate (an alltoall through a congested tree) or latency dominates: a round measured is what
/// the loop will pay (docs/collectives.md, "Persistent collectives").
inline std::unique_ptr<persistent_operation> faster_of(std::unique_ptr<persistent_operation> raw,
                                                       std::unique_ptr<persistent_operation> compressed,
                                                       MPI_Comm comm, const char* who) {
  // Each round starts together on every rank, so that its time is the round's own and not the
  // ranks' skew from the round before.
  const auto round = [&](persistent_operation& op) {
    check_mpi(MPI_Barrier(comm), who, "MPI_Barrier");
    const double start = MPI_Wtime();  // simulated time under a simulator (SMPI), as MPI's are
    op.run();
    return MPI_Wtime() - start;
  };
  round(*raw);
  round(*compressed);
  double best[2] = {1e300, 1e300}, spent = 0.0;  // raw, compressed
  for (int pair = 0; pair < 8 && spent < 0.5; ++pair) {
    double t[2] = {round(*raw), round(*compressed)};
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, t, 2, MPI_DOUBLE, MPI_MAX, comm), who, "MPI_Allreduce");
    best[0] = std::min(best[0], t[0]);
    best[1] = std::min(best[1], t[1]);
    spent += t[0] + t[1];
  }
  constexpr double margin = 1.05;  // noise between rounds; a tie keeps MPI's call
  return best[1] * margin < best[0] ? std::move(compressed) : std::move(raw);
}

}  // namespace detail


/// A persistent collective (alltoall_init, alltoallv_init, allreduce_init, allgather_init,
/// reduce_scatter_init). start() runs one round on what the send View holds now; wait() (or
/// test() until true) completes it, the result then in the receive View. Then start() again.
/// Move-only. Rules, as for MPI's persistent requests:
/// - start() on an active request (started, not yet completed) is an invalid_argument;
/// - wait() or test() on a request never started is an invalid_argument; once a round
///   completed, they return at once (the last round's report);
/// - every rank starts its persistent requests in the same order (they are collectives);
/// - destroying (or assigning to) an active request waits for its round first; it holds the
///   Views, its scratch and its duplicated communicator until it goes (destroying it is
///   collective where it holds a communicator, like MPI_Comm_free).
/// Nothing is re-checked at start(): the Views' extents, the mode, the bound and the counts are
/// those agreed at init. The values are read at every start; a REL bound resolves against
/// each round's values (for the ring collectives with one small MPI_Allreduce per round).
class persistent_request {
 public:
  persistent_request() = default;
  explicit persistent_request(std::unique_ptr<detail::persistent_operation> op) : op_(std::move(op)) {}
  persistent_request(persistent_request&& other) noexcept
      : op_(std::move(other.op_)), active_(std::exchange(other.active_, false)),
        started_(std::exchange(other.started_, false)) {}
  persistent_request& operator=(persistent_request&& other) noexcept {
    if (this != &other) {
      finish_quietly();
      op_ = std::move(other.op_);
      active_ = std::exchange(other.active_, false);
      started_ = std::exchange(other.started_, false);
    }
    return *this;
  }
  persistent_request(const persistent_request&) = delete;
  persistent_request& operator=(const persistent_request&) = delete;
  ~persistent_request() { finish_quietly(); }

  /// Begins a round: fences the execution space, then posts the data collective (raw: MPI's
  /// own; compressed: every receive, and the messages it can encode at once).
  void start() {
    require("start");
    if (active_)
      throw invalid_argument(
          "kompress::persistent_request::start: the request is active (started and not yet completed); "
          "wait() for it before starting it again");
    op_->start();
    active_ = started_ = true;
  }

  /// A whole round in one blocking call: start() and wait(), except that a raw transfer is
  /// MPI's blocking collective (MPI_Allreduce, ...), exactly what plain MPI calls, where
  /// start() and wait() use MPI's persistent form (slower at small sizes on MPICH); on two
  /// ranks the faster of that and the exchange with the peer, as timed at init. Blocking
  /// collective semantics: every rank must reach it, as for MPI_Allreduce.
  const collective_report& run() {
    require("run");
    if (active_)
      throw invalid_argument(
          "kompress::persistent_request::run: the request is active (started and not yet completed); "
          "wait() for it first");
    started_ = true;
    op_->run();
    return op_->report();
  }

  /// Completes the round: the receive View holds the result when it returns.
  const collective_report& wait() {
    require_started("wait");
    if (active_) {
      active_ = false;  // a round that throws is abandoned
      active_ = !op_->progress(true);
    }
    return op_->report();
  }

  /// Advances without blocking; true once the round's result is in place.
  bool test() {
    require_started("test");
    if (active_) {
      active_ = false;
      active_ = !op_->progress(false);
    }
    return !active_;
  }

  bool valid() const { return op_ != nullptr; }
  /// Started and not yet completed.
  bool active() const { return active_; }

  /// The last round's report (complete once it completed).
  const collective_report& report() const {
    if (!op_) throw invalid_argument("kompress::persistent_request::report: empty request");
    return op_->report();
  }

 private:
  void require(const char* what) const {
    if (!op_)
      throw invalid_argument(std::string("kompress::persistent_request::") + what +
                             ": empty request (default-constructed or moved from)");
  }
  void require_started(const char* what) const {
    require(what);
    if (!started_)
      throw invalid_argument(std::string("kompress::persistent_request::") + what +
                             ": the request was never started; call start() first");
  }
  void finish_quietly() noexcept {
    if (op_ && active_) {
      try {
        op_->progress(true);
      } catch (...) {
        // A destructor must not throw; callers who care call wait().
      }
    }
    active_ = false;
  }

  std::unique_ptr<detail::persistent_operation> op_;
  bool active_ = false;
  bool started_ = false;
};

}  // namespace v0
}  // namespace kompress
