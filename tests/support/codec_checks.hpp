#pragma once
// Round trips through kompress::compress/decompress on the build's default execution space
// (Kokkos::Cuda's device memory in a CUDA build, the host under OpenMP), and the exact bound
// check every codec test uses: |x - x'| <= e for every element, no slack; NaN, Inf, -0.0 and
// fill values bit-exact. Values and streams reach the host only through deep_copy.

// The codec's headers alone: a change to the stash does not recompile the codec suites.
#include <kompress/bound.hpp>
#include <kompress/compress.hpp>
#include <kompress/detail/bytes.hpp>
#include <kompress/detail/checksum.hpp>
#include <kompress/format.hpp>

#include <Kokkos_Core.hpp>
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace kompress::test {

/// Where the round trips run: the build's default execution space and its memory space.
using default_exec = Kokkos::DefaultExecutionSpace;
using default_memory = default_exec::memory_space;

template <class T>
using host_unmanaged = Kokkos::View<T*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>;

/// A View of the default memory space holding a copy of `values`.
template <class T>
Kokkos::View<T*, default_memory> to_default_space(std::span<const T> values) {
  Kokkos::View<T*, default_memory> view(Kokkos::view_alloc(Kokkos::WithoutInitializing, "values"),
                                        values.size());
  Kokkos::deep_copy(view, host_unmanaged<const T>(values.data(), values.size()));
  return view;
}

template <class T>
Kokkos::View<T*, default_memory> to_default_space(const std::vector<T>& values) {
  return to_default_space(std::span<const T>(values));
}

/// The elements of a contiguous View of any rank and memory space, in memory order, on the host.
template <class View>
std::vector<typename View::non_const_value_type> to_host(const View& view) {
  using T = typename View::non_const_value_type;
  std::vector<T> values(view.size());
  Kokkos::deep_copy(host_unmanaged<T>(values.data(), values.size()),
                    Kokkos::View<const T*, typename View::memory_space, Kokkos::MemoryUnmanaged>(
                        view.data(), view.size()));
  return values;
}

/// The first `length` bytes of a stream View of any memory space, on the host.
template <class View>
std::vector<std::byte> stream_bytes(const View& stream, std::size_t length) {
  return to_host(Kokkos::subview(stream, std::pair<std::size_t, std::size_t>(0, length)));
}

/// The values a stream (host bytes) decodes to, decompressed on the default execution space
/// from a copy of the stream in its memory space.
template <class T>
std::vector<T> decompress_on_default(std::span<const std::byte> stream, std::size_t count) {
  const auto device_stream = to_default_space(stream);
  Kokkos::View<T*, default_memory> out("decoded", count);
  kompress::decompress(default_exec{}, device_stream, out);
  return to_host(out);
}

template <class T>
struct round_trip_result {
  std::vector<T> decoded;
  std::vector<std::byte> stream;
  kompress::stream_info info;
  double ratio() const { return double(decoded.size() * sizeof(T)) / double(stream.size()); }
};

/// Round trip of a host View of any rank and layout (values in memory order): compressed on the
/// default execution space from a copy in its memory space (same layout and extents; no copy
/// where that is the host), inspected on the host, decompressed on the default space.
template <class InView>
round_trip_result<typename InView::non_const_value_type> round_trip_view(
    const InView& in, const kompress::compress_options& options) {
  using T = typename InView::non_const_value_type;
  const default_exec exec;
  const auto device_in = Kokkos::create_mirror_view_and_copy(default_memory{}, in);
  Kokkos::View<std::byte*, default_memory> buffer("stream", kompress::max_compressed_size(device_in, options));
  const std::size_t length = kompress::compress(exec, device_in, buffer, options);
  REQUIRE(length <= buffer.size());
  const auto stream = Kokkos::subview(buffer, std::pair<std::size_t, std::size_t>(0, length));
  round_trip_result<T> result;
  result.stream = stream_bytes(buffer, length);
  result.info = kompress::inspect(host_unmanaged<const std::byte>(result.stream.data(), length));
  Kokkos::View<T*, default_memory> out("decoded", in.size());
  kompress::decompress(exec, stream, out);
  result.decoded = to_host(out);
  return result;
}

template <class T>
round_trip_result<T> round_trip(std::span<const T> values, const kompress::compress_options& options) {
  return round_trip_view(host_unmanaged<const T>(values.data(), values.size()), options);
}

/// Calls f with an unmanaged host View over `values` of the given extents (rank 1 to 4) in
/// layout `Layout`.
template <class Layout, class T, class F>
decltype(auto) with_view(std::span<const T> values, const std::vector<std::size_t>& extents, F&& f) {
  using unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;
  const auto e = [&](std::size_t d) { return d < extents.size() ? extents[d] : std::size_t(1); };
  switch (extents.size()) {
    case 2: return f(Kokkos::View<const T**, Layout, Kokkos::HostSpace, unmanaged>(values.data(), e(0), e(1)));
    case 3: return f(Kokkos::View<const T***, Layout, Kokkos::HostSpace, unmanaged>(values.data(), e(0), e(1), e(2)));
    case 4: return f(Kokkos::View<const T****, Layout, Kokkos::HostSpace, unmanaged>(values.data(), e(0), e(1), e(2), e(3)));
    default: return f(Kokkos::View<const T*, Layout, Kokkos::HostSpace, unmanaged>(values.data(), values.size()));
  }
}

template <class T>
std::uint64_t bits(T x) {
  if constexpr (sizeof(T) == 4) {
    std::uint32_t b;
    std::memcpy(&b, &x, 4);
    return b;
  } else {
    std::uint64_t b;
    std::memcpy(&b, &x, 8);
    return b;
  }
}

/// The absolute bound a bound resolves to, computed here independently of the library:
/// relative bounds over the finite values that are not the fill value.
template <class T>
double expected_abs_bound(std::span<const T> values, const kompress::error_bound& bound,
                          std::optional<double> fill = std::nullopt) {
  if (bound.mode == kompress::bound_mode::absolute) return bound.value;
  double low = INFINITY, high = -INFINITY;
  for (T x : values) {
    if (!std::isfinite(x)) continue;
    if (fill && bits(x) == bits(static_cast<T>(*fill))) continue;
    low = std::min(low, double(x));
    high = std::max(high, double(x));
  }
  return low <= high ? bound.value * (high - low) : 0.0;
}

/// r * (max - min) over the finite, non-fill values, in long double: finite where the double
/// range overflows (x86-64's 80-bit and the 128-bit formats both reach 1e4932).
template <class T>
long double exact_relative_bound(std::span<const T> values, double r,
                                 std::optional<double> fill = std::nullopt) {
  static_assert(std::numeric_limits<long double>::max_exponent > 1025,
                "kompress tests: long double must have a wider exponent range than double");
  long double low = INFINITY, high = -INFINITY;
  for (T x : values) {
    if (!std::isfinite(x)) continue;
    if (fill && bits(x) == bits(static_cast<T>(*fill))) continue;
    low = std::min(low, (long double)x);
    high = std::max(high, (long double)x);
  }
  return low <= high ? (long double)r * (high - low) : 0.0L;
}

struct bound_check {
  std::size_t violations = 0;
  std::size_t first_violation = 0;
  double max_error = 0.0;
};

/// Every element within `abs_bound`; non-finite, -0.0 and fill values bit-exact.
template <class T>
bound_check check_bound(std::span<const T> original, std::span<const T> decoded, double abs_bound,
                        std::optional<double> fill = std::nullopt) {
  bound_check check;
  REQUIRE(original.size() == decoded.size());
  for (std::size_t i = 0; i < original.size(); ++i) {
    const T x = original[i], y = decoded[i];
    const bool exact_required = !std::isfinite(x) || (x == T(0) && std::signbit(x)) ||
                                (fill && bits(x) == bits(static_cast<T>(*fill)));
    bool ok;
    if (exact_required) {
      ok = bits(x) == bits(y);
    } else {
      const double error = std::fabs(double(x) - double(y));
      ok = error <= abs_bound;
      if (error > check.max_error) check.max_error = error;
    }
    if (!ok && check.violations++ == 0) check.first_violation = i;
  }
  return check;
}

/// Round trip plus the bound check; returns the result for further checks. With `extents`
/// (rank 1 to 4), the values are compressed as a View of that shape in `Layout`.
template <class T, class Layout = Kokkos::LayoutRight>
round_trip_result<T> require_round_trip(std::span<const T> values, const kompress::compress_options& options,
                                        const std::vector<std::size_t>& extents = {}) {
  auto result = extents.empty() ? round_trip(values, options)
                                : with_view<Layout>(values, extents, [&](const auto& view) {
                                    return round_trip_view(view, options);
                                  });
  double abs_bound = expected_abs_bound(values, options.bound, options.fill_value);
  if (std::isinf(abs_bound)) {
    // max - min overflows double: the stream's bound must still be at most r * (max - min),
    // here in long double, whose exponent range holds it.
    const long double exact = exact_relative_bound(values, options.bound.value, options.fill_value);
    CHECK(result.info.absolute_bound <= exact);
    if (result.info.absolute_bound != 0.0)
      CHECK(result.info.absolute_bound >=
            std::min(exact, (long double)std::numeric_limits<double>::max()) * (1.0L - 0x1p-40L));
    abs_bound = result.info.absolute_bound;
  }
  // The stream's bound is the one asked for (or 0: lossless, tighter still).
  if (result.info.absolute_bound != 0.0) CHECK(result.info.absolute_bound == abs_bound);
  const bound_check check = check_bound<T>(values, result.decoded, abs_bound, options.fill_value);
  if (check.violations) {
    const std::size_t i = check.first_violation;
    FAIL_CHECK(check.violations << " values out of bound " << abs_bound << "; first at " << i
                                << ": " << double(values[i]) << " -> " << double(result.decoded[i]));
  }
  return result;
}


/// The header of a crafted stream of `count` values: ABS 1e-3 on a grid of 2e-3, values in
/// [0, 0]; callers set the block shape, flags and range they test.
inline kompress::detail::stream_header crafted_header(std::uint64_t count, kompress::element_type type) {
  kompress::detail::stream_header h;
  h.type = type;
  h.mode = kompress::bound_mode::absolute;
  h.count = count;
  h.user_bound = 1e-3;
  h.abs_bound = 1e-3;
  h.quant_step = 2e-3;
  h.value_min = 0.0;
  h.value_max = 0.0;
  return h;
}

/// A stream of header `h` whose every chunk is `chunk_bytes` zero bytes, with valid chunk and
/// header checksums: what passes the checksums and reaches the header's and decoder's checks.
inline std::vector<std::byte> uniform_chunk_stream(kompress::detail::stream_header h, std::uint64_t chunk_bytes) {
  namespace detail = kompress::detail;
  const detail::stream_layout layout = h.layout();
  const std::uint64_t chunks = layout.chunk_count();
  h.stream_bytes = layout.data_offset() + chunks * chunk_bytes;
  std::vector<std::byte> stream(h.stream_bytes);
  detail::write_header_fields(stream.data(), h);
  const std::uint64_t chunk_checksum = detail::checksum_of(stream.data() + layout.data_offset(), chunk_bytes);
  for (std::uint64_t c = 0; c < chunks; ++c) {
    detail::store<std::uint64_t>(stream.data() + layout.chunk_end_table_offset() + 8 * c, (c + 1) * chunk_bytes);
    detail::store<std::uint64_t>(stream.data() + layout.chunk_checksum_table_offset() + 8 * c, chunk_checksum);
  }
  detail::store<std::uint64_t>(stream.data() + detail::header_checksum_offset,
                               detail::header_checksum(stream.data(), layout.data_offset()));
  return stream;
}

}  // namespace kompress::test
