#pragma once
// Error bounds and compression options.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>

namespace kompress {
inline namespace v0 {

enum class bound_mode : std::uint8_t {
  absolute = 0,  ///< |x - x'| <= value
  relative = 1,  ///< |x - x'| <= value * (max - min), over the finite, non-fill values
};

/// A pointwise error bound: every decompressed value x' satisfies |x - x'| <= the absolute
/// bound it resolves to. A bound of 0 is lossless.
struct error_bound {
  bound_mode mode = bound_mode::absolute;
  double value = 0.0;
};

/// |x - x'| <= bound.
constexpr error_bound absolute(double bound) { return {bound_mode::absolute, bound}; }
/// |x - x'| <= fraction * (max - min) of the array's finite, non-fill values.
constexpr error_bound relative(double fraction) { return {bound_mode::relative, fraction}; }
/// Bit-exact.
constexpr error_bound lossless() { return {bound_mode::absolute, 0.0}; }

/// Which codec writes the stream (docs/format.md). Both keep the same bound, special values
/// and determinism; the stream records its mode and decompress reads either.
enum class codec_mode : std::uint8_t {
  fast = 0,   ///< format 1.0: blocks of 32-128 values with one width each (the default)
  ratio = 1,  ///< format 1.2: chunks of 4096 values, predicted codes in zero-eliminated bit planes or Rice codes
};

/// How a value becomes a code (docs/error-bound.md). Both keep |x - x'| <= e.
enum class rounding_mode : std::uint8_t {
  nearest = 0,     ///< the nearest code, step 2e: deterministic, the fewest bits
  stochastic = 1,  ///< step e, up or down with the probability that makes E[x'] = x: one bit more
};

struct compress_options {
  error_bound bound = lossless();
  /// Values bit-identical to this one (converted to the element type) come back bit-exact and
  /// are left out of the relative bound's value range: netCDF's _FillValue, land masks.
  std::optional<double> fill_value = std::nullopt;
  /// Values per block: 32, 64 or 128. Recorded in the stream.
  int block_size = 32;
  /// The codec. codec_mode::ratio ignores block_size (its chunks have their own layout).
  codec_mode codec = codec_mode::fast;
  /// rounding_mode::stochastic draws each rounding from a hash of the value's index and
  /// `rounding_seed`: the same seed writes the same bytes everywhere, another one independent
  /// roundings. Decoders need neither.
  rounding_mode rounding = rounding_mode::nearest;
  std::uint64_t rounding_seed = 0;
};

/// Options of the allocating decompress<T>(exec, stream, options).
struct decompress_options {
  /// The most bytes it may allocate for the decoded values: a stream that decodes to more is
  /// refused with resource_error before anything is allocated. A well-formed stream can decode
  /// to some 1560 times its size (constant doubles in ratio chunks: 32 GiB from 22 MB), so set
  /// one where streams come from outside. The default is no limit.
  std::size_t max_output_bytes = std::numeric_limits<std::size_t>::max();
};

}  // namespace v0
}  // namespace kompress
