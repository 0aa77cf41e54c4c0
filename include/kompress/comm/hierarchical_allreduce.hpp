#pragma once
// kompress::allreduce over node_groups: the hierarchical allreduce (docs/collectives.md,
// "Hierarchical allreduce"). With k ranks on each of q nodes, the vector's first k * floor(n/k)
// values go in three phases:
//   1. within each node, a raw reduce_scatter: local rank j holds the node's sum of block j;
//   2. across nodes, k allreduces at once (the ranks at place j of every node, one each), as
//      `options` says: compressed, automatic or raw, either schedule or the homomorphic sum;
//   3. within each node, a raw allgather of the k summed blocks;
// and the last n mod k values (fewer than k) with one raw MPI_Allreduce over all ranks first.
// Only phase 2 crosses the network and only it compresses: an element's result goes through
// the compressions of a q-rank allreduce, so it is within q * e (allreduce_bound::per_hop) or e
// (total) of the exact sum, not p * e; floating-point summation error comes on top. A REL bound
// resolves against the value range of all p ranks' inputs, as the flat allreduce's does, so
// every block is summed under the same absolute bound. Every rank ends bit-identical: each block
// is summed by one group of q ranks, which agree bit for bit, and copied raw to the rest.
//
// Groups that are not uniform (nodes of different sizes) and one rank per node are the flat
// allreduce on groups.comm(); so is, after the agreement, a call that would not compress across
// nodes (raw mode; automatic mode where the cost model says the largest message across does not
// pay), as MPI_Allreduce. With every rank on one node a compressing call runs the phases and none
// compresses: the sum is exact.
//
// Every rank of groups.comm() must pass the same count, element type, mode, cost model,
// schedule, reduction method and bound: a mismatch or a bad argument on any rank is an
// invalid_argument on every rank before any data moves. A failure during a phase never leaves
// a rank waiting: between phases the ranks that go on together agree on whether all of them
// can (a flag through one small MPI_Allreduce on the next phase's communicator), and a rank
// that cannot go on throws (its own exception, or a peer_error naming the rank that failed).
//
// Sync points: fence `exec`, one MPI_Allreduce to agree over all ranks (plus one for a REL
// bound's range), the tail's MPI_Allreduce where n mod k > 0, then each phase's own agreement
// and data, with the flag agreements between them. Blocking only. The block each rank sums is
// allocated per call (n / k values in recv's memory space).

#include <kompress/comm/allgather.hpp>
#include <kompress/comm/allreduce.hpp>
#include <kompress/comm/node_groups.hpp>
#include <kompress/comm/reduce_scatter.hpp>

#include <Kokkos_Core.hpp>

#include <exception>
#include <limits>
#include <string>
#include <utility>

namespace kompress::inline v0 {

namespace detail {

/// Added to the fingerprint of a hierarchical allreduce: it never matches a flat call.
inline constexpr std::uint64_t hierarchical_call_mark = 0x6869657261726368ull;

/// The ranks of a hierarchical allreduce that share a phase agree on whether all can go on: each
/// passes the rank (of the whole communicator) whose failure stopped it, or none; all learn the
/// lowest such rank. Returns it, or -1 when every rank can go on.
inline int first_failed_rank(int failed_rank, MPI_Comm comm, const char* who) {
  int first = failed_rank < 0 ? std::numeric_limits<int>::max() : failed_rank;
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, comm), who, "MPI_Allreduce");
  return first == std::numeric_limits<int>::max() ? -1 : first;
}

/// Rank `rank` of `part` (a communicator split from `whole`) as a rank of `whole`; `otherwise`
/// where MPI cannot say (this runs on an error path: it does not throw).
inline int rank_in(int rank, MPI_Comm part, MPI_Comm whole, int otherwise) noexcept {
  MPI_Group part_group = MPI_GROUP_NULL, whole_group = MPI_GROUP_NULL;
  int translated = MPI_UNDEFINED;
  if (MPI_Comm_group(part, &part_group) == MPI_SUCCESS && MPI_Comm_group(whole, &whole_group) == MPI_SUCCESS)
    MPI_Group_translate_ranks(part_group, 1, &rank, whole_group, &translated);
  if (part_group != MPI_GROUP_NULL) MPI_Group_free(&part_group);
  if (whole_group != MPI_GROUP_NULL) MPI_Group_free(&whole_group);
  return translated == MPI_UNDEFINED ? otherwise : translated;
}

/// What a rank stopped by another's failure says.
inline std::string failed_during(int rank, const char* who) {
  return "rank " + std::to_string(rank) + " failed during " + who +
         "; this rank stopped at the next phase (it completed the messages of those it ran) and its output is "
         "unspecified";
}

/// Adds one phase's report to the call's: bytes and messages add up; the bound and the measured
/// error are the compressing phase's (the raw phases add no error).
inline void add_phase(collective_report& total, const collective_report& phase) {
  total.payload_bytes += phase.payload_bytes;
  total.wire_bytes += phase.wire_bytes;
  total.messages += phase.messages;
  total.compressed_messages += phase.compressed_messages;
  total.chunks += phase.chunks;
}

}  // namespace detail

/// Sum of `send` over all ranks of groups.comm() into `recv` (the same View twice for in
/// place), reduced within each node raw and across nodes as `options` says (see above).
template <execution_space Exec, float_view SendView, float_view RecvView>
collective_report allreduce(const Exec& exec, const SendView& send, const RecvView& recv, const node_groups& groups,
                            const collective_options& options = {}) {
  constexpr const char* who = "kompress::allreduce (hierarchical)";
  using T = typename RecvView::non_const_value_type;
  using memory = typename RecvView::memory_space;
  const int k = groups.ranks_per_node();
  if (!groups.uniform() || k == 1) return allreduce(exec, send, recv, groups.comm(), options);

  const MPI_Comm comm = groups.comm();
  const detail::comm_shape shape = detail::shape_of(comm, who);
  exec.fence();  // the input may be the output of work on exec

  // Checks and the block this rank sums, then one agreement over all ranks: a bad call stops
  // every rank before any data moves.
  const std::size_t n = send.size();
  const std::size_t block = n / std::size_t(k), body = block * std::size_t(k);
  Kokkos::View<T*, memory> summed;
  detail::agreement a;
  a.must_match = "the element count, element type, transfer mode, cost model, transport, reduction method, "
                 "schedule and bound (mode, value and reduction_bound), and the node groups";
  a.local_failure = detail::run_local_checks([&] {
    const detail::allreduce_call<Exec, SendView, RecvView> call{{exec, send, recv, options, who}};
    call.check(shape);
    if (options.reduction == reduction_method::homomorphic && !detail::host_memory_space<memory>)
      throw invalid_argument(std::string(who) + ": the homomorphic reduction runs on host memory only; use "
                             "reduction_method::recompress for device Views");
    summed = Kokkos::View<T*, memory>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kompress::allreduce block"),
                                      block);
  });
  detail::fingerprint f = detail::call_fingerprint(detail::collective_kind::allreduce, false, sizeof(T));
  f.add(detail::hierarchical_call_mark).add(std::uint64_t(n)).add(std::uint64_t(k)).add(std::uint64_t(groups.nodes()));
  f.add(std::uint64_t(options.codec.bound.mode)).add(options.codec.bound.value).add(std::uint64_t(options.schedule));
  f.add(std::uint64_t(options.reduction_bound)).add(std::uint64_t(options.reduction));
  f.add(std::uint64_t(options.codec.block_size)).add(std::uint64_t(options.transport));
  f.add(std::uint64_t(detail::host_memory_space<memory>));
  detail::wire_rule{options.mode, options.cost}.add_to(f);
  a.fingerprint = f.value();
  detail::agree_by_allreduce(a, shape, comm, who);

  // Where compressing across nodes would not pay (raw mode; automatic mode where the largest
  // message of the allreduce across nodes, half a rail's block, does not), MPI's own allreduce
  // over all ranks: one call, not three phases, their agreements and a REL bound's range pass,
  // which the cost model does not price (final blocks alone that pay across q - 1 nodes do not
  // repay them: 0.71x plain MPI, simulated at 64 ranks, 4 per host, 100 Gb/s).
  const int q = groups.nodes();
  const std::uint64_t rail_bytes = block * sizeof(T);
  const bool across_may_compress =
      options.mode == transfer_mode::compressed ||
      (options.mode == transfer_mode::automatic && q > 1 && options.cost.worth_compressing(rail_bytes / 2));
  collective_options raw = options;
  raw.mode = transfer_mode::raw;
  if (!across_may_compress) return allreduce(exec, send, recv, comm, raw);

  // Every block under one absolute bound: a REL bound against all ranks' inputs.
  collective_options across = options;
  across.codec.bound = absolute(detail::ring_bound(exec, send.data(), n, options, comm, who));

  const auto values = [](const auto& view, std::size_t from, std::size_t to) {
    return Kokkos::subview(view, std::pair<std::size_t, std::size_t>(from, to));
  };
  collective_report report;
  std::exception_ptr failure;
  int failed_rank = -1;  // in comm: this rank, or the one whose failure reached it
  // Runs a phase on `phase_comm`; a peer_error it throws names a rank of phase_comm, which the
  // call names in comm.
  const auto run = [&](MPI_Comm phase_comm, auto&& phase) {
    try {
      phase();
    } catch (const peer_error& e) {
      failed_rank = detail::rank_in(e.failed_rank(), phase_comm, comm, shape.rank);
      failure = std::make_exception_ptr(peer_error(detail::failed_during(failed_rank, who), failed_rank));
    } catch (...) {
      failure = std::current_exception();
      failed_rank = shape.rank;
    }
  };
  // Called by every rank after every phase, whether it ran the phase or not.
  const auto stop_unless_all_can_go_on = [&](MPI_Comm next) {
    const int first = detail::first_failed_rank(failed_rank, next, who);
    if (first < 0) return false;
    if (!failure) {
      failed_rank = first;
      failure = std::make_exception_ptr(peer_error(detail::failed_during(first, who), first));
    }
    return true;
  };

  // The tail (n mod k values, fewer than k) while every rank is still in step.
  bool stopped = false;
  if (body < n) {
    run(comm, [&] {
      detail::add_phase(report, allreduce(exec, values(send, body, n), values(recv, body, n), comm, raw));
    });
    stopped = stop_unless_all_can_go_on(groups.node());
  }
  if (!stopped)
    run(groups.node(), [&] {
      detail::add_phase(report, reduce_scatter(exec, values(send, 0, body), summed, groups.node(), raw));
    });
  // Phase 2's ranks sit on every node: a failure on one node stops them all, and through the
  // node agreement below, every rank of every node.
  stopped = stop_unless_all_can_go_on(groups.across());
  if (!stopped)
    run(groups.across(), [&] {
      const collective_report summed_across = allreduce(exec, summed, summed, groups.across(), across);
      detail::add_phase(report, summed_across);
      report.absolute_bound = summed_across.absolute_bound;
      report.max_error = summed_across.max_error;
    });
  stopped = stop_unless_all_can_go_on(groups.node());
  if (!stopped)
    run(groups.node(), [&] {
      detail::add_phase(report, allgather(exec, summed, values(recv, 0, body), groups.node(), raw));
    });
  if (failure) std::rethrow_exception(failure);
  return report;
}

/// In place: `data` holds the sum on return.
template <execution_space Exec, float_view View>
collective_report allreduce(const Exec& exec, const View& data, const node_groups& groups,
                            const collective_options& options = {}) {
  return allreduce(exec, data, data, groups, options);
}

}  // namespace kompress::inline v0
