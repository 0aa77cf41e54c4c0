#pragma once
// The sign bits of a keep_sign save: x > 0 as one bit per value, and restored values put back
// on their saved side of 0 within the same bound (docs/stash.md, "Per-save options").

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>

namespace kompress::inline v0::detail {

constexpr std::size_t sign_words(std::size_t count) { return (count + 31) / 32; }
constexpr std::size_t sign_bytes(std::size_t count) { return sign_words(count) * sizeof(std::uint32_t); }

/// words[w] bit b = values[32 w + b] > 0 (NaN: 0). Enqueued on `exec`.
template <class T, class ExecutionSpace>
void pack_signs(const ExecutionSpace& exec, const T* values, std::size_t count, std::uint32_t* words) {
  Kokkos::parallel_for(
      "kompress::stash::pack_signs",
      Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::size_t>>(exec, 0, sign_words(count)),
      KOKKOS_LAMBDA(const std::size_t w) {
        const std::size_t first = 32 * w;
        const std::size_t n = count - first < 32 ? count - first : 32;
        std::uint32_t bits = 0;
        for (std::size_t b = 0; b < n; ++b)
          if (values[first + b] > T(0)) bits |= std::uint32_t(1) << b;
        words[w] = bits;
      });
}

/// Puts every restored value x' back on the side of 0 its bit records, within `bound` of the
/// saved x when x' was: a set bit with x' <= 0 means x in (0, x' + bound], and its midpoint
/// (at least the smallest positive value) is within x' + bound <= bound of x; a clear bit with
/// x' > 0 means x in [x' - bound, 0], and +0 is within bound - x' of x. Enqueued on `exec`.
template <class T, class ExecutionSpace>
void apply_signs(const ExecutionSpace& exec, const std::uint32_t* words, T* values, std::size_t count,
                 double bound) {
  Kokkos::parallel_for(
      "kompress::stash::apply_signs",
      Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::size_t>>(exec, 0, sign_words(count)),
      KOKKOS_LAMBDA(const std::size_t w) {
        const std::size_t first = 32 * w;
        const std::size_t n = count - first < 32 ? count - first : 32;
        const std::uint32_t bits = words[w];
        for (std::size_t b = 0; b < n; ++b) {
          const T x = values[first + b];
          if ((bits >> b) & 1u) {
            if (!(x > T(0))) {
              T inside = T((double(x) + bound) * 0.5);
              if (!(inside > T(0))) inside = std::numeric_limits<T>::denorm_min();
              values[first + b] = inside;
            }
          } else if (x > T(0)) {
            values[first + b] = T(0);
          }
        }
      });
}

}  // namespace kompress::inline v0::detail
