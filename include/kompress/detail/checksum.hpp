#pragma once
// The stream checksum: a 64-bit multiply-rotate hash over 8-byte little-endian words.
// Each step h -> rotl(h ^ (w * P1), 31) * P2 is a bijection of h for a fixed word and of w for
// a fixed h, so a change confined to one word (every single-byte corruption) always changes
// the result; other corruptions go unnoticed with probability about 2^-64. Table-free, so the
// same function runs on host and device.

#include <kompress/detail/bytes.hpp>

#include <cstddef>
#include <cstdint>

namespace kompress::inline v0::detail {

inline constexpr std::uint64_t checksum_p1 = 0x9E3779B185EBCA87ull;
inline constexpr std::uint64_t checksum_p2 = 0xC2B2AE3D27D4EB4Full;
inline constexpr std::uint64_t checksum_p3 = 0x165667B19E3779F9ull;

KOMPRESS_FUNCTION std::uint64_t rotl64(std::uint64_t x, int r) {
  return (x << r) | (x >> (64 - r));
}

class checksum {
 public:
  KOMPRESS_FUNCTION explicit checksum(std::uint64_t seed = 0) : state_(seed) {}

  /// Mixes `length` bytes. Callers feed whole spans; the span length is mixed in too, so
  /// moving a boundary between two spans changes the result.
  KOMPRESS_FUNCTION void update(const std::byte* data, std::size_t length) {
    std::uint64_t h = state_ ^ (static_cast<std::uint64_t>(length) * checksum_p3);
    std::size_t i = 0;
    for (; i + 8 <= length; i += 8) h = mix(h, load<std::uint64_t>(data + i));
    if (i < length) h = mix(h, load_bytes(data + i, static_cast<int>(length - i)));
    state_ = h;
  }

  KOMPRESS_FUNCTION std::uint64_t value() const { return finish(state_); }

  /// One step of the hash, and its last: checksums_of runs several hashes with them.
  KOMPRESS_FUNCTION static std::uint64_t mix(std::uint64_t h, std::uint64_t word) {
    return rotl64(h ^ (word * checksum_p1), 31) * checksum_p2;
  }
  KOMPRESS_FUNCTION static std::uint64_t finish(std::uint64_t h) {
    h ^= h >> 33;
    h *= checksum_p2;
    h ^= h >> 29;
    h *= checksum_p3;
    h ^= h >> 32;
    return h;
  }

 private:
  std::uint64_t state_;
};

KOMPRESS_FUNCTION std::uint64_t checksum_of(const std::byte* data, std::size_t length) {
  checksum c;
  c.update(data, length);
  return c.value();
}

/// Whether chunk `chunk` of a stream's data matches its checksum: its bytes run from the previous
/// chunk's end to its own (`ends`, the chunk end table), its checksum is the `checksums` table's.
KOMPRESS_FUNCTION bool chunk_matches(const std::byte* data, const std::byte* ends, const std::byte* checksums,
                                     std::uint64_t chunk) {
  const std::uint64_t begin = chunk ? load<std::uint64_t>(ends + 8 * (chunk - 1)) : 0;
  const std::uint64_t end = load<std::uint64_t>(ends + 8 * chunk);
  return checksum_of(data + begin, end - begin) == load<std::uint64_t>(checksums + 8 * chunk);
}

/// checksum_of of N spans at once, the same N values. One hash is a chain of dependent
/// multiplications (about 1.6 bytes per cycle); N chains side by side keep the multiplier
/// busy, so verifying or sealing N chunks costs little more than one.
template <int N>
KOMPRESS_FUNCTION void checksums_of(const std::byte* const (&data)[N],
                                    const std::size_t (&length)[N], std::uint64_t (&result)[N]) {
  std::uint64_t h[N];
  std::size_t common = length[0];
  for (int j = 0; j < N; ++j) {
    h[j] = length[j] * checksum_p3;  // checksum_of's seed 0, then update's length
    common = length[j] < common ? length[j] : common;
  }
  std::size_t i = 0;
  for (; i + 8 <= common; i += 8)
    for (int j = 0; j < N; ++j) h[j] = checksum::mix(h[j], load<std::uint64_t>(data[j] + i));
  for (int j = 0; j < N; ++j) {
    std::size_t k = i;
    for (; k + 8 <= length[j]; k += 8) h[j] = checksum::mix(h[j], load<std::uint64_t>(data[j] + k));
    if (k < length[j]) h[j] = checksum::mix(h[j], load_bytes(data[j] + k, static_cast<int>(length[j] - k)));
    result[j] = checksum::finish(h[j]);
  }
}

}  // namespace kompress::inline v0::detail
