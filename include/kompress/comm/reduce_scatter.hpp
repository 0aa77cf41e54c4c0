#pragma once
// kompress::reduce_scatter (sum): MPI_Reduce_scatter_block on Views, compressed on the wire.
// send holds p blocks of n = recv.size() values; rank r receives the sum over ranks of block r.
// It is allreduce's reduce-scatter phase alone: block r travels p - 1 hops, each carrying a
// compressed partial sum, so it goes through p - 1 compressions. With allreduce_bound::per_hop
// each is within the bound e and the result within (p - 1) * e of the exact sum; with
// allreduce_bound::total each gets e / (p - 1) and the result is within e.
// collective_report::absolute_bound reports that number. Floating-point summation error comes
// on top, as it does for MPI's own sum in a different order. A REL bound resolves against the
// value range of all ranks' send Views, agreed with one small MPI_Allreduce.
// reduction_method::homomorphic: every rank (the owner too) quantizes once and the hops add
// integer codes: p quantizations, within p * e (total: e / p each, within e).
//
// Every rank must pass the same count, mode and bound: a mismatch (or a bad argument on any
// rank) is an invalid_argument on every rank before any data moves (docs/collectives.md).
// send and recv must not overlap (there is no in-place form).
//
// Sync points as allreduce: fence `exec`, agree (one small MPI_Allreduce or, on two to four
// ranks, one message between every pair; plus one MPI_Allreduce for a REL bound), then p - 1
// ring hops; the nonblocking form sends the first hop before it returns and advances hop by hop
// in test() and wait(). Raw mode (and a block too small to compress, and
// one rank) is MPI_Reduce_scatter_block / MPI_Ireduce_scatter_block itself (on two ranks up
// to 1 MiB rides the agreement's one message each way instead): with one rank recv is an exact
// copy of send.

#include <kompress/comm/allreduce.hpp>

namespace kompress {
inline namespace v0 {

namespace detail {

/// MPI_Reduce_scatter_block itself for raw mode, a block too small to compress, and one rank.
inline bool reduce_scatter_sends_raw(const agreed_ring& agreed, std::size_t block_bytes) {
  return !agreed.how.staged && (agreed.shape.size == 1 || !agreed.rule.may_compress(block_bytes));
}

/// reduce_scatter's prologue: fence, check locally, agree.
template <class Exec, class SendView, class RecvView>
agreed_ring agree_reduce_scatter(const Exec& exec, const SendView& send, const RecvView& recv, MPI_Comm comm,
                                 const collective_options& options, comm_workspace* workspace, bool nonblocking,
                                 bool persistent, const char* who) {
  using T = typename SendView::non_const_value_type;
  agreed_ring agreed = enter_ring_collective<SendView, RecvView>(exec, comm, options, who);
  const comm_shape shape = agreed.shape;
  const auto local_checks = [&] {
    validate_options(options.codec, who);
    if (options.codec.fill_value)
      throw invalid_argument(std::string(who) + ": a fill value has no meaning for a sum; leave codec.fill_value empty");
    require_contiguous(send, who, "the send View");
    require_contiguous(recv, who, "the receive View");
    if (send.size() != recv.size() * std::size_t(shape.size))
      throw invalid_argument(std::string(who) + ": the send View has " + std::to_string(send.size()) +
                             " elements; expected " + std::to_string(shape.size) + " ranks times the receive View's " +
                             std::to_string(recv.size()) + " = " + std::to_string(recv.size() * shape.size));
    require_disjoint(send, recv, who, "the send and receive Views");
    byte_count(send.size() * sizeof(T), who);  // MPI's int counts
  };
  // On two ranks a raw call of at most max_carried_bytes per block sends the peer's block with
  // the agreement; the peer's part of this rank's block lands in recv, and the sum is one add.
  const std::size_t block_bytes = recv.size() * sizeof(T);
  carried_payload carry;
  if (ring_carries(agreed, reduce_scatter_sends_raw(agreed, block_bytes), persistent, block_bytes) &&
      send.size() == 2 * recv.size())
    carry = {true, send.data() + std::size_t(1 - shape.rank) * recv.size(), block_bytes, recv.data(), block_bytes,
             nullptr, nullptr, 0};
  agree_ring_call<T>(agreed, collective_kind::reduce_scatter, recv.size(), true, options, workspace, comm, nonblocking,
                     who, local_checks, persistent, carry);
  return agreed;
}

inline collective_report raw_reduce_scatter_report(const agreed_ring& agreed, std::size_t block_bytes,
                                                   const collective_options& options) {
  collective_report report;
  if (agreed.shape.size > 1) {
    report.payload_bytes = report.wire_bytes = block_bytes * std::size_t(agreed.shape.size - 1);
    report.messages = std::uint64_t(agreed.shape.size - 1);
  }
  if (options.measure_error) report.max_error = 0.0;
  return report;
}

/// The compressing ring, once agreed; a REL bound resolves against all ranks' values now.
template <class Exec, class SendView, class RecvView>
std::unique_ptr<operation> launch_reduce_scatter_ring(const Exec& exec, const SendView& send, const RecvView& recv,
                                                      const agreed_ring& agreed, workspace_slot* slot,
                                                      const collective_options& options, MPI_Comm comm,
                                                      bool nonblocking, const char* who) {
  using T = typename SendView::non_const_value_type;
  const comm_shape shape = agreed.shape;
  // Recompress: p - 1 compressions per block, `total` splits the bound among them.
  // Homomorphic: p quantizations (one per rank, the owner's too), `total` splits it p ways.
  collective_options per_hop = options;
  per_hop.reduction_bound = allreduce_bound::per_hop;
  const double e = hop_bound(exec, send, per_hop, shape, comm, who);
  const int terms = options.reduction == reduction_method::homomorphic ? shape.size : shape.size - 1;
  const double hop = options.reduction_bound == allreduce_bound::total ? e / terms : e;
  compress_options codec = options.codec;
  codec.bound = absolute(hop);
  const ring_extras extras = ring_extras_for(options, hop, shape);
  // The phase leaves ring chunk rank + 1 reduced on this rank; rotation -1 makes it block rank.
  return std::make_unique<ring_allreduce_operation<T, Exec>>(
      exec, ring_geometry{shape, send.size(), -1}, agreed.rule, codec, hop * terms, send.data(), recv.data(), slot, comm,
      nonblocking, agreed.how, who, ring_schedule::reduce_scatter, extras);
}

template <class Exec, class SendView, class RecvView>
std::unique_ptr<operation> make_reduce_scatter(const Exec& exec, const SendView& send, const RecvView& recv,
                                               MPI_Comm comm, const collective_options& options,
                                               comm_workspace* workspace, bool nonblocking, const char* who) {
  using T = typename SendView::non_const_value_type;
  Kokkos::Profiling::ScopedRegion region(who);
  const agreed_ring agreed = agree_reduce_scatter(exec, send, recv, comm, options, workspace, nonblocking, false, who);
  const std::size_t bytes = recv.size() * sizeof(T);
  if (!reduce_scatter_sends_raw(agreed, bytes))
    return launch_reduce_scatter_ring(exec, send, recv, agreed, agreed.slot, options, comm, nonblocking, who);
  auto op = std::make_unique<mpi_request_operation<SendView, RecvView>>(send, recv, who);
  op->mutable_report() = raw_reduce_scatter_report(agreed, bytes, options);
  if (agreed.carried) {
    add_pair(recv.data(), recv.data(), send.data() + std::size_t(agreed.shape.rank) * recv.size(), recv.size());
    return op;
  }
  const int count = int(recv.size());
  if (nonblocking)
    check_mpi(MPI_Ireduce_scatter_block(send.data(), recv.data(), count, mpi_type<T>(), MPI_SUM, comm, op->handle()),
              who, "MPI_Ireduce_scatter_block");
  else
    check_mpi(MPI_Reduce_scatter_block(send.data(), recv.data(), count, mpi_type<T>(), MPI_SUM, comm), who,
              "MPI_Reduce_scatter_block");
  return op;
}

/// reduce_scatter_init: agreed once; raw rounds are MPI's persistent reduce-scatter (on two
/// ranks one exchange and an add), compressed ones the ring on the request's own scratch and
/// communicator.
template <class Exec, class SendView, class RecvView>
std::unique_ptr<persistent_operation> init_reduce_scatter(const Exec& exec, const SendView& send,
                                                          const RecvView& recv, MPI_Comm comm,
                                                          const collective_options& options, const char* who) {
  using T = typename SendView::non_const_value_type;
  Kokkos::Profiling::ScopedRegion region(who);
  const agreed_ring agreed = agree_reduce_scatter(exec, send, recv, comm, options, nullptr, true, true, who);
  const std::size_t bytes = recv.size() * sizeof(T);
  if (!reduce_scatter_sends_raw(agreed, bytes))
    return std::make_unique<persistent_engine_collective<Exec>>(
        exec, comm,
        [=](workspace_slot& slot) {
          return launch_reduce_scatter_ring(exec, send, recv, agreed, &slot, options, slot.comm, true, who);
        },
        who);
  const T* const in = send.data();
  T* const out = recv.data();
  const int count = int(recv.size());
  if (pair_rounds(agreed, bytes)) {
    using pair = persistent_pair_exchange<Exec, SendView, RecvView>;
    const std::size_t n = recv.size();
    const int me = agreed.shape.rank;
    auto scratch = std::make_shared_for_overwrite<T[]>(n);
    const typename pair::plan how{send.data() + std::size_t(1 - me) * n, scratch.get(),
                                  send.data() + std::size_t(me) * n, recv.data(), n, true};
    std::vector<T> a(send.size(), T(1)), b(n);
    return std::make_unique<pair>(
        exec, send, recv, comm, how, std::move(scratch),
        [=] { return MPI_Reduce_scatter_block(in, out, count, mpi_type<T>(), MPI_SUM, comm); },
        "MPI_Reduce_scatter_block",
        [&] { return MPI_Reduce_scatter_block(a.data(), b.data(), count, mpi_type<T>(), MPI_SUM, comm); },
        raw_reduce_scatter_report(agreed, bytes, options), who);
  }
  return std::make_unique<persistent_mpi_collective<Exec, SendView, RecvView>>(
      exec, send, recv,
      [=](MPI_Request* r) {
#if KOMPRESS_MPI_PERSISTENT_COLLECTIVES
        return MPI_Reduce_scatter_block_init(in, out, count, mpi_type<T>(), MPI_SUM, comm, MPI_INFO_NULL, r);
#else
        return MPI_Ireduce_scatter_block(in, out, count, mpi_type<T>(), MPI_SUM, comm, r);
#endif
      },
      KOMPRESS_MPI_PERSISTENT_COLLECTIVES ? "MPI_Reduce_scatter_block_init" : "MPI_Ireduce_scatter_block",
      [=] { return MPI_Reduce_scatter_block(in, out, count, mpi_type<T>(), MPI_SUM, comm); }, "MPI_Reduce_scatter_block",
      raw_reduce_scatter_report(agreed, bytes, options), who);
}

}  // namespace detail


/// MPI_Reduce_scatter_block with MPI_SUM: `send` holds p blocks of recv.size() values; `recv`
/// gets the sum over ranks of block `rank`. `workspace` (optional, built on `comm`) removes the
/// per-call allocation.
template <execution_space Exec, float_view SendView, float_view RecvView>
collective_report reduce_scatter(const Exec& exec, const SendView& send, const RecvView& recv, MPI_Comm comm,
                                 const collective_options& options = {}, comm_workspace* workspace = nullptr) {
  return detail::complete(
      detail::make_reduce_scatter(exec, send, recv, comm, options, workspace, false, "kompress::reduce_scatter"));
}

/// Nonblocking reduce_scatter; wait() on the request delivers `recv`.
template <execution_space Exec, float_view SendView, float_view RecvView>
request ireduce_scatter(const Exec& exec, const SendView& send, const RecvView& recv, MPI_Comm comm,
                        const collective_options& options = {}, comm_workspace* workspace = nullptr) {
  return request(
      detail::make_reduce_scatter(exec, send, recv, comm, options, workspace, true, "kompress::ireduce_scatter"));
}

/// Persistent reduce_scatter (MPI_Reduce_scatter_block_init with MPI_SUM): checks and agrees
/// once, then every start() sums block `rank` of what every rank's `send` holds into `recv`;
/// see kompress::persistent_request.
template <execution_space Exec, float_view SendView, float_view RecvView>
persistent_request reduce_scatter_init(const Exec& exec, const SendView& send, const RecvView& recv, MPI_Comm comm,
                                       const collective_options& options = {}) {
  return persistent_request(
      detail::init_reduce_scatter(exec, send, recv, comm, options, "kompress::reduce_scatter_init"));
}

}  // namespace v0
}  // namespace kompress
