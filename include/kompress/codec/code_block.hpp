#pragma once
// Integer codes on a shared power-of-two grid, and their block coding: the codec's integer
// stage (bit widths per block, plain or delta, zigzagged base differences; codec/block.hpp)
// applied to codes that are *sums*, for the homomorphic reduction of the ring collectives
// (comm/detail/homomorphic.hpp; docs/collectives.md gives the bound). Pure functions for host
// and device: no allocation, no dispatch.
//
// Grid: step s = 2^k, the largest power of two <= 2e (clamped to [2^-1000, 2^1000]). A finite
// value x is on the grid when |x / s| <= code_limit; its code is q = round(x / s) (ties to even)
// and |x - q s| <= s / 2 <= e holds exactly: x / s and q * s are exact in binary floating point
// (a power-of-two scaling), only the rounding to an integer errs. code_limit is a power of two
// with p * code_limit <= 2^53, so a sum of p codes never overflows and Q * s is exact in double.
//
// Codes and their sums are held in doubles: integers of magnitude <= 2^53 are exact there, their
// sums of that size too, and the loops over a block vectorize as the codec's do.
//
// A block of a code message is one of:
//   w <= 30            codes: [base: zigzag(base - previous base), {0,1,3,8} bytes][w-bit codes]
//                      plain: code_i = q_i - base (base = min); delta: base = q_0, zigzag steps.
//   0x7F  verbatim     m codes as little-endian int64 (a code range of 2^30 or more)
//   0x1F  floating     m values of the element type verbatim: a partial sum that left the grid
//                      (a NaN, infinity or off-grid value on some rank, or raw on the wire)

#include <kompress/codec/bitpack.hpp>
#include <kompress/codec/block.hpp>
#include <kompress/detail/bytes.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace kompress::inline v0::detail {

inline constexpr std::uint8_t descriptor_floating = descriptor_raw;  // 0x1F
inline constexpr std::uint8_t descriptor_verbatim_codes = 0x7F;
/// |sum of codes| <= 2^53: exact in a double and, times a power of two, as a value.
inline constexpr double max_code_sum = 0x1p53;

/// The grid every rank quantizes on. step == 0: no grid (every block travels floating).
struct code_grid {
  double step = 0.0;
  double inverse_step = 0.0;
  double code_limit = 0.0;  ///< largest |code| one rank may contribute

  /// The grid for a per-rank bound e over p ranks. Identical on every rank that passes the
  /// same e and p (the arithmetic is exact: frexp and ldexp).
  static code_grid make(double e, int p) {
    code_grid grid;
    if (!(e > 0.0) || !is_finite(e) || p < 1) return grid;
    int exponent = 0;
    (void)std::frexp(2.0 * e, &exponent);  // 2e = m * 2^exponent, m in [0.5, 1)
    int k = exponent - 1;                  // 2^k <= 2e < 2^(k+1)
    if (k < -1000) return grid;
    if (k > 1000) k = 1000;
    int ceil_log2_p = 0;
    while ((1ll << ceil_log2_p) < p) ++ceil_log2_p;
    const int limit_bits = 53 - ceil_log2_p < 50 ? 53 - ceil_log2_p : 50;
    grid.step = std::ldexp(1.0, k);
    grid.inverse_step = std::ldexp(1.0, -k);
    grid.code_limit = std::ldexp(1.0, limit_bits);
    return grid;
  }
  bool active() const { return step > 0.0; }

  /// The code of x (an integer in a double) and whether x is on the grid; NaN, infinities and
  /// values beyond code_limit * s are not (their code is then meaningless). Branch-free.
  KOMPRESS_FUNCTION double quantize(double x, bool& on_grid) const {
    const double t = x * inverse_step;  // exact (a power of two), or below 2^-1022: code 0
    on_grid = magnitude(t) <= code_limit;
    const double bounded = on_grid ? t : 0.0;
    return (bounded + rounding_constant) - rounding_constant;  // nearest, ties to even (|t| <= 2^50)
  }
  /// The value of a code sum: exact in double (|q| <= 2^53, a power-of-two step), then one
  /// rounding to the element type.
  template <class T>
  KOMPRESS_FUNCTION T value(double code) const {
    return static_cast<T>(code * step);
  }
};

/// The largest of a block's relative codes.
template <int BlockSize>
KOMPRESS_FUNCTION std::uint32_t relative_max(const std::uint32_t (&relative)[BlockSize]) {
  std::uint32_t high = 0;
  for (int i = 0; i < BlockSize; ++i) high = relative[i] > high ? relative[i] : high;
  return high;
}

/// Encodes BlockSize codes (a short block padded with its last code), |q| <= 2^53, of which
/// the first m are meaningful. Writes the descriptor, returns the payload length (room: m * 8
/// bytes). `base` chains the quantized blocks' bases inside a chunk.
template <int BlockSize>
KOMPRESS_FUNCTION int encode_code_block(const double* codes, int m, std::int64_t& base, std::uint8_t& descriptor,
                                        std::byte* out) {
  double low = codes[0], high = codes[0];
  for (int i = 0; i < BlockSize; ++i) {
    low = codes[i] < low ? codes[i] : low;
    high = codes[i] > high ? codes[i] : high;
  }
  // A computed range below 2^30 is exact (both ends are integers of at most 2^53).
  if (high - low < 0x1p30) {
    std::uint32_t relative[BlockSize], steps[BlockSize];
    std::uint32_t any_step = 0;
    for (int i = 0; i < BlockSize; ++i) relative[i] = static_cast<std::uint32_t>(static_cast<std::int32_t>(codes[i] - low));
    steps[0] = 0;
    for (int i = 1; i < BlockSize; ++i) {
      const std::int32_t d = std::int32_t(relative[i] - relative[i - 1]);
      steps[i] = (std::uint32_t(d) << 1) ^ std::uint32_t(d >> 31);
      any_step |= steps[i];
    }
    const int plain_width = bit_width(std::uint64_t(relative_max(relative)));
    const int delta_width = bit_width(any_step);
    const int delta = delta_width < plain_width;
    const int width = delta ? delta_width : plain_width;
    if (width <= max_width) {
      const std::int64_t new_base = static_cast<std::int64_t>(delta ? codes[0] : low);
      const int length_code = base_length_code<double>(zigzag(new_base - base));
      const int length = base_length<double>(length_code);
      const int bytes = length + packed_bytes<BlockSize>(width);
      if (bytes < m * 8) {
        store_bytes(out, zigzag(new_base - base), length);
        pack<BlockSize>(width, delta ? steps : relative, out + length);
        base = new_base;
        descriptor = make_descriptor(length_code, delta, width);
        return bytes;
      }
    }
  }
  for (int i = 0; i < m; ++i) store<std::int64_t>(out + 8 * i, static_cast<std::int64_t>(codes[i]));
  descriptor = descriptor_verbatim_codes;
  return m * 8;
}

/// Decodes the BlockSize codes of a block whose descriptor is not descriptor_floating from at
/// most `available` bytes (m meaningful). Returns the bytes consumed, or -1 if malformed (a code
/// sum beyond 2^53 included); never reads past `available`.
template <int BlockSize>
KOMPRESS_FUNCTION int decode_code_block(const std::byte* in, std::size_t available, std::uint8_t descriptor, int m,
                                        std::int64_t& base, double* out) {
  if (descriptor == descriptor_verbatim_codes) {
    if (std::size_t(m) * 8 > available) return -1;
    bool bad = false;
    for (int i = 0; i < m; ++i) {
      out[i] = static_cast<double>(load<std::int64_t>(in + 8 * i));
      bad |= !(magnitude(out[i]) <= max_code_sum);
    }
    return bad ? -1 : m * 8;
  }
  const int width = descriptor & 0x1F;
  const int delta = (descriptor >> 5) & 1;
  const int length = base_length<double>(descriptor >> 6);
  const int bytes = length + packed_bytes<BlockSize>(width);
  if (width > max_width || (delta && width == 0) || std::size_t(bytes) > available) return -1;
  // Unsigned arithmetic: a corrupted base wraps instead of overflowing.
  const std::int64_t block_base =
      std::int64_t(std::uint64_t(base) + std::uint64_t(unzigzag(load_bytes(in, length))));
  if (!(block_base <= std::int64_t(max_code_sum) && block_base >= -std::int64_t(max_code_sum))) return -1;
  base = block_base;
  std::uint32_t codes[BlockSize];
  unpack<BlockSize>(width, in + length, codes);
  const double base_value = static_cast<double>(block_base);
  if (delta) {
    // Steps below 2^30 each: the running offset stays an exact int64.
    std::int64_t offset = 0;
    for (int i = 0; i < BlockSize; ++i) {
      offset += std::int64_t(codes[i] >> 1) ^ -std::int64_t(codes[i] & 1);
      out[i] = base_value + static_cast<double>(offset);
    }
  } else {
    for (int i = 0; i < BlockSize; ++i) out[i] = base_value + static_cast<double>(codes[i]);
  }
  bool bad = false;
  for (int i = 0; i < BlockSize; ++i) bad |= !(magnitude(out[i]) <= max_code_sum);
  return bad ? -1 : bytes;
}

}  // namespace kompress::inline v0::detail
