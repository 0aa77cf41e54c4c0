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
// Sync points as allreduce: fence `exec`, agree (one small MPI_Allreduce, plus one for a REL
// bound), then p - 1 ring hops; the nonblocking form sends the first hop before it returns and
// advances hop by hop in test() and wait(). Raw mode (and a per-rank block too small to
// compress, and one rank) is MPI_Allgather / MPI_Iallgather itself: with one rank recv is an
// exact copy of send.

#include <kompress/comm/allreduce.hpp>

namespace kompress {
inline namespace v0 {

namespace detail {

template <class Exec, class SendView, class RecvView>
std::unique_ptr<operation> make_allgather(const Exec& exec, const SendView& send, const RecvView& recv, MPI_Comm comm,
                                          const collective_options& options, comm_workspace* workspace,
                                          bool nonblocking, const char* who) {
  using T = typename SendView::non_const_value_type;
  Kokkos::Profiling::ScopedRegion region(who);
  const comm_shape shape = enter_collective<SendView, RecvView>(exec, comm, who);
  const wire_rule rule{options.mode, options.cost};
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
  workspace_slot* const slot = agree_ring_call<T>(collective_kind::allgather, send.size(), false, options,
                                                  rule, workspace, comm, nonblocking, who, local_checks);

  const std::size_t bytes = send.size() * sizeof(T);
  if (shape.size == 1 || !rule.may_compress(bytes)) {
    auto op = std::make_unique<mpi_request_operation<SendView, RecvView>>(send, recv, who);
    const int count = int(send.size());
    if (nonblocking)
      check_mpi(MPI_Iallgather(send.data(), count, mpi_type<T>(), recv.data(), count, mpi_type<T>(), comm,
                               op->handle()),
                who, "MPI_Iallgather");
    else
      check_mpi(MPI_Allgather(send.data(), count, mpi_type<T>(), recv.data(), count, mpi_type<T>(), comm), who,
                "MPI_Allgather");
    if (shape.size > 1) {
      op->mutable_report().payload_bytes = op->mutable_report().wire_bytes = bytes * std::size_t(shape.size - 1);
      op->mutable_report().messages = std::uint64_t(shape.size - 1);
    }
    if (options.measure_error) op->mutable_report().max_error = 0.0;
    return op;
  }
  collective_options per_hop = options;
  per_hop.reduction_bound = allreduce_bound::per_hop;
  const double bound = hop_bound(exec, send, per_hop, shape, comm, who);
  compress_options codec = options.codec;
  codec.bound = absolute(bound);
  // Ring chunk rank + 1 is memory block rank (rotation -1): this rank's block.
  return std::make_unique<ring_allreduce_operation<T, Exec>>(exec, ring_geometry{shape, recv.size(), -1}, rule, codec,
                                                             bound, send.data(), recv.data(), slot, comm, nonblocking,
                                                             who, ring_schedule::allgather,
                                                             ring_extras{.homomorphic = {}, .measure_error = options.measure_error});
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

}  // namespace v0
}  // namespace kompress
