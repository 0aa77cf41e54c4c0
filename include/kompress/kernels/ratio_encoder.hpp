#pragma once
// The ratio codec's chunk encoder and chunk decoding (codec/ratio.hpp mapped over chunks): the
// counterparts of chunk_encoder and decompress_chunks for codec_mode::ratio streams. Chunks are
// encoded at their worst-case slots and assembled by the same steps as fast-mode streams
// (enqueue_compress_kernels).

#include <kompress/codec/ratio.hpp>
#include <kompress/format.hpp>
#include <kompress/kernels/chunk_encoder.hpp>
#include <kompress/kernels/value_range.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>

namespace kompress::detail {

/// Encodes ratio chunk `chunk` at its worst-case slot and records its length and checksum.
/// Each call keeps its scratch (ratio_scratch, about 54 KiB) on its own stack.
template <class T>
struct ratio_chunk_encoder {
  const T* in;
  const packed_range<T>* range;
  std::byte* data;
  std::byte* ends;
  std::byte* checksums;
  stream_header base;
  stream_layout layout;
  std::uint64_t values_per_chunk;
  std::uint64_t full_chunk_bytes;
  ratio_shape shape;

  KOKKOS_INLINE_FUNCTION void operator()(std::uint64_t chunk) const { encode(chunk); }

  KOKKOS_INLINE_FUNCTION void encode(std::uint64_t chunk) const {
    const value_codec<T> codec = plan_compression<T>(base, *range).codec;
    std::byte* const slot = data + chunk * full_chunk_bytes;
    ratio_scratch scratch;
    const std::uint64_t first = chunk * values_per_chunk;
    const std::uint64_t bytes =
        encode_ratio_chunk<T>(in + first, int(layout.values_in_chunk(chunk)), first, shape, codec,
                              scratch, slot);
    store<std::uint64_t>(ends + 8 * chunk, bytes);
    store<std::uint64_t>(checksums + 8 * chunk, checksum_of(slot, bytes));
  }
};

/// The ratio predictors' view of a View's shape: extents in memory order, fastest first,
/// extents of 1 left out. Layouts other than Left and Right give none (1-D predictors only).
template <class View>
ratio_shape ratio_shape_of(const View& view) {
  using layout = typename View::array_layout;
  constexpr int rank = int(View::rank);
  std::uint64_t extents[8] = {};
  int k = 0;
  if constexpr (std::is_same_v<layout, Kokkos::LayoutRight>) {
    for (int d = rank - 1; d >= 0; --d)
      if (view.extent(d) > 1) extents[k++] = view.extent(d);
  } else if constexpr (std::is_same_v<layout, Kokkos::LayoutLeft>) {
    for (int d = 0; d < rank; ++d)
      if (view.extent(d) > 1) extents[k++] = view.extent(d);
  }
  ratio_shape shape;
  if (k >= 2) shape.row = extents[0];
  if (k >= 3) shape.plane_rows = extents[1];
  return shape;
}

/// Verifies every chunk's checksum, then decodes the ratio chunks. Throws format_error before
/// writing any output if a checksum does not match.
template <class T, class Exec>
void decompress_ratio_chunks(const Exec& exec, const std::byte* in, const stream_header& header,
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
      "kompress::decompress::decode_ratio_chunks", Kokkos::RangePolicy<Exec>(exec, 0, chunks),
      KOKKOS_LAMBDA(std::uint64_t chunk, std::uint64_t& bad) {
        const std::uint64_t begin = chunk_begin(chunk);
        const std::uint64_t end = load<std::uint64_t>(ends + 8 * chunk);
        ratio_scratch scratch;
        const std::uint64_t first = chunk * values_per_chunk;
        if (!decode_ratio_chunk<T>(data + begin, end - begin, int(layout.values_in_chunk(chunk)),
                                   first, codec, scratch, out + first))
          bad = chunk < bad ? chunk : bad;
      },
      Kokkos::Min<std::uint64_t>(first_bad));
  if (first_bad < chunks)
    throw_format(who, "malformed ratio chunk " + std::to_string(first_bad));
}

}  // namespace kompress::detail
