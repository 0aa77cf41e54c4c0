#pragma once
// A stream in the stash's pool without its 88-byte header (docs/stash.md, "Framed streams"). A
// stash stores many small streams whose headers say the same thing: the element type, the
// codec, its block sizes, the bound. A stream in the pool keeps only what differs, in a 16-byte
// frame, followed by its chunk tables and chunks as the codec wrote them:
//
//   frame, 16 bytes: f64 the quantization step; u32 the value count; u32 the frame's check,
//     the low 32 bits of the stream's header checksum over the header the frame stands for
//     (framed_header: the stash's codec options, the step and the count, the bounds 0, the
//     value range NaN) and the chunk tables;
//   the stream from its byte 88 on (chunk end table, chunk checksum table, chunks).
//
// Restore rebuilds the header from the frame and the stash's codec options, checks it and the
// chunk tables against the frame's check and as kompress::decompress checks a stream's
// (format.hpp's parse_header), and decodes the chunks where they lie, their checksums checked.

#include <kompress/compress.hpp>
#include <kompress/detail/checksum.hpp>
#include <kompress/format.hpp>

#include <Kokkos_Core.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace kompress::inline v0::detail {

inline constexpr std::size_t piece_frame_bytes = 16;
/// The frame is written over the last 16 of the stream's 88 header bytes, so a framed stream is
/// the stream from this byte on.
inline constexpr std::size_t piece_frame_offset = header_bytes - piece_frame_bytes;

/// Bytes of the framed form of a stream of `stream_bytes`.
constexpr std::size_t framed_bytes(std::size_t stream_bytes) { return stream_bytes - piece_frame_offset; }

/// The header a framed stream stands for, from what differs between a stash's streams: its
/// bounds left 0 and its value range NaN (neither is needed to decode), so that save and
/// restore rebuild the same bytes, which the frame's check covers.
inline stream_header framed_header(stream_header header, double step, std::size_t stream_bytes) {
  header.mode = bound_mode::absolute;
  header.user_bound = header.abs_bound = 0.0;
  header.quant_step = step;
  header.stream_bytes = stream_bytes;
  header.value_min = header.value_max = NAN;
  header.minor_version = (header.flags & flag_rice_residuals) ? 2 : header.ratio() ? 1 : 0;
  return header;
}

/// The header fields a stream's `info` gives.
inline stream_header header_of(const stream_info& info) {
  stream_header header;
  header.type = info.type;
  header.count = info.count;
  header.block_size = info.block_size;
  header.blocks_per_chunk = info.blocks_per_chunk;
  header.flags = (info.has_fill_value ? flag_fill_value : 0u) |
                 (info.codec == codec_mode::ratio ? flag_ratio_codec : 0u) |
                 (info.format_minor >= 2 ? flag_rice_residuals : 0u);
  if (info.has_fill_value)
    header.fill_bits = info.type == element_type::float32 ? to_bits(static_cast<float>(info.fill_value))
                                                          : to_bits(info.fill_value);
  return framed_header(header, info.quantization_step, info.compressed_bytes);
}

/// The rebuilt header's 80 field bytes, as a kernel takes them.
struct header_field_bytes {
  std::byte bytes[header_checksum_offset];
};

/// The frame's check: the low 32 bits of the stream's header checksum over the rebuilt fields
/// and the chunk tables (`table_bytes` at `tables`).
KOMPRESS_FUNCTION std::uint32_t frame_check(const header_field_bytes& fields, const std::byte* tables,
                                            std::size_t table_bytes) {
  checksum c;
  c.update(fields.bytes, header_checksum_offset);
  c.update(tables, table_bytes);
  return static_cast<std::uint32_t>(c.value());
}

/// Writes the frame of the stream at `stream` (in the memory `exec` writes; its header read as
/// `info`) at `frame` (16 bytes there), through `exec`: over the header's last 16 bytes, the
/// framed stream is [stream + piece_frame_offset, + framed_bytes(info.compressed_bytes));
/// elsewhere, the frame and the stream from its byte 88 on are stored one after the other.
template <class ExecutionSpace>
void write_piece_frame(const ExecutionSpace& exec, const std::byte* stream, std::byte* frame,
                       const stream_info& info) {
  const stream_header header = header_of(info);
  header_field_bytes fields;
  write_header_fields(fields.bytes, header);
  const double step = info.quantization_step;
  const auto count = static_cast<std::uint32_t>(info.count);
  const std::byte* const tables = stream + header_bytes;
  const std::size_t table_bytes = header.layout().data_offset() - header_bytes;
  const auto write = [=] KOKKOS_FUNCTION(int) {
    const std::uint32_t check = frame_check(fields, tables, table_bytes);
    store<double>(frame, step);
    store<std::uint32_t>(frame + 8, count);
    store<std::uint32_t>(frame + 12, check);
  };
  // The host writes host memory directly (`exec` has finished the stream: its header was read);
  // elsewhere a one-thread kernel, ordered on `exec` before the copies that read the frame.
  if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename ExecutionSpace::memory_space>::accessible)
    write(0);
  else
    Kokkos::parallel_for("kompress::stash::frame_stream", Kokkos::RangePolicy<ExecutionSpace>(exec, 0, 1), write);
}

/// The checked header of the framed stream at `framed` (`bytes` long, in `exec`'s memory) of
/// `count` values of T compressed with `codec` (the fill value, the codec and block size the
/// stash used; its bound and rounding do not matter). Throws format_error where the frame's
/// check does not match the header it rebuilds and the chunk tables, or the tables are not what
/// a stream of those values could hold. Reads the frame and the chunk tables to the host
/// (through `exec`, waited for, where the host cannot read them).
template <class T, class ExecutionSpace>
stream_header read_framed_header(const ExecutionSpace& exec, const std::byte* framed, std::size_t bytes,
                                 std::size_t count, const compress_options& codec, const char* who) {
  using memory_space = typename ExecutionSpace::memory_space;
  stream_header header = header_fields_of<T>(codec, count);
  const std::size_t data_offset = header.layout().data_offset();
  if (bytes < piece_frame_bytes || bytes + piece_frame_offset < data_offset)
    throw_format(who, "a framed stream of " + std::to_string(bytes) + " bytes is too short for " +
                          std::to_string(count) + " values");
  // The frame and the tables, behind a header rebuilt for parse_header to check (on the stack
  // for up to 58 chunks: a restore reads one such prefix per stream).
  std::array<std::byte, 1024> small;
  std::vector<std::byte> large(data_offset > small.size() ? data_offset : 0);
  const std::span<std::byte> prefix(data_offset > small.size() ? large.data() : small.data(), data_offset);
  const std::size_t copied = data_offset - piece_frame_offset;
  if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, memory_space>::accessible) {
    std::memcpy(prefix.data() + piece_frame_offset, framed, copied);
  } else {
    Kokkos::deep_copy(exec,
                      Kokkos::View<std::byte*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                          prefix.data() + piece_frame_offset, copied),
                      Kokkos::View<const std::byte*, memory_space, Kokkos::MemoryUnmanaged>(framed, copied));
    exec.fence("kompress::stash::restore: frame read");
  }
  const std::byte* const frame = prefix.data() + piece_frame_offset;
  if (load<std::uint32_t>(frame + 8) != count)
    throw_format(who, "a framed stream's count does not match its entry's (the pool is corrupted)");
  header = framed_header(header, load<double>(frame), bytes + piece_frame_offset);
  header_field_bytes fields;
  write_header_fields(fields.bytes, header);
  if (frame_check(fields, prefix.data() + header_bytes, data_offset - header_bytes) != load<std::uint32_t>(frame + 12))
    throw_format(who, "a framed stream's frame or chunk tables do not match its check (the pool is corrupted)");
  std::memcpy(prefix.data(), fields.bytes, header_checksum_offset);
  store<std::uint64_t>(prefix.data() + header_checksum_offset, header_checksum(prefix.data(), data_offset));
  return parse_header(prefix.data(), data_offset, header.stream_bytes, who);
}

/// Decodes the framed stream at `framed` (`header` from read_framed_header) into `out`.
template <class ExecutionSpace, class OutView>
void decompress_framed(const ExecutionSpace& exec, const std::byte* framed, const stream_header& header,
                       const OutView& out, const char* who) {
  // The decoder reads the stream from its byte 88 on (the tables, then the chunks): a pointer
  // 72 bytes before the frame, inside the pool (its workspace comes first), stands for the
  // header it no longer needs.
  const Kokkos::View<const std::byte*, typename ExecutionSpace::memory_space, Kokkos::MemoryUnmanaged> stream(
      framed - piece_frame_offset, header.stream_bytes);
  decompress_parsed(exec, stream, header, out, who);
}

}  // namespace kompress::inline v0::detail
