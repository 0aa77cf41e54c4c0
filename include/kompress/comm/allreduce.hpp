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

#include <kompress/comm/detail/mpi_operation.hpp>
#include <kompress/comm/persistent.hpp>
#include <kompress/comm/ring_allreduce.hpp>
#include <kompress/detail/arguments.hpp>
#include <kompress/kernels/range_pass.hpp>

namespace kompress {
inline namespace v0 {

namespace detail {

template <class T, class SendView, class RecvView>
void check_allreduce_views(const SendView& send, const RecvView& recv, const collective_options& options,
                           const char* who) {
  validate_options(options.codec, who);
  if (options.codec.fill_value)
    throw invalid_argument(std::string(who) + ": a fill value has no meaning for a sum; leave codec.fill_value empty");
  require_contiguous(send, who, "the send View");
  require_contiguous(recv, who, "the result View");
  if (send.size() != recv.size())
    throw invalid_argument(std::string(who) + ": the send View has " + std::to_string(send.size()) +
                           " elements, the result View " + std::to_string(recv.size()) + "; they must match");
  const bool in_place = static_cast<const void*>(send.data()) == static_cast<const void*>(recv.data());
  if (!in_place)
    require_disjoint(send, recv, who, "the send and result Views (pass the same View twice for in place)");
  byte_count(send.size() * sizeof(T), who);  // MPI's int counts
}

/// The absolute bound of every compression: ABS as given, REL against all ranks' value range
/// (one small MPI_Allreduce), divided by p for allreduce_bound::total.
template <class Exec, class SendView>
double hop_bound(const Exec& exec, const SendView& send, const collective_options& options, comm_shape shape,
                 MPI_Comm comm, const char* who) {
  double bound = options.codec.bound.value;
  if (options.codec.bound.mode == bound_mode::relative) {
    using T = typename SendView::non_const_value_type;
    const value_range local = backend_value_range(exec, send.data(), send.size(), false, bits_t<T>(0));
    double extremes[2] = {-local.min, local.max};  // +inf/-inf when empty
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, extremes, 2, MPI_DOUBLE, MPI_MAX, comm), who, "MPI_Allreduce");
    bound = relative_to_absolute(options.codec.bound.value, -extremes[0], extremes[1]);
  }
  return options.reduction_bound == allreduce_bound::total ? bound / shape.size : bound;
}

/// The ring's extras for these options: the homomorphic grid of a per-rank bound `e` (the same
/// on every rank: e and p are agreed), error measurement.
inline ring_extras ring_extras_for(const collective_options& options, double e, comm_shape shape) {
  ring_extras extras;
  if (options.reduction == reduction_method::homomorphic) extras.homomorphic = code_grid::make(e, shape.size);
  extras.measure_error = options.measure_error;
  return extras;
}

/// What a ring collective's agreement settled. `carried`: the call ran on two ranks, raw and
/// small, and the peer's values moved with the agreement (into the receive View, or for an
/// in-place allreduce into `arrival`).
struct agreed_ring {
  comm_shape shape;
  wire_rule rule;
  workspace_slot* slot = nullptr;
  bool carried = false;
  std::shared_ptr<std::byte[]> arrival;
  transport how{};  ///< how the bytes reach MPI (agreed: every rank staged or none)
};

/// A ring collective's prologue before its checks: the Views' types checked, `exec` fenced,
/// the wire rule and the transport of these Views.
template <class SendView, class RecvView, class Exec>
agreed_ring enter_ring_collective(const Exec& exec, MPI_Comm comm, const collective_options& options,
                                  const char* who) {
  agreed_ring agreed;
  agreed.shape = enter_collective<SendView, RecvView>(exec, comm, who);
  agreed.how = transport_for<Exec, typename SendView::memory_space, typename RecvView::memory_space>(options.transport);
  agreed.rule = wire_rule::for_call(options, agreed.how);
  return agreed;
}

/// The prologue the ring collectives share once the execution space is fenced: `local_checks`
/// (this rank's arguments) and the workspace slot, then the agreement on what every rank must
/// pass alike (the element count, type, mode, cost model and bound; with `sums`, the
/// reduction_bound and method too, and for the homomorphic one the block size), with `carry`
/// riding it where it can. Throws on every rank if any
/// rank's checks failed. Fills `agreed`'s slot (nullptr without a workspace) and `carried`.
template <class T, class LocalChecks>
void agree_ring_call(agreed_ring& agreed, collective_kind kind, std::size_t count, bool sums,
                     const collective_options& options, comm_workspace* workspace, MPI_Comm comm, bool nonblocking,
                     const char* who, LocalChecks&& local_checks, bool persistent, const carried_payload& carry) {
  workspace_slot* slot = nullptr;
  agreement a;
  a.carry = carry;
  a.must_match = sums ? "the element count, element type, transfer mode, cost model, reduction method, bound "
                        "(mode, value and reduction_bound) and, for the homomorphic reduction, block size"
                      : "the element count, element type, transfer mode, cost model and bound (mode and value)";
  a.local_failure = run_local_checks([&] {
    local_checks();
    if (sums && options.reduction == reduction_method::homomorphic && !agreed.how.host_memory)
      throw invalid_argument(std::string(who) + ": the homomorphic reduction runs on host memory only; use "
                             "reduction_method::recompress for device Views");
    if (workspace) slot = &workspace->slot_for(comm, nonblocking, who);
  });
  fingerprint f = call_fingerprint(kind, nonblocking, sizeof(T));
  if (persistent) f.add(persistent_call_mark);
  f.add(std::uint64_t(count)).add(std::uint64_t(options.codec.bound.mode)).add(options.codec.bound.value);
  if (sums) f.add(std::uint64_t(options.reduction_bound)).add(std::uint64_t(options.reduction));
  // The homomorphic codes are blocked by it on every rank alike (streams carry their own).
  if (sums && options.reduction == reduction_method::homomorphic) f.add(std::uint64_t(options.codec.block_size));
  agreed.rule.add_to(f);
  // A staged rank runs the ring where others may take MPI's own collective.
  f.add(std::uint64_t(agreed.how.staged));
  a.fingerprint = f.value();
  agreed.carried = agree(a, comm, who);
  agreed.slot = slot;
  if (workspace) workspace->taken(nonblocking);
}

/// Exactly MPI_Allreduce (with one rank: the input itself) where the ring would compress nothing
/// and MPI reads the Views (staged Views always take the ring).
inline bool allreduce_sends_raw(const agreed_ring& agreed, std::size_t bytes) {
  return !agreed.how.staged &&
         (agreed.shape.size == 1 || !agreed.rule.may_compress(bytes / std::size_t(agreed.shape.size)));
}

/// Whether a one-shot ring collective, raw, of `bytes` per message, offers its data to the
/// agreement between pairs (on two to max_pairwise_ranks ranks, up to carried_limit). allgather
/// offers wherever the pairs agree; the sums only on two ranks (ring_carries).
inline bool pairwise_carries(const agreed_ring& agreed, bool sends_raw, bool persistent, std::size_t bytes) {
  return agreed.shape.size >= 2 && sends_raw && !persistent && agreed.how.small_calls() &&
         bytes <= carried_limit(agreed.shape.size);
}
inline bool ring_carries(const agreed_ring& agreed, bool sends_raw, bool persistent, std::size_t bytes) {
  return agreed.shape.size == 2 && pairwise_carries(agreed, sends_raw, persistent, bytes);
}
/// Whether a persistent collective's raw rounds are one exchange with the peer
/// (persistent_pair_exchange): on two ranks, up to the size a one-shot call carries with its
/// agreement (above it, MPI's own persistent collective, as measured there).
inline bool pair_rounds(const agreed_ring& agreed, std::size_t bytes) {
  return agreed.shape.size == 2 && agreed.how.small_calls() && bytes <= carried_limit(2);
}

/// allreduce's prologue: fence, check locally, agree. On two ranks a raw call of at most
/// max_carried_bytes sends its whole input with the agreement; the peer's lands in the result
/// View (in place: in `arrival`), and the sum is one add.
template <class Exec, class SendView, class RecvView>
agreed_ring agree_allreduce(const Exec& exec, const SendView& send, const RecvView& recv, MPI_Comm comm,
                            const collective_options& options, comm_workspace* workspace, bool nonblocking,
                            bool persistent, const char* who) {
  using T = typename SendView::non_const_value_type;
  agreed_ring agreed = enter_ring_collective<SendView, RecvView>(exec, comm, options, who);
  const std::size_t bytes = send.size() * sizeof(T);
  carried_payload carry;
  if (ring_carries(agreed, allreduce_sends_raw(agreed, bytes), persistent, bytes) && recv.size() == send.size()) {
    void* arrival = recv.data();
    if (static_cast<const void*>(send.data()) == static_cast<const void*>(recv.data())) {
      agreed.arrival = std::make_shared_for_overwrite<std::byte[]>(bytes);
      arrival = agreed.arrival.get();
    }
    carry = {true, send.data(), bytes, arrival, bytes, nullptr, nullptr, 0};
  }
  agree_ring_call<T>(agreed, collective_kind::allreduce, send.size(), true, options, workspace, comm, nonblocking, who,
                     [&] { check_allreduce_views<T>(send, recv, options, who); }, persistent, carry);
  return agreed;
}

/// The report of a raw allreduce (MPI's own), `bytes` per rank.
inline collective_report raw_allreduce_report(const agreed_ring& agreed, std::size_t bytes,
                                              const collective_options& options) {
  collective_report report;
  if (agreed.shape.size > 1) report.payload_bytes = report.wire_bytes = bytes;
  if (options.measure_error) report.max_error = 0.0;
  return report;
}

/// The compressing ring, once agreed; a REL bound resolves against all ranks' values now.
template <class Exec, class SendView, class RecvView>
std::unique_ptr<operation> launch_allreduce_ring(const Exec& exec, const SendView& send, const RecvView& recv,
                                                 const agreed_ring& agreed, workspace_slot* slot,
                                                 const collective_options& options, MPI_Comm comm, bool nonblocking,
                                                 const char* who) {
  using T = typename SendView::non_const_value_type;
  const comm_shape shape = agreed.shape;
  // Recompress: the bound of each of the p compressions on an element's path. Homomorphic: the
  // bound of each rank's one quantization (p of them add up), the same grid on every rank.
  const double hop = hop_bound(exec, send, options, shape, comm, who);
  compress_options codec = options.codec;
  codec.bound = absolute(hop);
  const ring_extras extras = ring_extras_for(options, hop, shape);
  return std::make_unique<ring_allreduce_operation<T, Exec>>(exec, ring_geometry{shape, send.size()}, agreed.rule,
                                                             codec, hop * shape.size, send.data(), recv.data(), slot,
                                                             comm, nonblocking, agreed.how, who,
                                                             ring_schedule::allreduce, extras);
}

template <class Exec, class SendView, class RecvView>
std::unique_ptr<operation> make_allreduce(const Exec& exec, const SendView& send, const RecvView& recv, MPI_Comm comm,
                                          const collective_options& options, comm_workspace* workspace,
                                          bool nonblocking, const char* who) {
  using T = typename SendView::non_const_value_type;
  Kokkos::Profiling::ScopedRegion region(who);
  const agreed_ring agreed = agree_allreduce(exec, send, recv, comm, options, workspace, nonblocking, false, who);
  const std::size_t bytes = send.size() * sizeof(T);
  if (!allreduce_sends_raw(agreed, bytes))
    return launch_allreduce_ring(exec, send, recv, agreed, agreed.slot, options, comm, nonblocking, who);
  const bool in_place = static_cast<const void*>(send.data()) == static_cast<const void*>(recv.data());
  auto op = std::make_unique<mpi_request_operation<SendView, RecvView>>(send, recv, who);
  op->mutable_report() = raw_allreduce_report(agreed, bytes, options);
  if (agreed.carried) {
    add_pair(recv.data(), recv.data(), in_place ? reinterpret_cast<const T*>(agreed.arrival.get()) : send.data(),
             send.size());
    return op;
  }
  const void* in = in_place ? MPI_IN_PLACE : static_cast<const void*>(send.data());
  const int count = int(send.size());
  if (nonblocking)
    check_mpi(MPI_Iallreduce(in, recv.data(), count, mpi_type<T>(), MPI_SUM, comm, op->handle()), who,
              "MPI_Iallreduce");
  else
    check_mpi(MPI_Allreduce(in, recv.data(), count, mpi_type<T>(), MPI_SUM, comm), who, "MPI_Allreduce");
  return op;
}

/// allreduce_init: agreed once; raw rounds are MPI's persistent allreduce (on two ranks one
/// exchange and an add), compressed ones the ring on the request's own scratch and communicator.
template <class Exec, class SendView, class RecvView>
std::unique_ptr<persistent_operation> init_allreduce(const Exec& exec, const SendView& send, const RecvView& recv,
                                                     MPI_Comm comm, const collective_options& options,
                                                     const char* who) {
  using T = typename SendView::non_const_value_type;
  Kokkos::Profiling::ScopedRegion region(who);
  const agreed_ring agreed = agree_allreduce(exec, send, recv, comm, options, nullptr, true, true, who);
  const std::size_t bytes = send.size() * sizeof(T);
  if (!allreduce_sends_raw(agreed, bytes))
    return std::make_unique<persistent_engine_collective<Exec>>(
        exec, comm,
        [=](workspace_slot& slot) {
          return launch_allreduce_ring(exec, send, recv, agreed, &slot, options, slot.comm, true, who);
        },
        who);
  const bool in_place = static_cast<const void*>(send.data()) == static_cast<const void*>(recv.data());
  const void* in = in_place ? MPI_IN_PLACE : static_cast<const void*>(send.data());
  T* const out = recv.data();
  const int count = int(send.size());
  if (pair_rounds(agreed, bytes)) {
    using pair = persistent_pair_exchange<Exec, SendView, RecvView>;
    auto scratch = std::make_shared_for_overwrite<T[]>(send.size());
    const typename pair::plan how{send.data(), scratch.get(), send.data(), recv.data(), send.size(), true};
    std::vector<T> a(send.size(), T(1)), b(send.size());
    return std::make_unique<pair>(
        exec, send, recv, comm, how, std::move(scratch),
        [=] { return MPI_Allreduce(in, out, count, mpi_type<T>(), MPI_SUM, comm); }, "MPI_Allreduce",
        [&] { return MPI_Allreduce(a.data(), b.data(), count, mpi_type<T>(), MPI_SUM, comm); },
        raw_allreduce_report(agreed, bytes, options), who);
  }
  return std::make_unique<persistent_mpi_collective<Exec, SendView, RecvView>>(
      exec, send, recv,
      [=](MPI_Request* r) {
#if KOMPRESS_MPI_PERSISTENT_COLLECTIVES
        return MPI_Allreduce_init(in, out, count, mpi_type<T>(), MPI_SUM, comm, MPI_INFO_NULL, r);
#else
        return MPI_Iallreduce(in, out, count, mpi_type<T>(), MPI_SUM, comm, r);
#endif
      },
      KOMPRESS_MPI_PERSISTENT_COLLECTIVES ? "MPI_Allreduce_init" : "MPI_Iallreduce",
      [=] { return MPI_Allreduce(in, out, count, mpi_type<T>(), MPI_SUM, comm); }, "MPI_Allreduce",
      raw_allreduce_report(agreed, bytes, options), who);
}

}  // namespace detail


/// Sum of `send` over all ranks into `recv` (pass the same View twice for in place).
/// `workspace` (optional, built on `comm`) removes the per-call allocation.
template <execution_space Exec, float_view SendView, float_view RecvView>
collective_report allreduce(const Exec& exec, const SendView& send, const RecvView& recv, MPI_Comm comm,
                            const collective_options& options = {}, comm_workspace* workspace = nullptr) {
  return detail::complete(detail::make_allreduce(exec, send, recv, comm, options, workspace, false, "kompress::allreduce"));
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
  return request(detail::make_allreduce(exec, send, recv, comm, options, workspace, true, "kompress::iallreduce"));
}

/// Persistent allreduce (MPI_Allreduce_init): checks and agrees once (collective, bad arguments
/// on any rank an invalid_argument on every rank), then every start() sums what `send` holds
/// into `recv` (the same View twice for in place); see kompress::persistent_request.
template <execution_space Exec, float_view SendView, float_view RecvView>
persistent_request allreduce_init(const Exec& exec, const SendView& send, const RecvView& recv, MPI_Comm comm,
                                  const collective_options& options = {}) {
  return persistent_request(detail::init_allreduce(exec, send, recv, comm, options, "kompress::allreduce_init"));
}

}  // namespace v0
}  // namespace kompress
