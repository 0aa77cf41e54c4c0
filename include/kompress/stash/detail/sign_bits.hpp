#pragma once
// The sign bits of a keep_sign save: x > 0 as one bit per value, and restored values put back
// on their saved side of 0 within the same bound (docs/stash.md, "Per-save options").
//
// Layout of one stream's sign bits: the bits in 32-bit words (a multiple of 4 of them), then
// the sum and the count of the values in (0, e] (e: the stream's absolute bound) as the real
// and imaginary parts of one Kokkos::complex<double>. Restore gives a positive value that came
// back <= 0 their mean, the expected value of what the quantizer rounded to 0, rather than a
// fixed point of (0, e] that would shift every such value the same way.

#include <kompress/detail/bytes.hpp>
#include <kompress/format.hpp>

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
/// values in (0, e] into the bytes after the words. e is `bound`, or, when `header` is given,
/// the absolute bound in that stream header (written by kernels enqueued before on `exec`: a
/// save_async's bound is known only on the device). Enqueued on `exec`, nothing waits.
template <class T, class ExecutionSpace>
void pack_signs(const ExecutionSpace& exec, const T* values, std::size_t count, std::byte* out, double bound,
                const std::byte* header = nullptr) {
  using memory_space = typename ExecutionSpace::memory_space;
  auto* const words = reinterpret_cast<std::uint32_t*>(out);
  const Kokkos::View<Kokkos::complex<double>, memory_space, Kokkos::MemoryUnmanaged> small_positives(
      reinterpret_cast<Kokkos::complex<double>*>(out + sign_words(count) * sizeof(std::uint32_t)));
  Kokkos::parallel_reduce(
      "kompress::stash::pack_signs",
      Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::size_t>>(exec, 0, sign_words(count)),
      KOKKOS_LAMBDA(const std::size_t w, Kokkos::complex<double>& sum_count) {
        const T e = T(header ? load<double>(header + abs_bound_offset) : bound);
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
        const Kokkos::complex<double> sum_count = *small_positives;
        const double mean = sum_count.imag() > 0.0 ? sum_count.real() / sum_count.imag() : 0.0;
        // x' = 0 (the quantizer's grid has a point there: the common case) takes the mean when
        // it lies in (0, bound], else half the bound; any other x' <= 0 half of (x' + bound).
        T at_zero = T(mean > 0.0 && mean <= bound ? mean : bound * 0.5);
        if (stochastic || !(at_zero > T(0) && double(at_zero) <= bound))
          at_zero = Kokkos::Experimental::denorm_min_v<T>;
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
              T inside = T((double(x) + bound) * 0.5);
              if (!(inside > T(0))) inside = Kokkos::Experimental::denorm_min_v<T>;
              values[first + b] = inside;
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

#undef KOMPRESS_IMPL_SIGN_LANES

}  // namespace kompress::inline v0::detail
