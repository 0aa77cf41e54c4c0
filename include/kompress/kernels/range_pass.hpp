#pragma once
// The value range a REL bound resolves against, read back on the host (kompress::absolute_bound,
// the collectives), by the backend's range reduction: the one compress runs, AVX2 where the
// host has it (on 32 MiB of DLRM lookups 1.5 ms against 4.0 ms for the portable loop on one
// core, docs/performance.md, "Collectives").

#include <kompress/bound.hpp>
#include <kompress/codec/quantizer.hpp>
#include <kompress/kernels/backend/backend.hpp>
#include <kompress/kernels/value_range.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>

namespace kompress::inline v0::detail {

/// Order keys of the value range of [data, data + count): finite values other than the fill
/// value (when `has_fill`); low > high when none counted. Waits for `exec`.
template <class Exec, class T>
packed_range<T> range_keys(const Exec& exec, const T* data, std::size_t count, bool has_fill, bits_t<T> fill_bits) {
  packed_range<T> keys;
  keys.set(order_key_max<T>(), order_key_min<T>());
  if (count == 0) return keys;
  const kernel_tuning tuning = backend<Exec>::tuning();
  backend<Exec>::enqueue_value_range(
      exec, make_value_range_segments(data, count, has_fill, fill_bits, tuning.range_segment),
      Kokkos::View<packed_range<T>, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(&keys), tuning.encoder);
  exec.fence("kompress: value range read on the host");
  return keys;
}

/// The union of two ranges of order keys.
template <class T>
packed_range<T> join_keys(const packed_range<T>& a, const packed_range<T>& b) {
  packed_range<T> keys;
  keys.set(std::min(a.low(), b.low()), std::max(a.high(), b.high()));
  return keys;
}

template <class T>
value_range to_value_range(const packed_range<T>& keys) {
  value_range range;
  if (keys.low() <= keys.high()) {
    range.min = static_cast<double>(from_order_key<T>(keys.low()));
    range.max = static_cast<double>(from_order_key<T>(keys.high()));
  }
  return range;
}

/// The value range of [data, data + count) (finite values, not the fill value), by the backend.
template <class Exec, class T>
value_range backend_value_range(const Exec& exec, const T* data, std::size_t count, bool has_fill,
                                bits_t<T> fill_bits) {
  return to_value_range(range_keys(exec, data, count, has_fill, fill_bits));
}

/// The fill value's bits in T (0 without one).
template <class T>
bits_t<T> fill_bits_of(const compress_options& options) {
  return options.fill_value ? to_bits(static_cast<T>(*options.fill_value)) : bits_t<T>(0);
}

/// The absolute bound of `options` for values whose range `keys` holds (resolve_bound).
template <class T>
double bound_for(const compress_options& options, const packed_range<T>& keys) {
  if (options.bound.mode == bound_mode::absolute) return options.bound.value;
  const value_range range = to_value_range(keys);
  return resolve_bound(options.bound, range.min, range.max);
}

}  // namespace kompress::inline v0::detail
