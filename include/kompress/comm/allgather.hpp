#pragma once
// kompress::allgather: MPI_Allgather on Views, compressed on the wire. Each rank contributes
// send.size() values; recv (p times that) holds every rank's block in rank order. A rank's
// block is compressed once, by its owner, and those bytes travel unchanged (around the ring, or
// by recursive doubling: collective_options::schedule, docs/collectives.md), so every
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
// hops or log2 p doubling steps; the nonblocking form sends the first before it returns and
// advances step by step in test() and wait(). Raw mode (and a per-rank block too small to
// compress, and one rank) is MPI_Allgather / MPI_Iallgather itself (on two ranks up to 1 MiB,
// on three and four up to 16 KiB per rank, rides the agreement's messages instead): with one
// rank recv is an exact copy of send.

#include <kompress/comm/detail/halving_doubling.hpp>
#include <kompress/comm/detail/ring_collective.hpp>
#include <kompress/comm/persistent.hpp>
#include <kompress/detail/arguments.hpp>

#include <algorithm>

namespace kompress {
inline namespace v0 {

namespace detail {

/// allgather as the ring collectives' shell runs it (comm/detail/ring_collective.hpp).
template <class Exec, class SendView, class RecvView>
struct allgather_call : ring_call<Exec, SendView, RecvView> {
  using base = ring_call<Exec, SendView, RecvView>;
  using typename base::value_type;
  using base::exec, base::send, base::recv, base::options, base::who;
  static constexpr collective_kind kind = collective_kind::allgather;
  static constexpr bool sums = false;

  std::size_t count() const { return send.size(); }

  void check(comm_shape shape) const {
    this->check_options_and_views(false, "the receive View");
    if (recv.size() != send.size() * std::size_t(shape.size))
      throw invalid_argument(std::string(who) + ": the receive View has " + std::to_string(recv.size()) +
                             " elements; expected " + std::to_string(shape.size) + " ranks times the send View's " +
                             std::to_string(send.size()) + " = " + std::to_string(send.size() * shape.size));
    require_disjoint(send, recv, who, "the send and receive Views");
    byte_count(recv.size() * sizeof(value_type), who);  // MPI's int counts
  }

  /// MPI_Allgather itself for raw mode, a per-rank block too small to compress, and one rank
  /// (either schedule compresses each rank's block alone).
  bool sends_raw(const agreed_ring& agreed) const {
    return this->raw_for(agreed, block_bytes(), gather_rule(agreed));
  }
  std::uint64_t block_bytes() const { return send.size() * sizeof(value_type); }
  /// The wire rule the blocks travel by. Automatic mode decides for the whole call: a block is
  /// compressed once, by its owner, and its stream then reaches the p - 1 other ranks, so
  /// where the model says that pays (cost_model::worth_compressing_forwarded) every block is
  /// compressed, even where compressing one message for one link alone would not pay.
  wire_rule gather_rule(const agreed_ring& agreed) const {
    wire_rule rule = agreed.rule;
    const auto others = std::uint64_t(std::max(agreed.shape.size - 1, 0));
    if (rule.mode == transfer_mode::automatic && rule.cost.worth_compressing_forwarded(block_bytes(), others))
      rule.mode = transfer_mode::compressed;
    return rule;
  }
  /// Whether the compressing schedule is recursive doubling rather than the ring.
  bool butterfly(const agreed_ring& agreed) const {
    return takes_halving_doubling(options.schedule, gather_rule(agreed), recv.size() * sizeof(value_type),
                                  agreed.shape.size, butterfly_collective::allgather);
  }
  small_call<value_type> small_call_of(const agreed_ring& agreed) const {
    return allgather_small_call(send.data(), recv.data(), send.size(), agreed.shape, agreed.how, sends_raw(agreed));
  }
  collective_report raw_report(comm_shape shape) const {
    const auto peers = std::size_t(shape.size - 1);
    return detail::raw_report(send.size() * sizeof(value_type) * peers, peers, options);
  }
  mpi_allgather<value_type> mpi(MPI_Comm comm) const { return {send.data(), recv.data(), int(send.size()), comm}; }

  /// The compressing schedule, the ring or recursive doubling (by the cost model, or as
  /// options.schedule says); a REL bound resolves against all ranks' values now. Each block is
  /// compressed once, by its owner: the bound is the per-hop one, reduction_bound plays no part.
  std::unique_ptr<operation> ring(const agreed_ring& agreed, workspace_slot* slot, MPI_Comm comm,
                                  bool nonblocking) const {
    const double bound = ring_bound(exec, send.data(), send.size(), options, comm, who);
    compress_options codec = options.codec;
    codec.bound = absolute(bound);
    const wire_rule rule = gather_rule(agreed);
    if (butterfly(agreed))
      return std::make_unique<halving_doubling_operation<value_type, Exec>>(
          exec, butterfly_geometry{agreed.shape, recv.size(), butterfly_collective::allgather}, rule, codec, bound,
          send.data(), recv.data(), slot, comm, nonblocking, agreed.how, options.measure_error, who);
    // Ring chunk rank + 1 is memory block rank (rotation -1): this rank's block.
    return std::make_unique<ring_allreduce_operation<value_type, Exec>>(
        exec, ring_geometry{agreed.shape, recv.size(), -1}, rule, codec, bound, send.data(), recv.data(), slot,
        comm, nonblocking, agreed.how, who, ring_schedule::allgather,
        ring_extras{.homomorphic = {}, .measure_error = options.measure_error});
  }
};

}  // namespace detail


/// MPI_Allgather: every rank's `send` into block `rank` of `recv` (p * send.size() values),
/// bit-identical on every rank. `workspace` (optional, built on `comm`) removes the per-call
/// allocation.
template <execution_space Exec, float_view SendView, float_view RecvView>
collective_report allgather(const Exec& exec, const SendView& send, const RecvView& recv, MPI_Comm comm,
                            const collective_options& options = {}, comm_workspace* workspace = nullptr) {
  const detail::allgather_call<Exec, SendView, RecvView> call{{exec, send, recv, options, "kompress::allgather"}};
  return detail::complete(detail::start_ring_collective(call, comm, workspace, false));
}

/// Nonblocking allgather; wait() on the request delivers `recv`.
template <execution_space Exec, float_view SendView, float_view RecvView>
request iallgather(const Exec& exec, const SendView& send, const RecvView& recv, MPI_Comm comm,
                   const collective_options& options = {}, comm_workspace* workspace = nullptr) {
  const detail::allgather_call<Exec, SendView, RecvView> call{{exec, send, recv, options, "kompress::iallgather"}};
  return request(detail::start_ring_collective(call, comm, workspace, true));
}

/// Persistent allgather (MPI_Allgather_init): checks and agrees once, then every start()
/// gathers what each rank's `send` holds into `recv`; see kompress::persistent_request.
template <execution_space Exec, float_view SendView, float_view RecvView>
persistent_request allgather_init(const Exec& exec, const SendView& send, const RecvView& recv, MPI_Comm comm,
                                  const collective_options& options = {}) {
  const detail::allgather_call<Exec, SendView, RecvView> call{{exec, send, recv, options, "kompress::allgather_init"}};
  return persistent_request(detail::init_ring_collective(call, comm));
}

}  // namespace v0
}  // namespace kompress
