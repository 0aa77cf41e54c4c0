#pragma once
// Bounds relative to each group's own range (stash_save_options::group_relative; docs/stash.md,
// "Bounds relative to each group"). Group g holds values [256 g, 256 g + 256) of a save. Its
// exponent k_g is floor(log2) of the range of its finite values, clamped to
// group_exponent_limits<T>. The save stores y = x 2^-k_g within r (1 - 2^-20) of y, and
// restore gives x'' = y'' 2^k_g. A product by a power of two is exact unless it leaves the
// normal numbers; the rounding there is at most the least subnormal, and
// 2^-20 r covers it twice for every r >= group_relative_min, so every value is within r 2^k_g.
// The exponents are stored as int16, padded to 16 bytes (the pool's alignment).

#include <kompress/error.hpp>

#include <Kokkos_BitManipulation.hpp>
#include <Kokkos_Core.hpp>
#include <Kokkos_NumericTraits.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

namespace kompress::inline v0::detail {

inline constexpr std::size_t group_values = 256;
using group_exponent = std::int16_t;

/// The smallest relative bound a group-relative save takes (above 0, which is lossless and
/// scales nothing): below it the subnormal roundings of the scaling could reach the bound.
inline constexpr double group_relative_min = 0x1p-28;

/// The bound the scaled values are compressed within: the rest of r is the scaling's rounding.
constexpr double group_codec_bound(double r) { return r * (1.0 - 0x1p-20); }

constexpr std::size_t group_count(std::size_t count) { return (count + group_values - 1) / group_values; }
constexpr std::size_t group_scale_bytes(std::size_t count) {
  return (group_count(count) * sizeof(group_exponent) + 15) / 16 * 16;
}

/// k_g's range: 2^-k and 2^k are exact T for every k in it, y stays finite (|y| < 2^26 for float,
/// 2^55 for double), and a scaled-back value that rounds to a subnormal is off by less than
/// 2^-20 r 2^k (docs/stash.md).
template <class T>
struct group_exponent_limits;
template <>
struct group_exponent_limits<float> {
  static constexpr int low = -100, high = 127;
};
template <>
struct group_exponent_limits<double> {
  static constexpr int low = -1000, high = 1023;
};

/// 2^k as T, exactly, for k in group_exponent_limits<T> widened by one (a subnormal at the low end).
template <class T>
KOKKOS_INLINE_FUNCTION T power_of_two(int k) {
  using bits_type = std::conditional_t<std::is_same_v<T, float>, std::uint32_t, std::uint64_t>;
  constexpr int mantissa = std::numeric_limits<T>::digits - 1;
  constexpr int bias = std::numeric_limits<T>::max_exponent - 1;
  const bits_type bits = k > -bias ? bits_type(k + bias) << mantissa : bits_type(1) << (mantissa + k + bias - 1);
  return Kokkos::bit_cast<T>(bits);
}

/// floor(log2(v)) of a finite v > 0 in double, clamped to [low, high]; infinity gives high.
KOKKOS_INLINE_FUNCTION int clamped_floor_log2(double v, int low, int high) {
  if (!(v >= 0x1p-1022)) return low;  // subnormal doubles are far below every low
  const int k = int((Kokkos::bit_cast<std::uint64_t>(v) >> 52) & 0x7ff) - 1023;  // 1024: infinity
  return k < low ? low : k > high ? high : k;
}

/// Each group's exponent, and whether any value has its sign bit set (-0.0 included).
struct group_exponents_result {
  int max_exponent = std::numeric_limits<int>::min();
  bool has_negative = false;
};

template <class T>
struct group_exponents_functor {
  const T* values;
  group_exponent* exponents;
  std::size_t count;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t g, int& max_exponent, int& negative) const {
    using limits = group_exponent_limits<T>;
    const std::size_t first = g * group_values;
    const std::size_t last = first + group_values < count ? first + group_values : count;
    T low = Kokkos::Experimental::infinity_v<T>, high = -Kokkos::Experimental::infinity_v<T>, largest = T(0);
    bool any_finite = false;
    for (std::size_t i = first; i < last; ++i) {
      const T x = values[i];
      negative |= int(Kokkos::signbit(x));
      if (!Kokkos::isfinite(x)) continue;
      any_finite = true;
      low = x < low ? x : low;
      high = x > high ? x : high;
      const T magnitude = Kokkos::fabs(x);
      largest = magnitude > largest ? magnitude : largest;
    }
    int k = limits::low;
    if (any_finite) {
      const double range = double(high) - double(low);  // may overflow to infinity: k = high
      // A constant group: any exponent keeps it exact; its magnitude's keeps y near 1.
      k = clamped_floor_log2(range > 0.0 ? range : double(largest), limits::low, limits::high);
    }
    exponents[g] = group_exponent(k);
    max_exponent = k > max_exponent ? k : max_exponent;
  }
};

/// Writes the exponents of the groups of `values[0, count)` to `exponents` (device memory of
/// the execution space) and returns their largest and whether a value is negative. Waits.
template <class T, class ExecutionSpace>
group_exponents_result find_group_exponents(const ExecutionSpace& exec, const T* values, std::size_t count,
                                            group_exponent* exponents) {
  group_exponents_result result;
  const std::size_t groups = group_count(count);
  if (groups == 0) return result;
  int negative = 0;
  Kokkos::parallel_reduce("kompress::stash::group_exponents",
                          Kokkos::RangePolicy<ExecutionSpace>(exec, 0, groups),
                          group_exponents_functor<T>{values, exponents, count}, Kokkos::Max<int>(result.max_exponent),
                          Kokkos::LOr<int>(negative));
  result.has_negative = negative != 0;
  return result;
}

/// The blocks of 32 values, aligned to the save's first value, that [first, first + n) meets:
/// each lies in one group, so a thread scales its block by one power of two, in a loop of 32
/// that vectorises where the block is whole, and the signs of activations (as good as random)
/// cost no branch.
struct group_blocks {
  std::size_t first, last, first_block;
  KOKKOS_INLINE_FUNCTION std::size_t begin(std::size_t b) const {
    const std::size_t start = 32 * (first_block + b);
    return start > first ? start : first;
  }
  KOKKOS_INLINE_FUNCTION std::size_t end(std::size_t b) const {
    const std::size_t stop = 32 * (first_block + b) + 32;
    return stop < last ? stop : last;
  }
  std::size_t count() const { return last > first ? (last - 1) / 32 + 1 - first_block : 0; }
};

template <class T>
KOKKOS_INLINE_FUNCTION T scaled_down(T x, T scale) {
  const T y = x * scale;
  return x > T(0) && !(y > T(0)) ? Kokkos::Experimental::denorm_min_v<T> : y;
}

template <class T>
KOKKOS_INLINE_FUNCTION T scaled_up(T y, T scale) {
  const T x = y * scale;
  const T finite = Kokkos::fabs(x) > Kokkos::Experimental::finite_max_v<T> &&
                           Kokkos::fabs(y) <= Kokkos::Experimental::finite_max_v<T>
                       ? Kokkos::copysign(Kokkos::Experimental::finite_max_v<T>, y)
                       : x;
  return y > T(0) && !(finite > T(0)) ? Kokkos::Experimental::denorm_min_v<T> : finite;
}

/// out[i] = values[first + i] 2^-k_g for i < n, g = (first + i) / group_values. A positive value
/// the product takes to 0 becomes the least positive one, so that its sign bit stays set.
template <class T, class ExecutionSpace>
void scale_down_groups(const ExecutionSpace& exec, const T* values, std::size_t first, std::size_t n,
                       const group_exponent* exponents, T* out) {
  const group_blocks blocks{first, first + n, first / 32};
  Kokkos::parallel_for(
      "kompress::stash::scale_down_groups", Kokkos::RangePolicy<ExecutionSpace>(exec, 0, blocks.count()),
      KOKKOS_LAMBDA(const std::size_t b) {
        const std::size_t begin = blocks.begin(b), end = blocks.end(b);
        const T scale = power_of_two<T>(-int(exponents[begin / group_values]));
        const T* const in = values + begin;
        T* const to = out + (begin - first);
        if (end - begin == 32) {
          for (std::size_t i = 0; i < 32; ++i) to[i] = scaled_down(in[i], scale);
        } else {
          for (std::size_t i = 0; i < end - begin; ++i) to[i] = scaled_down(in[i], scale);
        }
      });
}

/// The positive values of values [first, first + count) of a save, packed in order (`packed`,
/// sign_bits.hpp's pack_positives; `signs`: their sign bits, bit j of word j / 32 for value
/// first + j), scaled by 2^-k_g in place as scale_down_groups scales them. The piece is cut
/// into its runs within one group; a scan over the runs' counts of set bits says where each
/// run's positive values lie.
template <class T, class ExecutionSpace>
void scale_down_packed_groups(const ExecutionSpace& exec, const std::byte* signs, std::size_t first,
                              std::size_t count, T* packed, const group_exponent* exponents) {
  if (count == 0) return;
  const auto* const words = reinterpret_cast<const std::uint32_t*>(signs);
  const std::size_t head = group_values - first % group_values;  // values in the first run
  const std::size_t runs = head >= count ? 1 : 1 + (count - head + group_values - 1) / group_values;
  Kokkos::parallel_scan(
      "kompress::stash::scale_down_packed_groups", Kokkos::RangePolicy<ExecutionSpace>(exec, 0, runs),
      KOKKOS_LAMBDA(const std::size_t run, std::size_t& before, const bool final) {
        const std::size_t begin = run == 0 ? 0 : head + (run - 1) * group_values;
        const std::size_t end = begin + (run == 0 ? head : group_values) < count
                                    ? begin + (run == 0 ? head : group_values)
                                    : count;
        std::size_t positives = 0;
        for (std::size_t w = begin / 32; w * 32 < end; ++w) {
          std::uint32_t bits = words[w];
          if (w * 32 < begin) bits &= ~0u << (begin - w * 32);
          if (end < w * 32 + 32) bits &= ~(~0u << (end - w * 32));
          positives += std::size_t(Kokkos::popcount(bits));
        }
        if (final) {
          const T scale = power_of_two<T>(-int(exponents[(first + begin) / group_values]));
          for (std::size_t i = before; i < before + positives; ++i) packed[i] = scaled_down(packed[i], scale);
        }
        before += positives;
      });
}

/// values[i] = values[i] 2^k_g in place for i < count. A product past the largest finite value
/// becomes that value (the saved one was finite and at most it), and a positive value the
/// product takes to 0 the least positive one (its sign as saved).
template <class T, class ExecutionSpace>
void scale_up_groups(const ExecutionSpace& exec, T* values, std::size_t count, const group_exponent* exponents) {
  const group_blocks blocks{0, count, 0};
  Kokkos::parallel_for(
      "kompress::stash::scale_up_groups", Kokkos::RangePolicy<ExecutionSpace>(exec, 0, blocks.count()),
      KOKKOS_LAMBDA(const std::size_t b) {
        const std::size_t begin = blocks.begin(b), end = blocks.end(b);
        const T scale = power_of_two<T>(int(exponents[begin / group_values]));
        T* const block = values + begin;
        if (end - begin == 32) {
          for (std::size_t i = 0; i < 32; ++i) block[i] = scaled_up(block[i], scale);
        } else {
          for (std::size_t i = 0; i < end - begin; ++i) block[i] = scaled_up(block[i], scale);
        }
      });
}

/// Throws invalid_argument unless a group-relative save's bound can be kept (a relative bound,
/// 0 or at least group_relative_min).
inline void check_group_relative(bool relative, double r, const char* who) {
  if (!relative)
    throw invalid_argument(std::string(who) +
                           ": group_relative needs a relative bound (a fraction of each group's range)");
  if (r != 0.0 && r < group_relative_min)
    throw invalid_argument(std::string(who) + ": group_relative bounds must be 0 or at least 2^-28 (got " +
                           std::to_string(r) + ")");
}

}  // namespace kompress::inline v0::detail
