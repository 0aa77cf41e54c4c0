#pragma once
// The least index a kernel flags (the first bad chunk), reduced where the execution space can
// write it. On a host space the reduction lands in a local; elsewhere it lands in a one-value
// View in the space's memory, copied back once: the device then never holds a host address.
// (A Kokkos::Cuda reduction into a host scalar wrote through that address on an H200, under
// nvcc 13's misplaced kernel-object members: docs/gpu.md, "nvcc 13 and Kokkos's Views".)

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace kompress::inline v0::detail {

/// Where a device reduction's result waits before its copy to the host, in memory the kernel's
/// execution space can write; unallocated where that space runs on the host.
template <class Memory>
using flag_slot = Kokkos::View<std::uint64_t, Memory>;

template <class Exec>
inline constexpr bool runs_on_host = Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename Exec::memory_space>::accessible;

/// A slot in `Memory` for reductions on `exec` (allocated only where `exec` is not a host space).
template <class Memory, class Exec>
flag_slot<Memory> make_flag_slot(const Exec& exec) {
  if constexpr (runs_on_host<Exec>) return {};
  else return flag_slot<Memory>(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "kompress::first_bad"));
}

/// The least value `functor(work, least)` leaves in `least` (a Kokkos::Min reduction over
/// `policy`), or `none` where it is larger or nothing was flagged. Waits for the kernel.
template <class Policy, class Functor, class Memory>
std::uint64_t first_flagged(const char* label, const Policy& policy, const Functor& functor,
                            const flag_slot<Memory>& slot, std::uint64_t none) {
  std::uint64_t least = none;
  if constexpr (runs_on_host<typename Policy::execution_space>) {
    Kokkos::parallel_reduce(label, policy, functor, Kokkos::Min<std::uint64_t>(least));
  } else {
    Kokkos::parallel_reduce(label, policy, functor, Kokkos::Min<std::uint64_t, Memory>(slot));
    const auto exec = policy.space();
    Kokkos::deep_copy(exec, Kokkos::View<std::uint64_t, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(&least), slot);
    exec.fence("kompress: the first bad chunk copied to the host");
  }
  return least < none ? least : none;
}

}  // namespace kompress::inline v0::detail
