#pragma once
// kompress::reduce_scatter over node_groups: the hierarchical reduce_scatter (docs/collectives.md,
// "Hierarchical collectives"). `send` holds p blocks of m = recv.size() values, in rank order;
// rank r receives the sum over ranks of block r. With k ranks on each of q nodes, in two phases:
//   1. within each node, a raw reduce_scatter: the rank at place j of its node holds the node's
//      sum of the q blocks owned by the ranks at place j of every node;
//   2. across nodes, k reduce_scatters at once (the ranks at place j of every node, one each), as
//      `options` says: compressed, automatic or raw, either schedule or the homomorphic sum.
// Only phase 2 crosses the network and only it compresses: an element's sum goes through the
// compressions of a q-rank reduce_scatter, so it is within (q - 1) e of the exact sum with
// allreduce_bound::per_hop (q e by recursive halving where q is no power of two, and with the
// homomorphic sum), or e (total), not (p - 1) e; floating-point summation error comes on top. A
// REL bound resolves against the value range of all p ranks' send Views, as the flat
// reduce_scatter's does.
//
// Groups that are not uniform and one rank per node are the flat reduce_scatter on groups.comm();
// so is, after the agreement, a call that would not compress across nodes (raw mode; automatic
// mode where the largest message across does not pay), as MPI_Reduce_scatter_block.
//
// Every rank of groups.comm() must pass the same count, element type, mode, cost model,
// schedule, reduction method and bound: a mismatch or a bad argument on any rank is an
// invalid_argument on every rank before any data moves. A failure during a phase stops every
// rank (a small agreement across nodes comes between the phases, and one within each node after
// them): its own exception, or a peer_error naming the failed rank of groups.comm().
//
// Sync points: fence `exec`, one MPI_Allreduce to agree over all ranks (plus one for a REL
// bound's range), the phase within the node, one small MPI_Allreduce across nodes, the phase
// across nodes, one small MPI_Allreduce within each node. Blocking only. The send blocks in the
// order of phase 1 (p m values), this rank's sums of phase 1 (q m) and the phases' scratch come
// from a hierarchical_workspace where one is passed, else they are allocated per call.

#include <kompress/comm/detail/hierarchical.hpp>
#include <kompress/comm/hierarchical_workspace.hpp>
#include <kompress/comm/node_groups.hpp>
#include <kompress/comm/reduce_scatter.hpp>

#include <Kokkos_Core.hpp>

#include <string>
#include <vector>

namespace kompress::inline v0 {

/// Sum over all ranks of groups.comm() of block `rank` of `send` (p blocks of recv.size()
/// values) into `recv`, reduced within each node raw and across nodes as `options` says.
/// `workspace` (optional, built on `groups`) removes the per-call allocations.
template <execution_space Exec, float_view SendView, float_view RecvView>
collective_report reduce_scatter(const Exec& exec, const SendView& send, const RecvView& recv,
                                 const node_groups& groups, const collective_options& options = {},
                                 hierarchical_workspace* workspace = nullptr) {
  constexpr const char* who = "kompress::reduce_scatter (hierarchical)";
  using T = typename RecvView::non_const_value_type;
  using memory = typename RecvView::memory_space;
  const int k = groups.ranks_per_node(), q = groups.nodes();
  if (!groups.uniform()) return reduce_scatter(exec, send, recv, groups.comm(), options);
  // One rank per node: across() is every rank, in the same order.
  if (k == 1)
    return reduce_scatter(exec, send, recv, groups.across(), options, workspace ? workspace->across() : nullptr);

  const MPI_Comm comm = groups.comm();
  const detail::comm_shape shape = detail::shape_of(comm, who);
  exec.fence();  // the input may be the output of work on exec

  const std::size_t m = recv.size();
  detail::phase_blocks<T, memory> by_place, node_sums;
  detail::agree_hierarchical_call<T, detail::host_memory_space<memory>>(
      detail::collective_kind::reduce_scatter, true, m, groups, options, shape, who, [&] {
        const detail::reduce_scatter_call<Exec, SendView, RecvView> call{{exec, send, recv, options, who}};
        call.check(shape);
        if (workspace) workspace->check_for(groups, who);
        by_place =
            detail::phase_blocks<T, memory>(workspace, 0, send.size(), "kompress::reduce_scatter blocks by place");
        node_sums = detail::phase_blocks<T, memory>(workspace, 1, std::size_t(q) * m, "kompress::reduce_scatter sums");
      });

  // Where compressing across nodes would not pay (raw mode; automatic mode where the largest
  // message of the reduce_scatter across nodes, half its q blocks, does not), MPI's own
  // reduce_scatter over all ranks, as the hierarchical allreduce does.
  const std::uint64_t rail_bytes = std::uint64_t(q) * m * sizeof(T);
  const bool across_may_compress =
      options.mode == transfer_mode::compressed ||
      (options.mode == transfer_mode::automatic && q > 1 && options.cost.worth_compressing(rail_bytes / 2));
  collective_options raw = options;
  raw.mode = transfer_mode::raw;
  if (!across_may_compress) return reduce_scatter(exec, send, recv, comm, raw);
  comm_workspace* const within = workspace ? workspace->node() : nullptr;
  comm_workspace* const between = workspace ? workspace->across() : nullptr;

  // Every block under one absolute bound: a REL bound against all ranks' inputs.
  collective_options across = options;
  across.codec.bound = absolute(detail::ring_bound(exec, send.data(), send.size(), options, comm, who));

  collective_report report;
  detail::phase_sequence phases(comm, shape.rank, who);
  phases.run(groups.node(), [&] {
    // Place-major: the blocks the ranks at place 0 of every node own (in their order across
    // nodes), then place 1's, ...: phase 1 hands place j its q blocks, in the order phase 2 wants.
    detail::copy_blocks<memory>(exec, send.data(), by_place.view.data(), m, detail::owners_by_place(groups));
    detail::add_phase(report, reduce_scatter(exec, by_place.view, node_sums.view, groups.node(), raw, within));
  });
  // Phase 2's ranks sit on every node: a failure on one node stops them all.
  phases.agree_before(groups.across());
  phases.run(groups.across(), [&] {
    detail::add_phase(report, reduce_scatter(exec, node_sums.view, recv, groups.across(), across, between), true);
  });
  // The other places of a node finished their own sums; they learn of a failure all the same, so
  // that a call fails on every rank or on none, as the other hierarchical collectives do.
  phases.agree_before(groups.node());
  phases.finish();
  return report;
}

}  // namespace kompress::inline v0
