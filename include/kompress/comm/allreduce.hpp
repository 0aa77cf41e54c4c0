#pragma once
// kompress::allreduce (sum): MPI_Allreduce on Views, compressed on the wire, every rank ending
// bit-identical. With allreduce_bound::per_hop each compression is within the bound and the
// result within p times it of the exact sum; with allreduce_bound::total the result is within
// the bound (docs/collectives.md; floating-point summation error comes on top, as it does for
// MPI's own sum in a different order). A REL bound resolves against the value range of all
// ranks' inputs, agreed with one small MPI_Allreduce. With reduction_method::homomorphic every
// rank quantizes once on one power-of-two grid and the hops add integer codes: the result is
// within p times the per-rank bound, exactly for double (docs/collectives.md, "Homomorphic
// reduction").
//
// Every rank must pass the same count, mode, reduction method and bound: a mismatch (or a bad argument on any
// rank) is an invalid_argument on every rank before any data moves (docs/collectives.md).
//
// Sync points: every call first fences `exec` (the input may be the output of work on it),
// then agrees on the arguments with one small MPI_Allreduce (on two to four ranks one message
// between every pair instead; a REL bound adds one MPI_Allreduce for the global value range),
// both blocking, nonblocking forms too. The blocking form returns with
// the result in `recv`; the nonblocking form compresses the first hop before it returns and
// advances hop by hop in test() and wait(); each hop's codec work waits for `exec`. Raw mode
// is MPI_Allreduce / MPI_Iallreduce itself, but on two ranks, where up to 1 MiB rides the
// agreement's one message each way and the sum is one add. With one rank the result is the
// input.

#include <kompress/comm/detail/halving_doubling.hpp>
#include <kompress/comm/detail/ring_collective.hpp>
#include <kompress/comm/persistent.hpp>
#include <kompress/detail/arguments.hpp>


namespace kompress {
inline namespace v0 {

namespace detail {

/// allreduce as the ring collectives' shell runs it (comm/detail/ring_collective.hpp).
template <class Exec, class SendView, class RecvView>
struct allreduce_call : ring_call<Exec, SendView, RecvView> {
  using base = ring_call<Exec, SendView, RecvView>;
  using typename base::value_type;
  using base::exec, base::send, base::recv, base::options, base::who;
  static constexpr collective_kind kind = collective_kind::allreduce;
  static constexpr bool sums = true;

  std::size_t count() const { return send.size(); }
  bool in_place() const { return static_cast<const void*>(send.data()) == static_cast<const void*>(recv.data()); }

  void check(comm_shape) const {
    this->check_options_and_views(true, "the result View");
    if (send.size() != recv.size())
      throw invalid_argument(std::string(who) + ": the send View has " + std::to_string(send.size()) +
                             " elements, the result View " + std::to_string(recv.size()) + "; they must match");
    if (!in_place())
      require_disjoint(send, recv, who, "the send and result Views (pass the same View twice for in place)");
    byte_count(send.size() * sizeof(value_type), who);  // MPI's int counts
  }

  /// Exactly MPI_Allreduce (with one rank: the input itself) where the schedule would compress
  /// none of its messages, judged by its largest (the ring's n/p; halving and doubling's n/2, or
  /// the fold's n), and MPI reads the Views (staged Views always take the schedule).
  bool sends_raw(const agreed_ring& agreed) const {
    const std::size_t ring_message = send.size() * sizeof(value_type) / std::size_t(agreed.shape.size);
    return this->sum_sends_raw(agreed, ring_message, butterfly_collective::allreduce);
  }
  /// Whether the compressing schedule is recursive halving and doubling.
  bool butterfly(const agreed_ring& agreed) const {
    return this->sums_by_halving(agreed, butterfly_collective::allreduce);
  }
  small_call<value_type> small_call_of(const agreed_ring& agreed) const {
    return allreduce_small_call(send.data(), recv.data(), send.size(), agreed.shape, agreed.how, sends_raw(agreed));
  }
  collective_report raw_report(comm_shape shape) const {
    return detail::raw_report(shape.size > 1 ? send.size() * sizeof(value_type) : 0, 0, options);
  }
  mpi_allreduce<value_type> mpi(MPI_Comm comm) const {
    return {in_place() ? MPI_IN_PLACE : static_cast<const void*>(send.data()), recv.data(), int(send.size()), comm};
  }

  /// The compressing schedule, the ring or recursive halving and doubling (by the cost model,
  /// or as options.schedule says); a REL bound resolves against all ranks' values now.
  /// Recompress: the bound of each of the p compressions on an element's path (either
  /// schedule). Homomorphic (the ring): the bound of each rank's one quantization (p of them
  /// add up), the same grid on every rank.
  std::unique_ptr<operation> ring(const agreed_ring& agreed, workspace_slot* slot, MPI_Comm comm,
                                  bool nonblocking) const {
    const comm_shape shape = agreed.shape;
    const double e = ring_bound(exec, send.data(), send.size(), options, comm, who);
    const double hop = options.reduction_bound == allreduce_bound::total ? e / shape.size : e;
    compress_options codec = options.codec;
    codec.bound = absolute(hop);
    if (butterfly(agreed))
      return std::make_unique<halving_doubling_operation<value_type, Exec>>(
          exec, butterfly_geometry{shape, send.size()}, agreed.rule, codec, hop * shape.size, send.data(), recv.data(),
          slot, comm, nonblocking, agreed.how, options.measure_error, who);
    return std::make_unique<ring_allreduce_operation<value_type, Exec>>(
        exec, ring_geometry{shape, send.size()}, agreed.rule, codec, hop * shape.size, send.data(), recv.data(), slot,
        comm, nonblocking, agreed.how, who, ring_schedule::allreduce, ring_extras_for(options, hop, shape));
  }
};

}  // namespace detail


/// Sum of `send` over all ranks into `recv` (pass the same View twice for in place).
/// `workspace` (optional, built on `comm`) removes the per-call allocation.
template <execution_space Exec, float_view SendView, float_view RecvView>
collective_report allreduce(const Exec& exec, const SendView& send, const RecvView& recv, MPI_Comm comm,
                            const collective_options& options = {}, comm_workspace* workspace = nullptr) {
  const detail::allreduce_call<Exec, SendView, RecvView> call{{exec, send, recv, options, "kompress::allreduce"}};
  return detail::complete(detail::start_ring_collective(call, comm, workspace, false));
}

/// In place: `data` holds the sum on return.
template <execution_space Exec, float_view View>
collective_report allreduce(const Exec& exec, const View& data, MPI_Comm comm, const collective_options& options = {},
                            comm_workspace* workspace = nullptr) {
  return allreduce(exec, data, data, comm, options, workspace);
}

/// Nonblocking allreduce; wait() on the request delivers `recv`.
template <execution_space Exec, float_view SendView, float_view RecvView>
request iallreduce(const Exec& exec, const SendView& send, const RecvView& recv, MPI_Comm comm,
                   const collective_options& options = {}, comm_workspace* workspace = nullptr) {
  const detail::allreduce_call<Exec, SendView, RecvView> call{{exec, send, recv, options, "kompress::iallreduce"}};
  return request(detail::start_ring_collective(call, comm, workspace, true));
}

/// Persistent allreduce (MPI_Allreduce_init): checks and agrees once (collective, bad arguments
/// on any rank an invalid_argument on every rank), then every start() sums what `send` holds
/// into `recv` (the same View twice for in place); see kompress::persistent_request.
template <execution_space Exec, float_view SendView, float_view RecvView>
persistent_request allreduce_init(const Exec& exec, const SendView& send, const RecvView& recv, MPI_Comm comm,
                                  const collective_options& options = {}) {
  const detail::allreduce_call<Exec, SendView, RecvView> call{{exec, send, recv, options, "kompress::allreduce_init"}};
  return persistent_request(detail::init_ring_collective(call, comm));
}

}  // namespace v0
}  // namespace kompress
