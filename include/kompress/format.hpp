#pragma once
// The kompress stream: a fixed header, two per-chunk tables, then the chunks.
// docs/format.md is the specification; this header is its single implementation.

#include <kompress/bound.hpp>
#include <kompress/codec/ratio.hpp>
#include <kompress/detail/bytes.hpp>
#include <kompress/detail/checksum.hpp>
#include <kompress/detail/arguments.hpp>
#include <kompress/error.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

namespace kompress {
inline namespace v0 {

enum class element_type : std::uint8_t { float32 = 1, float64 = 2 };

/// What a stream's header says about it (kompress::inspect returns it).
struct stream_info {
  int format_major = 0;
  int format_minor = 0;
  element_type type = element_type::float32;
  std::uint64_t count = 0;            ///< elements
  error_bound requested_bound{};      ///< the caller's bound as given
  double absolute_bound = 0.0;        ///< |x - x'| <= this for every element; 0 = lossless
  double quantization_step = 0.0;     ///< 0 when no block is quantized
  bool has_fill_value = false;
  double fill_value = 0.0;
  int block_size = 0;
  int blocks_per_chunk = 0;
  codec_mode codec = codec_mode::fast;
  std::uint64_t chunk_count = 0;
  std::uint64_t compressed_bytes = 0; ///< whole stream, header included
  double value_min = NAN;             ///< over the finite, non-fill values; NaN if none
  double value_max = NAN;

  std::size_t element_size() const { return type == element_type::float32 ? 4 : 8; }
  std::uint64_t uncompressed_bytes() const { return count * element_size(); }
  double ratio() const {
    return compressed_bytes ? double(uncompressed_bytes()) / double(compressed_bytes) : 0.0;
  }
};

namespace detail {

/// The four bytes every stream starts with, "KMPZ" (a function: device code reads no host arrays).
KOMPRESS_FUNCTION constexpr std::byte stream_magic(int i) { return std::byte("KMPZ"[i]); }
inline constexpr int format_major = 1;
/// The newest minor version this library reads and writes: 1.1 adds the ratio codec (flag
/// bit 1), 1.2 its Rice-coded residuals (flag bit 2). Fast-mode streams are still written as
/// 1.0, byte for byte; ratio streams as 1.2.
inline constexpr int format_minor = 2;
inline constexpr std::size_t header_bytes = 88;
inline constexpr std::size_t header_checksum_offset = 80;
/// Where the header keeps the absolute bound used and the stream's length.
inline constexpr std::size_t abs_bound_offset = 24;
inline constexpr std::size_t stream_length_offset = 56;
inline constexpr std::uint32_t flag_fill_value = 1u << 0;
/// Format 1.1: the chunks are ratio chunks (codec/ratio.hpp); block size 32, 128 blocks per chunk.
inline constexpr std::uint32_t flag_ratio_codec = 1u << 1;
/// Format 1.2, with flag_ratio_codec: a ratio chunk may hold Rice-coded residuals.
inline constexpr std::uint32_t flag_rice_residuals = 1u << 2;
inline constexpr int default_blocks_per_chunk = 64;
inline constexpr int ratio_block_size = 32;
inline constexpr int ratio_blocks_per_chunk = 128;

template <class T>
constexpr element_type element_type_of() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "kompress: element type must be float or double");
  return std::is_same_v<T, float> ? element_type::float32 : element_type::float64;
}

/// Sizes of every part of a stream, from its element count and block geometry alone.
struct stream_layout {
  std::uint64_t count = 0;
  std::size_t element_size = 4;
  int block_size = 32;
  int blocks_per_chunk = default_blocks_per_chunk;
  /// Ratio chunks (flag_ratio_codec): 4096 values in at least 5 bytes (codec/ratio.hpp).
  bool ratio = false;

  KOMPRESS_FUNCTION std::uint64_t values_per_chunk() const {
    return std::uint64_t(block_size) * std::uint64_t(blocks_per_chunk);
  }
  KOMPRESS_FUNCTION std::uint64_t block_count() const {
    return (count + block_size - 1) / block_size;
  }
  KOMPRESS_FUNCTION std::uint64_t chunk_count() const {
    return (count + values_per_chunk() - 1) / values_per_chunk();
  }
  KOMPRESS_FUNCTION std::uint64_t chunk_end_table_offset() const { return header_bytes; }
  KOMPRESS_FUNCTION std::uint64_t chunk_checksum_table_offset() const {
    return header_bytes + 8 * chunk_count();
  }
  KOMPRESS_FUNCTION std::uint64_t data_offset() const {
    return header_bytes + 16 * chunk_count();
  }
  KOMPRESS_FUNCTION std::uint64_t values_in_chunk(std::uint64_t chunk) const {
    const std::uint64_t first = chunk * values_per_chunk();
    const std::uint64_t rest = count - first;
    return rest < values_per_chunk() ? rest : values_per_chunk();
  }
  /// Worst case of one chunk: every block stored raw, plus its descriptor byte.
  KOMPRESS_FUNCTION std::uint64_t max_chunk_bytes(std::uint64_t values) const {
    return values * element_size + (values + block_size - 1) / block_size;
  }
  /// Worst case of the whole stream; compress never writes more.
  KOMPRESS_FUNCTION std::uint64_t max_stream_bytes() const {
    return data_offset() + count * element_size + block_count();
  }
  /// The shortest a chunk of `values` values can be: a descriptor byte per block (a quantized
  /// block of width 0 that repeats the previous base has no payload); for ratio chunks, 5 bytes
  /// for 4096 values and 3 to 9 for a shorter last chunk (ratio_min_chunk_bytes).
  KOMPRESS_FUNCTION std::uint64_t min_chunk_bytes(std::uint64_t values) const {
    return ratio ? ratio_min_chunk_bytes(values, element_size) : (values + block_size - 1) / block_size;
  }
  /// The shortest stream of `count` values: a header that claims more values than its bytes
  /// can hold is rejected before anything is allocated for them.
  KOMPRESS_FUNCTION std::uint64_t min_stream_bytes() const {
    if (!ratio) return data_offset() + block_count();
    const std::uint64_t chunks = chunk_count();
    if (chunks == 0) return data_offset();
    // Every chunk but the last holds values_per_chunk() values.
    return data_offset() + (chunks - 1) * min_chunk_bytes(values_per_chunk()) +
           min_chunk_bytes(values_in_chunk(chunks - 1));
  }
};

/// The header's fields, as written at the front of every stream.
struct stream_header {
  element_type type = element_type::float32;
  bound_mode mode = bound_mode::absolute;
  std::uint64_t count = 0;
  double user_bound = 0.0;
  double abs_bound = 0.0;
  double quant_step = 0.0;
  std::uint64_t fill_bits = 0;
  int block_size = 32;
  int blocks_per_chunk = default_blocks_per_chunk;
  std::uint32_t flags = 0;
  std::uint64_t stream_bytes = 0;
  double value_min = NAN;
  double value_max = NAN;
  int minor_version = 0;  ///< as read; writers write 0 (fast codec) or 2 (ratio codec)
  /// How the encoder rounds; not written: the decoder needs only the step.
  rounding_mode rounding = rounding_mode::nearest;
  std::uint64_t rounding_seed = 0;

  KOMPRESS_FUNCTION bool ratio() const { return (flags & flag_ratio_codec) != 0; }
  KOMPRESS_FUNCTION stream_layout layout() const {
    return {count, type == element_type::float32 ? 4u : 8u, block_size, blocks_per_chunk, ratio()};
  }
};

/// Writes the header's 80 field bytes (the checksum at offset 80 is written separately).
KOMPRESS_FUNCTION void write_header_fields(std::byte* p, const stream_header& h) {
  for (int i = 0; i < 4; ++i) p[i] = stream_magic(i);
  p[4] = std::byte(format_major);
  // Fast-mode streams stay 1.0; ratio streams are 1.2, or 1.1 without Rice residuals.
  p[5] = std::byte((h.flags & flag_rice_residuals) ? 2 : h.ratio() ? 1 : 0);
  p[6] = std::byte(static_cast<std::uint8_t>(h.type));
  p[7] = std::byte(static_cast<std::uint8_t>(h.mode));
  store<std::uint64_t>(p + 8, h.count);
  store<double>(p + 16, h.user_bound);
  store<double>(p + abs_bound_offset, h.abs_bound);
  store<double>(p + 32, h.quant_step);
  store<std::uint64_t>(p + 40, h.fill_bits);
  store<std::uint16_t>(p + 48, static_cast<std::uint16_t>(h.block_size));
  store<std::uint16_t>(p + 50, static_cast<std::uint16_t>(h.blocks_per_chunk));
  store<std::uint32_t>(p + 52, h.flags);
  store<std::uint64_t>(p + stream_length_offset, h.stream_bytes);
  store<double>(p + 64, h.value_min);
  store<double>(p + 72, h.value_max);
}

/// The header checksum covers the header's field bytes and both chunk tables.
KOMPRESS_FUNCTION std::uint64_t header_checksum(const std::byte* stream,
                                                     std::uint64_t data_offset) {
  checksum c;
  c.update(stream, header_checksum_offset);
  c.update(stream + header_bytes, data_offset - header_bytes);
  return c.value();
}

[[noreturn]] inline void throw_format(const char* who, const std::string& what) {
  throw format_error(std::string(who) + ": " + what);
}

/// Parses and checks a header. `prefix` holds the first `prefix_bytes` bytes of a stream whose
/// total length is `available`; when the prefix covers the chunk tables, they are checked too.
/// Throws format_error naming what is wrong; never reads past `prefix_bytes`.
inline stream_header parse_header(const std::byte* prefix, std::size_t prefix_bytes,
                                  std::size_t available, const char* who) {
  if (available < header_bytes || prefix_bytes < header_bytes)
    throw_format(who, "stream truncated (got " + std::to_string(available) +
                          " bytes, a header alone needs " + std::to_string(header_bytes) + ")");
  for (int i = 0; i < 4; ++i)
    if (prefix[i] != stream_magic(i))
      throw_format(who, "not a kompress stream (wrong magic bytes)");
  const int major = int(prefix[4]), minor = int(prefix[5]);
  if (major != format_major)
    throw_format(who, "unsupported stream format version " + std::to_string(major) + "." +
                          std::to_string(minor) + " (this library reads " +
                          std::to_string(format_major) + ".x)");
  stream_header h;
  h.minor_version = minor;
  const auto type = std::uint8_t(prefix[6]);
  if (type != 1 && type != 2)
    throw_format(who, "unknown element type code " + std::to_string(type));
  h.type = element_type(type);
  const auto mode = std::uint8_t(prefix[7]);
  if (mode > 1) throw_format(who, "unknown bound mode code " + std::to_string(mode));
  h.mode = bound_mode(mode);
  h.count = load<std::uint64_t>(prefix + 8);
  h.user_bound = load<double>(prefix + 16);
  h.abs_bound = load<double>(prefix + abs_bound_offset);
  h.quant_step = load<double>(prefix + 32);
  h.fill_bits = load<std::uint64_t>(prefix + 40);
  h.block_size = load<std::uint16_t>(prefix + 48);
  h.blocks_per_chunk = load<std::uint16_t>(prefix + 50);
  h.flags = load<std::uint32_t>(prefix + 52);
  h.stream_bytes = load<std::uint64_t>(prefix + stream_length_offset);
  h.value_min = load<double>(prefix + 64);
  h.value_max = load<double>(prefix + 72);

  if (!supported_block_size(h.block_size))
    throw_format(who, "unsupported block size " + std::to_string(h.block_size));
  if (h.blocks_per_chunk < 1) throw_format(who, "blocks per chunk is 0");
  const std::uint32_t known_flags = flag_fill_value | (minor >= 1 ? flag_ratio_codec : 0u) |
                                    (minor >= 2 ? flag_rice_residuals : 0u);
  if ((h.flags & ~known_flags) != 0)
    throw_format(who, "unknown flag bits " + std::to_string(h.flags) + " (this library knows bits 0" +
                          (minor >= 2 ? ", 1 and 2" : minor >= 1 ? " and 1" : "") + " in a " +
                          std::to_string(major) + "." + std::to_string(minor) + " stream)");
  if ((h.flags & flag_rice_residuals) && !(h.flags & flag_ratio_codec))
    throw_format(who, "flag bit 2 (Rice residuals) without flag bit 1 (ratio chunks)");
  if (h.ratio() && (h.block_size != ratio_block_size || h.blocks_per_chunk != ratio_blocks_per_chunk))
    throw_format(who, "a ratio-codec stream must have block size 32 and 128 blocks per chunk (got " +
                          std::to_string(h.block_size) + " and " + std::to_string(h.blocks_per_chunk) + ")");
  if (!(h.quant_step >= 0.0) || !std::isfinite(h.quant_step) || !(h.abs_bound >= 0.0))
    throw_format(who, "invalid quantization step or bound in header");
  const std::size_t element_size = h.type == element_type::float32 ? 4 : 8;
  // Bound the count before any size arithmetic so nothing below can overflow.
  if (h.count > (std::uint64_t(1) << 58) / element_size)
    throw_format(who, "element count " + std::to_string(h.count) + " is implausibly large");
  const stream_layout layout = h.layout();
  if (h.stream_bytes < layout.min_stream_bytes())
    throw_format(who, "stream too short for its element count (header says " +
                          std::to_string(h.stream_bytes) + " bytes for " +
                          std::to_string(h.count) + " elements, which need at least " +
                          std::to_string(layout.min_stream_bytes()) +
                          (h.ratio() ? ": the tables and the shortest chunks, 5 bytes per 4096 values)"
                                     : ": the tables and a descriptor byte per block)"));
  if (h.stream_bytes > layout.max_stream_bytes())
    throw_format(who, "stream length " + std::to_string(h.stream_bytes) +
                          " in header is impossible for " + std::to_string(h.count) +
                          " elements");
  if (h.stream_bytes > available)
    throw_format(who, "stream truncated (header says " + std::to_string(h.stream_bytes) +
                          " bytes, got " + std::to_string(available) + ")");
  if (prefix_bytes >= layout.data_offset()) {
    if (header_checksum(prefix, layout.data_offset()) !=
        load<std::uint64_t>(prefix + header_checksum_offset))
      throw_format(who, "header checksum mismatch (the header or chunk tables are corrupted)");
    // Chunk ends must rise and the last must close the stream exactly.
    std::uint64_t previous = 0;
    const std::uint64_t chunks = layout.chunk_count();
    for (std::uint64_t c = 0; c < chunks; ++c) {
      const auto end = load<std::uint64_t>(prefix + header_bytes + 8 * c);
      const std::uint64_t values = layout.values_in_chunk(c);
      if (end < previous || end - previous > layout.max_chunk_bytes(values) ||
          end - previous < layout.min_chunk_bytes(values))
        throw_format(who, "chunk table corrupted at chunk " + std::to_string(c));
      previous = end;
    }
    if (layout.data_offset() + previous != h.stream_bytes)
      throw_format(who, "chunk table does not match the stream length");
  }
  return h;
}

inline stream_info to_info(const stream_header& h) {
  stream_info info;
  info.format_major = format_major;
  info.format_minor = h.minor_version;
  info.type = h.type;
  info.count = h.count;
  info.requested_bound = {h.mode, h.user_bound};
  info.absolute_bound = h.abs_bound;
  info.quantization_step = h.quant_step;
  info.has_fill_value = (h.flags & flag_fill_value) != 0;
  if (info.has_fill_value)
    info.fill_value = h.type == element_type::float32
                          ? double(from_bits<float>(static_cast<std::uint32_t>(h.fill_bits)))
                          : from_bits<double>(h.fill_bits);
  info.block_size = h.block_size;
  info.blocks_per_chunk = h.blocks_per_chunk;
  info.codec = h.ratio() ? codec_mode::ratio : codec_mode::fast;
  info.chunk_count = h.layout().chunk_count();
  info.compressed_bytes = h.stream_bytes;
  info.value_min = h.value_min;
  info.value_max = h.value_max;
  return info;
}

}  // namespace detail
}  // namespace v0
}  // namespace kompress
