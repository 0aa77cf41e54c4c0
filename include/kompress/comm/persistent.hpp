#pragma once
// kompress::persistent_request: a collective set up once and run many times, like MPI-4's
// persistent collectives (MPI_Allreduce_init, MPI_Start, MPI_Wait). The *_init call checks
// the arguments, agrees on them across ranks and fixes the transfer (raw or compressed, the
// chunk plan) once; every start() then runs only the data collective on the values the send
// View holds at that moment. That is what removes the per-call agreement (one small
// MPI_Allreduce) from calls of 4-64 KiB, where it costs about as much as the data itself
// (docs/collectives.md, "Persistent collectives").
//
// Raw transfers (raw mode, automatic mode where the cost model says raw, one rank) run MPI's
// own collective on the caller's Views: the persistent form (MPI_Allreduce_init and its
// siblings) where the MPI library is MPI-4, else the nonblocking one (MPI_Iallreduce...) per
// start; on two ranks, up to 1 MiB, one exchange with the peer instead (persistent_pair_exchange;
// alltoall(v): the engine). Compressed transfers run kompress's engine on scratch and a
// duplicated communicator the request owns.

#include <kompress/comm/options.hpp>
#include <kompress/comm/request.hpp>
#include <kompress/comm/workspace.hpp>
#include <kompress/detail/mpi.hpp>
#include <kompress/error.hpp>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

/// Whether MPI has the persistent collectives of MPI-4 (MPI_Allreduce_init, ...). Defining
/// KOMPRESS_NO_MPI_PERSISTENT_COLLECTIVES uses the nonblocking ones instead (as with MPI-3).
#if defined(MPI_VERSION) && MPI_VERSION >= 4 && !defined(KOMPRESS_NO_MPI_PERSISTENT_COLLECTIVES)
#define KOMPRESS_MPI_PERSISTENT_COLLECTIVES 1
#else
#define KOMPRESS_MPI_PERSISTENT_COLLECTIVES 0
#endif

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

/// MPI's own collective on the caller's Views, for raw transfers. `make` posts it: with MPI-4
/// it is the *_init call, made once here; without, the nonblocking call, made at every start.
/// `blocking` is the blocking call (MPI_Allreduce, ...), for run(): MPI's blocking collectives
/// are faster than its nonblocking and persistent ones at small sizes (docs/performance.md).
template <class Exec, class SendView, class RecvView>
class persistent_mpi_collective final : public persistent_operation {
 public:
  using post = std::function<int(MPI_Request*)>;
  using call = std::function<int()>;

  persistent_mpi_collective(const Exec& exec, SendView send, RecvView recv, post make, const char* make_name,
                            call blocking, const char* blocking_name, const collective_report& report,
                            const char* who)
      : exec_(exec), send_(std::move(send)), recv_(std::move(recv)), make_(std::move(make)), call_(make_name),
        blocking_(std::move(blocking)), blocking_name_(blocking_name), report_(report), who_(who) {
#if KOMPRESS_MPI_PERSISTENT_COLLECTIVES
    check_mpi(make_(&handle_), who_, call_);
#endif
  }
  persistent_mpi_collective(const persistent_mpi_collective&) = delete;
  persistent_mpi_collective& operator=(const persistent_mpi_collective&) = delete;
  ~persistent_mpi_collective() override {
    if (active_) MPI_Wait(&handle_, MPI_STATUS_IGNORE);
    if (handle_ != MPI_REQUEST_NULL) MPI_Request_free(&handle_);
  }

  void start() override {
    exec_.fence("kompress: before MPI reads a user View");
#if KOMPRESS_MPI_PERSISTENT_COLLECTIVES
    check_mpi(MPI_Start(&handle_), who_, "MPI_Start");
#else
    check_mpi(make_(&handle_), who_, call_);
#endif
    active_ = true;
  }
  void run() override {
    exec_.fence("kompress: before MPI reads a user View");
    check_mpi(blocking_(), who_, blocking_name_);
  }
  bool progress(bool block) override {
    if (!active_) return true;
    int done = 1;
    if (block) check_mpi(MPI_Wait(&handle_, MPI_STATUS_IGNORE), who_, "MPI_Wait");
    else check_mpi(MPI_Test(&handle_, &done, MPI_STATUS_IGNORE), who_, "MPI_Test");
    active_ = done == 0;
    return !active_;
  }
  const collective_report& report() const override { return report_; }

 private:
  Exec exec_;
  SendView send_;  // held: MPI reads and writes them at every start
  RecvView recv_;
  post make_;
  const char* call_;
  call blocking_;
  const char* blocking_name_;
  collective_report report_;
  const char* who_;
  MPI_Request handle_ = MPI_REQUEST_NULL;
  bool active_ = false;
};

/// out = own + other, n values: a sum on two ranks from the peer's values (the same bits on both
/// ranks: IEEE addition commutes, and it is MPI's own result there). `out` may be `own`. On the
/// calling thread: these messages are small (at most max_carried_bytes), and a parallel region
/// would cost more than the add at the sizes they exist for.
template <class T>
void add_pair(T* out, const T* own, const T* other, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = own[i] + other[i];
}

/// A raw round on two ranks as one exchange with the peer, what the one-shot calls do inside
/// the agreement's message (docs/collectives.md, "Two ranks"): each rank sends `count` values
/// to the peer and receives the peer's `count` into `arrival`; then, for the sums, `out` =
/// `own` + arrival (the same bits on both ranks: IEEE addition commutes, and it is MPI's own
/// result on two ranks), or for allgather `own` is copied to `out` while the messages travel.
/// MPI's persistent requests (MPI_Send_init, MPI_Recv_init) on a duplicated communicator of the
/// request's own, so the caller's messages never meet them. MPICH's two-rank collectives took
/// 1.0-4.4x longer at every size measured; Open MPI's blocking allreduce beat the exchange at
/// 4-8 KiB (docs/performance.md), so run() times both once, at init, and keeps the faster.
template <class Exec, class SendView, class RecvView>
class persistent_pair_exchange final : public persistent_operation {
 public:
  using T = typename SendView::non_const_value_type;
  struct plan {
    const T* to_peer = nullptr;  ///< `count` values sent to the peer
    T* arrival = nullptr;        ///< where the peer's `count` values land
    const T* own = nullptr;      ///< this rank's part of the result's inputs
    T* out = nullptr;            ///< out = own + arrival (sums), out = own (allgather)
    std::size_t count = 0;
    bool sums = false;
  };

  using call = std::function<int()>;
  /// `blocking`: MPI's blocking collective on the request's Views, for run() where it is the
  /// faster; `blocking_on_scratch`: the same call on scratch of the same sizes, timed at init.
  persistent_pair_exchange(const Exec& exec, SendView send, RecvView recv, MPI_Comm comm, const plan& how,
                           std::shared_ptr<T[]> scratch, call blocking, const char* blocking_name,
                           const call& blocking_on_scratch, const collective_report& report, const char* who)
      : exec_(exec), send_(std::move(send)), recv_(std::move(recv)), comm_(comm, who), plan_(how),
        scratch_(std::move(scratch)), blocking_(std::move(blocking)), blocking_name_(blocking_name), report_(report),
        who_(who) {
    if (plan_.count == 0) return;
    const int peer = 1 - shape_of(comm_.get(), who).rank;
    run_blocking_ = blocking_wins(peer, blocking_on_scratch);  // first: nothing of ours to free if it throws
    const int bytes = int(plan_.count * sizeof(T));  // checked to fit at init
    check_mpi(MPI_Recv_init(plan_.arrival, bytes, MPI_BYTE, peer, collective_tag, comm_.get(), &requests_[0]), who,
              "MPI_Recv_init");
    check_mpi(MPI_Send_init(plan_.to_peer, bytes, MPI_BYTE, peer, collective_tag, comm_.get(), &requests_[1]), who,
              "MPI_Send_init");
  }
  persistent_pair_exchange(const persistent_pair_exchange&) = delete;
  persistent_pair_exchange& operator=(const persistent_pair_exchange&) = delete;
  ~persistent_pair_exchange() override {
    // A round is still active here only after a failed MPI call (persistent_request completes
    // it first): its receive is cancelled and completed, so nothing lands in freed scratch.
    if (active_ && requests_[0] != MPI_REQUEST_NULL) {
      MPI_Cancel(&requests_[0]);
      MPI_Wait(&requests_[0], MPI_STATUS_IGNORE);
    }
    for (MPI_Request& r : requests_)
      if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
  }

  void start() override {
    exec_.fence("kompress: before MPI or the host reads a user View");
    if (plan_.count > 0) check_mpi(MPI_Startall(2, requests_), who_, "MPI_Startall");
    active_ = true;
    if (!plan_.sums && plan_.count > 0) std::memcpy(plan_.out, plan_.own, plan_.count * sizeof(T));
  }
  bool progress(bool block) override {
    if (!active_) return true;
    if (plan_.count > 0) {
      int done = 1;
      if (block) check_mpi(MPI_Waitall(2, requests_, MPI_STATUSES_IGNORE), who_, "MPI_Waitall");
      else check_mpi(MPI_Testall(2, requests_, &done, MPI_STATUSES_IGNORE), who_, "MPI_Testall");
      if (!done) return false;
      if (plan_.sums) add_pair(plan_.out, plan_.own, plan_.arrival, plan_.count);
    }
    active_ = false;
    return true;
  }
  void run() override {
    if (!run_blocking_) {
      start();
      progress(true);
      return;
    }
    exec_.fence("kompress: before MPI reads a user View");
    check_mpi(blocking_(), who_, blocking_name_);
  }
  const collective_report& report() const override { return report_; }

 private:
  /// Whether MPI's blocking collective beats the exchange: both timed on scratch in batches of
  /// back-to-back calls (a single call of a few microseconds would time the other rank's
  /// arrival), alternating, after untimed batches (a process's first exchanges ran 2-5x slower,
  /// for longer than its first collectives), the best batch of each. The slower rank's times
  /// decide, so both ranks choose alike (MPI_Allreduce of the two times). A cold start errs
  /// towards MPI's collective: run() then costs what plain MPI's call does.
  bool blocking_wins(int peer, const call& blocking_on_scratch) {
    constexpr int untimed = 3, batches = 5;
    const std::size_t bytes = plan_.count * sizeof(T);
    const int calls = int(std::clamp<std::size_t>((std::size_t(256) << 10) / std::max<std::size_t>(bytes, 1), 2, 32));
    std::vector<T> out(plan_.count), in(plan_.count, T(1)), arrival(plan_.count);
    const auto exchange = [&] {
      MPI_Request r[2];
      check_mpi(MPI_Irecv(arrival.data(), int(bytes), MPI_BYTE, peer, collective_tag, comm_.get(), &r[0]), who_,
                "MPI_Irecv");
      check_mpi(MPI_Isend(in.data(), int(bytes), MPI_BYTE, peer, collective_tag, comm_.get(), &r[1]), who_,
                "MPI_Isend");
      check_mpi(MPI_Waitall(2, r, MPI_STATUSES_IGNORE), who_, "MPI_Waitall");
      add_pair(out.data(), in.data(), arrival.data(), plan_.count);  // the sums' add, or the copy's
    };
    const auto mpi_round = [&] { check_mpi(blocking_on_scratch(), who_, blocking_name_); };
    const auto batch = [&](const auto& round) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < calls; ++i) round();
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    double best[2] = {1e30, 1e30};  // exchange, MPI's collective
    for (int b = 0; b < untimed + batches; ++b) {
      const double t[2] = {batch(exchange), batch(mpi_round)};
      if (b < untimed) continue;
      best[0] = std::min(best[0], t[0]);
      best[1] = std::min(best[1], t[1]);
    }
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, best, 2, MPI_DOUBLE, MPI_MAX, comm_.get()), who_, "MPI_Allreduce");
    return best[1] < best[0];
  }

  Exec exec_;
  SendView send_;  // held: every round reads and writes them
  RecvView recv_;
  owned_comm comm_;
  plan plan_;
  std::shared_ptr<T[]> scratch_;  // the peer's values for the sums
  call blocking_;
  const char* blocking_name_;
  collective_report report_;
  const char* who_;
  MPI_Request requests_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};  // receive, send
  bool active_ = false;
  bool run_blocking_ = false;  ///< run() calls MPI's blocking collective (timed faster at init)
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
