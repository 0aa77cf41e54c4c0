#pragma once
// The shell the ring collectives (allreduce, allgather, reduce_scatter) share: the prologue
// (Views' types, fence, transport, wire rule), the agreement, then MPI's own collective, the
// small-call path or the compressing ring (comm/detail/ring.hpp), one-shot or persistent.
// What tells the collectives apart is a description each header defines, derived from
// ring_call (the call's execution space, Views, options and name):
//   kind, sums                           the collective (fingerprinted); sums: a reduction
//   count()                              the element count every rank must pass alike
//   check(shape)                         this rank's local checks of its arguments
//   sends_raw(agreed)                    whether no message may be compressed and MPI reads
//                                        the Views: then MPI's own collective (or a small call)
//   small_call_of(agreed)                its data as the pairs carry it (small_calls.hpp)
//   raw_report(shape)                    the report of a raw call
//   mpi(comm)                            MPI's own collective on the Views (mpi_collective.hpp)
//   ring(agreed, slot, comm, nonblocking)  the compressing ring, once agreed

#include <kompress/comm/detail/engine.hpp>
#include <kompress/comm/detail/halving_doubling.hpp>
#include <kompress/comm/detail/mpi_collective.hpp>
#include <kompress/comm/detail/ring.hpp>
#include <kompress/comm/detail/small_calls.hpp>
#include <kompress/comm/detail/transport.hpp>
#include <kompress/comm/persistent.hpp>
#include <kompress/detail/arguments.hpp>
#include <kompress/kernels/range_pass.hpp>

#include <bit>
#include <memory>
#include <string>

namespace kompress::inline v0::detail {

/// What a ring collective's agreement settled. `carried`: the call was raw and small, and its
/// data moved with the agreement's messages (small_calls.hpp).
struct agreed_ring {
  comm_shape shape;
  wire_rule rule;
  transport how{};  ///< how the bytes reach MPI (agreed: every rank staged or none)
  workspace_slot* slot = nullptr;
  bool carried = false;
};

/// What every ring collective's description holds, and what their checks share.
template <class Exec, class SendView, class RecvView>
struct ring_call {
  using send_view = SendView;
  using recv_view = RecvView;
  using value_type = typename SendView::non_const_value_type;

  Exec exec;
  SendView send;
  RecvView recv;
  collective_options options;
  const char* who;

  /// Valid options (a sum has no fill value) and contiguous Views.
  void check_options_and_views(bool sums, const char* recv_name) const {
    validate_options(options.codec, who);
    if (sums && options.codec.fill_value)
      throw invalid_argument(std::string(who) +
                             ": a fill value has no meaning for a sum; leave codec.fill_value empty");
    require_contiguous(send, who, "the send View");
    require_contiguous(recv, who, recv_name);
  }
  /// Whether MPI's own collective (or a small call) runs: no message of `message_bytes` may be
  /// compressed under `rule` and MPI reads the Views; with one rank always; staged Views never.
  bool raw_for(const agreed_ring& agreed, std::size_t message_bytes, const wire_rule& rule) const {
    return !agreed.how.staged && (agreed.shape.size == 1 || !rule.may_compress(message_bytes));
  }
  bool raw_for(const agreed_ring& agreed, std::size_t message_bytes) const {
    return raw_for(agreed, message_bytes, agreed.rule);
  }
  /// Whether a sum (allreduce, reduce_scatter) that recompresses runs recursive halving rather
  /// than the ring.
  bool sums_by_halving(const agreed_ring& agreed, butterfly_collective collective) const {
    return options.reduction == reduction_method::recompress &&
           takes_halving_doubling(options.schedule, agreed.rule, send.size() * sizeof(value_type), agreed.shape.size,
                                  collective);
  }
  /// raw_for a sum's schedule, judged by its largest message: the ring's `ring_message_bytes`;
  /// recursive halving's n/2, or where p is no power of two the fold's n; and for allreduce's
  /// butterfly by its final blocks too, which may pay where no halving message does (each
  /// crosses p - 1 links: final_block_rule).
  bool sum_sends_raw(const agreed_ring& agreed, std::size_t ring_message_bytes, butterfly_collective collective) const {
    const int p = agreed.shape.size;
    if (p <= 1 || !sums_by_halving(agreed, collective)) return raw_for(agreed, ring_message_bytes);
    const std::size_t bytes = send.size() * sizeof(value_type);
    if (!raw_for(agreed, largest_halving_bytes(bytes, p))) return false;
    if (collective != butterfly_collective::allreduce) return true;
    const std::size_t block = bytes / std::bit_floor(std::size_t(p));
    return raw_for(agreed, block, final_block_rule(agreed.rule, block, p));
  }
};

/// Fences, checks and agrees on what every rank must pass alike (the element count, type, mode,
/// cost model, bound and staging; for the sums the reduction_bound and method too, and for the
/// homomorphic one the block size), the call's small data riding the agreement where it can
/// (`data`, filled for a one-shot call). Throws on every rank if any rank's checks failed.
template <class Call>
agreed_ring agree_ring_call(const Call& call, MPI_Comm comm, comm_workspace* workspace, bool nonblocking,
                            bool persistent, small_call<typename Call::value_type>& data) {
  using send_view = typename Call::send_view;
  using recv_view = typename Call::recv_view;
  const collective_options& options = call.options;
  const char* const who = call.who;
  agreed_ring agreed;
  agreed.shape = enter_collective<send_view, recv_view>(call.exec, comm, who);
  agreed.how = transport_for<decltype(call.exec), typename send_view::memory_space, typename recv_view::memory_space>(
      options.transport);
  agreed.rule = wire_rule::for_call(options, agreed.how);
  agreement a;
  a.must_match = Call::sums ? "the element count, element type, transfer mode, cost model, reduction method, "
                              "schedule, bound (mode, value and reduction_bound), for the homomorphic reduction "
                              "block size, and "
                              "whether the Views are staged for MPI"
                            : "the element count, element type, transfer mode, cost model, schedule, bound (mode and "
                              "value) and whether the Views are staged for MPI";
  a.local_failure = run_local_checks([&] {
    call.check(agreed.shape);
    if (Call::sums && options.reduction == reduction_method::homomorphic && !agreed.how.host_memory)
      throw invalid_argument(std::string(who) + ": the homomorphic reduction runs on host memory only; use "
                             "reduction_method::recompress for device Views");
    if (workspace) agreed.slot = &workspace->slot_for(comm, nonblocking, who);
  });
  fingerprint f = call_fingerprint(Call::kind, nonblocking, sizeof(typename Call::value_type));
  if (persistent) f.add(persistent_call_mark);
  f.add(std::uint64_t(call.count())).add(std::uint64_t(options.codec.bound.mode)).add(options.codec.bound.value);
  f.add(std::uint64_t(options.schedule));
  if (Call::sums) f.add(std::uint64_t(options.reduction_bound)).add(std::uint64_t(options.reduction));
  // The homomorphic codes are blocked by it on every rank alike (streams carry their own).
  if (Call::sums && options.reduction == reduction_method::homomorphic) f.add(std::uint64_t(options.codec.block_size));
  agreed.rule.add_to(f);
  // A staged rank runs the ring where others may take MPI's own collective.
  f.add(std::uint64_t(agreed.how.staged));
  a.fingerprint = f.value();
  if (!persistent && !a.local_failure) data = call.small_call_of(agreed);
  agreed.carried = agree(a, data, comm, who);
  if (workspace) workspace->taken(nonblocking);
  return agreed;
}

/// Every blocking and nonblocking ring collective: agree, then the ring, the data already moved
/// with the agreement, or MPI's own collective.
template <class Call>
std::unique_ptr<operation> start_ring_collective(const Call& call, MPI_Comm comm, comm_workspace* workspace,
                                                 bool nonblocking) {
  Kokkos::Profiling::ScopedRegion region(call.who);
  small_call<typename Call::value_type> data;
  const agreed_ring agreed = agree_ring_call(call, comm, workspace, nonblocking, false, data);
  if (!call.sends_raw(agreed)) return call.ring(agreed, agreed.slot, comm, nonblocking);
  if (agreed.carried) {
    finish_small_call(data, agreed.shape);
    return completed_call(call.send, call.recv, call.raw_report(agreed.shape), call.who);
  }
  return start_mpi_collective(call.mpi(comm), call.send, call.recv, nonblocking, call.raw_report(agreed.shape),
                              call.who);
}

/// Every persistent ring collective: agreed once; compressed rounds are the ring on the
/// request's own scratch and communicator, raw ones MPI's persistent collective, or on two
/// ranks one exchange with the peer (small_calls.hpp). Automatic mode times the two where
/// times_automatic_choice and worth_timing say and keeps the faster (faster_of).
template <class Call>
std::unique_ptr<persistent_operation> init_ring_collective(const Call& call, MPI_Comm comm) {
  using Exec = std::remove_cvref_t<decltype(call.exec)>;
  using send_view = typename Call::send_view;
  using recv_view = typename Call::recv_view;
  Kokkos::Profiling::ScopedRegion region(call.who);
  small_call<typename Call::value_type> unused;
  const agreed_ring agreed = agree_ring_call(call, comm, nullptr, true, true, unused);
  const auto engine = [&](const agreed_ring& on) -> std::unique_ptr<persistent_operation> {
    return std::make_unique<persistent_engine_collective<Exec>>(
        call.exec, comm, [=](workspace_slot& slot) { return call.ring(on, &slot, slot.comm, true); }, call.who);
  };
  const auto raw = [&]() -> std::unique_ptr<persistent_operation> {
    const auto mpi = call.mpi(comm);
    const collective_report report = call.raw_report(agreed.shape);
    const small_call<typename Call::value_type> pair = call.small_call_of(agreed);
    if (pair_rounds(agreed.shape, pair))
      return std::make_unique<persistent_pair_exchange<Exec, send_view, recv_view, decltype(mpi)>>(
          call.exec, call.send, call.recv, comm, pair, mpi, report, call.who);
    return std::make_unique<persistent_mpi_collective<Exec, send_view, recv_view, decltype(mpi)>>(
        call.exec, call.send, call.recv, mpi, report, call.who);
  };
  const bool model_says_raw = call.sends_raw(agreed);
  const std::uint64_t bytes = call.send.size() * sizeof(typename Call::value_type);  // agreed: alike everywhere
  if (times_automatic_choice(call.options, agreed.how, agreed.shape) && worth_timing(call.options, bytes)) {
    // The compressed candidate: automatic mode's engine where the model compresses, else the
    // engine compressing every message it may.
    agreed_ring compressed = agreed;
    if (model_says_raw) compressed.rule.mode = transfer_mode::compressed;
    return faster_of(raw(), engine(compressed), comm, call.who);
  }
  return model_says_raw ? raw() : engine(agreed);
}

/// The absolute bound of `options` for a ring collective: ABS as given, REL against the value
/// range of all ranks' `count` values at `values` (one small MPI_Allreduce).
template <class Exec, class T>
double ring_bound(const Exec& exec, const T* values, std::size_t count, const collective_options& options,
                  MPI_Comm comm, const char* who) {
  if (options.codec.bound.mode == bound_mode::absolute) return options.codec.bound.value;
  const value_range local = backend_value_range(exec, values, count, false, bits_t<T>(0));
  double extremes[2] = {-local.min, local.max};  // +inf/-inf when empty
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, extremes, 2, MPI_DOUBLE, MPI_MAX, comm), who, "MPI_Allreduce");
  return resolve_bound(options.codec.bound, -extremes[0], extremes[1]);
}

/// The ring's extras for these options: the homomorphic grid of a per-rank bound `e` (the same
/// on every rank: e and p are agreed), error measurement.
inline ring_extras ring_extras_for(const collective_options& options, double e, comm_shape shape) {
  ring_extras extras;
  if (options.reduction == reduction_method::homomorphic) extras.homomorphic = code_grid::make(e, shape.size);
  extras.measure_error = options.measure_error;
  return extras;
}

/// The report of a raw call that sends `payload_bytes` in `messages` messages.
inline collective_report raw_report(std::size_t payload_bytes, std::uint64_t messages,
                                    const collective_options& options) {
  collective_report report;
  report.payload_bytes = report.wire_bytes = payload_bytes;
  report.messages = messages;
  if (options.measure_error) report.max_error = 0.0;
  return report;
}

}  // namespace kompress::inline v0::detail
