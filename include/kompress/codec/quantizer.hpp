#pragma once
// Quantization against an absolute bound, and the numbers that make the bound unconditional.
// docs/error-bound.md gives the argument; the comments here name its steps.

#include <kompress/bound.hpp>
#include <kompress/detail/bytes.hpp>

#include <cmath>
#include <cstdint>
#include <limits>

#ifdef __FAST_MATH__
#error "kompress: -ffast-math breaks the rounding the error bound relies on; compile without it"
#endif
// The `+ 0.0` that keeps products rounded on their own (below) may be folded away without
// signed zeros (GCC says so with this macro; -fassociative-math implies it).
#ifdef __NO_SIGNED_ZEROS__
#error "kompress: -fno-signed-zeros breaks the rounding the error bound relies on; compile without it"
#endif

namespace kompress::inline v0::detail {

/// Codes stay below 2^50 in magnitude: rounding with the 1.5 * 2^52 constant is exact there,
/// and a code converts to double and back without loss.
inline constexpr double max_code_magnitude = 0x1p50;
inline constexpr double rounding_constant = 0x1.8p52;

/// Everything a block encoder and decoder need to agree on about values.
template <class T>
struct value_codec {
  using bits = bits_t<T>;
  /// Quantization step 2 * e_q, or 0: no block is quantized (lossless streams).
  double step = 0.0;
  /// A value passes verification when the computed |x - x'| is <= this.
  double accept_threshold = 0.0;
  bool has_fill = false;
  bits fill_bits = 0;

  /// 1 / step, or 0.
  double inverse_step = 0.0;
  /// Stochastic rounding (step e, not 2e): codes come from biased_code(x, dither(...)).
  bool stochastic = false;
  std::uint64_t rounding_seed = 0;

  /// The integer nearest to x / step (ties to even), as a double. Exact for |x / step| below
  /// 2^51; larger codes fail verification. The product is rounded on its own before the
  /// rounding constant is added: a compiler that fuses `x * inverse + 0.0` into an FMA still
  /// rounds the product once (adding zero is exact), and `+ 0.0` cannot be folded away while
  /// signed zeros are honoured. So every backend picks the same code and streams are
  /// byte-identical with or without FMA contraction.
  KOMPRESS_FUNCTION double quantize(double x) const {
    return biased_code(x) - rounding_constant;
  }

  /// code + 1.5 * 2^52: for |code| < 2^51 the code is the low bits of this double's bit
  /// pattern, so codes can be compared and subtracted as integers without a conversion.
  KOMPRESS_FUNCTION double biased_code(double x) const {
    const double t = x * inverse_step + 0.0;
    return t + rounding_constant;
  }

  /// biased_code of x + d * step, d in [-1/2, 1/2): rounding to nearest after adding a uniform
  /// dither rounds x / step up with probability frac(x / step). The sum is rounded on its own
  /// (no product is left in it); verification covers that rounding like every other.
  KOMPRESS_FUNCTION double biased_code(double x, double d) const {
    const double t = x * inverse_step + 0.0;
    return (t + d) + rounding_constant;
  }

  /// The key shared by the values whose indices agree above bit 31: blocks and chunks never
  /// straddle a multiple of 2^32, so each takes its key once.
  KOMPRESS_FUNCTION std::uint32_t dither_key(std::uint64_t first_index) const {
    return mix32(static_cast<std::uint32_t>(rounding_seed) ^
                 mix32(static_cast<std::uint32_t>(rounding_seed >> 32) +
                       0x9E3779B9u * static_cast<std::uint32_t>(first_index >> 32) + 0x85EBCA6Bu));
  }
  /// The dither of the value whose index has low 32 bits `index`: (h / 2^8) * 2^-24 - 1/2, on
  /// the 2^24-point grid of [-1/2, 1/2). Integer arithmetic, so every backend draws the same.
  KOMPRESS_FUNCTION static double dither(std::uint32_t key, std::uint32_t index) {
    return static_cast<double>(static_cast<std::int32_t>(mix32(index ^ key) >> 8)) * 0x1p-24 - 0.5;
  }
  /// A bijective 32-bit mix with full avalanche (C. Wellons' "lowbias32").
  KOMPRESS_FUNCTION static std::uint32_t mix32(std::uint32_t v) {
    v ^= v >> 16;
    v *= 0x7FEB352Du;
    v ^= v >> 15;
    v *= 0x846CA68Bu;
    v ^= v >> 16;
    return v;
  }

  /// The decoder's value for a code; the encoder verifies against exactly this, by calling
  /// this same function. `+ 0.0` makes the product round on its own wherever it is inlined:
  /// contracted, `code * step + 0.0` is fma(code, step, 0) = fl(code * step), the same value,
  /// and the verifier's `x - reconstruct(...)` then has no product left to fuse. Without it a
  /// compiler may fuse `x - code * step` into one FMA that tests the exact product instead of
  /// the rounded one the decoder returns (+Inf next to DBL_MAX). error-bound.md, "Verification".
  KOMPRESS_FUNCTION static T reconstruct(double code, double step) {
    return static_cast<T>(code * step + 0.0);
  }
};

/// std::isfinite and std::nextafter(x, 0.0) for positive finite x, usable on devices too.
KOMPRESS_FUNCTION bool is_finite(double x) {
  constexpr std::uint64_t exponent = 0x7FF0000000000000ull;
  return (to_bits(x) & exponent) != exponent;
}
KOMPRESS_FUNCTION double next_toward_zero(double positive) {
  return from_bits<double>(to_bits(positive) - 1);
}

/// The absolute bound of a relative bound r >= 0 over the range [min, max] of the counted
/// values: r * (max - min), never infinite; 0 when none counted (min > max or NaN). The one
/// place in kompress where a relative bound becomes an absolute one. Where max - min fits in a
/// double this is the plain product (the value streams have always recorded). Where it overflows, the range is taken in halves (exact
/// here: both ends exceed 2^1022 in magnitude) and the result rounded down by 2^-50, so it is
/// at most the exact r * (max - min) (three roundings add at most 3 * 2^-53). A bound beyond
/// DBL_MAX is recorded as DBL_MAX: still below the exact one, and the quantizer caps it anyway.
KOMPRESS_FUNCTION double relative_to_absolute(double r, double min, double max) {
  if (!(min <= max)) return 0.0;
  constexpr double largest = 0x1.fffffffffffffp1023;
  const double range = max - min;
  double e;
  if (is_finite(range)) {
    e = r * range;
  } else {
    const double half_range = max * 0.5 - min * 0.5;
    e = 2.0 * (r * half_range * (1.0 - 0x1p-50));
  }
  return is_finite(e) ? e : largest;
}

/// The absolute bound `bound` promises for values whose range is [min, max] (their finite
/// values, the fill value left out; min > max when none): the bound itself when absolute; when
/// relative, that fraction of the range. The one rule every layer resolves a bound by: the
/// codec's kernels, absolute_bound, the collectives (over what each rank sends, or all ranks'
/// values) and the DLRM exchange (per table).
KOMPRESS_FUNCTION double resolve_bound(const error_bound& bound, double min, double max) {
  return bound.mode == bound_mode::absolute ? bound.value : relative_to_absolute(bound.value, min, max);
}

/// Chooses the step and verification threshold for an absolute bound `bound`, given the
/// largest magnitude `max_abs` among the values that will be quantized.
/// Host and device: compress_async plans on the device, and both must pick the same numbers.
/// With `stochastic`, the step is half as large: a dithered code is within one step of x
/// (docs/error-bound.md, "Stochastic rounding"); the margins and thresholds are the same.
template <class T>
KOMPRESS_FUNCTION value_codec<T> make_value_codec(double bound, double max_abs, bool stochastic = false,
                                                  std::uint64_t rounding_seed = 0) {
  value_codec<T> codec;
  codec.stochastic = stochastic;
  codec.rounding_seed = rounding_seed;
  const double steps_per_bound = stochastic ? 1.0 : 2.0;
  // Keep the arithmetic below finite; a smaller bound than asked is still a valid one.
  const double e = bound < 0x1p1000 ? bound : 0x1p1000;
  const double m = max_abs < 0x1p1000 ? max_abs : 0x1p1000;
  if (!(e > 0.0)) return codec;  // lossless
  if constexpr (std::is_same_v<T, float>) {
    // Reconstruction rounds q * step to float: up to 2^-24 |x'| more error. The margin
    // (4x that, plus the double-precision terms) keeps honest codes well inside the bound.
    const double margin = (m + e) * 0x1p-22;
    codec.step = steps_per_bound * (e - margin);
    // d = x - x' is computed in double from two floats; rounding is monotone, so a computed
    // |d| below e proves the exact |d| <= e.
    codec.accept_threshold = next_toward_zero(e);
  } else {
    // d = x - x' is computed from two doubles (reconstruct leaves no product to fuse) and
    // rounding is monotone, so a threshold below e proves |x - x'| <= e. The threshold's
    // distance from e does not matter for the proof; it is kept as it was to keep the bytes.
    const double margin = (m + e) * 0x1p-48;
    codec.step = steps_per_bound * (e - margin);
    const double threshold = e - (m + e) * 0x1p-49;
    const double below_e = next_toward_zero(e);
    codec.accept_threshold = threshold < below_e ? threshold : below_e;
  }
  if (!(codec.step > 0.0) || !is_finite(codec.step) || !is_finite(1.0 / codec.step))
    codec.step = 0.0;
  codec.inverse_step = codec.step > 0.0 ? 1.0 / codec.step : 0.0;
  return codec;
}

}  // namespace kompress::inline v0::detail
