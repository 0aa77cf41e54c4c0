#pragma once
// The value range of an array over its finite, non-fill values: the relative bound's range
// and the largest magnitude the quantizer's margin depends on.

#include <kompress/detail/bytes.hpp>

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>

namespace kompress::detail {

struct value_range {
  double min = INFINITY;
  double max = -INFINITY;
  bool empty() const { return !(min <= max); }
  double max_abs() const { return empty() ? 0.0 : Kokkos::fmax(Kokkos::fabs(min), Kokkos::fabs(max)); }
};

template <class Exec, class T>
value_range compute_value_range(const Exec& exec, const T* data, std::uint64_t count,
                                bool has_fill, bits_t<T> fill_bits) {
  value_range range;
  if (count == 0) return range;
  Kokkos::parallel_reduce(
      "kompress::value_range", Kokkos::RangePolicy<Exec>(exec, 0, count),
      KOKKOS_LAMBDA(std::uint64_t i, double& low, double& high) {
        const T x = data[i];
        // x - x is 0 exactly for finite x and NaN otherwise.
        const bool counted = (x - x == T(0)) && !(has_fill && to_bits(x) == fill_bits);
        if (counted) {
          low = x < low ? double(x) : low;
          high = x > high ? double(x) : high;
        }
      },
      Kokkos::Min<double>(range.min), Kokkos::Max<double>(range.max));
  return range;
}

}  // namespace kompress::detail
