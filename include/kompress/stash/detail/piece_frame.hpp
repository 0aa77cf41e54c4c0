#pragma once
// A stream in the stash's pool without its 88-byte header (docs/stash.md, "Framed streams"). A
// stash stores many small streams whose headers say the same thing: the element type, the
// codec, its block sizes, the bound. A stream in the pool keeps only what differs, in a 16-byte
// frame, followed by its chunk tables and chunks as the codec wrote them:
//
//   frame, 16 bytes: f64 the quantization step; u32 the value count; u8 the stream's flags;
//     u8 its block size; u16 its blocks per chunk;
//   the stream from its byte 88 on (chunk end table, chunk checksum table, chunks).
//
// Restore rebuilds the header from the frame and the stash's codec options, checks it and the
// chunk tables as kompress::decompress checks a stream's (format.hpp's parse_header), and
// decodes the chunks where they lie. The chunks keep their checksums; the frame has none of its
// own, and every field but the step is checked against what the stash recorded.

#include <kompress/compress.hpp>
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

/// Writes the frame of a stream whose header reads as `info` at `frame` (16 bytes in the memory
/// `exec` writes), through `exec`: over the header's last 16 bytes, the framed stream is
/// [stream + piece_frame_offset, + framed_bytes(info.compressed_bytes)); elsewhere, the frame
/// and the stream from its byte 88 on are stored one after the other.
template <class ExecutionSpace>
void write_piece_frame(const ExecutionSpace& exec, std::byte* frame, const stream_info& info) {
  const double step = info.quantization_step;
  const auto count = static_cast<std::uint32_t>(info.count);
  const std::uint32_t flags = (info.has_fill_value ? flag_fill_value : 0u) |
                              (info.codec == codec_mode::ratio ? flag_ratio_codec : 0u) |
                              (info.format_minor >= 2 ? flag_rice_residuals : 0u);
  const std::uint32_t shape = flags | std::uint32_t(info.block_size) << 8 | std::uint32_t(info.blocks_per_chunk) << 16;
  const auto write = [=] KOKKOS_FUNCTION(int) {
    store<double>(frame, step);
    store<std::uint32_t>(frame + 8, count);
    store<std::uint32_t>(frame + 12, shape);
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
/// stash used; its bound and rounding do not matter). Throws format_error where the frame or the
/// chunk tables are not what a stream of those values could hold. Reads the frame and the chunk
/// tables to the host (through `exec`, waited for, where the host cannot read them).
template <class T, class ExecutionSpace>
stream_header read_framed_header(const ExecutionSpace& exec, const std::byte* framed, std::size_t bytes,
                                 std::size_t count, const compress_options& codec, const char* who) {
  using memory_space = typename ExecutionSpace::memory_space;
  stream_header header = header_fields_of<T>(codec, count);
  header.stream_bytes = bytes + piece_frame_offset;
  header.value_min = header.value_max = NAN;
  const std::size_t data_offset = header.layout().data_offset();
  if (bytes < piece_frame_bytes || header.stream_bytes < data_offset)
    throw_format(who, "a framed piece of " + std::to_string(bytes) + " bytes is too short for " +
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
  header.quant_step = load<double>(frame);
  const auto framed_count = load<std::uint32_t>(frame + 8);
  const auto shape = load<std::uint32_t>(frame + 12);
  if (framed_count != count || (shape & 0xFF) != header.flags || int((shape >> 8) & 0xFF) != header.block_size ||
      int(shape >> 16) != header.blocks_per_chunk)
    throw_format(who, "a framed piece's frame does not match its entry (the pool is corrupted)");
  header.minor_version = header.ratio() ? 2 : 0;
  write_header_fields(prefix.data(), header);
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
