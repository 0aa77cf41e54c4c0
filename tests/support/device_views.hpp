#pragma once
// Views in the default execution space's memory (device memory in a CUDA build) for the suites
// that run the collectives and the DLRM exchange there: copies to and from host Views, and the
// transports a call is run through: automatic (device memory staged unless the MPI moves it
// itself) and staged, which the tests force on host memory too so that the staging runs on
// every build.

#include <kompress/comm.hpp>

#include "support/mpi_checks.hpp"

#include <Kokkos_Core.hpp>

namespace kompress::test {

using exec_space = Kokkos::DefaultExecutionSpace;
template <class T>
using device_view = Kokkos::View<T*, exec_space::memory_space>;

inline constexpr kompress::transport_mode transports[] = {kompress::transport_mode::automatic,
                                                          kompress::transport_mode::staged};

template <class T>
device_view<T> to_device(const host_view<T>& values) {
  device_view<T> view("device", values.size());
  Kokkos::deep_copy(view, values);
  return view;
}

/// `n` copies of `value` in device memory, filled on the host: the suites do not depend on
/// Kokkos's fill, which nvcc 13 miscompiles without the layout definitions (its writes land
/// elsewhere; docs/gpu.md, "nvcc 13 and Kokkos's Views").
template <class T>
device_view<T> filled(std::size_t n, T value) {
  host_view<T> values("host", n);
  Kokkos::deep_copy(values, value);
  return to_device(values);
}

/// The elements of a contiguous View of any rank and memory space, in memory order, on the host.
template <class View>
host_view<typename View::non_const_value_type> to_host(const View& view) {
  using T = typename View::non_const_value_type;
  host_view<T> values("host", view.size());
  Kokkos::deep_copy(values, Kokkos::View<const T*, typename View::memory_space, Kokkos::MemoryUnmanaged>(
                                view.data(), view.size()));
  return values;
}

}  // namespace kompress::test
