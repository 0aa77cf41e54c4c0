#pragma once
// The value range the collectives resolve a REL bound against, by the backend's range reduction
// (the one compress runs, AVX2 where the host has it), where detail::compute_value_range runs
// the portable loop: on 32 MiB of DLRM lookups 1.5 ms against 4.0 ms on one core
// (docs/performance.md, "Collectives"). At 10 Gb/s every collective call is CPU-bound, so the
// range pass is paid in full before the first chunk leaves.

#include <kompress/bound.hpp>
#include <kompress/codec/quantizer.hpp>
#include <kompress/kernels/backend/backend.hpp>
#include <kompress/kernels/value_range.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <limits>

namespace kompress::inline v0::detail {

/// Order keys of the value range of [data, data + count): finite values other than the fill
/// value (when `has_fill`); low > high when none counted. Waits for `exec`.
template <class Exec, class T>
packed_range<T> range_keys(const Exec& exec, const T* data, std::size_t count, bool has_fill, bits_t<T> fill_bits) {
  packed_range<T> keys;
  keys.set(std::numeric_limits<order_key_t<T>>::max(), std::numeric_limits<order_key_t<T>>::min());
  if (count == 0) return keys;
  const kernel_tuning tuning = backend<Exec>::tuning();
  backend<Exec>::enqueue_value_range(
      exec, make_value_range_segments(data, count, has_fill, fill_bits, tuning.range_segment),
      Kokkos::View<packed_range<T>, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(&keys), tuning.encoder);
  exec.fence("kompress: value range read on the host");
  return keys;
}

/// The value range of [data, data + count) as compute_value_range gives it, by the backend.
template <class Exec, class T>
value_range backend_value_range(const Exec& exec, const T* data, std::size_t count, bool has_fill,
                                bits_t<T> fill_bits) {
  const packed_range<T> keys = range_keys(exec, data, count, has_fill, fill_bits);
  value_range range;
  if (keys.low() <= keys.high()) {
    range.min = static_cast<double>(from_order_key<T>(keys.low()));
    range.max = static_cast<double>(from_order_key<T>(keys.high()));
  }
  return range;
}

/// The absolute bound compress(exec, values, out, options) promises for [data, data + count):
/// kompress::absolute_bound's result, by the backend's range reduction.
template <class Exec, class T>
double resolve_bound(const Exec& exec, const T* data, std::size_t count, const compress_options& options) {
  if (options.bound.mode == bound_mode::absolute) return options.bound.value;
  const bits_t<T> fill = options.fill_value ? to_bits(static_cast<T>(*options.fill_value)) : bits_t<T>(0);
  const value_range range = backend_value_range(exec, data, count, options.fill_value.has_value(), fill);
  return relative_to_absolute(options.bound.value, range.min, range.max);
}

}  // namespace kompress::inline v0::detail
