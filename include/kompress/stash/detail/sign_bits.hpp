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
        std::uint32_t bits = 0;
        T sum = 0, small = 0;
        const auto pack = [&](const std::size_t b) {
          const T x = values[first + b];
          const bool positive = x > T(0);
          const bool below = positive & (x <= e);
          bits |= std::uint32_t(positive) << b;
          sum += Kokkos::bit_cast<T>(Kokkos::bit_cast<bits_type>(x) & (bits_type(0) - bits_type(below)));
          small += T(below);
        };
        if (n == 32)
          for (std::size_t b = 0; b < 32; ++b) pack(b);
        else
          for (std::size_t b = 0; b < n; ++b) pack(b);
        words[w] = bits;
        sum_count += Kokkos::complex<double>(double(sum), double(small));
      },
      Kokkos::Sum<Kokkos::complex<double>, memory_space>(small_positives));
}

/// Puts every restored value x' back on the side of 0 its bit records, within `bound` of the
/// saved x when x' was: a set bit with x' <= 0 means x in (0, x' + bound], and any point of
/// that range is within x' + bound <= bound of x (for x' = 0 the stream's mean of (0, e] when
/// it lies in (0, bound], else half the bound; for x' < 0 the range's midpoint; at least the
/// smallest positive value); a clear bit with x' > 0 means x in [x' - bound, 0], and +0 is
/// within bound - x' of x. Enqueued on `exec`.
template <class T, class ExecutionSpace>
void apply_signs(const ExecutionSpace& exec, const std::byte* in, T* values, std::size_t count, double bound) {
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
        if (!(at_zero > T(0) && double(at_zero) <= bound)) at_zero = Kokkos::Experimental::denorm_min_v<T>;
        const std::size_t first = 32 * w;
        const std::size_t n = count - first < 32 ? count - first : 32;
        const std::uint32_t bits = words[w];
        bool below_zero = false;  // a set bit and x' < 0: rare (a block stored as a constant < 0)
        for (std::size_t b = 0; b < n; ++b) below_zero |= bool((bits >> b) & 1u) & (values[first + b] < T(0));
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
          const bool positive = (bits >> b) & 1u;
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

}  // namespace kompress::inline v0::detail
