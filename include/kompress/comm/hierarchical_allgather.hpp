#pragma once
// kompress::allgather over node_groups: the hierarchical allgather (docs/collectives.md,
// "Hierarchical collectives"). Each rank contributes send.size() = m values; recv (p m) holds
// every rank's block in rank order. With k ranks on each of q nodes, in two phases:
//   1. across nodes, k allgathers at once (the ranks at place j of every node, one each), as
//      `options` says: each block compressed once, by its owner, or raw;
//   2. within each node, a raw allgather of what each place gathered, put in rank order.
// Only phase 1 crosses the network and only it compresses: every value is within e of the exact
// contribution, as with the flat allgather, and every rank ends bit-identical (a block's
// decoded values travel raw from the ranks that decoded them). The owner's own block holds the
// decoded values, as with the flat allgather. A REL bound resolves against the value range of
// all p ranks' send Views.
//
// Groups that are not uniform and one rank per node are the flat allgather on groups.comm(); so
// is, after the agreement, a call that would not compress across nodes (raw mode; automatic
// mode where a block forwarded to q - 1 nodes does not pay), as MPI_Allgather; where it pays,
// automatic mode compresses every block across nodes.
//
// Every rank of groups.comm() must pass the same count, element type, mode, cost model, schedule
// and bound: a mismatch or a bad argument on any rank is an invalid_argument on every rank before
// any data moves. A failure across nodes stops every rank (an agreement within each node comes
// between the phases); the phase within each node is MPI's own allgather. A stopped rank throws
// its own exception, or a peer_error naming the failed rank of groups.comm().
//
// Sync points: fence `exec`, one MPI_Allreduce to agree over all ranks (plus one for a REL
// bound's range), the phase across nodes, one small MPI_Allreduce within each node, the phase
// within the node. Blocking only. This place's blocks (q m values), every block in place order
// (p m) and the phases' scratch come from a hierarchical_workspace where one is passed, else
// they are allocated per call.

#include <kompress/comm/allgather.hpp>
#include <kompress/comm/detail/hierarchical.hpp>
#include <kompress/comm/hierarchical_workspace.hpp>
#include <kompress/comm/node_groups.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <vector>

namespace kompress::inline v0 {

/// Every rank's `send` (m values) into `recv` (p m, in rank order), gathered across nodes as
/// `options` says and within each node raw. `workspace` (optional, built on `groups`) removes
/// the per-call allocations.
template <execution_space Exec, float_view SendView, float_view RecvView>
collective_report allgather(const Exec& exec, const SendView& send, const RecvView& recv, const node_groups& groups,
                            const collective_options& options = {}, hierarchical_workspace* workspace = nullptr) {
  constexpr const char* who = "kompress::allgather (hierarchical)";
  using T = typename RecvView::non_const_value_type;
  using memory = typename RecvView::memory_space;
  const int k = groups.ranks_per_node(), q = groups.nodes();
  if (!groups.uniform()) return allgather(exec, send, recv, groups.comm(), options);
  // One rank per node: across() is every rank, in the same order.
  if (k == 1) return allgather(exec, send, recv, groups.across(), options, workspace ? workspace->across() : nullptr);

  const MPI_Comm comm = groups.comm();
  const detail::comm_shape shape = detail::shape_of(comm, who);
  exec.fence();  // the input may be the output of work on exec

  const std::size_t m = send.size();
  detail::phase_blocks<T, memory> this_place, by_place;
  detail::agree_hierarchical_call<T, detail::host_memory_space<memory>>(
      detail::collective_kind::allgather, false, m, groups, options, shape, who, [&] {
        const detail::allgather_call<Exec, SendView, RecvView> call{{exec, send, recv, options, who}};
        call.check(shape);
        if (workspace) workspace->check_for(groups, who);
        this_place =
            detail::phase_blocks<T, memory>(workspace, 0, std::size_t(q) * m, "kompress::allgather this place");
        by_place = detail::phase_blocks<T, memory>(workspace, 1, recv.size(), "kompress::allgather blocks by place");
      });

  // Where compressing across nodes would not pay (raw mode; automatic mode where a block
  // compressed once and forwarded to the q - 1 other nodes does not), MPI_Allgather over all
  // ranks, as the hierarchical allreduce does. The model's floor for a message alone
  // (min_message_bytes) does not apply: the block crosses the network q - 1 times, and where
  // it pays the phase across compresses every block (a 32 KiB block on 64 nodes of 4 ranks
  // read 9.7x plain MPI compressed, 0.97x raw under the floor, simulated).
  cost_model forwarded = options.cost;
  forwarded.min_message_bytes = 0;
  const bool across_may_compress =
      options.mode == transfer_mode::compressed ||
      (options.mode == transfer_mode::automatic && q > 1 &&
       forwarded.worth_compressing_forwarded(m * sizeof(T), std::uint64_t(q - 1)));
  collective_options raw = options;
  raw.mode = transfer_mode::raw;
  if (!across_may_compress) return allgather(exec, send, recv, comm, raw);
  comm_workspace* const within = workspace ? workspace->node() : nullptr;
  comm_workspace* const between = workspace ? workspace->across() : nullptr;

  collective_options across = options;
  across.mode = transfer_mode::compressed;  // decided above, for every block alike
  across.codec.bound = absolute(detail::ring_bound(exec, send.data(), m, options, comm, who));

  collective_report report;
  detail::phase_sequence phases(comm, shape.rank, who);
  phases.run(groups.across(), [&] {
    detail::add_phase(report, allgather(exec, send, this_place.view, groups.across(), across, between), true);
  });
  // Phase 2 needs every place's blocks: a failure across nodes stops every rank of its nodes.
  phases.agree_before(groups.node());
  phases.run(groups.node(), [&] {
    detail::add_phase(report, allgather(exec, this_place.view, by_place.view, groups.node(), raw, within));
    // by_place is place-major (place * q + node); recv's block r is the one rank r owns.
    const std::vector<int> owners = detail::owners_by_place(groups);
    std::vector<int> source(owners.size());
    for (std::size_t b = 0; b < owners.size(); ++b) source[std::size_t(owners[b])] = int(b);
    detail::copy_blocks<memory>(exec, by_place.view.data(), recv.data(), m, source);
  });
  phases.finish();
  return report;
}

}  // namespace kompress::inline v0
