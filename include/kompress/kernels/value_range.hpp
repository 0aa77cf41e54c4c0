#pragma once
// The value range of an array over its finite, non-fill values: the relative bound's range
// and the largest magnitude the quantizer's margin depends on.

#include <kompress/detail/bytes.hpp>

#include <Kokkos_Core.hpp>

#include <cmath>
#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace kompress::inline v0::detail {

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

/// The largest and smallest order key, callable from device code (std::numeric_limits is host
/// only under nvcc).
template <class T>
KOKKOS_INLINE_FUNCTION constexpr order_key_t<T> order_key_max() {
  return static_cast<order_key_t<T>>(static_cast<bits_t<T>>(~bits_t<T>(0)) >> 1);
}
template <class T>
KOKKOS_INLINE_FUNCTION constexpr order_key_t<T> order_key_min() {
  return static_cast<order_key_t<T>>(-order_key_max<T>() - 1);
}

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
  constexpr key key_max = order_key_max<T>(), key_min = order_key_min<T>();
  key lo = key_max, hi = key_min;
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

/// The value range as order keys, packed in 16 bytes at any alignment (compression keeps it in
/// the output's header bytes until the header replaces it). low > high if no value counted.
template <class T>
struct packed_range {
  using key = order_key_t<T>;
  std::byte bytes[2 * sizeof(key)];

  KOMPRESS_FUNCTION key low() const { return load<key>(bytes); }
  KOMPRESS_FUNCTION key high() const { return load<key>(bytes + sizeof(key)); }
  KOMPRESS_FUNCTION void set(key lo, key hi) {
    store<key>(bytes, lo);
    store<key>(bytes + sizeof(key), hi);
  }
};

/// A Kokkos reducer of packed_range into a View: in memory the execution space writes, the
/// reduction needs no wait.
template <class T, class Space>
struct range_reducer {
  using key = order_key_t<T>;
  using reducer = range_reducer;
  using value_type = packed_range<T>;
  using result_view_type = Kokkos::View<value_type, Space, Kokkos::MemoryUnmanaged>;

  result_view_type result;

  KOKKOS_INLINE_FUNCTION void join(value_type& into, const value_type& from) const {
    const key lo = from.low() < into.low() ? from.low() : into.low();
    const key hi = from.high() > into.high() ? from.high() : into.high();
    into.set(lo, hi);
  }
  KOKKOS_INLINE_FUNCTION void init(value_type& value) const {
    value.set(order_key_max<T>(), order_key_min<T>());
  }
  KOKKOS_INLINE_FUNCTION value_type& reference() const { return *result.data(); }
  KOKKOS_INLINE_FUNCTION result_view_type view() const { return result; }
  KOKKOS_INLINE_FUNCTION bool references_scalar() const { return false; }
};

/// The work of the value-range reduction: segment s is [s * segment, (s + 1) * segment) of
/// [data, data + count). A backend may run it compiled for other instructions
/// (kernels/backend/host.hpp); the result is the same integer min/max whatever runs it.
template <class T>
struct value_range_segments {
  using element_type = T;
  const T* data;
  std::uint64_t count;
  std::uint64_t segment;
  bits_t<T> fill_bits;
  bits_t<T> fill_enabled;

  KOKKOS_INLINE_FUNCTION std::uint64_t segments() const {
    return (count + segment - 1) / segment;
  }
  KOKKOS_INLINE_FUNCTION void operator()(std::uint64_t s, packed_range<T>& partial) const {
    reduce(s, partial);
  }
  KOKKOS_INLINE_FUNCTION void reduce(std::uint64_t s, packed_range<T>& partial) const {
    const std::uint64_t end = (s + 1) * segment < count ? (s + 1) * segment : count;
    order_key_t<T> lo = partial.low(), hi = partial.high();
    segment_range<T>(data, s * segment, end, fill_bits, fill_enabled, lo, hi);
    partial.set(lo, hi);
  }
};

template <class T>
value_range_segments<T> make_value_range_segments(const T* data, std::uint64_t count,
                                                  bool has_fill, bits_t<T> fill_bits,
                                                  std::uint64_t segment) {
  return {data, count, segment, fill_bits, has_fill ? ~bits_t<T>(0) : bits_t<T>(0)};
}

/// Enqueues the reduction of `segments` (value_range_segments or a functor derived from it)
/// into `result`. Asynchronous when `result` is in memory the execution space writes.
template <class Exec, class Segments, class ResultView>
void enqueue_range_reduction(const Exec& exec, const Segments& segments,
                             const ResultView& result) {
  using T = typename Segments::element_type;
  Kokkos::parallel_reduce("kompress::value_range",
                          Kokkos::RangePolicy<Exec>(exec, 0, segments.segments()), segments,
                          range_reducer<T, typename ResultView::memory_space>{result});
}

}  // namespace kompress::inline v0::detail
