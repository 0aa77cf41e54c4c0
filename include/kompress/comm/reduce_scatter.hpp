#pragma once
// kompress::reduce_scatter (sum): MPI_Reduce_scatter_block on Views, compressed on the wire.
// send holds p blocks of n = recv.size() values; rank r receives the sum over ranks of block r.
// It is allreduce's reduce-scatter phase alone, on the ring or by recursive halving
// (collective_options::schedule, docs/collectives.md): the sum of block r is built from p - 1
// compressed partial sums, so it goes through p - 1 compressions (recursive halving where p is no
// power of two: p, a folded rank's block compressed once more to reach it). With
// allreduce_bound::per_hop each is within the bound e and the result within (p - 1) * e (p * e)
// of the exact sum; with allreduce_bound::total each gets e / (p - 1) (e / p) and the result is
// within e.
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
// ring hops or log2 p halving steps; the nonblocking form sends the first before it returns and
// advances step by step in test() and wait(). Raw mode (and a block too small to compress, and
// one rank) is MPI_Reduce_scatter_block / MPI_Ireduce_scatter_block itself (on two ranks up
// to 1 MiB rides the agreement's one message each way instead): with one rank recv is an exact
// copy of send.

#include <kompress/comm/detail/halving_doubling.hpp>
#include <kompress/comm/detail/ring_collective.hpp>
#include <kompress/comm/persistent.hpp>
#include <kompress/detail/arguments.hpp>

#include <bit>

namespace kompress {
inline namespace v0 {

namespace detail {

/// reduce_scatter as the ring collectives' shell runs it (comm/detail/ring_collective.hpp).
template <class Exec, class SendView, class RecvView>
struct reduce_scatter_call : ring_call<Exec, SendView, RecvView> {
  using base = ring_call<Exec, SendView, RecvView>;
  using typename base::value_type;
  using base::exec, base::send, base::recv, base::options, base::who;
  static constexpr collective_kind kind = collective_kind::reduce_scatter;
  static constexpr bool sums = true;

  std::size_t count() const { return recv.size(); }

  void check(comm_shape shape) const {
    this->check_options_and_views(true, "the receive View");
    if (send.size() != recv.size() * std::size_t(shape.size))
      throw invalid_argument(std::string(who) + ": the send View has " + std::to_string(send.size()) +
                             " elements; expected " + std::to_string(shape.size) + " ranks times the receive View's " +
                             std::to_string(recv.size()) + " = " + std::to_string(recv.size() * shape.size));
    require_disjoint(send, recv, who, "the send and receive Views");
    byte_count(send.size() * sizeof(value_type), who);  // MPI's int counts
  }

  /// MPI_Reduce_scatter_block itself for raw mode, one rank, and where the schedule would
  /// compress none of its messages, judged by its largest (the ring's block; recursive
  /// halving's n/2, or the fold's n).
  bool sends_raw(const agreed_ring& agreed) const {
    return this->sum_sends_raw(agreed, recv.size() * sizeof(value_type), butterfly_collective::reduce_scatter);
  }
  /// Whether the compressing schedule is recursive halving rather than the ring.
  bool butterfly(const agreed_ring& agreed) const {
    return this->sums_by_halving(agreed, butterfly_collective::reduce_scatter);
  }
  small_call<value_type> small_call_of(const agreed_ring& agreed) const {
    return reduce_scatter_small_call(send.data(), recv.data(), recv.size(), agreed.shape, agreed.how,
                                     sends_raw(agreed));
  }
  collective_report raw_report(comm_shape shape) const {
    const auto peers = std::size_t(shape.size - 1);
    return detail::raw_report(recv.size() * sizeof(value_type) * peers, peers, options);
  }
  mpi_reduce_scatter<value_type> mpi(MPI_Comm comm) const {
    return {send.data(), recv.data(), int(recv.size()), comm};
  }

  /// The compressing schedule, the ring or recursive halving (by the cost model, or as
  /// options.schedule says); a REL bound resolves against all ranks' values now. Recompress:
  /// p - 1 compressions per block (recursive halving where p is no power of two: p, a folded
  /// rank's block compressed once more to reach it), `total` splits the bound among them.
  /// Homomorphic (the ring): p quantizations (one per rank, the owner's too), `total` splits it
  /// p ways.
  std::unique_ptr<operation> ring(const agreed_ring& agreed, workspace_slot* slot, MPI_Comm comm,
                                  bool nonblocking) const {
    const comm_shape shape = agreed.shape;
    const double e = ring_bound(exec, send.data(), send.size(), options, comm, who);
    const bool halving = butterfly(agreed);
    const bool folds = halving && !std::has_single_bit(unsigned(shape.size));
    const int terms =
        options.reduction == reduction_method::homomorphic || folds ? shape.size : shape.size - 1;
    const double hop = options.reduction_bound == allreduce_bound::total ? e / terms : e;
    compress_options codec = options.codec;
    codec.bound = absolute(hop);
    if (halving)
      return std::make_unique<halving_doubling_operation<value_type, Exec>>(
          exec, butterfly_geometry{shape, send.size(), butterfly_collective::reduce_scatter}, agreed.rule, codec,
          hop * terms, send.data(), recv.data(), slot, comm, nonblocking, agreed.how, options.measure_error, who);
    // The phase leaves ring chunk rank + 1 reduced on this rank; rotation -1 makes it block rank.
    return std::make_unique<ring_allreduce_operation<value_type, Exec>>(
        exec, ring_geometry{shape, send.size(), -1}, agreed.rule, codec, hop * terms, send.data(), recv.data(), slot,
        comm, nonblocking, agreed.how, who, ring_schedule::reduce_scatter, ring_extras_for(options, hop, shape));
  }
};

}  // namespace detail


/// MPI_Reduce_scatter_block with MPI_SUM: `send` holds p blocks of recv.size() values; `recv`
/// gets the sum over ranks of block `rank`. `workspace` (optional, built on `comm`) removes the
/// per-call allocation.
template <execution_space Exec, float_view SendView, float_view RecvView>
collective_report reduce_scatter(const Exec& exec, const SendView& send, const RecvView& recv, MPI_Comm comm,
                                 const collective_options& options = {}, comm_workspace* workspace = nullptr) {
  const detail::reduce_scatter_call<Exec, SendView, RecvView> call{{exec, send, recv, options,
                                                                   "kompress::reduce_scatter"}};
  return detail::complete(detail::start_ring_collective(call, comm, workspace, false));
}

/// Nonblocking reduce_scatter; wait() on the request delivers `recv`.
template <execution_space Exec, float_view SendView, float_view RecvView>
request ireduce_scatter(const Exec& exec, const SendView& send, const RecvView& recv, MPI_Comm comm,
                        const collective_options& options = {}, comm_workspace* workspace = nullptr) {
  const detail::reduce_scatter_call<Exec, SendView, RecvView> call{{exec, send, recv, options,
                                                                   "kompress::ireduce_scatter"}};
  return request(detail::start_ring_collective(call, comm, workspace, true));
}

/// Persistent reduce_scatter (MPI_Reduce_scatter_block_init with MPI_SUM): checks and agrees
/// once, then every start() sums block `rank` of what every rank's `send` holds into `recv`;
/// see kompress::persistent_request.
template <execution_space Exec, float_view SendView, float_view RecvView>
persistent_request reduce_scatter_init(const Exec& exec, const SendView& send, const RecvView& recv, MPI_Comm comm,
                                       const collective_options& options = {}) {
  const detail::reduce_scatter_call<Exec, SendView, RecvView> call{{exec, send, recv, options,
                                                                   "kompress::reduce_scatter_init"}};
  return persistent_request(detail::init_ring_collective(call, comm));
}

}  // namespace v0
}  // namespace kompress
