#pragma once
// What users store saved activations as when they do not bound the error: ActNN-style per-group
// quantizers with stochastic rounding, one group at a time (each bench runs the groups its own
// way: bench_stash on host threads, bench_stash_training as Kokkos kernels). No bound: a 2-bit
// code spans a third of its group's range, unbiased only in expectation.

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>

namespace kompress_bench {

/// A counter-based uniform in [0, 1): splitmix64 of (seed, index). Stochastic rounding needs
/// one per value; a counter makes it parallel and reproducible.
KOKKOS_INLINE_FUNCTION float uniform01(std::uint64_t seed, std::uint64_t index) {
  std::uint64_t z = seed + index * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return float(z >> 40) * 0x1p-24f;
}

/// IEEE binary16 bits of `x`, rounded to nearest even (overflow to infinity, NaN kept a NaN):
/// a portable cast where the backend's half type is a float in disguise (Kokkos's half_t on
/// host backends).
KOKKOS_INLINE_FUNCTION std::uint16_t to_half_bits(float x) {
  const std::uint32_t f = Kokkos::bit_cast<std::uint32_t>(x);
  const std::uint32_t sign = (f >> 16) & 0x8000u;
  const std::uint32_t magnitude = f & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return std::uint16_t(sign | 0x7E00u);           // NaN
  if (magnitude >= 0x477FF000u) return std::uint16_t(sign | 0x7C00u);          // rounds past 65504
  if (magnitude < 0x38800000u) {                                                // below 2^-14: subnormal
    const float scaled = Kokkos::bit_cast<float>(magnitude) * 0x1p24f;           // exact: units of 2^-24
    return std::uint16_t(sign | std::uint32_t(Kokkos::nearbyint(scaled)));      // ties to even
  }
  const std::uint32_t rounded = magnitude + 0x0FFFu + ((magnitude >> 13) & 1u);  // nearest even at bit 13
  return std::uint16_t(sign | ((rounded - 0x38000000u) >> 13));
}

KOKKOS_INLINE_FUNCTION float from_half_bits(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1Fu, mantissa = h & 0x3FFu;
  std::uint32_t f;
  if (exponent == 0) f = sign | Kokkos::bit_cast<std::uint32_t>(float(mantissa) * 0x1p-24f);
  else if (exponent == 31) f = sign | 0x7F800000u | (mantissa << 13);
  else f = sign | ((exponent + 112) << 23) | (mantissa << 13);
  return Kokkos::bit_cast<float>(f);
}

/// ActNN-style per-group quantizer: groups of 256 values, per group min and scale (two floats),
/// codes of `Bits` bits with stochastic rounding, packed little-endian within bytes. Records
/// are group_bytes apart (a multiple of 4: the floats are read in place).
template <int Bits>
struct group_quantizer {
  static constexpr std::size_t group = 256;
  static constexpr int levels = (1 << Bits) - 1;
  static constexpr std::size_t code_bytes = group * Bits / 8;
  static constexpr std::size_t group_bytes = code_bytes + 2 * sizeof(float);

  static constexpr std::size_t groups(std::size_t n) { return (n + group - 1) / group; }
  static constexpr std::size_t bytes(std::size_t n) { return groups(n) * group_bytes; }

  /// Group g of `in` (n values) into its record of `out`.
  KOKKOS_INLINE_FUNCTION static void encode_group(const float* in, std::size_t n, std::size_t g,
                                                  std::byte* out, std::uint64_t seed) {
    const std::size_t begin = g * group, end = n - begin < group ? n : begin + group;
    float low = in[begin], high = in[begin];
    for (std::size_t i = begin; i < end; ++i) low = Kokkos::min(low, in[i]), high = Kokkos::max(high, in[i]);
    const float scale = (high - low) / float(levels);
    const float inverse = scale > 0.0f ? 1.0f / scale : 0.0f;
    std::byte* const record = out + g * group_bytes;
    reinterpret_cast<float*>(record)[0] = low;
    reinterpret_cast<float*>(record)[1] = scale;
    std::uint8_t* const codes = reinterpret_cast<std::uint8_t*>(record + 2 * sizeof(float));
    for (std::size_t k = 0; k < code_bytes; ++k) codes[k] = 0;
    for (std::size_t i = begin; i < end; ++i) {
      const float t = (in[i] - low) * inverse + uniform01(seed, i);
      const int q = Kokkos::min(int(levels), Kokkos::max(0, int(t)));  // floor: t >= 0
      const std::size_t k = i - begin;
      codes[k * Bits / 8] |= std::uint8_t(q << ((k * Bits) % 8));
    }
  }

  KOKKOS_INLINE_FUNCTION static void decode_group(const std::byte* in, std::size_t n, std::size_t g, float* out) {
    const std::size_t begin = g * group, end = n - begin < group ? n : begin + group;
    const std::byte* const record = in + g * group_bytes;
    const float low = reinterpret_cast<const float*>(record)[0];
    const float scale = reinterpret_cast<const float*>(record)[1];
    const std::uint8_t* const codes = reinterpret_cast<const std::uint8_t*>(record + 2 * sizeof(float));
    for (std::size_t i = begin; i < end; ++i) {
      const std::size_t k = i - begin;
      const int q = (codes[k * Bits / 8] >> ((k * Bits) % 8)) & levels;
      out[i] = low + float(q) * scale;
    }
  }

  /// Groups [first, last) on the calling thread.
  static void encode(const float* in, std::size_t n, std::size_t first, std::size_t last, std::byte* out,
                     std::uint64_t seed) {
    for (std::size_t g = first; g < last; ++g) encode_group(in, n, g, out, seed);
  }
  static void decode(const std::byte* in, std::size_t n, std::size_t first, std::size_t last, float* out) {
    for (std::size_t g = first; g < last; ++g) decode_group(in, n, g, out);
  }
};

}  // namespace kompress_bench
