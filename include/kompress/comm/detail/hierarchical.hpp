#pragma once
// What the hierarchical collectives (comm/hierarchical_*.hpp) share: their agreement over all
// ranks before any data moves, the protocol that stops every rank whose result depends on a
// failed phase, and the copies between rank order and the order in which the phases hold
// blocks (place-major: the blocks of the ranks at place 0 of every node, then place 1, ...).

#include <kompress/comm/detail/agreement.hpp>
#include <kompress/comm/detail/engine.hpp>
#include <kompress/comm/hierarchical_workspace.hpp>
#include <kompress/comm/node_groups.hpp>
#include <kompress/comm/options.hpp>
#include <kompress/detail/mpi.hpp>
#include <kompress/error.hpp>

#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <cstdint>
#include <exception>
#include <limits>
#include <string>
#include <vector>

namespace kompress::inline v0::detail {

/// Added to the fingerprint of a hierarchical call: it never matches a flat one.
inline constexpr std::uint64_t hierarchical_call_mark = 0x6869657261726368ull;

/// Before any data moves, every rank of groups.comm() runs `check` (its own arguments; for
/// `sums`, also that a homomorphic reduction has host memory) and all agree on what must match,
/// hierarchical or not: a failure or a mismatch on any rank is an invalid_argument on every rank.
template <class T, bool host_memory, class Check>
void agree_hierarchical_call(collective_kind kind, bool sums, std::size_t count, const node_groups& groups,
                             const collective_options& options, comm_shape shape, const char* who, Check&& check) {
  agreement a;
  a.must_match = "the element count, element type, transfer mode, cost model, transport, reduction method, "
                 "schedule and bound (mode, value and reduction_bound), and the node groups";
  a.local_failure = run_local_checks([&] {
    check();
    if (sums && options.reduction == reduction_method::homomorphic && !host_memory)
      throw invalid_argument(std::string(who) + ": the homomorphic reduction runs on host memory only; use "
                             "reduction_method::recompress for device Views");
  });
  fingerprint f = call_fingerprint(kind, false, sizeof(T));
  f.add(hierarchical_call_mark).add(std::uint64_t(count));
  f.add(std::uint64_t(groups.ranks_per_node())).add(std::uint64_t(groups.nodes()));
  f.add(std::uint64_t(options.codec.bound.mode)).add(options.codec.bound.value).add(std::uint64_t(options.schedule));
  f.add(std::uint64_t(options.reduction_bound)).add(std::uint64_t(options.reduction));
  f.add(std::uint64_t(options.codec.block_size)).add(std::uint64_t(options.transport));
  f.add(std::uint64_t(host_memory));
  wire_rule{options.mode, options.cost}.add_to(f);
  a.fingerprint = f.value();
  agree_by_allreduce(a, shape, groups.comm(), who);
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

/// Adds one phase's report to the call's: bytes and messages add up. The bound and the measured
/// error are the compressing phase's (the raw phases add no error): `compressing` says which.
inline void add_phase(collective_report& total, const collective_report& phase, bool compressing = false) {
  total.payload_bytes += phase.payload_bytes;
  total.wire_bytes += phase.wire_bytes;
  total.messages += phase.messages;
  total.compressed_messages += phase.compressed_messages;
  total.chunks += phase.chunks;
  if (compressing) {
    total.absolute_bound = phase.absolute_bound;
    total.max_error = phase.max_error;
  }
}

/// The phases of one hierarchical call on one rank. A phase runs on its communicator; between
/// phases the ranks that go on together agree on whether all of them can (the lowest failed
/// rank through one small MPI_Allreduce on the next phase's communicator, made by every rank
/// whether it ran the phase or not), so a failure never leaves a rank waiting on one that
/// stopped. The rank that failed rethrows its own exception at the end, the others a peer_error
/// naming it as a rank of the whole communicator.
class phase_sequence {
 public:
  phase_sequence(MPI_Comm comm, int rank, const char* who) : comm_(comm), rank_(rank), who_(who) {}

  /// Runs `phase` on `phase_comm` unless an earlier phase stopped the call.
  template <class Phase>
  void run(MPI_Comm phase_comm, Phase&& phase) {
    if (stopped_) return;
    try {
      phase();
    } catch (const peer_error& e) {
      failed_rank_ = rank_in(e.failed_rank(), phase_comm, comm_, rank_);
      failure_ = std::make_exception_ptr(peer_error(failed_during(failed_rank_), failed_rank_));
    } catch (...) {
      failure_ = std::current_exception();
      failed_rank_ = rank_;
    }
  }

  /// The agreement before the phase on `next`; every rank of `next` must make it.
  void agree_before(MPI_Comm next) {
    int first = failed_rank_ < 0 ? std::numeric_limits<int>::max() : failed_rank_;
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, next), who_, "MPI_Allreduce");
    if (first == std::numeric_limits<int>::max()) return;
    stopped_ = true;
    if (!failure_) {
      failed_rank_ = first;
      failure_ = std::make_exception_ptr(peer_error(failed_during(first), first));
    }
  }

  /// Throws what stopped this rank, if anything did.
  void finish() const {
    if (failure_) std::rethrow_exception(failure_);
  }

 private:
  std::string failed_during(int rank) const {
    return "rank " + std::to_string(rank) + " failed during " + who_ +
           "; this rank stopped at the next phase (it completed the messages of those it ran) and its output is "
           "unspecified";
  }

  MPI_Comm comm_;
  int rank_;
  const char* who_;
  std::exception_ptr failure_;
  int failed_rank_ = -1;  // in comm_: this rank, or the one whose failure reached it
  bool stopped_ = false;
};

/// Block b (of `m` values) of `to` is block `source[b]` of `from`; both in `Memory`, the copy on
/// `exec`, finished on return.
template <class Memory, class Exec, class T>
void copy_blocks(const Exec& exec, const T* from, T* to, std::size_t m, const std::vector<int>& source) {
  if (source.empty() || m == 0) return;
  Kokkos::View<int*, Memory> on_device(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kompress::block order"),
                                       source.size());
  Kokkos::deep_copy(exec, on_device,
                    Kokkos::View<const int*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
                        source.data(), source.size()));
  // A team per block, its threads along the block: contiguous copies, no division per value.
  using policy = Kokkos::TeamPolicy<Exec>;
  Kokkos::parallel_for(
      "kompress::copy_blocks", policy(exec, int(source.size()), Kokkos::AUTO),
      KOKKOS_LAMBDA(const typename policy::member_type& team) {
        const std::size_t b = std::size_t(team.league_rank());
        T* const into = to + b * m;
        const T* const block = from + std::size_t(on_device(b)) * m;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, m), [&](const std::size_t i) { into[i] = block[i]; });
      });
  exec.fence();  // the block order and the caller's Views may go once this returns
}

/// Values a phase hands on: the workspace's block buffer `which`, or allocated for the call.
template <class T, class Memory>
struct phase_blocks {
  Kokkos::View<T*, Memory> owned;
  Kokkos::View<T*, Memory, Kokkos::MemoryTraits<Kokkos::Unmanaged>> view;

  phase_blocks(hierarchical_workspace* workspace, int which, std::size_t count, const char* label) {
    if (workspace) {
      view = workspace->blocks<T, Memory>(which, count);
    } else {
      owned = Kokkos::View<T*, Memory>(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), count);
      view = owned;
    }
  }
  phase_blocks() = default;
};

/// For each block in place-major order (place * nodes + node), the rank that owns it.
inline std::vector<int> owners_by_place(const node_groups& groups) {
  const int q = groups.nodes(), k = groups.ranks_per_node();
  std::vector<int> owners(std::size_t(q) * std::size_t(k));
  for (int place = 0; place < k; ++place)
    for (int node = 0; node < q; ++node) owners[std::size_t(place) * q + node] = groups.rank_at(node, place);
  return owners;
}

}  // namespace kompress::inline v0::detail
