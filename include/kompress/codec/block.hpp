#pragma once
// The per-block codec: one block of up to BlockSize values in, a descriptor byte and a
// payload out, and back. Pure functions for host and device: no allocation, no dispatch.
//
// Descriptor byte: bits 0-4 width w, bit 5 mode (0 plain, 1 delta), bits 6-7 base length code.
//   w = 31 marks the exact kinds: 0x1F raw (m values verbatim), 0x3F constant (one value,
//   bit pattern repeated), 0x5F signed zeros (one sign bit per value, all values +-0.0).
//   Every other w is a quantized block:
//   [base: zigzag(base - previous base), base_length bytes][BlockSize codes of w bits]
//   plain: code_i = q_i - base;  delta: base = q_0, code_i = zigzag(q_i - q_{i-1}) (code_0 = 0).
//   In streams with a fill value, a plain block with w >= 1 reads code 2^w - 1 as the fill.

#include <kompress/codec/bitpack.hpp>
#include <kompress/codec/quantizer.hpp>
#include <kompress/detail/bytes.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace kompress::inline v0::detail {

inline constexpr std::uint8_t descriptor_raw = 0x1F;
inline constexpr std::uint8_t descriptor_constant = 0x3F;
/// Every value is +0.0 or -0.0 (land masks written with both): one sign bit per value.
inline constexpr std::uint8_t descriptor_signed_zeros = 0x5F;
inline constexpr int escape_width = 31;

/// Bytes of the zigzagged base difference for each base length code.
template <class T>
KOMPRESS_FUNCTION constexpr int base_length(int code) {
  if constexpr (std::is_same_v<T, float>) {
    constexpr int lengths[4] = {0, 1, 2, 4};
    return lengths[code];
  } else {
    constexpr int lengths[4] = {0, 1, 3, 8};
    return lengths[code];
  }
}

/// Smallest base length code that holds `zigzagged`, or -1.
template <class T>
KOMPRESS_FUNCTION int base_length_code(std::uint64_t zigzagged) {
  for (int code = 0; code < 4; ++code) {
    const int bytes = base_length<T>(code);
    if (bytes == 8 || zigzagged < (std::uint64_t(1) << (8 * bytes))) return code;
  }
  return -1;
}

KOMPRESS_FUNCTION constexpr std::uint8_t make_descriptor(int length_code, int delta,
                                                              int width) {
  return static_cast<std::uint8_t>((length_code << 6) | (delta << 5) | width);
}

template <class T>
struct float_traits;
template <>
struct float_traits<float> {
  static constexpr std::uint32_t exponent_mask = 0x7F800000u;
  static constexpr std::uint32_t sign_mask = 0x80000000u;
};
template <>
struct float_traits<double> {
  static constexpr std::uint64_t exponent_mask = 0x7FF0000000000000ull;
  static constexpr std::uint64_t sign_mask = 0x8000000000000000ull;
};

/// How a block is stored, apart from the blocks before it: its best exact form and, where it
/// can be quantized, the quantized candidate. The candidate wins when its bytes, which include
/// the base difference from the previous quantized block of the chunk, are fewer than the
/// exact form's: the one decision a block's encoding takes from the blocks before it, so a
/// parallel encoder can settle a chunk's choices in one cheap pass (kernels/team_codec.hpp).
struct block_choice {
  std::uint8_t exact_descriptor = descriptor_raw;
  int exact_bytes = 0;
  bool quantizable = false;
  int delta = 0;
  int width = 0;
  /// The candidate's base: the code its codes are relative to.
  std::int64_t base = 0;

  /// The candidate's base length code after the chunk's previous base `previous`, or -1: the
  /// exact form is stored.
  template <class T, int BlockSize>
  KOMPRESS_FUNCTION int length_code(std::int64_t previous) const {
    if (!quantizable) return -1;
    const int code = base_length_code<T>(zigzag(base - previous));
    return code >= 0 && base_length<T>(code) + packed_bytes<BlockSize>(width) < exact_bytes ? code
                                                                                            : -1;
  }
  /// The payload bytes for the outcome `length_code` returned.
  template <class T, int BlockSize>
  KOMPRESS_FUNCTION int payload_bytes(int length_code) const {
    return length_code < 0 ? exact_bytes
                           : base_length<T>(length_code) + packed_bytes<BlockSize>(width);
  }
  KOMPRESS_FUNCTION std::uint8_t descriptor(int length_code) const {
    return length_code < 0 ? exact_descriptor : make_descriptor(length_code, delta, width);
  }
};

/// The choice for a block whose m values (and so its padding) all have the bit pattern of
/// `value`: the same as the general path below, which would compute the same numbers for
/// every value (one value is classified, quantized and verified here, exactly as there). Runs
/// of constant values (land masks, fill regions, zeros) cost a pass of bit comparisons instead
/// of the quantize-and-verify loop.
template <class T, int BlockSize>
KOMPRESS_FUNCTION block_choice uniform_block_choice(T value, const value_codec<T>& codec) {
  using bits = bits_t<T>;
  using traits = float_traits<T>;
  const bits b = to_bits(value);
  const bool fill = codec.has_fill && b == codec.fill_bits;
  const bool special = !fill && (((b & traits::exponent_mask) == traits::exponent_mask) ||
                                 b == traits::sign_mask);
  const double x = static_cast<double>(value);
  const double biased = codec.biased_code(x);
  const double error = x - static_cast<double>(value_codec<T>::reconstruct(
                               biased - rounding_constant, codec.step));
  const bool rejected = !fill && magnitude(error) > codec.accept_threshold;

  // All values equal: the exact constant beats raw (m >= 1).
  block_choice choice;
  choice.exact_bytes = int(sizeof(T));
  choice.exact_descriptor = descriptor_constant;
  if ((b & ~traits::sign_mask) == 0 && packed_bytes<BlockSize>(1) < choice.exact_bytes) {
    choice.exact_bytes = packed_bytes<BlockSize>(1);
    choice.exact_descriptor = descriptor_signed_zeros;
  }
  // Quantized: every code equals the first, so the relative codes, their range and every step
  // are 0: width 0, plain, base = the value's code. A block of fill values alone stays exact.
  if (codec.step > 0.0 && !rejected && !special && !fill &&
      magnitude(biased - rounding_constant) <= max_code_magnitude) {
    choice.quantizable = true;
    choice.base = static_cast<std::int64_t>(biased - rounding_constant);
  }
  return choice;
}

/// encode_block for a block of equal values (uniform_block_choice).
template <class T, int BlockSize>
KOMPRESS_FUNCTION int encode_uniform_block(T value, int m, const value_codec<T>& codec,
                                           std::int64_t& base, std::uint8_t& descriptor,
                                           std::byte* out) {
  const block_choice choice = uniform_block_choice<T, BlockSize>(value, codec);
  const int length_code = choice.length_code<T, BlockSize>(base);
  descriptor = choice.descriptor(length_code);
  if (descriptor == descriptor_constant) {
    store<T>(out, value);
  } else if (descriptor == descriptor_signed_zeros) {
    std::uint32_t codes[BlockSize];
    const std::uint32_t sign = static_cast<std::uint32_t>(to_bits(value) >> (8 * sizeof(T) - 1));
    for (int i = 0; i < BlockSize; ++i) codes[i] = sign & std::uint32_t(i < m);
    pack<BlockSize>(1, codes, out);
  } else {
    store_bytes(out, zigzag(choice.base - base), base_length<T>(length_code));
    base = choice.base;
  }
  return choice.payload_bytes<T, BlockSize>(length_code);
}

/// What the general path computes from a block's values before it writes anything: the
/// choice, and the codes either quantized form would pack.
template <int BlockSize>
struct block_analysis {
  block_choice choice;
  /// Codes relative to the block's reference value (fills: 0), and their minimum.
  std::int32_t relative[BlockSize];
  std::int32_t low;
  /// zigzag(code_i - code_{i-1}) (code_{-1} = code_0), read only without fills.
  std::uint32_t zigzag_steps[BlockSize];
  bool any_fill;
};

/// The general path's analysis of the BlockSize padded `values` of m values, the first at
/// index `first_index` of the stream; HasFill is codec.has_fill, Stochastic codec.stochastic, and
/// with UniformFastPath the values are known not to be all equal.
template <class T, int BlockSize, bool HasFill, bool UniformFastPath, bool Stochastic>
KOMPRESS_FUNCTION void analyze_padded_block(const T* values, int m, std::uint64_t first_index,
                                            const value_codec<T>& codec, block_analysis<BlockSize>& a) {
  using bits = bits_t<T>;
  using traits = float_traits<T>;
  const bits first = to_bits(values[0]);
  const bits fill_bits = codec.fill_bits;
  const bits fill_enabled = HasFill ? ~bits(0) : bits(0);
  const double step = codec.step, threshold = codec.accept_threshold;
  // Codes are taken relative to the first non-fill value (a block of fills alone is an exact
  // constant block). Known before the loop, so the loop also takes the relative codes and
  // the steps between neighbours: later passes reading back what it had just stored stalled
  // on store forwarding.
  int reference_index = 0;
  if (HasFill)
    while (reference_index < BlockSize && to_bits(values[reference_index]) == fill_bits)
      ++reference_index;
  // Padding repeats the last value with its dither too, so it adds no range and no steps.
  // The dithers in a loop of their own: folded into the loop below, GCC vectorizes neither.
  double dithers[Stochastic ? BlockSize : 1];
  if constexpr (Stochastic) {
    const std::uint32_t key = codec.dither_key(first_index);
    const std::uint32_t first_low = static_cast<std::uint32_t>(first_index);
    for (int i = 0; i < BlockSize; ++i)
      dithers[i] = value_codec<T>::dither(key, first_low + std::uint32_t(i < m ? i : m - 1));
  }
  const auto code_of = [&](int i) {
    const double x = static_cast<double>(values[i]);
    if constexpr (Stochastic)
      return codec.biased_code(x, dithers[i]);
    else
      return codec.biased_code(x);
  };
  const double first_biased = code_of(0);
  const double reference =
      reference_index == 0 ? first_biased : code_of(reference_index < BlockSize ? reference_index : 0);
  // Codes below 2^51 share the biased doubles' exponent: their difference is exact, and the
  // low 32 bits of the patterns differ by the code difference modulo 2^32. A code beyond 2^51
  // makes its difference huge and fails the range check.
  const std::uint32_t reference_low = static_cast<std::uint32_t>(to_bits(reference));
  std::uint32_t previous_low = static_cast<std::uint32_t>(to_bits(first_biased));

  // One pass: classify, quantize, and verify each value against exactly what the decoder
  // will compute, then its code relative to the reference and to its neighbour. Fixed trip
  // count, no branches, and flags kept in lanes as wide as the values they come from (bits
  // for the element, 64 for doubles), so it vectorizes well.
  bits differs = 0, fills = 0, specials = 0, magnitudes = 0;
  std::int64_t rejected = 0, out_of_range = 0;
  std::int32_t low = 0, high = 0;
  std::uint32_t any_step = 0;
  for (int i = 0; i < BlockSize; ++i) {
    const bits b = to_bits(values[i]);
    const bits fill = -bits(((b ^ fill_bits) | ~fill_enabled) == 0);
    differs |= b ^ first;
    magnitudes |= b & ~traits::sign_mask;
    fills |= fill;
    // NaN, +-Inf and -0.0 only come back bit-exact from an exact block.
    specials |= ~fill & -bits(((b & traits::exponent_mask) == traits::exponent_mask) |
                             (b == traits::sign_mask));
    const double x = static_cast<double>(values[i]);
    double biased;
    if constexpr (Stochastic)
      biased = codec.biased_code(x, dithers[i]);
    else
      biased = codec.biased_code(x);
    const double error = x - static_cast<double>(value_codec<T>::reconstruct(
                                 biased - rounding_constant, step));
    // Fill values may fail this freely; they never reach the decoder's arithmetic.
    const std::int64_t keep = std::int64_t(~fill);
    rejected |= -std::int64_t(magnitude(error) > threshold) & keep;
    out_of_range |= -std::int64_t(!(magnitude(biased - reference) < 0x1p30)) & keep;
    const std::uint32_t code_low = static_cast<std::uint32_t>(to_bits(biased));
    a.relative[i] = static_cast<std::int32_t>(code_low - reference_low) & std::int32_t(keep);
    low = a.relative[i] < low ? a.relative[i] : low;
    high = a.relative[i] > high ? a.relative[i] : high;
    // Only read in blocks without fills, where they are the differences of `relative`.
    const std::int32_t d = static_cast<std::int32_t>(code_low - previous_low);
    previous_low = code_low;
    a.zigzag_steps[i] = (std::uint32_t(d) << 1) ^ std::uint32_t(d >> 31);
    any_step |= a.zigzag_steps[i];
  }
  // After the uniform fast path the values differ (and `differs` folds away).
  const int all_same = !UniformFastPath && differs == 0, any_fill = fills != 0;
  a.low = low;
  a.any_fill = any_fill;

  block_choice& choice = a.choice;
  choice.exact_bytes = m * int(sizeof(T));
  choice.exact_descriptor = descriptor_raw;
  if (all_same && int(sizeof(T)) <= choice.exact_bytes) {
    choice.exact_bytes = int(sizeof(T));
    choice.exact_descriptor = descriptor_constant;
  }
  if (magnitudes == 0 && packed_bytes<BlockSize>(1) < choice.exact_bytes) {
    choice.exact_bytes = packed_bytes<BlockSize>(1);
    choice.exact_descriptor = descriptor_signed_zeros;
  }

  out_of_range |= !(magnitude(reference - rounding_constant) <= max_code_magnitude);
  if (step > 0.0 && !rejected && !specials && reference_index < BlockSize && !out_of_range) {
    const std::uint32_t range = std::uint32_t(high - low);
    // With a fill value in the stream, code 2^w - 1 must stay free for it.
    const int plain_width = HasFill && (any_fill || range > 0)
                                ? bit_width(std::uint64_t(range) + 1)
                                : bit_width(range);
    // OR of the steps has the width of the largest one.
    const int delta_width = any_fill ? 64 : bit_width(any_step);
    choice.delta = delta_width < plain_width;
    choice.width = choice.delta ? delta_width : plain_width;
    choice.base =
        static_cast<std::int64_t>(reference - rounding_constant) + (choice.delta ? 0 : low);
    choice.quantizable = choice.width <= max_width;
  }
}

/// Writes the block `a` analysed (the BlockSize padded `values` of the m values at `in`) after
/// the chunk's previous base `base`, updated when the block is quantized; returns the payload
/// length.
template <class T, int BlockSize, bool HasFill>
KOMPRESS_FUNCTION int write_padded_block(const block_analysis<BlockSize>& a, const T* values,
                                         const T* in, int m, const value_codec<T>& codec,
                                         std::int64_t& base, std::uint8_t& descriptor,
                                         std::byte* out) {
  const block_choice& choice = a.choice;
  const int length_code = choice.length_code<T, BlockSize>(base);
  descriptor = choice.descriptor(length_code);
  std::uint32_t codes[BlockSize];
  if (descriptor == descriptor_raw) {
    std::memcpy(out, in, std::size_t(m) * sizeof(T));
  } else if (descriptor == descriptor_constant) {
    store<T>(out, values[0]);
  } else if (descriptor == descriptor_signed_zeros) {
    for (int i = 0; i < BlockSize; ++i)
      codes[i] = static_cast<std::uint32_t>(to_bits(values[i]) >> (8 * sizeof(T) - 1)) & (i < m);
    pack<BlockSize>(1, codes, out);
  } else {
    const std::uint32_t* packed_codes = codes;
    if (choice.delta) {
      packed_codes = a.zigzag_steps;
    } else if (HasFill && a.any_fill) {
      const std::uint32_t fill_code = (std::uint32_t(1) << choice.width) - 1;
      for (int i = 0; i < BlockSize; ++i)
        codes[i] = to_bits(values[i]) == codec.fill_bits ? fill_code
                                                         : std::uint32_t(a.relative[i] - a.low);
    } else {
      for (int i = 0; i < BlockSize; ++i) codes[i] = std::uint32_t(a.relative[i] - a.low);
    }
    const int length = base_length<T>(length_code);
    store_bytes(out, zigzag(choice.base - base), length);
    pack<BlockSize>(choice.width, packed_codes, out + length);
    base = choice.base;
  }
  return choice.payload_bytes<T, BlockSize>(length_code);
}

/// Calls f(values) with the block's BlockSize values: a full block where it lies, a short one
/// padded with its last value (no new range, zero deltas).
template <class T, int BlockSize, class F>
KOMPRESS_FUNCTION decltype(auto) with_padded_block(const T* in, int m, F&& f) {
  T padded[BlockSize];
  const T* values = in;
  if (m < BlockSize) {
    for (int i = 0; i < BlockSize; ++i) padded[i] = in[i < m ? i : m - 1];
    values = padded;
  }
  return f(values);
}

template <class T, int BlockSize>
KOMPRESS_FUNCTION bool is_uniform_block(const T* values) {
  using bits = bits_t<T>;
  const bits pattern = to_bits(values[0]);
  bits differs = 0;
  for (int i = 0; i < BlockSize; ++i) differs |= to_bits(values[i]) ^ pattern;
  return differs == 0;
}

/// Whether a block of equal values takes the uniform path: always when rounding to nearest;
/// with stochastic rounding only where the dither cannot change a code (zeros) or no code is
/// taken (NaN, infinities, the fill value). Other constants are dithered value by value.
template <class T>
KOMPRESS_FUNCTION bool uniform_path_applies(T value, const value_codec<T>& codec) {
  using traits = float_traits<T>;
  const bits_t<T> b = to_bits(value);
  return !codec.stochastic || (b & ~traits::sign_mask) == 0 ||
         (b & traits::exponent_mask) == traits::exponent_mask || (codec.has_fill && b == codec.fill_bits);
}

/// The general path's analysis with the fill and rounding flags as compile-time ones: without
/// a fill value (most streams) every fill test folds away, and rounding to nearest draws no
/// dither. A uniform block that reaches it with stochastic rounding is analysed as not known
/// to differ, so its exact constant form stays a candidate.
template <class T, int BlockSize, bool UniformFastPath>
KOMPRESS_FUNCTION void analyze_block(const T* values, int m, std::uint64_t first, const value_codec<T>& codec,
                                     block_analysis<BlockSize>& a) {
  if (codec.stochastic) {
    if (codec.has_fill)
      analyze_padded_block<T, BlockSize, true, false, true>(values, m, first, codec, a);
    else
      analyze_padded_block<T, BlockSize, false, false, true>(values, m, first, codec, a);
  } else if (codec.has_fill) {
    analyze_padded_block<T, BlockSize, true, UniformFastPath, false>(values, m, first, codec, a);
  } else {
    analyze_padded_block<T, BlockSize, false, UniformFastPath, false>(values, m, first, codec, a);
  }
}

/// Encodes the m (1..BlockSize) values at `in`, the first at index `first` of the stream.
/// Writes the descriptor to `descriptor` and the payload to `out` (room for m * sizeof(T)
/// bytes), returns the payload length. `base` is the previous quantized block's base in this
/// chunk, updated when this block is quantized. `UniformFastPath` = false skips
/// encode_uniform_block (the tests compare the two; the bytes are the same).
template <class T, int BlockSize, bool UniformFastPath = true>
KOMPRESS_FUNCTION int encode_block(const T* in, int m, std::uint64_t first, const value_codec<T>& codec,
                                   std::int64_t& base, std::uint8_t& descriptor, std::byte* out) {
  return with_padded_block<T, BlockSize>(in, m, [&](const T* values) {
    if constexpr (UniformFastPath)
      if (is_uniform_block<T, BlockSize>(values) && uniform_path_applies(values[0], codec))
        return encode_uniform_block<T, BlockSize>(values[0], m, codec, base, descriptor, out);
    block_analysis<BlockSize> a;
    analyze_block<T, BlockSize, UniformFastPath>(values, m, first, codec, a);
    if (codec.has_fill)
      return write_padded_block<T, BlockSize, true>(a, values, in, m, codec, base, descriptor, out);
    return write_padded_block<T, BlockSize, false>(a, values, in, m, codec, base, descriptor, out);
  });
}

/// The choice encode_block makes for the m values at `in`, without writing anything.
template <class T, int BlockSize>
KOMPRESS_FUNCTION block_choice choose_block(const T* in, int m, std::uint64_t first, const value_codec<T>& codec) {
  return with_padded_block<T, BlockSize>(in, m, [&](const T* values) {
    if (is_uniform_block<T, BlockSize>(values) && uniform_path_applies(values[0], codec))
      return uniform_block_choice<T, BlockSize>(values[0], codec);
    block_analysis<BlockSize> a;
    analyze_block<T, BlockSize, true>(values, m, first, codec, a);
    return a.choice;
  });
}

/// The payload length of a block of m values with `descriptor`, or -1 for a descriptor no
/// encoder writes for `codec`: what decode_block consumes, from the descriptor alone, so a
/// parallel decoder can place every block before decoding any.
template <class T, int BlockSize>
KOMPRESS_FUNCTION int block_payload_bytes(std::uint8_t descriptor, int m,
                                          const value_codec<T>& codec) {
  const int width = descriptor & 0x1F;
  if (width == escape_width) {
    if (descriptor == descriptor_raw) return m * int(sizeof(T));
    if (descriptor == descriptor_constant) return int(sizeof(T));
    if (descriptor == descriptor_signed_zeros) return packed_bytes<BlockSize>(1);
    return -1;
  }
  const int delta = (descriptor >> 5) & 1;
  if (!(codec.step > 0.0) || width > max_width || (delta && width == 0)) return -1;
  return base_length<T>(descriptor >> 6) + packed_bytes<BlockSize>(width);
}

/// The base difference a quantized block's payload starts with (0 for the exact kinds): the
/// chunk's bases are the running sums of these.
template <class T>
KOMPRESS_FUNCTION std::int64_t block_base_difference(const std::byte* payload,
                                                     std::uint8_t descriptor) {
  if ((descriptor & 0x1F) == escape_width) return 0;
  return unzigzag(load_bytes(payload, base_length<T>(descriptor >> 6)));
}

/// Decodes one block of m values from at most `available` payload bytes. Returns the bytes
/// consumed, or -1 if the payload is malformed (never reads past `available`).
template <class T, int BlockSize>
KOMPRESS_FUNCTION int decode_block(const std::byte* in, std::size_t available,
                                        std::uint8_t descriptor, int m,
                                        const value_codec<T>& codec, std::int64_t& base,
                                        T* out) {
  const int width = descriptor & 0x1F;
  if (width == escape_width) {
    if (descriptor == descriptor_raw) {
      const std::size_t bytes = std::size_t(m) * sizeof(T);
      if (bytes > available) return -1;
      std::memcpy(out, in, bytes);
      return int(bytes);
    }
    if (descriptor == descriptor_constant) {
      if (sizeof(T) > available) return -1;
      const T value = load<T>(in);
      for (int i = 0; i < m; ++i) out[i] = value;
      return int(sizeof(T));
    }
    if (descriptor == descriptor_signed_zeros) {
      const int bytes = packed_bytes<BlockSize>(1);
      if (std::size_t(bytes) > available) return -1;
      std::uint32_t signs[BlockSize];
      unpack<BlockSize>(1, in, signs);
      for (int i = 0; i < m; ++i) out[i] = signs[i] ? T(-0.0) : T(0.0);
      return bytes;
    }
    return -1;
  }
  const int delta = (descriptor >> 5) & 1;
  const int length = base_length<T>(descriptor >> 6);
  const int bytes = length + packed_bytes<BlockSize>(width);
  if (!(codec.step > 0.0) || width > max_width || (delta && width == 0) ||
      std::size_t(bytes) > available)
    return -1;
  // Unsigned arithmetic: a corrupted base wraps instead of overflowing.
  const std::int64_t block_base = static_cast<std::int64_t>(
      static_cast<std::uint64_t>(base) +
      static_cast<std::uint64_t>(unzigzag(load_bytes(in, length))));
  if (block_base > std::int64_t(max_code_magnitude) ||
      block_base < -std::int64_t(max_code_magnitude))
    return -1;
  base = block_base;
  std::uint32_t codes[BlockSize];
  unpack<BlockSize>(width, in + length, codes);
  const double step = codec.step;
  if (delta) {
    std::int64_t code = block_base;
    out[0] = value_codec<T>::reconstruct(double(code), step);
    for (int i = 1; i < m; ++i) {
      code += unzigzag(codes[i]);
      out[i] = value_codec<T>::reconstruct(double(code), step);
    }
  } else {
    const double base_value = double(block_base);
    if (codec.has_fill && width > 0) {
      const std::uint32_t fill_code = (std::uint32_t(1) << width) - 1;
      const T fill = from_bits<T>(codec.fill_bits);
      for (int i = 0; i < m; ++i)
        out[i] = codes[i] == fill_code
                     ? fill
                     : value_codec<T>::reconstruct(base_value + double(std::int32_t(codes[i])),
                                                   step);
    } else {
      for (int i = 0; i < m; ++i)
        out[i] = value_codec<T>::reconstruct(base_value + double(std::int32_t(codes[i])), step);
    }
  }
  return bytes;
}

}  // namespace kompress::inline v0::detail
