#pragma once
// Fixed-width bit packing of a block's unsigned codes: value i takes bits [i*w, (i+1)*w) of
// a little-endian bit string. Width and block size are template parameters so every shift
// and index is a constant in the unrolled loop.

#include <kompress/detail/bytes.hpp>

#include <cstddef>
#include <cstdint>
#include <utility>

namespace kompress::inline v0::detail {

/// Widths 0..max_width are encodable; a block needing more is stored raw.
inline constexpr int max_width = 30;

template <int BlockSize>
KOMPRESS_FUNCTION constexpr int packed_bytes(int width) {
  return BlockSize * width / 8;
}

template <int BlockSize, int Width>
KOMPRESS_FUNCTION void pack_fixed(const std::uint32_t* values, std::byte* out) {
  static_assert(BlockSize % 32 == 0, "kompress::detail::pack_fixed: block size must be a multiple of 32");
  if constexpr (Width > 0) {
    // 64-bit words: half the values that straddle a word. Little-endian, as unpack_fixed.
    constexpr int bytes = BlockSize * Width / 8, words = (bytes + 7) / 8;
    std::uint64_t packed[words] = {};
    KOMPRESS_UNROLL
    for (int i = 0; i < BlockSize; ++i) {
      const int bit = i * Width, word = bit >> 6, shift = bit & 63;
      packed[word] |= std::uint64_t(values[i]) << shift;
      if (shift + Width > 64) packed[word + 1] |= std::uint64_t(values[i]) >> (64 - shift);
    }
    std::memcpy(out, packed, bytes);
  }
}

template <int BlockSize, int Width>
KOMPRESS_FUNCTION void unpack_fixed(const std::byte* in, std::uint32_t* values) {
  if constexpr (Width == 0) {
    for (int i = 0; i < BlockSize; ++i) values[i] = 0;
  } else {
    constexpr int words = BlockSize * Width / 32;
    constexpr std::uint32_t mask = (std::uint32_t(1) << Width) - 1;
    std::uint32_t packed[words + 1];
    std::memcpy(packed, in, sizeof(std::uint32_t) * words);
    packed[words] = 0;
    KOMPRESS_UNROLL
    for (int i = 0; i < BlockSize; ++i) {
      const int bit = i * Width, word = bit >> 5, shift = bit & 31;
      std::uint32_t v = packed[word] >> shift;
      if (shift + Width > 32) v |= packed[word + 1] << (32 - shift);
      values[i] = v & mask;
    }
  }
}

template <int BlockSize, int... Widths>
KOMPRESS_FUNCTION void pack_dispatch(int width, const std::uint32_t* values, std::byte* out,
                                          std::integer_sequence<int, Widths...>) {
  (void)((width == Widths ? (pack_fixed<BlockSize, Widths>(values, out), true) : false) || ...);
}
template <int BlockSize, int... Widths>
KOMPRESS_FUNCTION void unpack_dispatch(int width, const std::byte* in, std::uint32_t* values,
                                            std::integer_sequence<int, Widths...>) {
  (void)((width == Widths ? (unpack_fixed<BlockSize, Widths>(in, values), true) : false) || ...);
}

/// Packs BlockSize values of `width` bits (0 <= width <= max_width) into packed_bytes(width).
template <int BlockSize>
KOMPRESS_FUNCTION void pack(int width, const std::uint32_t* values, std::byte* out) {
  pack_dispatch<BlockSize>(width, values, out,
                                   std::make_integer_sequence<int, max_width + 1>{});
}

template <int BlockSize>
KOMPRESS_FUNCTION void unpack(int width, const std::byte* in, std::uint32_t* values) {
  unpack_dispatch<BlockSize>(width, in, values,
                                     std::make_integer_sequence<int, max_width + 1>{});
}

}  // namespace kompress::inline v0::detail
