#pragma once
// The constraints of kompress's public templates: an execution space, a View of float or
// double values, a View of bytes (a compressed stream).

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <type_traits>

namespace kompress::inline v0 {

/// A Kokkos execution space (Kokkos::OpenMP, Kokkos::Serial, Kokkos::Cuda, ...), or an instance.
template <class E>
concept execution_space = Kokkos::is_execution_space_v<E>;

/// A Kokkos::View of float or double (const or not), any rank.
template <class V>
concept float_view = Kokkos::is_view_v<V> &&
                     (std::is_same_v<typename V::non_const_value_type, float> ||
                      std::is_same_v<typename V::non_const_value_type, double>);

/// A rank-1 Kokkos::View of std::byte (const or not): a compressed stream.
template <class V>
concept byte_view = Kokkos::is_view_v<V> && V::rank == 1 &&
                    std::is_same_v<typename V::non_const_value_type, std::byte>;

}  // namespace kompress::inline v0
