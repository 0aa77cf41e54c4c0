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
/// |sum of codes| <= 2^53: exact as an int64 and, times a power of two, as a double.
inline constexpr std::int64_t max_code_sum = std::int64_t(1) << 53;

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
    const double mantissa = std::frexp(2.0 * e, &exponent);  // 2e = mantissa * 2^exponent, mantissa in [0.5, 1)
    (void)mantissa;
    int k = exponent - 1;  // 2^k <= 2e < 2^(k+1)
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

  /// Whether x is on the grid, and its code in `code` if so (0 if not). NaN and infinities
  /// are not on the grid.
  KOMPRESS_FUNCTION bool quantize(double x, std::int64_t& code) const {
    const double t = x * inverse_step;  // exact (a power of two), or below 2^-1022: code 0
    code = 0;
    if (!(magnitude(t) <= code_limit)) return false;  // NaN, infinities, off the grid
    code = static_cast<std::int64_t>((t + rounding_constant) - rounding_constant);  // |t| <= 2^50
    return true;
  }
  /// The value of a code sum: exact in double (|q| <= 2^53, a power-of-two step), then one
  /// rounding to the element type.
  template <class T>
  KOMPRESS_FUNCTION T value(std::int64_t code) const {
    return static_cast<T>(static_cast<double>(code) * step);
  }
};

/// Encodes m (1..BlockSize) codes, |q| <= 2^53. Writes the descriptor, returns the payload
/// length (room: m * 8 bytes). `base` chains the quantized blocks' bases inside a chunk.
template <int BlockSize>
KOMPRESS_FUNCTION int encode_code_block(const std::int64_t* in, int m, std::int64_t& base,
                                        std::uint8_t& descriptor, std::byte* out) {
  std::int64_t values[BlockSize];
  for (int i = 0; i < BlockSize; ++i) values[i] = in[i < m ? i : m - 1];
  std::int64_t low = values[0], high = values[0];
  std::uint64_t any_step = 0;
  for (int i = 0; i < BlockSize; ++i) {
    low = values[i] < low ? values[i] : low;
    high = values[i] > high ? values[i] : high;
    if (i > 0) any_step |= zigzag(values[i] - values[i - 1]);
  }
  const std::uint64_t range = std::uint64_t(high - low);
  const int plain_width = range >> max_width ? 64 : bit_width(range);
  const int delta_width = any_step >> max_width ? 64 : bit_width(any_step);
  const int delta = delta_width < plain_width;
  const int width = delta ? delta_width : plain_width;
  const int verbatim_bytes = m * 8;
  if (width <= max_width) {
    const std::int64_t new_base = delta ? values[0] : low;
    const int length_code = base_length_code<double>(zigzag(new_base - base));
    const int length = base_length<double>(length_code);
    const int bytes = length + packed_bytes<BlockSize>(width);
    if (bytes < verbatim_bytes) {
      std::uint32_t codes[BlockSize];
      if (delta) {
        codes[0] = 0;
        for (int i = 1; i < BlockSize; ++i) codes[i] = std::uint32_t(zigzag(values[i] - values[i - 1]));
      } else {
        for (int i = 0; i < BlockSize; ++i) codes[i] = std::uint32_t(values[i] - low);
      }
      store_bytes(out, zigzag(new_base - base), length);
      pack<BlockSize>(width, codes, out + length);
      base = new_base;
      descriptor = make_descriptor(length_code, delta, width);
      return bytes;
    }
  }
  for (int i = 0; i < m; ++i) store<std::int64_t>(out + 8 * i, in[i]);
  descriptor = descriptor_verbatim_codes;
  return verbatim_bytes;
}

/// Decodes the codes of a block whose descriptor is not descriptor_floating from at most
/// `available` bytes. Returns the bytes consumed, or -1 if malformed (a code sum beyond 2^53
/// included); never reads past `available`.
template <int BlockSize>
KOMPRESS_FUNCTION int decode_code_block(const std::byte* in, std::size_t available, std::uint8_t descriptor,
                                        int m, std::int64_t& base, std::int64_t* out) {
  const auto in_range = [](std::int64_t q) { return q <= max_code_sum && q >= -max_code_sum; };
  if (descriptor == descriptor_verbatim_codes) {
    if (std::size_t(m) * 8 > available) return -1;
    for (int i = 0; i < m; ++i) {
      out[i] = load<std::int64_t>(in + 8 * i);
      if (!in_range(out[i])) return -1;
    }
    return m * 8;
  }
  const int width = descriptor & 0x1F;
  const int delta = (descriptor >> 5) & 1;
  const int length = base_length<double>(descriptor >> 6);
  const int bytes = length + packed_bytes<BlockSize>(width);
  if (width > max_width || (delta && width == 0) || std::size_t(bytes) > available) return -1;
  // Unsigned arithmetic: a corrupted base wraps instead of overflowing.
  const std::int64_t block_base =
      std::int64_t(std::uint64_t(base) + std::uint64_t(unzigzag(load_bytes(in, length))));
  if (!in_range(block_base)) return -1;
  base = block_base;
  std::uint32_t codes[BlockSize];
  unpack<BlockSize>(width, in + length, codes);
  if (delta) {
    std::int64_t code = block_base;
    out[0] = code;
    for (int i = 1; i < m; ++i) {
      code += unzigzag(codes[i]);  // |steps| < 2^30: no overflow from an in-range code
      if (!in_range(code)) return -1;
      out[i] = code;
    }
  } else {
    for (int i = 0; i < m; ++i) {
      out[i] = block_base + std::int64_t(codes[i]);
      if (!in_range(out[i])) return -1;
    }
  }
  return bytes;
}

}  // namespace kompress::inline v0::detail
