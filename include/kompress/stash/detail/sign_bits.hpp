#pragma once
// The sign bits of a keep_sign save: x > 0 as one bit per value, and restored values put back
// on their saved side of 0 within the same bound (docs/stash.md, "Per-save options").
//
// Layout of one stream's sign bits: the bits in 32-bit words (a multiple of 4 of them), then
// the sum and the count of the values in (0, e] (e: the stream's absolute bound) as the real
// and imaginary parts of one Kokkos::complex<double>. Restore gives a positive value that came
// back <= 0 their mean, the expected value of what the quantizer rounded to 0, rather than a
// fixed point of (0, e] that would shift every such value the same way.
//
// Where every value that is not positive is +0 (a ReLU's output), the bits also say where the
// zeros are: the stash then compresses only the positive values, packed in order
// (pack_positives), and restore puts them back between exact zeros (unpack_positives).

#include <Kokkos_BitManipulation.hpp>
#include <Kokkos_Complex.hpp>
#include <Kokkos_Core.hpp>
#include <Kokkos_NumericTraits.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace kompress::inline v0::detail {

/// Words of bits, a multiple of 4 so that the complex<double> after them (aligned to 16 bytes)
/// is: every stored range starts on 64 bytes.
/// The bit of lane b of a word: a table, so that the loops below test and set bits with a
/// plain AND per value, which vectorises where a shift by a varying count does not (SSE2).
#define KOMPRESS_IMPL_SIGN_LANES                                                                       \
  constexpr std::uint32_t lanes[32] = {                                                             \
      1u << 0,  1u << 1,  1u << 2,  1u << 3,  1u << 4,  1u << 5,  1u << 6,  1u << 7,                \
      1u << 8,  1u << 9,  1u << 10, 1u << 11, 1u << 12, 1u << 13, 1u << 14, 1u << 15,               \
      1u << 16, 1u << 17, 1u << 18, 1u << 19, 1u << 20, 1u << 21, 1u << 22, 1u << 23,               \
      1u << 24, 1u << 25, 1u << 26, 1u << 27, 1u << 28, 1u << 29, 1u << 30, 1u << 31}

constexpr std::size_t sign_words(std::size_t count) { return ((count + 31) / 32 + 3) / 4 * 4; }
static_assert(alignof(Kokkos::complex<double>) <= 4 * sizeof(std::uint32_t));
constexpr std::size_t sign_bytes(std::size_t count) {
  return sign_words(count) * sizeof(std::uint32_t) + sizeof(Kokkos::complex<double>);
}

/// Packs words[w] bit b = values[32 w + b] > 0 (NaN: 0) and reduces the sum and count of the
/// values in (0, e] into the bytes after the words, e = `bound`. Enqueued on `exec`, nothing
/// waits.
template <class T, class ExecutionSpace>
void pack_signs(const ExecutionSpace& exec, const T* values, std::size_t count, std::byte* out, double bound) {
  using memory_space = typename ExecutionSpace::memory_space;
  auto* const words = reinterpret_cast<std::uint32_t*>(out);
  const Kokkos::View<Kokkos::complex<double>, memory_space, Kokkos::MemoryUnmanaged> small_positives(
      reinterpret_cast<Kokkos::complex<double>*>(out + sign_words(count) * sizeof(std::uint32_t)));
  Kokkos::parallel_reduce(
      "kompress::stash::pack_signs",
      Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::size_t>>(exec, 0, sign_words(count)),
      KOKKOS_LAMBDA(const std::size_t w, Kokkos::complex<double>& sum_count) {
        const T e = T(bound);
        const std::size_t first = 32 * w;
        const std::size_t n = first >= count ? 0 : count - first < 32 ? count - first : 32;
        // Without branches (the signs of activations are as good as random: a mispredicted
        // branch per value costs more than the rest), and a fixed trip count for whole words.
        // The sum takes the value masked to its bits or to +0; e rounded to T may be a little
        // off, the mean only has to lie in (0, e'], which restore checks.
        using bits_type = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
        KOMPRESS_IMPL_SIGN_LANES;
        std::uint32_t bits = 0;
        T sum[4] = {}, small[4] = {};  // four chains of adds, which the compiler runs as one vector
        const auto pack = [&](const std::size_t b, const std::size_t chain) {
          const T x = values[first + b];
          const bool positive = x > T(0);
          const bool below = positive & (x <= e);
          bits |= lanes[b] & (0u - std::uint32_t(positive));
          sum[chain] += Kokkos::bit_cast<T>(Kokkos::bit_cast<bits_type>(x) & (bits_type(0) - bits_type(below)));
          small[chain] += T(below);
        };
        if (n == 32) {
          for (std::size_t b = 0; b < 32; b += 4) {
            pack(b, 0);
            pack(b + 1, 1);
            pack(b + 2, 2);
            pack(b + 3, 3);
          }
        } else {
          for (std::size_t b = 0; b < n; ++b) pack(b, 0);
        }
        words[w] = bits;
        sum_count += Kokkos::complex<double>(double(sum[0]) + double(sum[1]) + double(sum[2]) + double(sum[3]),
                                             double(small[0]) + double(small[1]) + double(small[2]) + double(small[3]));
      },
      Kokkos::Sum<Kokkos::complex<double>, memory_space>(small_positives));
}

/// What a positive value restored as x' = 0 becomes: the stream's mean of (0, e] when it lies
/// in (0, bound], else half the bound; with stochastic rounding (already unbiased), or where
/// that is no positive value of T, the smallest positive value.
template <class T>
KOKKOS_INLINE_FUNCTION T positive_at_zero(const Kokkos::complex<double>& sum_count, double bound, bool stochastic) {
  const double mean = sum_count.imag() > 0.0 ? sum_count.real() / sum_count.imag() : 0.0;
  T at_zero = T(mean > 0.0 && mean <= bound ? mean : bound * 0.5);
  if (stochastic || !(at_zero > T(0) && double(at_zero) <= bound)) at_zero = Kokkos::Experimental::denorm_min_v<T>;
  return at_zero;
}

/// What a positive value restored as x' < 0 becomes: the midpoint of (0, x' + bound], where it
/// lies, at least the smallest positive value.
template <class T>
KOKKOS_INLINE_FUNCTION T positive_below_zero(T restored, double bound) {
  const T inside = T((double(restored) + bound) * 0.5);
  return inside > T(0) ? inside : Kokkos::Experimental::denorm_min_v<T>;
}

/// Puts every restored value x' back on the side of 0 its bit records, within `bound` of the
/// saved x when x' was: a set bit with x' <= 0 means x in (0, x' + bound], and any point of
/// that range is within x' + bound <= bound of x (for x' = 0 the stream's mean of (0, e] when
/// it lies in (0, bound], else half the bound; for x' < 0 the range's midpoint; at least the
/// smallest positive value); a clear bit with x' > 0 means x in [x' - bound, 0], and +0 is
/// within bound - x' of x. With `stochastic` rounding x' = 0 takes the smallest positive value
/// instead of the mean: the rounding was already unbiased, the mean would shift it up.
/// Enqueued on `exec`.
template <class T, class ExecutionSpace>
void apply_signs(const ExecutionSpace& exec, const std::byte* in, T* values, std::size_t count, double bound,
                 bool stochastic = false) {
  const auto* const words = reinterpret_cast<const std::uint32_t*>(in);
  const auto* const small_positives =
      reinterpret_cast<const Kokkos::complex<double>*>(in + sign_words(count) * sizeof(std::uint32_t));
  Kokkos::parallel_for(
      "kompress::stash::apply_signs",
      Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::size_t>>(exec, 0, (count + 31) / 32),
      KOKKOS_LAMBDA(const std::size_t w) {
        // x' = 0 (the quantizer's grid has a point there: the common case) takes the mean;
        // any other x' <= 0 half of (x' + bound).
        const T at_zero = positive_at_zero<T>(*small_positives, bound, stochastic);
        const std::size_t first = 32 * w;
        const std::size_t n = count - first < 32 ? count - first : 32;
        const std::uint32_t bits = words[w];
        KOMPRESS_IMPL_SIGN_LANES;
        bool below_zero = false;  // a set bit and x' < 0: rare (a block stored as a constant < 0)
        for (std::size_t b = 0; b < n; ++b) below_zero |= ((bits & lanes[b]) != 0) & (values[first + b] < T(0));
        if (below_zero) {
          for (std::size_t b = 0; b < n; ++b) {
            const T x = values[first + b];
            if (!((bits >> b) & 1u)) {
              if (x > T(0)) values[first + b] = T(0);
            } else if (x < T(0)) {  // x lies in (0, x' + bound]
              values[first + b] = positive_below_zero(x, bound);
            } else if (!(x > T(0))) {
              values[first + b] = at_zero;
            }
          }
          return;
        }
        // Without branches, as pack_signs: the value's bits, at_zero's or +0's, chosen by masks.
        using bits_type = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
        const bits_type zero_bits = Kokkos::bit_cast<bits_type>(at_zero);
        const auto apply = [&](const std::size_t b) {
          const T x = values[first + b];
          const bool positive = (bits & lanes[b]) != 0;
          const bool restored_positive = x > T(0);
          const bits_type up = bits_type(0) - bits_type(positive & !restored_positive);
          const bits_type keep = bits_type(0) - bits_type(positive == restored_positive);  // NaN: both false
          values[first + b] = Kokkos::bit_cast<T>((Kokkos::bit_cast<bits_type>(x) & keep) | (zero_bits & up));
        };
        if (n == 32)
          for (std::size_t b = 0; b < 32; ++b) apply(b);
        else
          for (std::size_t b = 0; b < n; ++b) apply(b);
      });
}

/// What pack_positives found: how many values it packed, and whether every other value was +0
/// (only then do the sign bits alone restore them).
struct packed_positives {
  std::size_t count = 0;
  bool others_zero = false;
};

/// Copies the positive values among values[0, count) to out[0, P), in order (out must have
/// room for `count`), counts them, and writes their sign bits' words (pack_signs's layout,
/// without the sum and count after them: reduce_small_positives). `count` must be below 2^32:
/// the scan carries the count of positives in the low 32 bits and the number of words holding
/// a value that is neither positive nor +0 (negative, -0.0, NaN) in the high ones. Waits for
/// `exec`.
template <class T, class ExecutionSpace>
packed_positives pack_positives(const ExecutionSpace& exec, const T* values, std::size_t count, T* out,
                                std::byte* signs) {
  using bits_type = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  auto* const words = reinterpret_cast<std::uint32_t*>(signs);
  std::uint64_t total = 0;
  Kokkos::parallel_scan(
      "kompress::stash::pack_positives",
      Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::size_t>>(exec, 0, sign_words(count)),
      KOKKOS_LAMBDA(const std::size_t w, std::uint64_t& prefix, const bool final) {
        const std::size_t first = 32 * w;
        const std::size_t n = first >= count ? 0 : count - first < 32 ? count - first : 32;
        KOMPRESS_IMPL_SIGN_LANES;
        std::uint32_t positive = 0, other = 0;
        const auto classify = [&](const std::size_t b) {
          const T x = values[first + b];
          const std::uint32_t is_positive = 0u - std::uint32_t(x > T(0));
          positive |= lanes[b] & is_positive;
          other |= ~is_positive & (0u - std::uint32_t(Kokkos::bit_cast<bits_type>(x) != 0));
        };
        if (n == 32)
          for (std::size_t b = 0; b < 32; ++b) classify(b);
        else
          for (std::size_t b = 0; b < n; ++b) classify(b);
        if (final) {  // packed without a branch per value, then copied out
          T packed[32];
          int k = 0;
          for (std::size_t b = 0; b < n; ++b) {
            packed[k] = values[first + b];
            k += int((positive >> b) & 1u);
          }
          T* const to = out + (prefix & 0xFFFFFFFFu);
          for (int j = 0; j < k; ++j) to[j] = packed[j];
          words[w] = positive;
        }
        prefix += std::uint64_t(Kokkos::popcount(positive)) + (std::uint64_t(other != 0) << 32);
      },
      total);
  return {std::size_t(total & 0xFFFFFFFFu), (total >> 32) == 0};
}

/// pack_signs's sum and count of the values in (0, bound], from the positive values alone
/// (packed[0, positives), pack_positives's output), into the sign bits of `count` values at
/// `signs`. Enqueued on `exec`.
template <class T, class ExecutionSpace>
void reduce_small_positives(const ExecutionSpace& exec, const T* packed, std::size_t positives, std::byte* signs,
                            std::size_t count, double bound) {
  using memory_space = typename ExecutionSpace::memory_space;
  const Kokkos::View<Kokkos::complex<double>, memory_space, Kokkos::MemoryUnmanaged> small_positives(
      reinterpret_cast<Kokkos::complex<double>*>(signs + sign_words(count) * sizeof(std::uint32_t)));
  if (positives == 0) {
    Kokkos::deep_copy(exec, small_positives, Kokkos::complex<double>(0.0, 0.0));
    return;
  }
  Kokkos::parallel_reduce(
      "kompress::stash::reduce_small_positives",
      Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::size_t>>(exec, 0, (positives + 31) / 32),
      KOKKOS_LAMBDA(const std::size_t g, Kokkos::complex<double>& sum_count) {
        const T e = T(bound);
        const std::size_t first = 32 * g;
        const std::size_t n = positives - first < 32 ? positives - first : 32;
        T sum = 0, small = 0;
        for (std::size_t i = 0; i < n; ++i) {
          const T x = packed[first + i];
          const bool below = x <= e;
          sum += below ? x : T(0);
          small += T(below);
        }
        sum_count += Kokkos::complex<double>(double(sum), double(small));
      },
      Kokkos::Sum<Kokkos::complex<double>, memory_space>(small_positives));
}

/// The inverse of pack_positives given the sign bits packed from the same values, with
/// apply_signs's fix-up: values[i] = the next of `packed` where bit i is set (put back above 0
/// as apply_signs does when it was restored <= 0), +0 where it is clear. `packed` holds the P
/// restored positive values and must be readable one value past them (P < count: the stash
/// packs only segments with a zero). Enqueued on `exec`.
template <class T, class ExecutionSpace>
void unpack_positives(const ExecutionSpace& exec, const std::byte* signs, const T* packed, T* values,
                      std::size_t count, double bound, bool stochastic) {
  const auto* const words = reinterpret_cast<const std::uint32_t*>(signs);
  const auto* const small_positives =
      reinterpret_cast<const Kokkos::complex<double>*>(signs + sign_words(count) * sizeof(std::uint32_t));
  Kokkos::parallel_scan(
      "kompress::stash::unpack_positives",
      Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::size_t>>(exec, 0, (count + 31) / 32),
      KOKKOS_LAMBDA(const std::size_t w, std::size_t& prefix, const bool final) {
        const std::uint32_t bits = words[w];
        if (final) {
          const T at_zero = positive_at_zero<T>(*small_positives, bound, stochastic);
          const std::size_t first = 32 * w;
          const std::size_t n = count - first < 32 ? count - first : 32;
          // Without a branch per value (the bits are as good as random): the word's values are
          // gathered first (every step reads the next packed value, and moves on under a set
          // bit), then each keeps its bits, at_zero's or +0's, chosen by masks in a loop that
          // vectorises. A packed value restored below 0 (rare: a block stored as a constant
          // < 0) redoes the word with branches.
          using bits_type = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
          KOMPRESS_IMPL_SIGN_LANES;
          T gathered[32];
          std::size_t at = prefix;
          for (std::size_t b = 0; b < n; ++b) {
            gathered[b] = packed[at];
            at += (bits >> b) & 1u;
          }
          const bits_type zero_bits = Kokkos::bit_cast<bits_type>(at_zero);
          bool below_zero = false;
          const auto spread = [&](const std::size_t b) {
            const T x = gathered[b];
            const bool positive = (bits & lanes[b]) != 0;
            const bits_type keep = bits_type(0) - bits_type(positive);
            const bits_type above = bits_type(0) - bits_type(x > T(0));
            below_zero |= positive & (x < T(0));
            values[first + b] =
                Kokkos::bit_cast<T>(((Kokkos::bit_cast<bits_type>(x) & above) | (zero_bits & ~above)) & keep);
          };
          if (n == 32)
            for (std::size_t b = 0; b < 32; ++b) spread(b);
          else
            for (std::size_t b = 0; b < n; ++b) spread(b);
          if (below_zero) {
            at = prefix;
            for (std::size_t b = 0; b < n; ++b) {
              if (!((bits >> b) & 1u)) continue;
              const T x = packed[at++];
              if (x < T(0)) values[first + b] = positive_below_zero(x, bound);
            }
          }
        }
        prefix += std::size_t(Kokkos::popcount(bits));
      });
}

#undef KOMPRESS_IMPL_SIGN_LANES

}  // namespace kompress::inline v0::detail
