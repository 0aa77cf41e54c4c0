#pragma once
// MPI's own collectives, described once each: what a raw call runs where kompress has nothing
// to compress and MPI reads the Views. A description (mpi_allreduce, mpi_allgather, ...) holds
// the call's buffers, counts and communicator, and knows its blocking, nonblocking and
// persistent (MPI-4 *_init) forms; start_mpi_collective and persistent_mpi_collective build a
// kompress operation from any of them.

#include <kompress/comm/options.hpp>
#include <kompress/comm/persistent.hpp>
#include <kompress/comm/request.hpp>
#include <kompress/detail/mpi.hpp>

#include <mpi.h>

#include <memory>
#include <utility>
#include <vector>

/// Whether MPI has the persistent collectives of MPI-4 (MPI_Allreduce_init, ...). Defining
/// KOMPRESS_NO_MPI_PERSISTENT_COLLECTIVES uses the nonblocking ones instead (as with MPI-3).
#if defined(MPI_VERSION) && MPI_VERSION >= 4 && !defined(KOMPRESS_NO_MPI_PERSISTENT_COLLECTIVES)
#define KOMPRESS_MPI_PERSISTENT_COLLECTIVES 1
#else
#define KOMPRESS_MPI_PERSISTENT_COLLECTIVES 0
#endif

namespace kompress::inline v0::detail {

/// MPI_Allreduce with MPI_SUM; `in` may be MPI_IN_PLACE.
template <class T>
struct mpi_allreduce {
  const void* in;
  T* out;
  int count;
  MPI_Comm comm;
  static constexpr const char* names[3] = {"MPI_Allreduce", "MPI_Iallreduce", "MPI_Allreduce_init"};
  int blocking() const { return MPI_Allreduce(in, out, count, mpi_type<T>(), MPI_SUM, comm); }
  int nonblocking(MPI_Request* r) const { return MPI_Iallreduce(in, out, count, mpi_type<T>(), MPI_SUM, comm, r); }
  int init(MPI_Request* r) const;
  mpi_allreduce on(const T* other_in, T* other_out) const { return {other_in, other_out, count, comm}; }
};

/// MPI_Allgather of `count` values per rank.
template <class T>
struct mpi_allgather {
  const T* in;
  T* out;
  int count;
  MPI_Comm comm;
  static constexpr const char* names[3] = {"MPI_Allgather", "MPI_Iallgather", "MPI_Allgather_init"};
  int blocking() const { return MPI_Allgather(in, count, mpi_type<T>(), out, count, mpi_type<T>(), comm); }
  int nonblocking(MPI_Request* r) const {
    return MPI_Iallgather(in, count, mpi_type<T>(), out, count, mpi_type<T>(), comm, r);
  }
  int init(MPI_Request* r) const;
  mpi_allgather on(const T* other_in, T* other_out) const { return {other_in, other_out, count, comm}; }
};

/// MPI_Reduce_scatter_block with MPI_SUM, `count` values per rank.
template <class T>
struct mpi_reduce_scatter {
  const T* in;
  T* out;
  int count;
  MPI_Comm comm;
  static constexpr const char* names[3] = {"MPI_Reduce_scatter_block", "MPI_Ireduce_scatter_block",
                                           "MPI_Reduce_scatter_block_init"};
  int blocking() const { return MPI_Reduce_scatter_block(in, out, count, mpi_type<T>(), MPI_SUM, comm); }
  int nonblocking(MPI_Request* r) const {
    return MPI_Ireduce_scatter_block(in, out, count, mpi_type<T>(), MPI_SUM, comm, r);
  }
  int init(MPI_Request* r) const;
  mpi_reduce_scatter on(const T* other_in, T* other_out) const { return {other_in, other_out, count, comm}; }
};

/// MPI_Alltoall of `count` values per peer.
template <class T>
struct mpi_alltoall {
  const T* in;
  T* out;
  int count;
  MPI_Comm comm;
  static constexpr const char* names[3] = {"MPI_Alltoall", "MPI_Ialltoall", "MPI_Alltoall_init"};
  int blocking() const { return MPI_Alltoall(in, count, mpi_type<T>(), out, count, mpi_type<T>(), comm); }
  int nonblocking(MPI_Request* r) const {
    return MPI_Ialltoall(in, count, mpi_type<T>(), out, count, mpi_type<T>(), comm, r);
  }
  int init(MPI_Request* r) const;
};

/// MPI's int counts and displacements of an alltoallv, checked to fit before the agreement.
struct mpi_layout {
  std::vector<int> send_counts, send_displs, recv_counts, recv_displs;
};

/// MPI_Alltoallv. The layout is shared: MPI reads it at every start of a persistent request.
template <class T>
struct mpi_alltoallv {
  const T* in;
  T* out;
  std::shared_ptr<const mpi_layout> layout;
  MPI_Comm comm;
  static constexpr const char* names[3] = {"MPI_Alltoallv", "MPI_Ialltoallv", "MPI_Alltoallv_init"};
  int blocking() const {
    const mpi_layout& l = *layout;
    return MPI_Alltoallv(in, l.send_counts.data(), l.send_displs.data(), mpi_type<T>(), out, l.recv_counts.data(),
                         l.recv_displs.data(), mpi_type<T>(), comm);
  }
  int nonblocking(MPI_Request* r) const {
    const mpi_layout& l = *layout;
    return MPI_Ialltoallv(in, l.send_counts.data(), l.send_displs.data(), mpi_type<T>(), out, l.recv_counts.data(),
                          l.recv_displs.data(), mpi_type<T>(), comm, r);
  }
  int init(MPI_Request* r) const;
};

#if KOMPRESS_MPI_PERSISTENT_COLLECTIVES
template <class T>
int mpi_allreduce<T>::init(MPI_Request* r) const {
  return MPI_Allreduce_init(in, out, count, mpi_type<T>(), MPI_SUM, comm, MPI_INFO_NULL, r);
}
template <class T>
int mpi_allgather<T>::init(MPI_Request* r) const {
  return MPI_Allgather_init(in, count, mpi_type<T>(), out, count, mpi_type<T>(), comm, MPI_INFO_NULL, r);
}
template <class T>
int mpi_reduce_scatter<T>::init(MPI_Request* r) const {
  return MPI_Reduce_scatter_block_init(in, out, count, mpi_type<T>(), MPI_SUM, comm, MPI_INFO_NULL, r);
}
template <class T>
int mpi_alltoall<T>::init(MPI_Request* r) const {
  return MPI_Alltoall_init(in, count, mpi_type<T>(), out, count, mpi_type<T>(), comm, MPI_INFO_NULL, r);
}
template <class T>
int mpi_alltoallv<T>::init(MPI_Request* r) const {
  const mpi_layout& l = *layout;
  return MPI_Alltoallv_init(in, l.send_counts.data(), l.send_displs.data(), mpi_type<T>(), out, l.recv_counts.data(),
                            l.recv_displs.data(), mpi_type<T>(), comm, MPI_INFO_NULL, r);
}
#endif

/// A raw one-shot call as a kompress operation: MPI's collective on the caller's Views,
/// blocking or nonblocking, the request keeping the Views alive. Its handle stays
/// MPI_REQUEST_NULL (complete) where nothing is left to do: a call whose data moved with the
/// agreement (comm/detail/small_calls.hpp).
template <class SendView, class RecvView>
class mpi_request_operation final : public operation {
 public:
  mpi_request_operation(SendView send, RecvView recv, const collective_report& report, const char* who)
      : send_(std::move(send)), recv_(std::move(recv)), report_(report), who_(who) {}
  ~mpi_request_operation() override {
    if (request_ != MPI_REQUEST_NULL) MPI_Wait(&request_, MPI_STATUS_IGNORE);
  }
  MPI_Request* handle() { return &request_; }
  bool progress(bool block) override {
    if (block) {
      check_mpi(MPI_Wait(&request_, MPI_STATUS_IGNORE), who_, "MPI_Wait");
      return true;
    }
    int done = 0;
    check_mpi(MPI_Test(&request_, &done, MPI_STATUS_IGNORE), who_, "MPI_Test");
    return done != 0;
  }
  const collective_report& report() const override { return report_; }

 private:
  SendView send_;
  RecvView recv_;
  collective_report report_;
  const char* who_;
  MPI_Request request_ = MPI_REQUEST_NULL;
};

/// A call that is already done (its data moved with the agreement): an operation with nothing
/// left to wait for.
template <class SendView, class RecvView>
std::unique_ptr<operation> completed_call(const SendView& send, const RecvView& recv,
                                          const collective_report& report, const char* who) {
  return std::make_unique<mpi_request_operation<SendView, RecvView>>(send, recv, report, who);
}

/// MPI's collective `call` on the Views, blocking or nonblocking, as a kompress operation.
template <class Call, class SendView, class RecvView>
std::unique_ptr<operation> start_mpi_collective(const Call& call, const SendView& send, const RecvView& recv,
                                                bool nonblocking, const collective_report& report, const char* who) {
  auto op = std::make_unique<mpi_request_operation<SendView, RecvView>>(send, recv, report, who);
  if (nonblocking) check_mpi(call.nonblocking(op->handle()), who, Call::names[1]);
  else check_mpi(call.blocking(), who, Call::names[0]);
  return op;
}

/// MPI's own collective on the caller's Views, for raw transfers: with MPI-4 its persistent
/// form, made once here and started every round; without, its nonblocking form, made at every
/// start. run() is the blocking call: MPI's blocking collectives are faster than its
/// nonblocking and persistent ones at small sizes (docs/performance.md).
template <class Exec, class SendView, class RecvView, class Call>
class persistent_mpi_collective final : public persistent_operation {
 public:
  persistent_mpi_collective(const Exec& exec, SendView send, RecvView recv, const Call& call,
                            const collective_report& report, const char* who)
      : exec_(exec), send_(std::move(send)), recv_(std::move(recv)), call_(call), report_(report), who_(who) {
#if KOMPRESS_MPI_PERSISTENT_COLLECTIVES
    check_mpi(call_.init(&handle_), who_, Call::names[2]);
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
    check_mpi(call_.nonblocking(&handle_), who_, Call::names[1]);
#endif
    active_ = true;
  }
  void run() override {
    exec_.fence("kompress: before MPI reads a user View");
    check_mpi(call_.blocking(), who_, Call::names[0]);
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
  Call call_;
  collective_report report_;
  const char* who_;
  MPI_Request handle_ = MPI_REQUEST_NULL;
  bool active_ = false;
};

}  // namespace kompress::inline v0::detail
