#pragma once
// kompress::allreduce over node_groups: the hierarchical allreduce (docs/collectives.md,
// "Hierarchical collectives"). With k ranks on each of q nodes, the vector's first k * floor(n/k)
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
// and data, with the flag agreements between them. Blocking only. The block each rank sums
// (n / k values in recv's memory space) and the phases' scratch come from a
// hierarchical_workspace where one is passed, else they are allocated per call.

#include <kompress/comm/allgather.hpp>
#include <kompress/comm/allreduce.hpp>
#include <kompress/comm/detail/hierarchical.hpp>
#include <kompress/comm/hierarchical_workspace.hpp>
#include <kompress/comm/node_groups.hpp>
#include <kompress/comm/reduce_scatter.hpp>

#include <Kokkos_Core.hpp>

#include <string>
#include <utility>

namespace kompress::inline v0 {

/// Sum of `send` over all ranks of groups.comm() into `recv` (the same View twice for in
/// place), reduced within each node raw and across nodes as `options` says (see above).
/// `workspace` (optional, built on `groups`) removes the per-call allocations.
template <execution_space Exec, float_view SendView, float_view RecvView>
collective_report allreduce(const Exec& exec, const SendView& send, const RecvView& recv, const node_groups& groups,
                            const collective_options& options = {}, hierarchical_workspace* workspace = nullptr) {
  constexpr const char* who = "kompress::allreduce (hierarchical)";
  using T = typename RecvView::non_const_value_type;
  using memory = typename RecvView::memory_space;
  const int k = groups.ranks_per_node();
  if (!groups.uniform()) return allreduce(exec, send, recv, groups.comm(), options);
  // One rank per node: across() is every rank, in the same order.
  if (k == 1) return allreduce(exec, send, recv, groups.across(), options, workspace ? workspace->across() : nullptr);

  const MPI_Comm comm = groups.comm();
  const detail::comm_shape shape = detail::shape_of(comm, who);
  exec.fence();  // the input may be the output of work on exec

  // Checks and the block this rank sums, then one agreement over all ranks: a bad call stops
  // every rank before any data moves.
  const std::size_t n = send.size();
  const std::size_t block = n / std::size_t(k), body = block * std::size_t(k);
  detail::phase_blocks<T, memory> summed;
  detail::agree_hierarchical_call<T, detail::host_memory_space<memory>>(
      detail::collective_kind::allreduce, true, n, groups, options, shape, who, [&] {
        const detail::allreduce_call<Exec, SendView, RecvView> call{{exec, send, recv, options, who}};
        call.check(shape);
        if (workspace) workspace->check_for(groups, who);
        summed = detail::phase_blocks<T, memory>(workspace, 0, block, "kompress::allreduce block");
      });

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
  comm_workspace* const within = workspace ? workspace->node() : nullptr;
  comm_workspace* const between = workspace ? workspace->across() : nullptr;

  // Every block under one absolute bound: a REL bound against all ranks' inputs.
  collective_options across = options;
  across.codec.bound = absolute(detail::ring_bound(exec, send.data(), n, options, comm, who));

  const auto values = [](const auto& view, std::size_t from, std::size_t to) {
    return Kokkos::subview(view, std::pair<std::size_t, std::size_t>(from, to));
  };
  collective_report report;
  detail::phase_sequence phases(comm, shape.rank, who);
  // The tail (n mod k values, fewer than k) while every rank is still in step.
  if (body < n) {
    phases.run(comm, [&] {
      detail::add_phase(report, allreduce(exec, values(send, body, n), values(recv, body, n), comm, raw));
    });
    phases.agree_before(groups.node());
  }
  phases.run(groups.node(), [&] {
    detail::add_phase(report, reduce_scatter(exec, values(send, 0, body), summed.view, groups.node(), raw, within));
  });
  // Phase 2's ranks sit on every node: a failure on one node stops them all, and through the
  // node agreement below, every rank of every node.
  phases.agree_before(groups.across());
  phases.run(groups.across(), [&] {
    detail::add_phase(report, allreduce(exec, summed.view, summed.view, groups.across(), across, between), true);
  });
  phases.agree_before(groups.node());
  phases.run(groups.node(), [&] {
    detail::add_phase(report, allgather(exec, summed.view, values(recv, 0, body), groups.node(), raw, within));
  });
  phases.finish();
  return report;
}

/// In place: `data` holds the sum on return.
template <execution_space Exec, float_view View>
collective_report allreduce(const Exec& exec, const View& data, const node_groups& groups,
                            const collective_options& options = {}, hierarchical_workspace* workspace = nullptr) {
  return allreduce(exec, data, data, groups, options, workspace);
}

}  // namespace kompress::inline v0
