#pragma once
// The ratio codec's chunk encoder and chunk decoder (codec/ratio.hpp mapped over chunks): the
// counterparts of chunk_encoder and chunk_decoder for codec_mode::ratio streams. Chunks are
// encoded at their worst-case slots and assembled by the same steps as fast-mode streams
// (enqueue_compress_kernels).

#include <kompress/codec/ratio.hpp>
#include <kompress/format.hpp>
#include <kompress/kernels/backend/tuning.hpp>
#include <kompress/kernels/chunk_encoder.hpp>
#include <kompress/kernels/team_codec.hpp>
#include <kompress/kernels/value_range.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace kompress::inline v0::detail {

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
                              scratch, slot, (base.flags & flag_rice_residuals) != 0);
    store<std::uint64_t>(ends + 8 * chunk, bytes);
    store<std::uint64_t>(checksums + 8 * chunk, checksum_of(slot, bytes));
  }
};

/// The ratio codec's chunk for the team kernel: one thread encodes it (the codec is serial
/// within a chunk) into team scratch, with its ratio_scratch there too instead of on its stack;
/// `write` copies it into place with the whole team.
template <class T>
struct team_ratio_chunk {
  ratio_chunk_encoder<T> encoder;

  static constexpr std::size_t scratch_offset = (sizeof(ratio_scratch) + 15) / 16 * 16;
  std::size_t scratch_bytes() const { return scratch_offset + encoder.full_chunk_bytes; }
  static constexpr const char* label = "kompress::compress::team_ratio_chunks";

  template <class Member>
  KOKKOS_INLINE_FUNCTION std::uint64_t measure(const Member& team, std::uint64_t chunk,
                                               void* scratch) const {
    std::uint64_t bytes = 0;
    Kokkos::single(
        Kokkos::PerTeam(team),
        [&](std::uint64_t& length) {
          const value_codec<T> codec = plan_compression<T>(encoder.base, *encoder.range).codec;
          const std::uint64_t first = chunk * encoder.values_per_chunk;
          length = encode_ratio_chunk<T>(encoder.in + first,
                                         int(encoder.layout.values_in_chunk(chunk)), first,
                                         encoder.shape, codec,
                                         *static_cast<ratio_scratch*>(scratch),
                                         static_cast<std::byte*>(scratch) + scratch_offset,
                                         (encoder.base.flags & flag_rice_residuals) != 0);
        },
        bytes);
    return bytes;
  }

  template <class Member>
  KOKKOS_INLINE_FUNCTION void write(const Member& team, std::uint64_t, void* scratch,
                                    std::uint64_t bytes, std::byte* to) const {
    const std::byte* const from = static_cast<const std::byte*>(scratch) + scratch_offset;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, bytes),
                         [&](std::uint64_t i) { to[i] = from[i]; });
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

/// Decodes ratio chunk `chunk` into its values; a malformed chunk lowers `bad` to it. The
/// call operator keeps its ratio_scratch (about 54 KiB) on its own stack; a team kernel passes
/// one in team scratch to `decode`.
template <class T>
struct ratio_chunk_decoder {
  const std::byte* data;
  const std::byte* ends;
  stream_layout layout;
  value_codec<T> codec;
  T* out;
  std::uint64_t values_per_chunk;
  bool rice_allowed;

  KOKKOS_INLINE_FUNCTION void operator()(std::uint64_t chunk, std::uint64_t& bad) const {
    ratio_scratch scratch;
    if (!decode(chunk, scratch)) bad = chunk < bad ? chunk : bad;
  }

  KOKKOS_INLINE_FUNCTION bool decode(std::uint64_t chunk, ratio_scratch& scratch) const {
    const std::uint64_t begin = chunk ? load<std::uint64_t>(ends + 8 * (chunk - 1)) : 0;
    const std::uint64_t end = load<std::uint64_t>(ends + 8 * chunk);
    const std::uint64_t first = chunk * values_per_chunk;
    return decode_ratio_chunk<T>(data + begin, end - begin, int(layout.values_in_chunk(chunk)), first, codec,
                                 scratch, out + first, rice_allowed);
  }
};

}  // namespace kompress::inline v0::detail
