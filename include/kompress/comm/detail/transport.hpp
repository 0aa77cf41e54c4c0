#pragma once
// The transport seam: how the bytes of a collective's messages reach MPI
// (docs/collectives.md, "The transport seam"). Straight through where MPI can read the memory
// (host memory, or device memory under a device-aware MPI); otherwise each message is copied
// into host staging just before it is sent and each arrival out of it just before it is
// decoded, on the call's execution space, so only the bytes a message holds cross: the
// stream when the message is compressed. The copies sit in the exchange's chunk pipeline, so
// the copy of one chunk overlaps the transfer of the one before.

#include <kompress/comm/options.hpp>

#include <Kokkos_Core.hpp>
#include <mpi.h>
#if defined(OPEN_MPI) && __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // Open MPI's MPIX_Query_cuda_support
#endif

#include <cstddef>

namespace kompress::inline v0::detail {

/// Whether the MPI library moves CUDA device memory itself, asked at run time (an MPI built
/// with CUDA support can have it switched off): Open MPI's MPIX_Query_cuda_support, MPICH's
/// MPIX_GPU_query_support. False for any other MPI.
inline bool mpi_moves_cuda_memory() {
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  return MPIX_Query_cuda_support() == 1;
#elif defined(MPIX_GPU_SUPPORT_CUDA)
  int supported = 0;
  return MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &supported) == MPI_SUCCESS && supported != 0;
#else
  return false;
#endif
}

/// Whether the host can read memory of this space (then MPI can too).
template <class Memory>
inline constexpr bool host_memory_space = Kokkos::SpaceAccessibility<Kokkos::HostSpace, Memory>::accessible;

/// How one call's bytes reach MPI on this rank.
struct transport {
  bool host_memory = true;  ///< the Views and the call's scratch are host memory
  bool staged = false;      ///< MPI sees host staging buffers, never the Views or the scratch

  /// The small-call paths (data riding the agreement, MPI's own collective on the Views, host
  /// adds) are for MPI reading host memory directly; every other call takes the engine.
  bool small_calls() const { return host_memory && !staged; }
};

/// The transport of a call on `Exec` over Views in the memory spaces `Memory...` (its scratch
/// lives in Exec's memory space).
template <class Exec, class... Memory>
transport transport_for(transport_mode mode) {
  constexpr bool host = host_memory_space<typename Exec::memory_space> && (host_memory_space<Memory> && ...);
  switch (mode) {
    case transport_mode::direct: return {host, false};
    case transport_mode::staged: return {host, true};
    default: break;
  }
  if constexpr (host) {
    return {true, false};
  } else {
#ifdef KOKKOS_ENABLE_CUDA
    constexpr bool cuda = Kokkos::SpaceAccessibility<Kokkos::Cuda, typename Exec::memory_space>::accessible;
    if constexpr (cuda) return {false, !mpi_moves_cuda_memory()};
#endif
    return {false, true};
  }
}

/// Values and bytes in the memory a call works in (host or device), unmanaged.
template <class T, class Memory>
using values_in = Kokkos::View<T*, Memory, Kokkos::MemoryUnmanaged>;
using staging_space = Kokkos::SharedHostPinnedSpace;

/// Copies `bytes` bytes from memory `exec` reaches into host staging, and waits: MPI reads them
/// next.
template <class Exec>
void stage_out(const Exec& exec, std::byte* staging, const std::byte* from, std::size_t bytes) {
  if (bytes == 0) return;
  Kokkos::deep_copy(exec, values_in<std::byte, staging_space>(staging, bytes),
                    values_in<const std::byte, typename Exec::memory_space>(from, bytes));
  exec.fence("kompress: message staged for MPI");
}

/// Copies `bytes` bytes that MPI delivered to host staging into memory `exec` reaches, and
/// waits: the decoding that follows may read them from the host (its header).
template <class Exec>
void stage_in(const Exec& exec, std::byte* to, const std::byte* staging, std::size_t bytes) {
  if (bytes == 0) return;
  Kokkos::deep_copy(exec, values_in<std::byte, typename Exec::memory_space>(to, bytes),
                    values_in<const std::byte, staging_space>(staging, bytes));
  exec.fence("kompress: arrival copied from staging");
}

}  // namespace kompress::inline v0::detail
