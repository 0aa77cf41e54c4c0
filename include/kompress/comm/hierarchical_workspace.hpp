#pragma once
// kompress::hierarchical_workspace: reusable scratch for the hierarchical collectives over one
// node_groups (docs/collectives.md, "Hierarchical collectives"), so that a call repeated every
// iteration allocates nothing: a comm_workspace for the phases within the node, one for the
// phases across nodes, and the blocks the phases hand on (grown to the largest call, kept).
// Without it each call allocates those blocks (first touch of fresh pages cost as much as the
// rest of a 16 MiB reduce_scatter within 4-rank nodes, simulated) and the phases their scratch.

#include <kompress/comm/node_groups.hpp>
#include <kompress/comm/workspace.hpp>
#include <kompress/error.hpp>

#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <array>
#include <cstddef>
#include <string>
#include <type_traits>

namespace kompress::inline v0 {

/// Scratch for the hierarchical allreduce, reduce_scatter and allgather over `groups`. Building
/// it is collective over groups.comm() (each of its two comm_workspaces duplicates its
/// communicator once); so is destroying it. Pass it to hierarchical calls over the same groups
/// only; it must not outlive them. Not thread-safe: one thread calls the collectives that share
/// it.
class hierarchical_workspace {
 public:
  explicit hierarchical_workspace(const node_groups& groups)
      : comm_(groups.comm()), node_comm_(groups.node()), across_comm_(groups.across()), node_(groups.node(), 1),
        across_(groups.across(), 1) {}
  hierarchical_workspace(const hierarchical_workspace&) = delete;
  hierarchical_workspace& operator=(const hierarchical_workspace&) = delete;

  /// Bytes held now: the blocks and both comm_workspaces' staging.
  std::size_t bytes() const {
    std::size_t all = node_.staging_bytes() + across_.staging_bytes();
    for (const auto& b : host_blocks_) all += b.size();
    if constexpr (!std::is_same_v<device_memory, Kokkos::HostSpace>)
      for (const auto& b : device_blocks_) all += b.size();
    return all;
  }

  // Internal (the hierarchical collectives): ---------------------------------------------------

  /// Throws invalid_argument unless the workspace was built for `groups`.
  void check_for(const node_groups& groups, const char* who) const {
    if (groups.comm() != comm_ || groups.node() != node_comm_ || groups.across() != across_comm_)
      throw invalid_argument(std::string(who) + ": the workspace was built for other node groups");
  }
  comm_workspace* node() { return &node_; }
  comm_workspace* across() { return &across_; }
  /// Block buffer `which` (0 or 1) as `count` values of T in `Memory`, grown as needed.
  template <class T, class Memory>
  Kokkos::View<T*, Memory, Kokkos::MemoryTraits<Kokkos::Unmanaged>> blocks(int which, std::size_t count) {
    auto& bytes = [&]() -> auto& {
      if constexpr (detail::host_memory_space<Memory>) return host_blocks_[std::size_t(which)];
      else {
        static_assert(std::is_same_v<Memory, device_memory>,
                      "kompress hierarchical collectives: the memory must be the host's or the default execution "
                      "space's");
        return device_blocks_[std::size_t(which)];
      }
    }();
    detail::grow(bytes, count * sizeof(T), "kompress::hierarchical_blocks");
    return Kokkos::View<T*, Memory, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(reinterpret_cast<T*>(bytes.data()), count);
  }

 private:
  using device_memory = Kokkos::DefaultExecutionSpace::memory_space;
  MPI_Comm comm_, node_comm_, across_comm_;
  comm_workspace node_, across_;
  std::array<Kokkos::View<std::byte*, Kokkos::HostSpace>, 2> host_blocks_;
  std::array<Kokkos::View<std::byte*, device_memory>, 2> device_blocks_;
};

}  // namespace kompress::inline v0
