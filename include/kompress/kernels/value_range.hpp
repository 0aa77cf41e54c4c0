#pragma once
// The value range of an array over its finite, non-fill values: the relative bound's range
// and the largest magnitude the quantizer's margin depends on.

#include <kompress/detail/bytes.hpp>

#include <Kokkos_Core.hpp>

#include <cmath>
#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace kompress::detail {

struct value_range {
  double min = INFINITY;
  double max = -INFINITY;
  bool empty() const { return !(min <= max); }
  double max_abs() const { return empty() ? 0.0 : std::fmax(std::fabs(min), std::fabs(max)); }
};

/// Signed integers ordered like the floats whose bit patterns they come from (for non-NaN
/// values): integer min/max reductions vectorize where floating-point ones, which must honour
/// NaN, do not.
template <class T>
using order_key_t = std::make_signed_t<bits_t<T>>;

template <class T>
KOKKOS_INLINE_FUNCTION order_key_t<T> order_key(bits_t<T> bits) {
  using key = order_key_t<T>;
  constexpr int shift = 8 * sizeof(T) - 1;
  const key k = static_cast<key>(bits);
  return k ^ static_cast<key>(static_cast<bits_t<T>>(k >> shift) >> 1);
}

template <class T>
KOKKOS_INLINE_FUNCTION T from_order_key(order_key_t<T> k) {
  constexpr int shift = 8 * sizeof(T) - 1;
  return from_bits<T>(static_cast<bits_t<T>>(k ^ static_cast<order_key_t<T>>(
                                                     static_cast<bits_t<T>>(k >> shift) >> 1)));
}

/// Order keys of the smallest and largest counted value in [begin, end); low > high if none.
template <class T>
KOKKOS_INLINE_FUNCTION void segment_range(const T* data, std::uint64_t begin, std::uint64_t end,
                                          bits_t<T> fill_bits, bits_t<T> fill_enabled,
                                          order_key_t<T>& low, order_key_t<T>& high) {
  using key = order_key_t<T>;
  using bits = bits_t<T>;
  constexpr bits exponent_mask = std::is_same_v<T, float> ? bits(0x7F800000u)
                                                          : bits(0x7FF0000000000000ull);
  key lo = std::numeric_limits<key>::max(), hi = std::numeric_limits<key>::min();
  constexpr key key_max = std::numeric_limits<key>::max(), key_min = std::numeric_limits<key>::min();
  for (std::uint64_t i = begin; i < end; ++i) {
    const bits b = to_bits(data[i]);
    const key counted = -key(((b & exponent_mask) != exponent_mask) &
                             (((b ^ fill_bits) | ~fill_enabled) != 0));
    // Masks, not selects: the loop stays a pair of integer min/max reductions.
    const key k = order_key<T>(b);
    lo = Kokkos::min(lo, key((k & counted) | (key_max & ~counted)));
    hi = Kokkos::max(hi, key((k & counted) | (key_min & ~counted)));
  }
  low = lo < low ? lo : low;
  high = hi > high ? hi : high;
}

template <class Exec, class T>
value_range compute_value_range(const Exec& exec, const T* data, std::uint64_t count,
                                bool has_fill, bits_t<T> fill_bits) {
  using key = order_key_t<T>;
  value_range range;
  if (count == 0) return range;
  constexpr std::uint64_t segment = 4096;
  const bits_t<T> fill_enabled = has_fill ? ~bits_t<T>(0) : bits_t<T>(0);
  key low = std::numeric_limits<key>::max(), high = std::numeric_limits<key>::min();
  Kokkos::parallel_reduce(
      "kompress::value_range",
      Kokkos::RangePolicy<Exec>(exec, 0, (count + segment - 1) / segment),
      KOKKOS_LAMBDA(std::uint64_t s, key& lo, key& hi) {
        const std::uint64_t end = (s + 1) * segment < count ? (s + 1) * segment : count;
        segment_range<T>(data, s * segment, end, fill_bits, fill_enabled, lo, hi);
      },
      Kokkos::Min<key>(low), Kokkos::Max<key>(high));
  if (low <= high) {
    range.min = static_cast<double>(from_order_key<T>(low));
    range.max = static_cast<double>(from_order_key<T>(high));
  }
  return range;
}

}  // namespace kompress::detail
