#pragma once
// The array kernels: the block codec mapped over chunks with Kokkos.
//
// Compression is three launches on the caller's execution space instance:
//   1. every chunk is encoded by one thread at its worst-case position in the output, writing
//      its length and checksum to the chunk tables;
//   2. an inclusive scan turns the lengths into chunk ends;
//   3. one thread moves the chunks down into place in order (a chunk only ever moves towards
//      the front, over space already vacated) and writes the header and its checksum.
// Step 3 copies compressed bytes only, a fraction of the input. The stream does not depend
// on the thread count: every chunk's bytes depend on its values alone.

#include <kompress/codec/chunk.hpp>
#include <kompress/format.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstring>

namespace kompress::detail {

template <class T, int BlockSize, class Exec>
std::uint64_t compress_chunks(const Exec& exec, const T* in, std::byte* out,
                              const stream_header& header, const value_codec<T>& codec) {
  const stream_layout layout = header.layout();
  const std::uint64_t chunks = layout.chunk_count();
  const std::uint64_t values_per_chunk = layout.values_per_chunk();
  const std::uint64_t full_chunk_bytes = layout.max_chunk_bytes(values_per_chunk);
  std::byte* const ends = out + layout.chunk_end_table_offset();
  std::byte* const checksums = out + layout.chunk_checksum_table_offset();
  std::byte* const data = out + layout.data_offset();

  Kokkos::parallel_for(
      "kompress::compress::encode_chunks", Kokkos::RangePolicy<Exec>(exec, 0, chunks),
      KOKKOS_LAMBDA(std::uint64_t chunk) {
        std::byte* const slot = data + chunk * full_chunk_bytes;
        const std::uint64_t length = encode_chunk<T, BlockSize>(
            in + chunk * values_per_chunk, layout.values_in_chunk(chunk), codec, slot);
        store<std::uint64_t>(ends + 8 * chunk, length);
        store<std::uint64_t>(checksums + 8 * chunk, checksum_of(slot, length));
      });
  Kokkos::parallel_scan(
      "kompress::compress::chunk_offsets", Kokkos::RangePolicy<Exec>(exec, 0, chunks),
      KOKKOS_LAMBDA(std::uint64_t chunk, std::uint64_t& end, bool final) {
        end += load<std::uint64_t>(ends + 8 * chunk);
        if (final) store<std::uint64_t>(ends + 8 * chunk, end);
      });
  std::uint64_t stream_bytes = 0;
  Kokkos::parallel_reduce(
      "kompress::compress::assemble", Kokkos::RangePolicy<Exec>(exec, 0, 1),
      KOKKOS_LAMBDA(int, std::uint64_t& total) {
        std::uint64_t begin = chunks ? load<std::uint64_t>(ends) : 0;
        for (std::uint64_t chunk = 1; chunk < chunks; ++chunk) {
          const std::uint64_t end = load<std::uint64_t>(ends + 8 * chunk);
          std::byte* const from = data + chunk * full_chunk_bytes;
          std::byte* const to = data + begin;
          if (to != from) {
            KOKKOS_IF_ON_HOST((std::memmove(to, from, end - begin);))
            KOKKOS_IF_ON_DEVICE((for (std::uint64_t i = 0; i < end - begin; ++i) to[i] = from[i];))
          }
          begin = end;
        }
        stream_header h = header;
        h.stream_bytes = layout.data_offset() + begin;
        write_header_fields(out, h);
        store<std::uint64_t>(out + header_checksum_offset,
                             header_checksum(out, layout.data_offset()));
        total = h.stream_bytes;
      },
      stream_bytes);
  return stream_bytes;
}

/// Verifies every chunk's checksum, then decodes. Throws format_error before writing any
/// output if a checksum does not match.
template <class T, int BlockSize, class Exec>
void decompress_chunks(const Exec& exec, const std::byte* in, const stream_header& header,
                       const value_codec<T>& codec, T* out, const char* who) {
  const stream_layout layout = header.layout();
  const std::uint64_t chunks = layout.chunk_count();
  const std::uint64_t values_per_chunk = layout.values_per_chunk();
  const std::byte* const ends = in + layout.chunk_end_table_offset();
  const std::byte* const checksums = in + layout.chunk_checksum_table_offset();
  const std::byte* const data = in + layout.data_offset();
  const auto chunk_begin = [=] KOKKOS_FUNCTION(std::uint64_t chunk) {
    return chunk ? load<std::uint64_t>(ends + 8 * (chunk - 1)) : std::uint64_t(0);
  };

  std::uint64_t first_bad = chunks;
  Kokkos::parallel_reduce(
      "kompress::decompress::verify", Kokkos::RangePolicy<Exec>(exec, 0, chunks),
      KOKKOS_LAMBDA(std::uint64_t chunk, std::uint64_t& bad) {
        const std::uint64_t begin = chunk_begin(chunk);
        const std::uint64_t end = load<std::uint64_t>(ends + 8 * chunk);
        if (checksum_of(data + begin, end - begin) != load<std::uint64_t>(checksums + 8 * chunk))
          bad = chunk < bad ? chunk : bad;
      },
      Kokkos::Min<std::uint64_t>(first_bad));
  if (first_bad < chunks)
    throw_format(who, "checksum mismatch in chunk " + std::to_string(first_bad) + " of " +
                          std::to_string(chunks) + " (the stream is corrupted)");

  Kokkos::parallel_reduce(
      "kompress::decompress::decode_chunks", Kokkos::RangePolicy<Exec>(exec, 0, chunks),
      KOKKOS_LAMBDA(std::uint64_t chunk, std::uint64_t& bad) {
        const std::uint64_t begin = chunk_begin(chunk);
        const std::uint64_t end = load<std::uint64_t>(ends + 8 * chunk);
        if (!decode_chunk<T, BlockSize>(data + begin, end - begin,
                                        layout.values_in_chunk(chunk), codec,
                                        out + chunk * values_per_chunk))
          bad = chunk < bad ? chunk : bad;
      },
      Kokkos::Min<std::uint64_t>(first_bad));
  if (first_bad < chunks)
    throw_format(who, "malformed block data in chunk " + std::to_string(first_bad));
}

}  // namespace kompress::detail
