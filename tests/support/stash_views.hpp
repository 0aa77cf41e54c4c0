#pragma once
// Copies between host vectors and Views of the default execution space's memory (device memory
// in a CUDA build) for the stash suites. Kokkos alone: support/device_views.hpp would bring the
// collectives with it.

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstddef>
#include <vector>

namespace kompress::test {

/// A View of the default memory space holding a copy of `values`.
template <class T>
Kokkos::View<T*, Kokkos::DefaultExecutionSpace::memory_space> to_view(const std::vector<T>& values) {
  Kokkos::View<T*, Kokkos::DefaultExecutionSpace::memory_space> view("values", values.size());
  Kokkos::deep_copy(view, Kokkos::View<const T*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                              values.data(), values.size()));
  return view;
}

/// The elements of a contiguous View of any rank and memory space, in memory order, on the host.
template <class View>
std::vector<typename View::non_const_value_type> to_vector(const View& view) {
  using T = typename View::non_const_value_type;
  std::vector<T> values(view.size());
  auto flat = Kokkos::View<const T*, typename View::memory_space, Kokkos::MemoryUnmanaged>(
      view.data(), view.size());
  Kokkos::deep_copy(Kokkos::View<T*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(values.data(),
                                                                                 values.size()),
                    flat);
  return values;
}

/// What a keep_sign restore must never do: put a value on the other side of 0 than its saved
/// one (a saved 0 restored as anything but +0 counts), or farther than `bound` from it.
struct sign_and_bound_errors {
  std::size_t flips = 0;
  std::size_t outside = 0;
};
template <class T>
sign_and_bound_errors count_errors(const std::vector<T>& saved, const std::vector<T>& restored, double bound) {
  sign_and_bound_errors errors;
  for (std::size_t i = 0; i < saved.size(); ++i) {
    errors.flips += (saved[i] > T(0)) != (restored[i] > T(0)) ||
                    (saved[i] == T(0) && (restored[i] != T(0) || std::signbit(restored[i])));
    errors.outside += !(std::fabs(double(restored[i]) - double(saved[i])) <= bound);
  }
  return errors;
}

}  // namespace kompress::test
