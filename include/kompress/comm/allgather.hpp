#pragma once
// kompress::allgather: MPI_Allgather on Views, compressed on the wire. Each rank contributes
// send.size() values; recv (p times that) holds every rank's block in rank order. A rank's
// block is compressed once, by its owner, and those bytes travel the ring unchanged, so every
// rank decodes the same bytes and ends bit-identical -- the owner included: recv's own block
// holds the decoded values, not a copy of send. Every value is within the bound of the exact
// contribution (a REL bound resolves against the value range of all ranks' send Views, agreed
// with one small MPI_Allreduce; reduction_bound plays no part).
//
// Every rank must pass the same count, mode and bound: a mismatch (or a bad argument on any
// rank) is an invalid_argument on every rank before any data moves (docs/collectives.md).
// send and recv must not overlap (there is no in-place form).
//
// Sync points as allreduce: fence `exec`, agree (one small MPI_Allreduce, on two to four ranks
// one message between every pair; plus one MPI_Allreduce for a REL bound), then p - 1 ring
// hops; the nonblocking form sends the first hop before it returns and
// advances hop by hop in test() and wait(). Raw mode (and a per-rank block too small to
// compress, and one rank) is MPI_Allgather / MPI_Iallgather itself (on two ranks up to 1 MiB,
// on three and four up to 16 KiB per rank, rides the agreement's messages instead): with one
// rank recv is an exact copy of send.

#include <kompress/comm/allreduce.hpp>

namespace kompress {
inline namespace v0 {

namespace detail {

/// MPI_Allgather itself for raw mode, a per-rank block too small to compress, and one rank.
inline bool allgather_sends_raw(const agreed_ring& agreed, std::size_t bytes) {
  return !agreed.how.staged && (agreed.shape.size == 1 || !agreed.rule.may_compress(bytes));
}

/// allgather's prologue: fence, check locally, agree.
template <class Exec, class SendView, class RecvView>
agreed_ring agree_allgather(const Exec& exec, const SendView& send, const RecvView& recv, MPI_Comm comm,
                            const collective_options& options, comm_workspace* workspace, bool nonblocking,
                            bool persistent, const char* who) {
  using T = typename SendView::non_const_value_type;
  agreed_ring agreed = enter_ring_collective<SendView, RecvView>(exec, comm, options, who);
  const comm_shape shape = agreed.shape;
  const auto local_checks = [&] {
    validate_options(options.codec, who);
    require_contiguous(send, who, "the send View");
    require_contiguous(recv, who, "the receive View");
    if (recv.size() != send.size() * std::size_t(shape.size))
      throw invalid_argument(std::string(who) + ": the receive View has " + std::to_string(recv.size()) +
                             " elements; expected " + std::to_string(shape.size) + " ranks times the send View's " +
                             std::to_string(send.size()) + " = " + std::to_string(send.size() * shape.size));
    require_disjoint(send, recv, who, "the send and receive Views");
    byte_count(recv.size() * sizeof(T), who);  // MPI's int counts
  };
  // On up to max_pairwise_ranks ranks a small raw call sends its block to every peer with the
  // agreement, and theirs land in place.
  const std::size_t bytes = send.size() * sizeof(T);
  carried_payload carry;
  if (pairwise_carries(agreed, allgather_sends_raw(agreed, bytes), persistent, bytes) &&
      recv.size() == std::size_t(shape.size) * send.size())
    carry = {true, send.data(), bytes, recv.data(), bytes, send.data(),
             recv.data() + std::size_t(shape.rank) * send.size(), bytes, 0, bytes};
  agree_ring_call<T>(agreed, collective_kind::allgather, send.size(), false, options, workspace, comm, nonblocking, who,
                     local_checks, persistent, carry);
  return agreed;
}

inline collective_report raw_allgather_report(const agreed_ring& agreed, std::size_t bytes,
                                              const collective_options& options) {
  collective_report report;
  if (agreed.shape.size > 1) {
    report.payload_bytes = report.wire_bytes = bytes * std::size_t(agreed.shape.size - 1);
    report.messages = std::uint64_t(agreed.shape.size - 1);
  }
  if (options.measure_error) report.max_error = 0.0;
  return report;
}

/// The compressing ring, once agreed; a REL bound resolves against all ranks' values now.
template <class Exec, class SendView, class RecvView>
std::unique_ptr<operation> launch_allgather_ring(const Exec& exec, const SendView& send, const RecvView& recv,
                                                 const agreed_ring& agreed, workspace_slot* slot,
                                                 const collective_options& options, MPI_Comm comm, bool nonblocking,
                                                 const char* who) {
  using T = typename SendView::non_const_value_type;
  collective_options per_hop = options;
  per_hop.reduction_bound = allreduce_bound::per_hop;
  const double bound = hop_bound(exec, send, per_hop, agreed.shape, comm, who);
  compress_options codec = options.codec;
  codec.bound = absolute(bound);
  // Ring chunk rank + 1 is memory block rank (rotation -1): this rank's block.
  return std::make_unique<ring_allreduce_operation<T, Exec>>(
      exec, ring_geometry{agreed.shape, recv.size(), -1}, agreed.rule, codec, bound, send.data(), recv.data(), slot,
      comm, nonblocking, agreed.how, who, ring_schedule::allgather,
      ring_extras{.homomorphic = {}, .measure_error = options.measure_error});
}

template <class Exec, class SendView, class RecvView>
std::unique_ptr<operation> make_allgather(const Exec& exec, const SendView& send, const RecvView& recv, MPI_Comm comm,
                                          const collective_options& options, comm_workspace* workspace,
                                          bool nonblocking, const char* who) {
  using T = typename SendView::non_const_value_type;
  Kokkos::Profiling::ScopedRegion region(who);
  const agreed_ring agreed = agree_allgather(exec, send, recv, comm, options, workspace, nonblocking, false, who);
  const std::size_t bytes = send.size() * sizeof(T);
  if (!allgather_sends_raw(agreed, bytes))
    return launch_allgather_ring(exec, send, recv, agreed, agreed.slot, options, comm, nonblocking, who);
  auto op = std::make_unique<mpi_request_operation<SendView, RecvView>>(send, recv, who);
  op->mutable_report() = raw_allgather_report(agreed, bytes, options);
  if (agreed.carried) return op;  // both blocks are in place
  const int count = int(send.size());
  if (nonblocking)
    check_mpi(MPI_Iallgather(send.data(), count, mpi_type<T>(), recv.data(), count, mpi_type<T>(), comm,
                             op->handle()),
              who, "MPI_Iallgather");
  else
    check_mpi(MPI_Allgather(send.data(), count, mpi_type<T>(), recv.data(), count, mpi_type<T>(), comm), who,
              "MPI_Allgather");
  return op;
}

/// allgather_init: agreed once; raw rounds are MPI's persistent allgather (on two ranks one
/// exchange), compressed ones the ring on the request's own scratch and communicator.
template <class Exec, class SendView, class RecvView>
std::unique_ptr<persistent_operation> init_allgather(const Exec& exec, const SendView& send, const RecvView& recv,
                                                     MPI_Comm comm, const collective_options& options,
                                                     const char* who) {
  using T = typename SendView::non_const_value_type;
  Kokkos::Profiling::ScopedRegion region(who);
  const agreed_ring agreed = agree_allgather(exec, send, recv, comm, options, nullptr, true, true, who);
  const std::size_t bytes = send.size() * sizeof(T);
  if (!allgather_sends_raw(agreed, bytes))
    return std::make_unique<persistent_engine_collective<Exec>>(
        exec, comm,
        [=](workspace_slot& slot) {
          return launch_allgather_ring(exec, send, recv, agreed, &slot, options, slot.comm, true, who);
        },
        who);
  const T* const in = send.data();
  T* const out = recv.data();
  const int count = int(send.size());
  if (pair_rounds(agreed, bytes)) {
    using pair = persistent_pair_exchange<Exec, SendView, RecvView>;
    const int me = agreed.shape.rank;
    const typename pair::plan how{send.data(), recv.data() + std::size_t(1 - me) * send.size(), send.data(),
                                  recv.data() + std::size_t(me) * send.size(), send.size(), false};
    std::vector<T> a(send.size(), T(1)), b(recv.size());
    return std::make_unique<pair>(
        exec, send, recv, comm, how, nullptr,
        [=] { return MPI_Allgather(in, count, mpi_type<T>(), out, count, mpi_type<T>(), comm); }, "MPI_Allgather",
        [&] { return MPI_Allgather(a.data(), count, mpi_type<T>(), b.data(), count, mpi_type<T>(), comm); },
        raw_allgather_report(agreed, bytes, options), who);
  }
  return std::make_unique<persistent_mpi_collective<Exec, SendView, RecvView>>(
      exec, send, recv,
      [=](MPI_Request* r) {
#if KOMPRESS_MPI_PERSISTENT_COLLECTIVES
        return MPI_Allgather_init(in, count, mpi_type<T>(), out, count, mpi_type<T>(), comm, MPI_INFO_NULL, r);
#else
        return MPI_Iallgather(in, count, mpi_type<T>(), out, count, mpi_type<T>(), comm, r);
#endif
      },
      KOMPRESS_MPI_PERSISTENT_COLLECTIVES ? "MPI_Allgather_init" : "MPI_Iallgather",
      [=] { return MPI_Allgather(in, count, mpi_type<T>(), out, count, mpi_type<T>(), comm); }, "MPI_Allgather",
      raw_allgather_report(agreed, bytes, options), who);
}

}  // namespace detail


/// MPI_Allgather: every rank's `send` into block `rank` of `recv` (p * send.size() values),
/// bit-identical on every rank. `workspace` (optional, built on `comm`) removes the per-call
/// allocation.
template <execution_space Exec, float_view SendView, float_view RecvView>
collective_report allgather(const Exec& exec, const SendView& send, const RecvView& recv, MPI_Comm comm,
                            const collective_options& options = {}, comm_workspace* workspace = nullptr) {
  return detail::complete(detail::make_allgather(exec, send, recv, comm, options, workspace, false, "kompress::allgather"));
}

/// Nonblocking allgather; wait() on the request delivers `recv`.
template <execution_space Exec, float_view SendView, float_view RecvView>
request iallgather(const Exec& exec, const SendView& send, const RecvView& recv, MPI_Comm comm,
                   const collective_options& options = {}, comm_workspace* workspace = nullptr) {
  return request(detail::make_allgather(exec, send, recv, comm, options, workspace, true, "kompress::iallgather"));
}

/// Persistent allgather (MPI_Allgather_init): checks and agrees once, then every start()
/// gathers what each rank's `send` holds into `recv`; see kompress::persistent_request.
template <execution_space Exec, float_view SendView, float_view RecvView>
persistent_request allgather_init(const Exec& exec, const SendView& send, const RecvView& recv, MPI_Comm comm,
                                  const collective_options& options = {}) {
  return persistent_request(detail::init_allgather(exec, send, recv, comm, options, "kompress::allgather_init"));
}

}  // namespace v0
}  // namespace kompress
