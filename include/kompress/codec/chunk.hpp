#pragma once
// A chunk: blocks_per_chunk consecutive blocks, coded by one thread with no reference outside
// the chunk. Layout: one descriptor byte per block, then each block's payload in order.
// Base differences chain from block to block inside a chunk and restart at 0 in the next.

#include <kompress/codec/block.hpp>

#include <cstddef>
#include <cstdint>

namespace kompress::inline v0::detail {

/// Encodes `count` values, the first at index `first_index` of the stream, into `out` (room
/// for count * sizeof(T) + blocks bytes); returns the chunk's length in bytes.
template <class T, int BlockSize>
KOMPRESS_FUNCTION std::uint64_t encode_chunk(const T* in, std::uint64_t count, std::uint64_t first_index,
                                             const value_codec<T>& codec, std::byte* out) {
  const std::uint64_t blocks = (count + BlockSize - 1) / BlockSize;
  std::byte* payload = out + blocks;
  std::int64_t base = 0;
  for (std::uint64_t b = 0; b < blocks; ++b) {
    const std::uint64_t first = b * BlockSize;
    const int m = int(count - first < BlockSize ? count - first : BlockSize);
    std::uint8_t descriptor = 0;
    payload += encode_block<T, BlockSize>(in + first, m, first_index + first, codec, base, descriptor, payload);
    out[b] = std::byte(descriptor);
  }
  return std::uint64_t(payload - out);
}

/// Decodes a chunk of exactly `bytes` bytes into `count` values; false if it is malformed.
template <class T, int BlockSize>
KOMPRESS_FUNCTION bool decode_chunk(const std::byte* in, std::uint64_t bytes,
                                         std::uint64_t count, const value_codec<T>& codec,
                                         T* out) {
  const std::uint64_t blocks = (count + BlockSize - 1) / BlockSize;
  if (bytes < blocks) return false;
  std::uint64_t position = blocks;
  std::int64_t base = 0;
  for (std::uint64_t b = 0; b < blocks; ++b) {
    const std::uint64_t first = b * BlockSize;
    const int m = int(count - first < BlockSize ? count - first : BlockSize);
    const int used = decode_block<T, BlockSize>(in + position, bytes - position,
                                                std::uint8_t(in[b]), m, codec, base, out + first);
    if (used < 0) return false;
    position += std::uint64_t(used);
  }
  return position == bytes;
}

}  // namespace kompress::inline v0::detail
